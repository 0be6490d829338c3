"""The package as a user installs it: a wheel built from the repo, installed (not editable) into
a fresh virtualenv, used from another directory. It compiles and trains a user's model_fn and a
reference model (in weight streaming: its weight servers start from the wheel), finds its
engine specs as package data, and installs no top-level `models`.

The fresh virtualenv borrows the dependencies (TensorFlow, ...) of the project's .venv through
a path file, so the test costs seconds instead of a 1.7 GB install; cerebras_tf itself comes
only from the wheel (the .venv's editable-install hook is not read by that path file).
"""

import glob
import os
import subprocess
import sys
import sysconfig
import textwrap
import zipfile

import pytest

from conftest import ROOT

USER_MODEL = '''
import tensorflow as tf

def model_fn(features, labels, mode, params):
  logits = tf.compat.v1.layers.dense(features["x"], 3, name="head")
  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
  train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
      loss, global_step=tf.compat.v1.train.get_or_create_global_step())
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

def input_fn(params):
  ds = tf.data.Dataset.from_tensors(({"x": tf.ones([8])}, tf.constant(1)))
  return ds.repeat().batch(params["batch_size"], drop_remainder=True)
'''

SCRIPT = '''
import os, sys
import cerebras_tf
from cerebras_tf import CerebrasEstimator, CSConfig, CSRunConfig, params, runner
site = sys.argv[1]
assert cerebras_tf.__file__.startswith(site), cerebras_tf.__file__
try:
  import models
  raise SystemExit("a top-level models package is importable: " + models.__file__)
except ModuleNotFoundError:
  pass
import user_model
est = CerebrasEstimator(user_model.model_fn, params={"batch_size": 4}, config=CSRunConfig(
    model_dir="user_run", cs_config=CSConfig(execution_strategy="pipelined")))
est.train(user_model.input_fn, max_steps=2, use_cs=True)
result = est.compile(user_model.input_fn)
assert result.plan.fits and result.plan.engine == "cs2", result.plan
assert os.path.exists(os.path.join("user_run", "cs_compile", "report.txt"))
p = params.parse_params("""
model: {name: mlp, hidden_sizes: [16]}
train_input: {batch_size: 8}
runconfig: {model_dir: mlp_run, max_steps: 2}
csconfig: {execution_strategy: weight_streaming}
""", "mlp.yaml")  # weight servers started from the wheel, in this (the user's) directory
summary = runner.run(p, runner.RunOptions(mode="train"))
assert summary["global_step"] == 2, summary
print("WHEEL OK", est.latest_checkpoint())
'''


@pytest.mark.slow
def test_wheel_installs_and_trains_from_another_directory(tmp_path):
  dist = tmp_path / "dist"
  subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                  "-q", "-w", str(dist), ROOT], check=True, cwd=tmp_path, timeout=300)
  wheel, = glob.glob(str(dist / "cerebras_tf-*.whl"))
  names = zipfile.ZipFile(wheel).namelist()
  assert "cerebras_tf/engine/specs/cs2.yaml" in names
  assert not [n for n in names if n.startswith("models/")]

  venv = tmp_path / "venv"
  subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                 timeout=120)
  site = glob.glob(str(venv / "lib" / "python3*" / "site-packages"))[0]
  subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", site,
                  wheel], check=True, timeout=300)
  with open(os.path.join(site, "project_deps.pth"), "w") as f:
    f.write(sysconfig.get_paths()["purelib"] + "\n")

  work = tmp_path / "elsewhere"
  work.mkdir()
  (work / "user_model.py").write_text(textwrap.dedent(USER_MODEL))
  (work / "check.py").write_text(SCRIPT)
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TF_CONFIG")}
  env["TF_CPP_MIN_LOG_LEVEL"] = "3"
  proc = subprocess.run([str(venv / "bin" / "python"), "check.py", site], cwd=work, env=env,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "WHEEL OK" in proc.stdout

  # The seed's example as printed (`from cerebras.tf.cs_estimator import CerebrasEstimator`),
  # from the wheel's namespace portion: cerebras/tf/*, and no cerebras/__init__.py to collide
  # with a real Cerebras install.
  assert "cerebras/tf/cs_estimator.py" in names and "cerebras/tf/run_config.py" in names
  assert "cerebras/__init__.py" not in names and "cerebras/tf/__init__.py" not in names
  (work / "seed_example.py").write_text(open(os.path.join(ROOT, "tests", "seed_example.py")).read())
  proc = subprocess.run([str(venv / "bin" / "python"), "seed_example.py"], cwd=work, env=env,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "SEED OK 5" in proc.stdout and os.path.exists(work / "out" / "model.ckpt-5.index")

  # The local launcher from the wheel, in the user's directory with relative paths: its tasks
  # ran <package root>/scripts/run.py (not in a wheel) from the package root.
  (work / "mlp.yaml").write_text("model: {name: mlp, hidden_sizes: [16]}\n"
                                 "train_input: {batch_size: 8}\n")
  proc = subprocess.run(
      [str(venv / "bin" / "python"), "-c", "import sys; from cerebras_tf.runtime import launcher; "
       "sys.exit(launcher.main(sys.argv[1:]))", "--workers", "1", "--", "--params", "mlp.yaml",
       "--model_dir", "launched", "--max_steps", "2"],
      cwd=work, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
  assert "[chief:0] global_step=2" in proc.stdout, proc.stdout[-3000:]
  assert os.path.exists(work / "launched" / "model.ckpt-2.index")

  # Data preparation is a command of the wheel, and the messages name it: they named
  # `python scripts/prepare_data.py`, which a wheel does not have.
  entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
  assert ("cerebras-prepare-data = cerebras_models.data.prepare:console_main"
          in zipfile.ZipFile(wheel).read(entry_points).decode())
  (work / "gpt.yaml").write_text("model: {name: gpt, vocab_size: 64, hidden_size: 8, "
                                 "num_hidden_layers: 1, num_heads: 1, filter_size: 8, "
                                 "max_position_embeddings: 8}\n"
                                 "train_input: {batch_size: 2, max_sequence_length: 8, "
                                 "data_dir: nowhere}\n")
  proc = subprocess.run([str(venv / "bin" / "python"), "-m", "cerebras_tf", "--params",
                         "gpt.yaml", "--validate_only"], cwd=work, env=env, capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 2 and "run `cerebras-prepare-data --datasets vocab,bert_pretrain`" \
      in proc.stderr, proc.stderr[-3000:]
  proc = subprocess.run([str(venv / "bin" / "python"), "-m", "cerebras_models.data.prepare",
                         "--help"], cwd=work, env=env, capture_output=True, text=True,
                        timeout=120)
  assert proc.returncode == 0 and "--text_to_bert" in proc.stdout, proc.stderr[-3000:]
