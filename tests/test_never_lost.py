"""Never lost work (issue 12): changed models, NaN checkpoints, damaged state files, full disks.

Runs go through `cerebras_tf.cli.main` (the code behind scripts/run.py) on the MLP config,
in-process, a few steps each. The error messages themselves are asserted in
docs/bad_inputs.md's catalogue; here the files on disk are.
"""

import glob
import hashlib
import os
import re
import signal
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest
import tensorflow as tf
from conftest import as_from_a_shell

from cerebras_tf import cli
from cerebras_tf.runtime import checkpoints
import warm_python

MLP = "configs/params_mlp.yaml"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def _at_root(monkeypatch):
  monkeypatch.chdir(ROOT)
  monkeypatch.delenv("TF_CONFIG", raising=False)


def run(model_dir, *flags):
  return cli.main(["run.py", "--params", MLP, "--model_dir", str(model_dir), *flags])


def snapshot(model_dir):
  """{file: (sha256, mtime_ns)} of everything but our own log and lock."""
  out = {}
  for path in sorted(glob.glob(os.path.join(model_dir, "**"), recursive=True)):
    name = os.path.relpath(path, model_dir)
    if os.path.isfile(path) and name not in ("cerebras_tf.log", ".cerebras_tf.lock"):
      with open(path, "rb") as fh:
        out[name] = (hashlib.sha256(fh.read()).hexdigest(), os.stat(path).st_mtime_ns)
  return out


def latest_step(model_dir):
  return int(tf.train.latest_checkpoint(str(model_dir)).rsplit("-", 1)[1])


def finite(prefix):
  reader = tf.train.load_checkpoint(prefix)
  return all(np.all(np.isfinite(reader.get_tensor(n)))
             for n, d in reader.get_variable_to_dtype_map().items() if d.is_floating)


def test_changed_model_is_refused_and_touches_no_file(tmp_path, capsys):
  model_dir = tmp_path / "m"
  assert run(model_dir, "--max_steps", "4", "--params_override",
             "runconfig.save_checkpoints_steps=2") == 0
  before = snapshot(model_dir)
  capsys.readouterr()
  assert run(model_dir, "--max_steps", "8", "--params_override", "model.hidden_sizes=[32]") == 2
  err = capsys.readouterr().err
  assert "does not match this model" in err and "is [128] there and [32] in this model" in err, err
  # The old run's files are all there, byte for byte, never rewritten (the bug rewrote .meta).
  assert snapshot(model_dir) == before
  # The unchanged model still resumes.
  assert run(model_dir, "--max_steps", "6") == 0 and latest_step(model_dir) == 6


def test_nan_checkpoint_never_becomes_the_latest(tmp_path, capsys):
  model_dir = tmp_path / "m"
  assert run(model_dir, "--max_steps", "20", "--params_override",
             "optimizer.learning_rate=1e30", "--params_override",
             "runconfig.save_checkpoints_steps=1") == 2
  err = capsys.readouterr().err
  kept = tf.train.latest_checkpoint(str(model_dir))
  assert kept is not None and finite(kept)
  assert f"the latest checkpoint is now {os.path.basename(kept)}, the last one before" in err
  # The loss of step 2 was NaN: it was computed on the weights saved as step 1 (finite but
  # about 1e30: a rerun from them diverges again), so step 1 and every later one are moved.
  moved = sorted(glob.glob(str(model_dir / "nonfinite" / "model.ckpt-*.index")))
  assert [os.path.basename(p) for p in moved][:1] == ["model.ckpt-1.index"], moved
  assert os.path.basename(kept) == "model.ckpt-0"
  # Rerun with a sane rate: resumes from the finite checkpoint and trains to the end.
  assert run(model_dir, "--max_steps", "10") == 0
  assert latest_step(model_dir) == 10 and finite(tf.train.latest_checkpoint(str(model_dir)))


