"""The bad-input catalogue: every row of docs/bad_inputs.md is run and its message asserted.

The table in the doc is the test data (command and exact message), so the doc and the
behaviour cannot drift apart. Rows run in-process through `cerebras_tf.cli.main` (one
TensorFlow import for all of them); `test_rows_through_the_script` runs a few through
scripts/run.py in a subprocess to show the real exit code and that no traceback is printed.
"""

import os
import re
import shlex
import subprocess
import sys

import pytest

from cerebras_tf import cli
from cerebras_tf import registry
from cerebras_models.data import acquire
import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")
DOC = os.path.join(ROOT, "docs", "bad_inputs.md")
VOCAB = os.path.join(ROOT, "data_cache", "vocab", "bert_uncased_vocab.txt")
DATA = os.path.join(ROOT, "data_cache", "bert_pretrain", "train.tfrecord")


FIXTURE_YAML = {
    "syntax.yaml": "model:\n    name: mlp\n  x: 1\n",
    "tag.yaml": "model: !!python/object/apply:os.system ['true']\n",
    "unknown_key.yaml": "train_input:\n  batch_size: 64\nmodel:\n  name: mlp\n"
                        "  hiden_sizes: [8]\n",
    "wrong_type.yaml": "train_input:\n  batch_size: lots\nmodel:\n  name: mlp\n",
    "missing_section.yaml": "model:\n  name: mlp\nrunconfig:\n  max_steps: 10\n",
    "train_only.yaml": "train_input:\n  batch_size: 64\nmodel:\n  name: mlp\n",
    "pyfunc.yaml": "train_input:\n  batch_size: 8\nmodel:\n  name: pyfunc_model\n"
                   "runconfig:\n  max_steps: 2\n",
    "reshape.yaml": "train_input:\n  batch_size: 8\nmodel:\n  name: reshape_model\n",
    "own_batch.yaml": "train_input:\n  batch_size: 8\nmodel:\n  name: own_batch_model\n"
                      "csconfig:\n  execution_strategy: multi_replica\n",
    "broken.yaml": "train_input:\n  batch_size: 8\nmodel:\n  name: broken\n",
    "empty.yaml": "",
    "list.yaml": "- train_input\n- model\n",
    "dup.yaml": "model:\n  name: mlp\ntrain_input:\n  batch_size: 8\ntrain_input:\n  batch_size: 0\n",
    "nanlr.yaml": "train_input:\n  batch_size: 8\nmodel:\n  name: mlp\noptimizer:\n"
                  "  learning_rate: .nan\n",
    # Nine levels of nine-fold aliases: 9^9 (387 million) values if expanded.
    "bomb.yaml": "x_anchors:\n  a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"  {c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))
                 + "train_input:\n  batch_size: 8\nmodel:\n  name: mlp\n  hidden_sizes: *i\n",
    # The same at batch_size, its anchors inline: 10^6 values if expanded.
    "bomb_batch.yaml": "train_input:\n  batch_size: [&a [x, x, x, x, x, x, x, x, x, x], " + ", ".join(
        f"&{c} [{', '.join(['*' + p] * 10)}]" for p, c in zip("abcd", "bcde"))
                       + f", [{', '.join(['*e'] * 10)}]]\nmodel:\n  name: mlp\n",
}


