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
SLOW = {"does_not_fit"}


def make_fixtures(tmp):
  for name, text in FIXTURE_YAML.items():
    (tmp / name).write_text(text)
  (tmp / "latin1.yaml").write_bytes("model:\n  name: caf\xe9\n".encode("latin-1"))
  (tmp / "empty").mkdir()
  (tmp / "dirdata" / "bert_pretrain" / "train.tfrecord").mkdir(parents=True)
  (tmp / "afile").write_text("a regular file, not a directory\n")
  with open(DATA, "rb") as f:  # a real header, then garbage: a length/CRC mismatch
    head = f.read(64)
  (tmp / "corrupt.tfrecord").write_bytes(head + b"\x00garbage" * 512)
  with open(VOCAB, encoding="utf-8") as f:
    vocab = f.read().splitlines()
  (tmp / "vocab_200.txt").write_text("\n".join(vocab[:200]) + "\n")
  _write_foreign_checkpoint(str(tmp / "othermodel" / "model.ckpt"))
  (tmp / "vocab_no_cls.txt").write_text(
      "\n".join("[XLS]" if t == "[CLS]" else t for t in vocab) + "\n")


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
  path = tmp_path_factory.mktemp("bad_inputs")
  make_fixtures(path)
  return path


def test_catalogue_is_complete():
  ids = [r["id"] for r in ROWS]
  assert len(ids) >= 25 and len(set(ids)) == len(ids), ids
  for r in ROWS:
    assert r["message"].startswith("error: ") and "\n" not in r["message"], r


@pytest.mark.parametrize("row", [pytest.param(r, id=r["id"], marks=[pytest.mark.slow]
                                              if r["id"] in SLOW else []) for r in ROWS])
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
  try:
    code = cli.main(["run.py"] + argv)
  finally:
    if toy is not None:
      registry._REGISTRY["toy"] = toy
  out, err = capsys.readouterr()
  assert "Traceback" not in err
  assert (code, error_lines(err, tmp)) == (2, [row["message"]]), (out, err)


def test_rows_through_the_script(tmp):
  """A few rows through scripts/run.py: exit code 2, one error line, no traceback."""
  for row in [r for r in ROWS if r["id"] in ("yaml_tag", "tf_config_json", "nan_loss_no_cs")]:
    extra, argv = command(row, tmp)
    env = dict(os.environ, PYTHONPATH=TESTS, TF_CPP_MIN_LOG_LEVEL="2", **extra)
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "run.py")] + argv,
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert (proc.returncode, error_lines(proc.stderr, tmp)) == (2, [row["message"]]), row["id"]