@pytest.mark.parametrize("no_cs", [False, True], ids=["use_cs", "no_cs"])
def test_zero_byte_checkpoint_state_is_rebuilt(tmp_path, capsys, no_cs):
  model_dir = tmp_path / "m"
  flags = ["--no_cs"] if no_cs else []
  assert run(model_dir, "--max_steps", "4", "--params_override",
             "runconfig.save_checkpoints_steps=2", *flags) == 0
  open(model_dir / "checkpoint", "w").close()  # e.g. a crash while the state was written
  capsys.readouterr()
  assert run(model_dir, "--max_steps", "6", *flags) == 0
  out = capsys.readouterr()
  assert "renamed it checkpoint.corrupt and resuming from model.ckpt-4" in out.err, out
  assert (model_dir / "checkpoint.corrupt").exists() and latest_step(model_dir) == 6
  with open(model_dir / "cerebras_tf.log") as fh:
    assert "Restoring parameters from" in fh.read()


def test_truncated_checkpoint_is_recovered_without_the_engine(tmp_path, capsys):
  model_dir = tmp_path / "m"
  assert run(model_dir, "--no_cs", "--max_steps", "4", "--params_override",
             "runconfig.save_checkpoints_steps=2") == 0
  data = glob.glob(str(model_dir / "model.ckpt-4.data-*"))[0]
  with open(data, "r+b") as fh:
    fh.truncate(os.path.getsize(data) // 2)
  capsys.readouterr()
  assert run(model_dir, "--no_cs", "--max_steps", "6") == 0
  assert "resuming from model.ckpt-2" in capsys.readouterr().err
  assert latest_step(model_dir) == 6 and glob.glob(str(model_dir / "*.corrupt"))


def test_progress_counts_to_the_runs_own_max_steps(tmp_path, capsys):
  """train_and_eval trains in rounds (to each checkpoint); progress and ETA count to the end
  of the run, not of the round (the demo printed step 50/2500 while running to 5,000)."""
  assert run(tmp_path / "m", "--mode", "train_and_eval", "--max_steps", "12", "--eval_steps",
             "2", "--params_override", "runconfig.save_checkpoints_steps=6",
             "--params_override", "runconfig.log_step_count_steps=3") == 0
  out = capsys.readouterr().out
  steps = [line.split()[1] for line in out.splitlines() if line.startswith("step ")]
  assert steps and all(s.endswith("/12") for s in steps), out
  assert "loss = " not in out  # tf.estimator's own line is off when ours is on


def _tmpfs(path, size):
  path.mkdir()
  proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                        capture_output=True, text=True, check=False)
  if proc.returncode:
    pytest.skip(f"cannot mount a small tmpfs here (needs root): {proc.stderr.strip()}")


def test_a_really_full_disk_stops_cleanly_and_resumes(tmp_path, capsys):
  """A real ENOSPC: a 10 MB tmpfs fills during the first checkpoints (the MLP's graph, with
  its synthetic data as constants, is about 1.5 MB per .meta file)."""
  disk = tmp_path / f"disk{uuid.uuid4().hex[:6]}"
  _tmpfs(disk, "10m")
  try:
    model_dir = disk / "m"
    assert run(model_dir, "--max_steps", "400", "--params_override",
               "runconfig.save_checkpoints_steps=5", "--params_override",
               "runconfig.keep_checkpoint_max=0") == 2
    err = capsys.readouterr().err
    assert "disk full while writing" in err and "rerun the same command to resume" in err, err
    assert not [n for n in os.listdir(model_dir) if ".tmp" in n or n.endswith("_temp")]
    step = latest_step(model_dir)
    subprocess.run(["mount", "-o", "remount,size=80m", str(disk)], check=True)
    assert run(model_dir, "--max_steps", str(step + 5), "--params_override",
               "runconfig.save_checkpoints_steps=5") == 0
    assert latest_step(model_dir) == step + 5
  finally:
    subprocess.run(["umount", "-l", str(disk)], check=False)  # lazy: the event writers hold files


def _fill(disk):
  """Writes zeros until the disk refuses. Unbuffered: a buffered file keeps what a failed
  flush did not write and raises ENOSPC again when closed (seen with 26,472,448 bytes free,
  once the input pipeline's checkpoints stopped writing a .meta file)."""
  with open(disk / "filler", "wb", buffering=0) as fh:
    try:
      while fh.write(b"\0" * (1 << 16)):
        pass
    except OSError:
      pass