def parse_catalogue(path=DOC):
  """Rows of the first markdown table whose header starts with `id`: dicts by column name.

  Cells are separated by ` | `; a literal `|` inside a cell is written `\\|`; a cell wrapped
  in backticks is unwrapped.
  """
  rows, header = [], None
  with open(path, encoding="utf-8") as f:
    for line in f:
      line = line.rstrip("\n")
      if not line.startswith("|"):
        if header is not None and rows:
          break
        continue
      cells = [c.strip().replace("\\|", "|")
               for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
      cells = [c[1:-1] if len(c) > 1 and c[0] == c[-1] == "`" else c for c in cells]
      if header is None:
        if cells and cells[0] == "id":
          header = cells
        continue
      if set(line.replace("|", "").strip()) <= set("-: "):
        continue  # the |---| line
      rows.append(dict(zip(header, cells)))
  return rows


ROWS = parse_catalogue()
SLOW = {"does_not_fit", "ckpt_changed_bert"}
# Rows that need a fresh TensorFlow process (2 logical CPUs for 2 host replicas) run only
# through scripts/run.py.
SCRIPT_ONLY = {"own_batch_key"}
# Rows whose stderr, through scripts/run.py, must be the one error line and nothing else:
# before TensorFlow starts, after it starts, after training steps ran.
THROUGH_THE_SCRIPT = ("yaml_tag", "tf_config_json", "nan_loss_no_cs", "nan_loss",
                      "eval_no_checkpoint", "ckpt_changed_model", "own_batch_key",
                      "model_dir_locked", "trace_failure")
# The one of them run in a process that imports TensorFlow itself: scripts/run.py must silence
# TensorFlow's C++ start-up lines before the import. The others fork from a process that
# imported it that way already (tests/warm_python.py).
FRESH_PROCESS = "eval_no_checkpoint"


def make_fixtures(tmp):
  for name, text in FIXTURE_YAML.items():
    (tmp / name).write_text(text)
  (tmp / "utf16.yaml").write_bytes("model:\n  name: mlp\n".encode("utf-16"))  # with a BOM
  (tmp / "utf16le.yaml").write_bytes("model:\n  name: mlp\n".encode("utf-16-le"))  # without
  # Found by tests/test_bad_input_generator.py: without a BOM and with non-Latin text, the
  # first check (half of the bytes zero) missed it and YAML said "unacceptable character".
  (tmp / "utf16_cjk.yaml").write_bytes("model:\n  name: mlp\n# 中文注释\n".encode("utf-16-le"))
  (tmp / "latin1.yaml").write_bytes("model:\n  name: caf\xe9\n".encode("latin-1"))
  (tmp / "empty").mkdir()
  (tmp / "dirdata" / "bert_pretrain" / "train.tfrecord").mkdir(parents=True)
  (tmp / "afile").write_text("a regular file, not a directory\n")
  with open(DATA, "rb") as f:  # a real header, then garbage: a length/CRC mismatch
    head = f.read(64)
  (tmp / "corrupt.tfrecord").write_bytes(head + b"\x00garbage" * 512)
  (tmp / "shards").mkdir()  # two shards of 8 real records; the second damaged mid-file
  import tensorflow as tf  # pylint: disable=import-outside-toplevel  # only for this fixture
  records = [r.numpy() for r in tf.data.TFRecordDataset(DATA).take(16)]
  for i in (0, 1):
    with tf.io.TFRecordWriter(str(tmp / "shards" / f"part-{i}.tfrecord")) as writer:
      for r in records[8 * i:8 * i + 8]:
        writer.write(r)
  damaged = tmp / "shards" / "part-1.tfrecord"
  with open(damaged, "r+b") as f:
    f.seek(damaged.stat().st_size // 2)
    f.write(b"\xff" * 32)
  (tmp / "reviews_5.tsv").write_text("a good film\t4\na dull plot\t3\n")  # five classes
  (tmp / "reviews.csv").write_text("sentence,label\na good film,1\na dull plot,0\n")
  (tmp / "trainer.yaml").write_text(
      "trainer:\n  init:\n    model:\n      name: gpt2\n    callbacks:\n    - GlobalFlags:\n"
      "        csx.debug.compile_crd_memory_gi: 67\n  fit:\n    train_dataloader:\n"
      "      batch_size: 8\n    ckpt_path: ./x\n")
  (tmp / "cola.tsv").write_text("gj04\t1\t\tThe cat sat.\ngj04\t0\t*\tCat the sat.\n")
  (tmp / "nli.tsv").write_text("sentence1\tsentence2\tgold_label\na cat\ta dog\tneutral\n"
                               "a cat\ta cat\tentailment\nbig\tsmall\tcontradiction\n")
  import tensorflow as tf  # pylint: disable=import-outside-toplevel  # only for this fixture
  with tf.io.TFRecordWriter(str(tmp / "other_features.tfrecord")) as writer:
    for i in range(64):  # a user's own reviews, named "text" (the input reads "sentence")
      writer.write(tf.train.Example(features=tf.train.Features(feature={
          "text": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"a good film"])),
          "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 2]))}))
                   .SerializeToString())
  (tmp / "my_corpus.txt").write_text("The first sentence.\nThe second one.\n\nAnother "
                                     "document.\nIts second sentence.\n")
  (tmp / "mixed").mkdir()
  (tmp / "mixed" / "README.txt").write_text("how the records beside me were made\n")
  _write_int64_records(tmp / "mixed" / "part-0.tfrecord", [{"x": [1]}])
  # Cerebras modelzoo GPT-2 records: written for 128 tokens; under other names; ids of a
  # 50,257-token vocab (the model's is 30,522); and its newer HDF5 format.
  gpt = {"input_ids": [7] * 64, "input_mask": [1] * 64, "labels": [7] * 64}
  _write_int64_records(tmp / "gpt_128.tfrecords",
                       [{k: v * 2 for k, v in gpt.items()}])
  _write_int64_records(tmp / "gpt_tokens.tfrecords", [{"tokens": [7] * 64}])
  _write_int64_records(tmp / "gpt_big_ids.tfrecords",
                       [dict(gpt, input_ids=[7] * 63 + [40000])] * 32)
  (tmp / "config.json").write_text('{"model_type": "llama", "hidden_size": 4096, '
                                   '"num_hidden_layers": 32, "vocab_size": 32000}')
  (tmp / "gpt2_vocab.json").write_text('{"hello": 0, "world": 1, "<|endoftext|>": 2}')
  (tmp / "owt.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(range(256)))  # cut short
  import h5py  # pylint: disable=import-outside-toplevel  # only for these fixtures
  (tmp / "owt_128").mkdir()  # modelzoo's HDF5 data_dir, preprocessed for 128 tokens
  with h5py.File(tmp / "owt_128" / "data-00000.h5", "w") as f:
    f.create_dataset("data", data=[[[7] * 128, [1] * 128, [7] * 128]] * 4, dtype="i4")
  with h5py.File(tmp / "tokens.h5", "w") as f:  # another program's HDF5 layout
    f.create_dataset("input_ids", data=[[7] * 64] * 4, dtype="i4")
  (tmp / "bert_csv_64").mkdir()  # modelzoo's create_csv_static_masking.py, for 64 tokens
  (tmp / "bert_csv_64" / "train-1.csv").write_text(
      "input_ids,token_type_ids,next_sentence_label,masked_lm_weights,masked_lm_positions,"
      "attention_mask,labels\n" + ",".join(f'"{v}"' for v in (
          [7] * 64, [0] * 64)) + ',0,"[1, 0]","[3, 0]",' + f'"{[1] * 64}","[9, 0]"\n')
  (tmp / "bert_csv_64" / "meta.dat").write_text("train-1.csv 1\n")
  with open(VOCAB, encoding="utf-8") as f:
    vocab = f.read().splitlines()
  (tmp / "vocab_200.txt").write_text("\n".join(vocab[:200]) + "\n")
  _write_foreign_checkpoint(str(tmp / "othermodel" / "model.ckpt"))
  _write_foreign_checkpoint(str(tmp / "cut" / "model.ckpt"))  # its data file cut in half
  data = tmp / "cut" / "model.ckpt-5.data-00000-of-00001"
  data.write_bytes(data.read_bytes()[:data.stat().st_size // 2])
  # "the" again at the end (a vocab merged from two files): lines 1997 and 30523.
  (tmp / "vocab_dup.txt").write_text("\n".join(vocab + ["the"]) + "\n")
  (tmp / "vocab_no_cls.txt").write_text(
      "\n".join("[XLS]" if t == "[CLS]" else t for t in vocab) + "\n")


def _write_int64_records(path, rows):
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  with tf.io.TFRecordWriter(str(path)) as writer:
    for row in rows:
      writer.write(tf.train.Example(features=tf.train.Features(feature={
          k: tf.train.Feature(int64_list=tf.train.Int64List(value=v)) for k, v in row.items()}))
                   .SerializeToString())


def _write_foreign_checkpoint(prefix):
  """A checkpoint of some other model (one variable `other/w`) at step 5."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  tf1 = tf.compat.v1
  with tf.Graph().as_default():
    tf1.get_variable("other/w", [3])
    tf1.train.get_or_create_global_step()
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      tf1.train.Saver().save(sess, prefix, global_step=5)


def _train_mlp(tmp, model_dir, monkeypatch):
  del tmp, monkeypatch
  assert cli.main(["run.py", "--params", "configs/params_mlp.yaml", "--max_steps", "2",
                   "--model_dir", model_dir]) == 0


def _train_bert(tmp, model_dir, monkeypatch):
  del tmp, monkeypatch
  assert cli.main(["run.py", "--params", "configs/params_bert_tiny_msl128.yaml", "--no_cs",
                   "--max_steps", "1", "--params_override", "train_input.batch_size=4",
                   "--params_override", "optimizer.learning_rate=0.0001",
                   "--model_dir", model_dir]) == 0


def _locked(tmp, model_dir, monkeypatch):
  """Another run holds the model_dir's lock (an flock, as dir_lock.model_dir_lock takes it)."""
  del tmp, monkeypatch
  import fcntl  # pylint: disable=import-outside-toplevel
  from cerebras_tf.runtime import dir_lock  # pylint: disable=import-outside-toplevel
  os.makedirs(model_dir, exist_ok=True)
  fh = open(os.path.join(model_dir, dir_lock.LOCK_FILE), "a+")  # pylint: disable=consider-using-with
  fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
  fh.write("pid 4242")
  fh.flush()
  return fh.close


def _disk_full(tmp, model_dir, monkeypatch):
  """Fault injection: the second checkpoint save runs out of space half-way, leaving what a
  real ENOSPC leaves (a `_temp` directory with a partial shard, a graph.pbtxt.tmp file)."""
  del tmp
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  real_save, calls = tf.compat.v1.train.Saver.save, []

  def save(self, sess, save_path, global_step=None, *args, **kw):
    if os.path.basename(save_path) == "model.ckpt":  # not the input pipeline's input.ckpt
      calls.append(save_path)
    if len(calls) < 2:
      return real_save(self, sess, save_path, global_step, *args, **kw)
    try:
      step = int(global_step)  # a Python or numpy int (CheckpointSaverHook passes the step)
    except TypeError:
      step = int(sess.run(global_step))
    temp = os.path.join(model_dir, f"model.ckpt-{step}_temp")
    os.makedirs(temp, exist_ok=True)
    with open(os.path.join(temp, "part-00000-of-00001.data-00000-of-00001.tempstate1"), "wb") as fh:
      fh.write(b"\0" * 100)
    with open(os.path.join(model_dir, "graph.pbtxt.tmp" + "0" * 32), "w") as fh:
      fh.write("node {")
    raise tf.errors.ResourceExhaustedError(
        None, None, f"{temp}/part-00000-of-00001.data-00000-of-00001.tempstate1; No space left "
                    "on device")
  monkeypatch.setattr(tf.compat.v1.train.Saver, "save", save)


SETUPS = {"-": None, "trained_mlp": _train_mlp, "trained_bert": _train_bert,
          "locked": _locked, "disk_full": _disk_full}


def command(row, tmp):
  """(env, argv after run.py) of a row; each run gets --model_dir <tmp>/m/<id> unless it names
  one."""
  words = shlex.split(row["command"].replace("<tmp>", str(tmp)))
  env = {}
  while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
    key, _, value = words.pop(0).partition("=")
    env[key] = value
  assert words and words[0] == "run.py", row
  argv = words[1:]
  if "--model_dir" not in argv:
    argv += ["--model_dir", str(tmp / "m" / row["id"])]
  return env, argv


def error_lines(err, tmp):
  return [line.replace(str(tmp), "<tmp>").replace(ROOT, "<repo>") for line in err.splitlines()
          if line.startswith("error: ")]


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
  acquire.ensure_datasets(["vocab", "bert_pretrain"], data_dir=os.path.join(ROOT, "data_cache"))
  path = tmp_path_factory.mktemp("bad_inputs")
  make_fixtures(path)
  return path


def test_catalogue_is_complete():
  ids = [r["id"] for r in ROWS]
  assert len(ids) >= 60 and len(set(ids)) == len(ids), ids
  for r in ROWS:
    assert r["message"].startswith("error: ") and "\n" not in r["message"], r
    assert r["before"] in SETUPS, r
  assert set(THROUGH_THE_SCRIPT) <= set(ids) and SCRIPT_ONLY <= set(THROUGH_THE_SCRIPT)


def _before(row, tmp, argv, monkeypatch):
  """Runs the row's `before` step on its model_dir; returns a cleanup callable or None."""
  setup = SETUPS[row["before"]]
  return setup and setup(tmp, argv[argv.index("--model_dir") + 1], monkeypatch)


@pytest.mark.parametrize("row", [pytest.param(r, id=r["id"], marks=[pytest.mark.slow]
                                              if r["id"] in SLOW else [])
                                 for r in ROWS if r["id"] not in SCRIPT_ONLY])
def test_row(row, tmp, capsys, monkeypatch):
  env, argv = command(row, tmp)
  monkeypatch.chdir(ROOT)
  monkeypatch.delenv("TF_CONFIG", raising=False)
  monkeypatch.delenv("CEREBRAS_TF_MODEL_MODULES", raising=False)
  for key, value in env.items():
    monkeypatch.setenv(key, value)
  # Other test modules register the test-only `toy` family; the catalogue lists the shipped ones.
  # (Pop and restore it: the registry must stay the same dict, models register into it lazily.)
  toy = registry._REGISTRY.pop("toy", None)
  cleanup = None
  try:
    cleanup = _before(row, tmp, argv, monkeypatch)
    capsys.readouterr()
    code = cli.main(["run.py"] + argv)
  finally:
    if cleanup:
      cleanup()
    if toy is not None:
      registry._REGISTRY["toy"] = toy
  out, err = capsys.readouterr()
  assert "Traceback" not in err
  assert (code, error_lines(err, tmp)) == (2, [row["message"]]), (out, err)


@pytest.mark.slow
@pytest.mark.parametrize("row_id", THROUGH_THE_SCRIPT)
def test_rows_through_the_script(row_id, tmp, monkeypatch):
  """Through scripts/run.py in a process of its own: exit code 2 and stderr is exactly the one
  error line (TensorFlow's start-up noise silenced, its log in the model_dir), also for
  errors raised after TensorFlow started or after training ran."""
  row = next(r for r in ROWS if r["id"] == row_id)
  extra, argv = command(row, tmp)
  argv[argv.index("--model_dir") + 1] += "_script"
  cleanup = _before(row, tmp, argv, monkeypatch)
  env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "TF_CONFIG")}
  env.update(PYTHONPATH=TESTS, **extra)
  try:
    run = subprocess.run if row_id == FRESH_PROCESS else warm_python.run
    proc = run([sys.executable, os.path.join(ROOT, "scripts", "run.py")] + argv,
               cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  finally:
    if cleanup:
      cleanup()
  message = row["message"].replace(f"/m/{row_id}", f"/m/{row_id}_script")
  assert proc.returncode == 2, proc.stderr
  # The input-speed warning measures this host against the engine: on a loaded machine it
  # comes and goes, so it is the one line besides the error that is not compared.
  lines = [line for line in proc.stderr.splitlines() if not line.startswith("cerebras_tf: input:")]
  assert [line.replace(str(tmp), "<tmp>").replace(ROOT, "<repo>")
          for line in lines] == [message], proc.stderr
