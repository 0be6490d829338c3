"""What a user's data file holds (models/data/formats.py), and their own text turned into BERT
pretraining records (models/data/convert.py, `prepare_data.py --text_to_bert`)."""

import os
import subprocess
import sys

import pytest
import tensorflow as tf

from cerebras_tf.errors import DataError
from cerebras_models.data import convert, formats

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _int64(values):
  return tf.train.Feature(int64_list=tf.train.Int64List(value=list(values)))


def _write_records(path, rows):
  with tf.io.TFRecordWriter(str(path)) as w:
    for row in rows:
      w.write(tf.train.Example(features=tf.train.Features(
          feature={k: _int64(v) for k, v in row.items()})).SerializeToString())


def test_each_format_is_told_from_its_first_bytes(tmp_path):
  """A record is believed only when TensorFlow's own checksum of its length holds: text whose
  first eight characters read as a length of 8e18 bytes was read as one (BERT's probe then
  asked for that many bytes: a segmentation fault)."""
  _write_records(tmp_path / "a.tfrecord", [{"input_ids": range(7), "labels": [1]}] * 3)
  (tmp_path / "text.txt").write_text("hello world this is text\nsecond line\n")
  (tmp_path / "utf8.txt").write_text("caf\u00e9 na\u00efve \u65e5\u672c\n" * 5)
  (tmp_path / "data.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(range(256)))
  (tmp_path / "blob.bin").write_bytes(bytes(range(256)) * 4)
  (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1") * 4)
  (tmp_path / "empty.txt").write_bytes(b"")
  record = (tmp_path / "a.tfrecord").read_bytes()
  # One bit of the length flipped: the checksum no longer holds.
  (tmp_path / "bad_len.tfrecord").write_bytes(bytes([record[0] ^ 1]) + record[1:])

  def kind(name):
    return formats.probe(str(tmp_path / name))

  assert kind("a.tfrecord") == (formats.TFRECORD, "TFRecords", {"input_ids": 7, "labels": 1}, "")
  assert kind("text.txt").kind == kind("utf8.txt").kind == formats.TEXT
  assert kind("data.h5") == (formats.HDF5, "HDF5", None, "")
  assert kind("blob.bin").kind == kind("latin1.txt").kind == kind("bad_len.tfrecord").kind \
      == formats.BINARY
  assert kind("empty.txt").kind == formats.EMPTY
  # TFRecords of something other than tf.train.Example: a record, no feature lengths.
  with tf.io.TFRecordWriter(str(tmp_path / "raw.tfrecord")) as w:
    w.write(b"\xff\xff not a protobuf")
  assert kind("raw.tfrecord") == (formats.TFRECORD, "TFRecords", None, "")


def test_gzip_compressed_records_are_records(tmp_path):
  """TFX's ExampleGen writes gzip-compressed TFRecords (*.gz); they were refused as
  "gzip-compressed". Read with compression_type GZIP; other gzip data is still named; plain
  and compressed records in one pattern are refused (one reader reads one kind)."""
  rows = [{"input_ids": range(5), "labels": [1]}] * 3
  with tf.io.TFRecordWriter(str(tmp_path / "part-0.gz"), options="GZIP") as w:
    for row in rows:
      w.write(tf.train.Example(features=tf.train.Features(
          feature={k: _int64(v) for k, v in row.items()})).SerializeToString())
  kind = formats.probe(str(tmp_path / "part-0.gz"))
  assert kind == (formats.TFRECORD, "gzip-compressed TFRecords", {"input_ids": 5, "labels": 1},
                  "GZIP")
  assert len(list(tf.data.TFRecordDataset(str(tmp_path / "part-0.gz"),
                                          compression_type=kind.compression))) == 3
  import gzip  # pylint: disable=import-outside-toplevel
  with gzip.open(tmp_path / "notes.txt.gz", "wt") as fh:
    fh.write("plain text, compressed\n" * 20)
  assert formats.probe(str(tmp_path / "notes.txt.gz")) == (formats.BINARY,
                                                          "gzip-compressed data", None, "")
  _write_records(tmp_path / "part-1.tfrecord", rows)
  with pytest.raises(DataError, match=r"part-0.gz is gzip-compressed TFRecords; .*part-1.tfrecord "
                                      r"is TFRecords"):
    formats.probe_files([str(tmp_path / "part-0.gz"), str(tmp_path / "part-1.tfrecord")], "k")


def test_a_pattern_of_mixed_formats_empty_files_or_nothing_is_refused(tmp_path):
  """`data/*` also matching the README beside the records would read it as records."""
  _write_records(tmp_path / "part-0.tfrecord", [{"x": [1]}])
  _write_records(tmp_path / "part-1.tfrecord", [{"x": [2]}])
  assert formats.probe_files(sorted(map(str, tmp_path.glob("part-*"))), "k").kind == \
      formats.TFRECORD
  (tmp_path / "README.txt").write_text("how these records were made\n")
  with pytest.raises(DataError, match=r"train_input.file_pattern matches files of different "
                                      r"formats \(.*part-0.tfrecord is TFRecords; .*README.txt "
                                      r"is text\); narrow the pattern"):
    formats.probe_files(sorted(map(str, tmp_path.glob("part-*"))) + [str(tmp_path / "README.txt")],
                        "train_input.file_pattern")
  (tmp_path / "part-2.tfrecord").write_bytes(b"")
  with pytest.raises(DataError, match=r"part-2.tfrecord is empty; remove it or narrow k$"):
    formats.probe_files(sorted(map(str, tmp_path.glob("part-*"))), "k")
  with pytest.raises(DataError, match=r"^k matches no file; fix it in the params file$"):
    formats.probe_files([], "k")


CORPUS = """The first sentence of one.
The second sentence of one.
The third sentence of one.

Alpha of two.
Beta of two.

Only one sentence here.

Red of four.
Green of four.
Blue of four.
"""


def test_text_becomes_next_sentence_pairs_of_whole_documents(tmp_path):
  """google-bert's text format: a sentence a line, a blank line between documents. A pair
  labelled 0 is a sentence and its successor in one document; 1, a sentence from another
  document. Held-out documents appear in eval only."""
  (tmp_path / "a.txt").write_text(CORPUS)
  (tmp_path / "b.txt").write_text("Last file line one.\nLast file line two.\n")  # no blank
  docs = convert.read_documents([str(tmp_path / "a.txt"), str(tmp_path / "b.txt")])
  assert [len(s) for _, s in docs] == [3, 2, 1, 3, 2]
  owner = {s: d for d, (_, sents) in enumerate(docs) for s in sents}
  counts = convert.text_to_bert(str(tmp_path / "*.txt"), str(tmp_path / "out"),
                                eval_fraction=0.4, progress=False)
  spec = {"text_a": tf.io.FixedLenFeature([], tf.string),
          "text_b": tf.io.FixedLenFeature([], tf.string),
          "next_sentence_label": tf.io.FixedLenFeature([], tf.int64)}
  seen = {}
  for split in ("train", "eval"):
    path = str(tmp_path / "out" / f"{split}.tfrecord")
    rows = [tf.io.parse_single_example(r, spec) for r in tf.data.TFRecordDataset(path)]
    assert counts[path] == len(rows) > 0
    seen[split] = set()
    for row in rows:
      a, b = (row[k].numpy().decode() for k in ("text_a", "text_b"))
      sents = docs[owner[a]][1]
      if row["next_sentence_label"] == 0:
        assert sents.index(b) == sents.index(a) + 1, (a, b)
      else:
        assert owner[b] != owner[a], (a, b)
      seen[split].add(owner[a])
  # 0.4 of 5 documents held out whole: 2 in eval, none of them in train.
  assert len(seen["eval"]) <= 2 and not seen["eval"] & seen["train"]


def test_too_little_text_is_refused_with_what_to_do(tmp_path):
  (tmp_path / "one.txt").write_text("Just one document.\nOf two lines.\n")
  with pytest.raises(DataError, match=r"holds 1 document\(s\): next-sentence pairs need at "
                                      r"least two \(separate documents by a blank line\)"):
    convert.text_to_bert(str(tmp_path / "one.txt"), str(tmp_path / "out"), progress=False)
  (tmp_path / "lines.txt").write_text("a\n\nb\n\nc\n")
  with pytest.raises(DataError, match=r"no two consecutive sentences: write one sentence per "
                                      r"line"):
    convert.text_to_bert(str(tmp_path / "lines.txt"), str(tmp_path / "out"), progress=False)
  (tmp_path / "latin1.txt").write_bytes("caf\xe9\n\nau lait\n".encode("latin-1"))
  with pytest.raises(DataError, match=r"latin1.txt is not UTF-8 text .*iconv"):
    convert.text_to_bert(str(tmp_path / "latin1.txt"), str(tmp_path / "out"), progress=False)


def test_the_script_writes_records_that_bert_trains_on(tmp_path):
  """`prepare_data.py --text_to_bert` then the BERT input_fn on its output: a batch of
  pretraining features, masked on the fly."""
  (tmp_path / "corpus.txt").write_text(CORPUS * 3)
  out = tmp_path / "rec"
  proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "prepare_data.py"),
                         "--text_to_bert", str(tmp_path / "*.txt"), "--out", str(out),
                         "--eval_fraction", "0"], capture_output=True, text=True, check=False,
                        env={k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"})
  assert proc.returncode == 0, proc.stderr
  assert f"train on them with train_input.file_pattern: {out}/train.tfrecord" in proc.stderr
  assert "cuDNN" not in proc.stderr and not (out / "eval.tfrecord").exists()
  vocab = os.path.join(ROOT, "data_cache", "vocab", "bert_uncased_vocab.txt")
  if not os.path.exists(vocab):
    pytest.skip("no prepared vocab (python scripts/prepare_data.py)")
  from cerebras_models.bert import input as bert_input  # pylint: disable=import-outside-toplevel
  params = {"train_input": {"file_pattern": str(out / "train.tfrecord"), "vocab_file": vocab,
                            "batch_size": 4, "max_sequence_length": 32,
                            "max_predictions_per_seq": 5},
            "model": {"vocab_size": 30522}}
  features, labels = next(iter(bert_input.input_fn(params)))
  assert features["token_ids"].shape == [4, 32] and labels.shape == [4]
  assert int(tf.reduce_sum(features["masked_lm_weights"])) > 0


def test_an_unwritable_output_is_one_line(tmp_path, capsys):
  """--out under a regular file (or a full disk): one line and exit 2, not a traceback."""
  from cerebras_models.data import prepare  # pylint: disable=import-outside-toplevel
  (tmp_path / "corpus.txt").write_text(CORPUS)
  (tmp_path / "afile").write_text("not a directory")
  code = prepare.main(["--text_to_bert", str(tmp_path / "corpus.txt"), "--out",
                       str(tmp_path / "afile" / "out")])
  err = capsys.readouterr().err.strip().splitlines()
  assert code == 2 and len(err) == 1 and err[0].startswith(
      f"prepare_data: error: cannot write {tmp_path}/afile/out/train.tfrecord: "), err
  assert not list(tmp_path.glob("afile*/**/*.tmp"))