def test_every_mode_on_a_full_disk_is_one_line(tmp_path, capsys):
  """Only the training step knew a full disk: a train call on a full disk printed logging
  tracebacks for every log line and then the model_dir lock's ENOSPC; eval printed
  TensorFlow's event-writer thread traceback; predict lost its predictions to a traceback.
  Each is now the one error line, and a predict leaves no partial file."""
  disk = tmp_path / f"disk{uuid.uuid4().hex[:6]}"
  _tmpfs(disk, "40m")
  try:
    model_dir = disk / "m"
    assert run(model_dir, "--max_steps", "4") == 0
    _fill(disk)
    capsys.readouterr()
    for flags in (["--max_steps", "8"], ["--mode", "eval"], ["--mode", "predict"]):
      assert run(model_dir, *flags) == 2, flags
      err = capsys.readouterr().err
      assert err.startswith("error: disk full while writing ") and err.count("\n") == 1, err
      assert "rerun the same command" in err
    assert latest_step(model_dir) == 4
    assert not glob.glob(str(model_dir / "predictions" / "*"))
    os.remove(disk / "filler")
    assert run(model_dir, "--mode", "predict") == 0
    assert [os.path.basename(p) for p in glob.glob(str(model_dir / "predictions" / "*"))] == \
        ["predictions-4.jsonl"]
  finally:
    subprocess.run(["umount", "-l", str(disk)], check=False)  # lazy: the event writers hold files


def test_warm_start_reuses_what_matches_in_a_new_model_dir(tmp_path, capsys):
  """What the changed-model error suggests: a new model_dir with --warm_start <old>."""
  old = tmp_path / "old"
  assert run(old, "--max_steps", "4") == 0
  capsys.readouterr()
  new = tmp_path / "new"
  assert run(new, "--max_steps", "4", "--warm_start", str(old),
             "--params_override", "model.hidden_sizes=[128,32]") == 0
  # dense_0 (32x128 kernel, bias) and logits/bias [4] match by name and shape; dense_1 and
  # logits/kernel do not.
  out = capsys.readouterr().out
  assert "warm start from" in out and "(3 of 6 trainable)" in out, out
  assert latest_step(new) == 4


def _fake_checkpoints(model_dir, model_steps, input_steps):
  """model.ckpt-N for each model step and input.ckpt-N (with its `checkpoint_input` state
  file, as CheckpointInputPipelineHook writes them) for each input step."""
  with tf.Graph().as_default():
    tf.compat.v1.train.get_or_create_global_step()
    tf.compat.v1.get_variable("w", [2])
    saver = tf.compat.v1.train.Saver(max_to_keep=None)
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      for step in model_steps:
        saver.save(sess, str(model_dir / "model.ckpt"), global_step=step)
      for step in input_steps:
        saver.save(sess, str(model_dir / "input.ckpt"), global_step=step,
                   latest_filename=checkpoints.INPUT_STATE)


def test_torn_model_and_input_pair_resumes_from_the_step_with_both(tmp_path):
  _fake_checkpoints(tmp_path, [10, 20], [10])  # killed between the model's and input's save 20
  chosen = checkpoints.align_input_state(str(tmp_path), log=lambda _: None)
  assert checkpoints.step_of(chosen) == 10 and latest_step(tmp_path) == 10
  assert (tmp_path / "model.ckpt-20.index").exists()  # not deleted


def test_a_run_without_input_state_retires_it_instead_of_being_rolled_back(tmp_path):
  _fake_checkpoints(tmp_path, [10, 20], [10])
  # A weight-streaming run (no input positions) starts, then writes model.ckpt-40: the step-10
  # input state is retired, so the next pipelined run resumes the model at 40, not at 10.
  assert checkpoints.retire_input_state(str(tmp_path), log=lambda _: None)
  assert not checkpoints.retire_input_state(str(tmp_path), log=lambda _: None)  # once
  _fake_checkpoints(tmp_path, [40], [])
  assert (tmp_path / "checkpoint_input.retired").exists()
  assert not (tmp_path / "checkpoint_input").exists() and (tmp_path / "input.ckpt-10.index").exists()
  assert checkpoints.step_of(checkpoints.align_input_state(str(tmp_path))) == 40
  assert latest_step(tmp_path) == 40


