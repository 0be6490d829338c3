"""Crash and resume: SIGKILL a run at a random step; the rerun resumes from the last checkpoint,
the input pipeline continues where it was, and with op determinism the final weights equal an
uninterrupted run's. A truncated latest checkpoint is detected and the previous one is used.
"""

import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf
import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# 600 MLP steps (4.7 epochs of 128 batches each, so the input pipeline's state crosses
# epoch reshuffles) with a checkpoint every 50: a kill at step 100..250 leaves 350+ steps, far
# more than the 20 ms poll needs to land the kill before the run would end. (1,000 steps until
# issue 42: the file's five runs took 80 s of a core.)
MAX_STEPS = 600
CKPT_STEPS = 50
HALF = MAX_STEPS // 2


def _cmd(model_dir):
  return [sys.executable, "scripts/run.py", "--params", "configs/params_mlp.yaml",
          "--model_dir", str(model_dir), "--max_steps", str(MAX_STEPS),
          "--params_override", "runconfig.op_determinism=true",
          "--params_override", f"runconfig.save_checkpoints_steps={CKPT_STEPS}",
          "--params_override", "runconfig.keep_checkpoint_max=0",
          "--params_override", "runconfig.log_step_count_steps=500"]


def _run(model_dir):
  proc = warm_python.run(_cmd(model_dir), cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
  assert proc.returncode == 0, proc.stderr[-2000:]
  return proc


def _step(model_dir):
  ckpt = tf.train.latest_checkpoint(str(model_dir))
  return int(ckpt.rsplit("-", 1)[1]) if ckpt else -1


def _weights(model_dir):
  reader = tf.train.load_checkpoint(str(model_dir))
  return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()
          if not n.startswith("global_step")}


def _assert_same(a, b):
  assert a.keys() == b.keys()
  for name in a:
    np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  model_dir = tmp_path_factory.mktemp("uninterrupted")
  _run(model_dir)
  assert _step(model_dir) == MAX_STEPS
  return _weights(model_dir)


@pytest.mark.slow
def test_sigkill_then_rerun_matches_uninterrupted(tmp_path, uninterrupted):
  kill_after = random.Random().choice(range(2 * CKPT_STEPS, HALF, CKPT_STEPS))
  proc = warm_python.Popen(_cmd(tmp_path), cwd=ROOT, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL,
                           env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
  deadline = time.monotonic() + 300
  while _step(tmp_path) < kill_after and proc.poll() is None and time.monotonic() < deadline:
    time.sleep(0.02)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  killed_at = _step(tmp_path)
  assert proc.returncode == -signal.SIGKILL and 0 < killed_at < MAX_STEPS, killed_at
  _run(tmp_path)  # the same command again
  assert _step(tmp_path) == MAX_STEPS
  _assert_same(uninterrupted, _weights(tmp_path))


@pytest.mark.slow
def test_truncated_latest_checkpoint_falls_back_to_previous(tmp_path, uninterrupted):
  proc = warm_python.run(_cmd(tmp_path)[:-2] + ["--params_override", "runconfig.log_step_count_steps=500"]
                         + ["--max_steps", str(HALF)], cwd=ROOT, capture_output=True,
                         text=True, timeout=600, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
  assert proc.returncode == 0, proc.stderr[-2000:]
  data = str(tmp_path / f"model.ckpt-{HALF}.data-00000-of-00001")
  with open(data, "r+b") as fh:
    fh.truncate(os.path.getsize(data) // 2)
  rerun = _run(tmp_path)
  assert f"checkpoint model.ckpt-{HALF} is corrupt" in rerun.stderr
  assert f"resuming from model.ckpt-{HALF - CKPT_STEPS}" in rerun.stderr
  assert os.path.exists(data + ".corrupt")  # kept, not deleted
  assert _step(tmp_path) == MAX_STEPS
  _assert_same(uninterrupted, _weights(tmp_path))
