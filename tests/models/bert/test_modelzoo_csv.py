"""BERT pretraining on Cerebras modelzoo's CSV datasets (models/data/modelzoo_csv.py).

The files are written here the way modelzoo's create_csv.py and create_csv_static_masking.py
write them (csv.DictWriter, QUOTE_MINIMAL, each cell str() of a Python list, meta.dat of
"<path> <examples>" lines), into a directory that is then moved, as a user's copy would be.
"""

import csv
import os
import shutil

import numpy as np
import pytest

import bert_test_base as base
from cerebras_tf.errors import DataError
from cerebras_models.bert import input as input_lib
from cerebras_models.data import modelzoo_csv

TRAIN = input_lib.ModeKeys.TRAIN
VOCAB = {t: i for i, t in enumerate(base.VOCAB)}


def _write(directory, fieldnames, rows, files=2):
  """rows split round-robin over `files` CSVs, meta.dat naming them by absolute path."""
  os.makedirs(directory)
  paths = [os.path.join(directory, f"train-{i + 1}.csv") for i in range(files)]
  handles = [open(p, "w", newline="", encoding="utf-8") for p in paths]
  writers = [csv.DictWriter(h, fieldnames=fieldnames, quoting=csv.QUOTE_MINIMAL)
             for h in handles]
  for w in writers:
    w.writeheader()
  counts = [0] * files
  for i, row in enumerate(rows):
    writers[i % files].writerow({k: str(v) if isinstance(v, list) else v for k, v in row.items()})
    counts[i % files] += 1
  for h in handles:
    h.close()
  with open(os.path.join(directory, "meta.dat"), "w") as f:
    f.writelines(f"{p} {c}\n" for p, c in zip(paths, counts))


def _pairs(rng, n):
  """create_csv.py rows: [CLS] a [SEP] b [SEP] as WordPiece strings (one with a quote and a
  comma token, which the CSV quotes), the segments, is_random_next."""
  rows = []
  for _ in range(n):
    a = list(rng.choice(base.WORDS, size=rng.randint(3, 9)))
    b = list(rng.choice(base.WORDS, size=rng.randint(3, 9))) + [",", "'"]
    tokens = ["[CLS]"] + a + ["[SEP]"] + b + ["[SEP]"]
    rows.append({"tokens": tokens, "segment_ids": [0] * (len(a) + 2) + [1] * (len(b) + 1),
                 "is_random_next": int(rng.randint(2))})
  return rows