def test_switching_pipelined_to_weight_streaming_keeps_every_runs_steps(tmp_path, capsys):
  """pipelined (saves input positions) -> weight_streaming -> weight_streaming -> pipelined on
  one model_dir: each run resumes where the previous one stopped (the bug: every run after
  the first restarted from the pipelined run's last input position, step 4)."""
  model_dir = tmp_path / "m"
  every = ["--params_override", "runconfig.save_checkpoints_steps=2"]
  assert run(model_dir, "--max_steps", "4", *every) == 0
  assert (model_dir / "checkpoint_input").exists()
  for last in (8, 12):
    capsys.readouterr()
    assert run(model_dir, "--max_steps", str(last), "--execution_strategy", "weight_streaming",
               *every) == 0
    err = capsys.readouterr().err
    assert "resuming both from step" not in err, err
    assert latest_step(model_dir) == last
  assert (model_dir / "checkpoint_input.retired").exists()
  capsys.readouterr()
  assert run(model_dir, "--max_steps", "14", *every) == 0
  with open(model_dir / "cerebras_tf.log") as fh:
    log = fh.read()
  assert "model.ckpt-12" in log.rsplit("Restoring parameters from", 1)[1].splitlines()[0]
  assert latest_step(model_dir) == 14 and (model_dir / "checkpoint_input").exists()


def test_a_changed_batch_starts_the_input_afresh_and_keeps_the_model(tmp_path, capsys):
  """Batch 64, then 32 on the same model_dir (pipelined saves the input's position): the
  restored iterator held 64-sample batches and the first step failed with TF's "Incompatible
  shapes at component 0: expected [32,...] but got [64,...]". The input now starts afresh,
  the model resumes from its latest checkpoint (not rolled back), and a third run with the
  same batch resumes the input's position again."""
  model_dir = tmp_path / "m"
  every = ["--params_override", "runconfig.save_checkpoints_steps=2"]
  assert run(model_dir, "--max_steps", "4", *every) == 0
  capsys.readouterr()
  small = ["--params_override", "train_input.batch_size=32"]
  assert run(model_dir, "--max_steps", "8", *every, *small) == 0
  err = capsys.readouterr().err
  assert re.search(r"the input changed since its position was saved \(features/x: "
                   r"float32\[64, \d+\]; labels: \w+\[64\] -> features/x: float32\[32, \d+\]; "
                   r"labels: \w+\[32\]\); the input starts from its beginning", err), err
  with open(model_dir / "cerebras_tf.log") as fh:
    assert "model.ckpt-4" in fh.read().rsplit("Restoring parameters from", 1)[1].splitlines()[0]
  assert latest_step(model_dir) == 8
  assert run(model_dir, "--max_steps", "10", *every, *small) == 0
  assert "the input changed" not in capsys.readouterr().err
  assert (model_dir / "checkpoint_input").exists() and latest_step(model_dir) == 10


@pytest.mark.slow
@pytest.mark.parametrize("signum, code, said", [
    (signal.SIGINT, 130, "interrupted"),
    # A scheduler's (or kill's) polite stop: its default action ended the run at once, with
    # exit -15, no word and no checkpoint at the step; now it stops as Ctrl-C does.
    (signal.SIGTERM, 143, "terminated (SIGTERM)")], ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_says_where_the_run_stands_and_the_same_command_resumes(tmp_path, signum, code,
                                                                         said):
  """Ctrl-C (SIGINT) or SIGTERM in a training run: one line on stderr naming the newest
  checkpoint, exit 130 (143); the same command then resumes from that step."""
  model_dir = str(tmp_path / "m")
  cmd = [sys.executable, os.path.join(ROOT, "scripts", "run.py"), "--params",
         os.path.join(ROOT, "configs", "params_mlp.yaml"), "--max_steps", "1000000",
         "--model_dir", model_dir]
  # As a user's shell has it: no TF_CPP_MIN_LOG_LEVEL (conftest sets one), no TF_CONFIG.
  env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "TF_CONFIG")}
  proc = warm_python.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=env, preexec_fn=as_from_a_shell)
  try:
    deadline = time.time() + 120
    while not glob.glob(os.path.join(model_dir, "model.ckpt-*.index")) and time.time() < deadline:
      time.sleep(0.5)
    time.sleep(1.0)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
  finally:
    proc.kill()  # a run that ignored the signal would otherwise train on for 30 minutes
  steps = sorted(int(p.rsplit("-", 1)[1].split(".")[0])
                 for p in glob.glob(os.path.join(model_dir, "model.ckpt-*.index")))
  assert proc.returncode == code and steps, err
  # One error line and no traceback. (The run's own measured warnings may come first: on a
  # loaded host the input-rate line joined stderr and an exact one-line check failed.)
  assert "Traceback" not in err, err
  (line,) = [l for l in err.strip().splitlines() if l.startswith("error:")] or [err]
  # Ctrl-C stops at the end of the step it fell in and saves the model and the input
  # position there: the run resumes from that newest checkpoint, nothing redone. (Before,
  # the KeyboardInterrupt skipped the final save, and in 3 of 4 parallel runs fell between
  # the model's save and the input's, rolling the resume one save further back.)
  resume = int(line.split("resumes from step ")[1].split(" ")[0].replace(",", ""))
  assert resume == steps[-1], (line, steps)
  assert os.path.exists(os.path.join(model_dir, f"input.ckpt-{resume}.index"))
  assert line == (f"error: {said}; the same command resumes from step {resume:,} "
                  f"(checkpoints in {model_dir})")
  again = warm_python.run(cmd[:-4] + ["--max_steps", str(resume + 5), "--model_dir", model_dir],
                          capture_output=True, text=True, timeout=180, env=env)
  assert again.returncode == 0, again.stderr
  assert f"step {resume + 1}/{resume + 5}" in again.stdout


def test_resume_step_reads_what_the_state_files_say(tmp_path):
  """ckpt_files.resume_step (TF-free: what Ctrl-C reports) agrees with align_input_state: a
  checkpoint whose save was cut off before its state file named it does not count, and a
  torn model/input pair resumes from the newest step that has both."""
  from cerebras_tf.runtime import ckpt_files  # pylint: disable=import-outside-toplevel
  d = str(tmp_path)
  for step in (200, 400, 600):
    for prefix in ("model.ckpt", "input.ckpt"):
      open(os.path.join(d, f"{prefix}-{step}.index"), "w").close()
  state = lambda name, step: open(os.path.join(d, name), "w").write(
      f'model_checkpoint_path: "{name == "checkpoint" and "model" or "input"}.ckpt-{step}"\n')
  state("checkpoint", 600)
  assert ckpt_files.resume_step(d) == 600          # no input state: the model's newest
  state("checkpoint_input", 400)                    # input.ckpt-600 written, never named
  assert ckpt_files.resume_step(d) == 400
  state("checkpoint_input", 600)
  state("checkpoint", 400)                          # model.ckpt-600 cut off the same way
  assert ckpt_files.resume_step(d) == 400
  assert ckpt_files.paired_step([200, 400], [100]) == 400  # no common step: the model's
  assert ckpt_files.resume_step(str(tmp_path / "none")) is None


@pytest.mark.parametrize("name,cli", [("SIGINT", False), ("SIGTERM", False),
                                      ("SIGTERM", True)])
def test_graceful_interrupt_first_stops_at_the_step_second_at_once(name, cli):
  """cli: under scripts/run.py, whose SIGTERM handler (errors.raise_terminated) stops a compile
  or a predict with a line; training takes it over and gives it back."""
  import signal as sig  # pylint: disable=import-outside-toplevel
  from cerebras_tf.errors import Terminated, raise_terminated  # pylint: disable=import-outside-toplevel
  from cerebras_tf.runtime.hooks import GracefulInterrupt  # pylint: disable=import-outside-toplevel

  class Ctx:
    stopped = False

    def request_stop(self):
      self.stopped = True
  signum = getattr(sig, name)
  defaults = GracefulInterrupt._DEFAULTS[signum]  # pylint: disable=protected-access
  inherited = sig.getsignal(signum)
  if inherited == sig.SIG_IGN:
    # A background job's (`python3 dev.py test &` in a shell without job control): set the
    # terminal's default for this test, so that it runs however the suite was started.
    sig.signal(signum, defaults[0])
  try:
    if sig.getsignal(signum) not in defaults:
      pytest.skip(f"{name} has a handler of this process's own, which GracefulInterrupt keeps")
    previous = sig.signal(signum, raise_terminated) if cli else None
    before = sig.getsignal(signum)
    stop = Terminated if name == "SIGTERM" else KeyboardInterrupt
    with pytest.raises(stop, match="checkpoint saved"):
      with GracefulInterrupt() as gi:
        assert sig.getsignal(signum) == gi._on_signal  # pylint: disable=protected-access
        ctx = Ctx()
        gi.hook.after_run(ctx, None)
        assert not ctx.stopped                    # no signal yet: training goes on
        sig.raise_signal(signum)                  # the first one only asks
        gi.hook.after_run(ctx, None)
        assert ctx.stopped
        with pytest.raises(stop):                 # the second one stops at once
          sig.raise_signal(signum)
    assert sig.getsignal(signum) == before
    if cli:
      sig.signal(signum, previous)
  finally:
    if inherited == sig.SIG_IGN:
      sig.signal(signum, inherited)