class ModelzooCsvTest(base.BertTestCase):

  def params(self, data_dir, **section):
    vocab = base.write_vocab(os.path.join(self.get_temp_dir(), "vocab.txt"))
    p = base.with_overrides(base.tiny_params(), "train_input", data_dir=data_dir,
                            vocab_file=vocab, shuffle=False, batch_size=4,
                            max_predictions_per_seq=5, **section)
    return p

  def test_create_csv_tokens_are_looked_up_packed_and_masked_on_the_fly(self):
    rows = _pairs(np.random.RandomState(0), 8)
    written = os.path.join(self.get_temp_dir(), "written")
    _write(written, ["tokens", "segment_ids", "is_random_next"], rows)
    moved = os.path.join(self.get_temp_dir(), "moved")
    shutil.move(written, moved)  # meta.dat still names the old absolute paths
    zoo = modelzoo_csv.find(moved, "train_input.data_dir")
    assert zoo.files == (os.path.join(moved, "train-1.csv"), os.path.join(moved, "train-2.csv"))
    assert zoo.counts == (4, 4) and not zoo.static
    batches = self.take(input_lib.input_fn, self.params(moved), TRAIN, 2)
    # Round-robin files, read file by file: train-1 holds rows 0, 2, 4, 6.
    order = [0, 2, 4, 6, 1, 3, 5, 7]
    for b, (f, labels) in enumerate(batches):
      self.assertEqual(f["token_ids"].shape, (4, 32))
      for r in range(4):
        row = rows[order[4 * b + r]]
        want = [VOCAB.get(t, VOCAB["[UNK]"]) for t in row["tokens"]]  # "," and "'": [UNK]
        n = len(want)
        ids = f["token_ids"][r].copy()
        k = int(f["masked_lm_weights"][r].sum())
        assert k >= 1
        ids[f["masked_lm_positions"][r][:k]] = f["masked_lm_ids"][r][:k]  # undo the masks
        self.assertAllEqual(ids[:n], want)
        self.assertAllEqual(f["padding_mask"][r], [1] * n + [0] * (32 - n))
        self.assertAllEqual(f["segment_ids"][r][:n], row["segment_ids"])
        self.assertEqual(labels[r], row["is_random_next"])

  def test_static_masking_csv_is_read_as_written(self):
    rng = np.random.RandomState(1)
    rows = []
    for _ in range(4):
      ids = list(rng.randint(5, len(base.VOCAB), size=32))
      rows.append({"input_ids": ids, "token_type_ids": [0] * 16 + [1] * 16,
                   "next_sentence_label": int(rng.randint(2)),
                   "masked_lm_weights": [1, 1, 1, 0, 0], "masked_lm_positions": [3, 7, 9, 0, 0],
                   "attention_mask": [1] * 30 + [0] * 2, "labels": [5, 6, 7, 0, 0]})
    d = os.path.join(self.get_temp_dir(), "static")
    _write(d, ["input_ids", "token_type_ids", "next_sentence_label", "masked_lm_weights",
               "masked_lm_positions", "attention_mask", "labels"], rows, files=1)
    (f, labels), = self.take(input_lib.input_fn, self.params(d), TRAIN, 1)
    self.assertAllEqual(f["token_ids"], [r["input_ids"] for r in rows])
    self.assertAllEqual(f["segment_ids"], [r["token_type_ids"] for r in rows])
    self.assertAllEqual(f["padding_mask"], [r["attention_mask"] for r in rows])
    self.assertAllEqual(f["masked_lm_positions"], [r["masked_lm_positions"] for r in rows])
    self.assertAllEqual(f["masked_lm_ids"], [r["labels"] for r in rows])
    self.assertAllEqual(f["masked_lm_weights"], [r["masked_lm_weights"] for r in rows])
    self.assertAllEqual(labels, [r["next_sentence_label"] for r in rows])
    # Written for 32 tokens, read for 64: one line naming the key and both lengths.
    with pytest.raises(DataError, match=r"column input_ids holds 32 values, but "
                                        r"max_sequence_length is 64: set it to 32"):
      self.take(input_lib.input_fn, self.params(d, max_sequence_length=64), TRAIN, 1)

  def test_a_bad_dataset_is_named_before_training(self):
    d = os.path.join(self.get_temp_dir(), "bad")
    _write(d, ["tokens", "segment_ids", "is_random_next"], _pairs(np.random.RandomState(2), 2))
    path = os.path.join(d, "train-2.csv")
    with open(path, "a", encoding="utf-8") as f:
      f.write('"[\'[CLS]\', \'the\'",[0],0\n')  # an unclosed list, after a good first row
    with open(path, encoding="utf-8") as f:
      lines = f.readlines()
    with open(path, "w", encoding="utf-8") as f:
      f.writelines([lines[0], lines[-1]] + lines[1:-1])  # ... now the first row
    with pytest.raises(DataError, match=r"train-2\.csv:2: column tokens is not a Python literal"):
      modelzoo_csv.find(d, "train_input.data_dir")
    with open(os.path.join(d, "meta.dat"), "a") as f:
      f.write("gone.csv 3\n")
    with pytest.raises(DataError, match=r"meta\.dat:3 lists gone\.csv, which is neither there "
                                        r"nor in"):
      modelzoo_csv.find(d, "train_input.data_dir")
    other = os.path.join(self.get_temp_dir(), "other")
    _write(other, ["text", "label"], [{"text": "a", "label": 1}], files=1)
    with pytest.raises(DataError, match="columns text, label are neither modelzoo's"):
      modelzoo_csv.find(other, "train_input.data_dir")
    assert modelzoo_csv.find(self.get_temp_dir(), "train_input.data_dir") is None  # no meta.dat

  def test_a_vocab_file_that_is_not_there_is_named_by_its_key(self):
    # create_csv.py's tokens need the vocab they were cut with; the published files name it
    # under $MODELZOO_ROOT, which a user's copy may not have.
    d = os.path.join(self.get_temp_dir(), "novocab")
    _write(d, ["tokens", "segment_ids", "is_random_next"], _pairs(np.random.RandomState(4), 2))
    gone = os.path.join(self.get_temp_dir(), "zoo", "vocab.txt")
    with pytest.raises(DataError, match=f"train_input.vocab_file {gone} does not exist: set it "
                                        f"to the WordPiece vocab the data was written with"):
      input_lib.input_fn(base.with_overrides(self.params(d), "train_input", vocab_file=gone),
                         TRAIN)

  def test_a_bad_row_later_in_a_file_stops_training_with_its_one_line(self):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from cerebras_tf import cli  # pylint: disable=import-outside-toplevel
    d = os.path.join(self.get_temp_dir(), "late")
    _write(d, ["tokens", "segment_ids", "is_random_next"], _pairs(np.random.RandomState(3), 3),
           files=1)
    with open(os.path.join(d, "train-1.csv"), "a", encoding="utf-8") as f:
      f.write('"[\'[CLS]\', \'the\'",[0],0\n')
    with pytest.raises(tf.errors.OpError) as raised:  # from the numpy_function, at run time
      self.take(input_lib.input_fn, self.params(d), TRAIN, 1)
    assert cli._user_facing_tf_error(raised.value) == (  # pylint: disable=protected-access
        f"train_input.data_dir {d}: column tokens is not a Python literal ('[' was never "
        f"closed (<unknown>, line 1))")


def test_cells_read_as_python_wrote_them_numbers_without_the_ast(monkeypatch):
  """Every cell is str() of a Python value. Numeric ones are JSON too and are read as such:
  CPython 3.11's AST state is shared between threads, and a parallel map's py_functions
  parsing at once failed a CI run with "AST constructor recursion depth mismatch"
  (python/cpython#106905). Python's own spellings (quoted tokens, booleans, tuples) still
  parse, and a cell that is no literal is one line naming its column."""
  values = {"ids": [101, 7, 0], "w": [1.0, 0.5], "label": 1, "tokens": ["[CLS]", "it's", "a"],
            "flag": True, "pair": (3, 4)}
  line = ",".join('"' + str(v).replace('"', '""') + '"' for v in values.values()).encode()
  parsed = []
  real = modelzoo_csv.ast.literal_eval
  monkeypatch.setattr(modelzoo_csv.ast, "literal_eval", lambda t: parsed.append(t) or real(t))
  (row,) = modelzoo_csv.parse_lines([line], list(values), "train-1.csv:2")
  assert row == values and isinstance(row["pair"], tuple)
  assert parsed == [str(values[k]) for k in ("tokens", "flag", "pair")]  # numbers: JSON
  with pytest.raises(DataError, match=r"^train-1.csv:2: column ids is not a Python literal"):
    modelzoo_csv.parse_lines([b'"[1, 2",1'], ["ids", "label"], "train-1.csv:2")