_STUCK_STEP = """
import sys, tensorflow as tf
from cerebras_tf.runtime.hooks import GracefulInterrupt
tf.compat.v1.disable_eager_execution()
step = tf.compat.v1.FIFOQueue(1, tf.float32).dequeue()  # nothing ever feeds it
with tf.compat.v1.Session() as sess, GracefulInterrupt(sys.argv[1], float(sys.argv[2])):
  print("stuck", flush=True)
  sess.run(step)
"""


@pytest.mark.slow
def test_a_step_stuck_in_tensorflow_still_stops_on_ctrl_c_and_sigterm(tmp_path):
  """A multi-worker chief whose peer was SIGSTOPped waits in the all-reduce forever; Python
  runs no signal handler while the main thread is inside TensorFlow, so Ctrl-C (any number of
  times), SIGTERM and `timeout` did nothing (the trial ran 26 minutes under `timeout 300`).
  Here the stuck step is a dequeue nothing feeds. A second Ctrl-C the main thread cannot take
  stops the process within about 2 s; a single SIGTERM does once the step has not finished
  within the grace period (CEREBRAS_TF_STOP_GRACE_S, 60 s by default; 3 s here)."""
  model_dir = tmp_path / "m"
  model_dir.mkdir()
  for name in ("model.ckpt-40.index", "checkpoint"):
    (model_dir / name).write_text('model_checkpoint_path: "model.ckpt-40"\n')
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  for signals, grace, code, said in (
      ([signal.SIGINT, signal.SIGINT], 600, 130, "Ctrl-C again, and the step in progress has "
       "not returned (a peer or weight server that stopped answering?): stopped at once, "
       "without a checkpoint at this step"),
      ([signal.SIGTERM], 3, 143, "SIGTERM 3s ago, and the step in progress has not finished "
       "(a peer or weight server that stopped answering?): stopped without it")):
    proc = warm_python.Popen([sys.executable, "-c", _STUCK_STEP, str(model_dir), str(grace)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                             preexec_fn=as_from_a_shell)
    assert proc.stdout.readline() == "stuck\n"
    time.sleep(0.5)
    t0 = time.monotonic()
    for signum in signals:
      proc.send_signal(signum)
      time.sleep(0.2)
    try:
      _, err = proc.communicate(timeout=30)
    finally:
      proc.kill()
    assert proc.returncode == code and time.monotonic() - t0 < 10, err
    assert err.strip().splitlines()[-1] == (f"error: {said}; the same command resumes from step "
                                            f"40 (checkpoints in {model_dir})")


def test_optimizer_state_is_told_apart_from_the_models_own_variables():
  """A resume refused for missing optimizer slots (another optimizer_type or grad_accum_steps)
  says the weights all match (row ckpt_changed_optimizer); a missing model variable, even a
  non-trainable one such as a batch-norm moving mean, is a changed model."""
  trainable = {"dense/kernel", "dense/bias"}
  for name in ("dense/kernel/Momentum", "dense/bias/Adam_1", "grad_accum/dense/kernel",
               "training/Adam/dense/kernel/m", "beta1_power", "training/Adam/iter"):
    assert checkpoints._optimizer_state(name, trainable), name  # pylint: disable=protected-access
  for name in ("dense/kernel", "bn/moving_mean", "dense_1/kernel/Momentum", "dense/kernel_1"):
    assert not checkpoints._optimizer_state(name, trainable), name  # pylint: disable=protected-access
