"""Multi-worker training over TF_CONFIG, as separate processes on 127.0.0.1.

* 2 and 3 workers (scripts/launch.py, MultiWorkerMirroredStrategy) and weight streaming with
  its MemoryX weight servers as ps tasks of the cluster train to the per-step losses of one
  process with the same global batch and seed;
* a worker stopped mid-run (SIGTERM, which TF's preemption notifier would swallow) exits, the
  chief stops within a bound with one line naming it, and the same commands resume from the
  last checkpoint;
* SIGTERM on the chief saves a checkpoint at its step, which the worker names;
* a task that never joins is named; SIGTERM on the launcher leaves no process behind.

Every process runs in its own process group and is killed in a `finally`; every wait is bounded.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import tensorflow as tf

from cerebras_tf.errors import ConfigError
from cerebras_tf.runtime import launcher, strategies, tf_config
import warm_python
from conftest import group_members

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 8
BATCH = 48  # splits over 1, 2 and 3 workers
# float32 sums in another order (a collective all-reduce instead of one device's sum) differ
# in the last bits; Adam amplifies that a little. A wrong split (each worker on the same
# samples, or a sum instead of a mean) moves step 1 by > 1%.
RTOL = 1e-4
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)


def _run_flags(model_dir, *extra, steps=STEPS, params="configs/params_mlp.yaml"):
  return ["--params", params, "--model_dir", str(model_dir),
          "--max_steps", str(steps), "--params_override", f"train_input.batch_size={BATCH}",
          "--params_override", "runconfig.log_step_count_steps=1",
          "--params_override", "runconfig.op_determinism=true",
          # Clipped once and accumulated once, as on one device. A tf.cond (the accumulation)
          # in the traced model once started TensorFlow before the workers could form.
          "--params_override", "optimizer.optimizer_type=momentum",
          "--params_override", "optimizer.learning_rate=0.1",
          "--params_override", "optimizer.max_gradient_norm=0.05",
          "--params_override", "optimizer.grad_accum_steps=2", *extra]


def _losses(text, prefix=""):
  """Per-step losses from the progress lines (`step 3/24  loss 1.23` -> {2: 1.23})."""
  found = {int(s) - 1: float(l) for s, l in
           re.findall(re.escape(prefix) + r".*?step (\d+)(?:/\d+)?  loss (\S+)", text)}
  assert sorted(found) == list(range(STEPS)), (sorted(found), text[-3000:])
  return np.array([found[s] for s in range(STEPS)])


def _alive(pid):
  try:
    with open(f"/proc/{pid}/stat") as fh:
      return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
  except OSError:
    return False


def _kill_groups(procs):
  for p in procs:
    try:
      os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
      pass
    p.wait()


def _launch(tmp_path, name, *args, timeout=300, cwd=ROOT):
  """scripts/launch.py ARGS, bounded; returns (exit code, output)."""
  proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "scripts", "launch.py"), *args],
                          cwd=cwd, env=ENV,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True)
  try:
    out, _ = proc.communicate(timeout=timeout)
  finally:
    _kill_groups([proc])
  (tmp_path / f"{name}.log").write_text(out)
  return proc.returncode, out


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
  model_dir = tmp_path_factory.mktemp("one")
  proc = warm_python.run([sys.executable, "scripts/run.py",
                         *_run_flags(model_dir, "--execution_strategy", "pipelined")],
                        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return _losses(proc.stdout)


@pytest.mark.slow
# 3 (an odd split); 2 workers train to the same losses in the pipelined params-file test below.
@pytest.mark.parametrize("workers", [3])
def test_workers_train_to_the_losses_of_one_process(tmp_path, one_process, workers):
  # Launched from the user's own directory with a relative model_dir: the tasks ran in the
  # repository and wrote <repo>/m.
  code, out = _launch(tmp_path, f"w{workers}", "--workers", str(workers), "--",
                      *_run_flags("m", "--execution_strategy", "multi_replica",
                                  "--mode", "train_and_eval",
                                  params=os.path.join(ROOT, "configs", "params_mlp.yaml")),
                      cwd=tmp_path)
  assert code == 0, out[-4000:]
  assert re.search(rf"\[chief:0\] .*multi_replica runtime: {workers} replica\(s\) of "
                   rf"{BATCH // workers} samples over {workers} worker\(s\)", out), out[-3000:]
  chief = _losses(out, "[chief:0]")
  np.testing.assert_allclose(chief, one_process, rtol=RTOL)
  for k in range(workers - 1):  # every worker steps with the same (all-reduced) loss
    np.testing.assert_allclose(_losses(out, f"[worker:{k}]"), chief, rtol=1e-6)
  # Only the chief evaluates (each worker's eval events clobbered the chief's in model_dir/eval).
  assert re.search(rf"^\[chief:0\] eval: global_step={STEPS} accuracy=", out, re.M), out[-3000:]
  for k in range(workers - 1):
    assert re.search(rf"^\[worker:{k}\] evaluation: the chief's", out, re.M), out[-3000:]
  assert not re.search(r"^\[worker:\d\] eval(:| done)", out, re.M)
  assert len(os.listdir(tmp_path / "m" / "eval")) == 1
  # Only the chief writes model_dir; the others save into a scratch directory.
  assert os.path.exists(tmp_path / "m" / f"model.ckpt-{STEPS}.index")
  assert not os.path.exists(tmp_path / "m" / "tmp_chief_0")
  assert not os.path.exists(os.path.join(ROOT, "m"))


@pytest.mark.slow
def test_weight_servers_on_other_hosts_train_to_the_losses_of_one_process(tmp_path,
                                                                           one_process):
  code, out = _launch(tmp_path, "ws", "--workers", "1", "--ps", "2", "--",
                      *_run_flags(tmp_path / "m", "--execution_strategy", "weight_streaming",
                                  "--num_wgt_servers", "2"))
  assert code == 0, out[-4000:]
  ps = re.findall(r"\[ps:(\d)\] cerebras_tf task ps:\d serving at grpc://(127\.0\.0\.1:\d+)", out)
  assert sorted(i for i, _ in ps) == ["0", "1"], out[-3000:]
  # The client used the cluster's weight servers, not local ones of its own.
  assert re.search(r"2 weight server\(s\) " + ", ".join(a for _, a in sorted(ps)), out)
  assert not os.path.exists(tmp_path / "m" / "cluster_logs")
  np.testing.assert_allclose(_losses(out, "[chief:0]"), one_process, rtol=RTOL)


def _task_procs(tmp_path, spec, flags, tag, task_flags=None):
  """run.py with `flags` on every task of `spec` (`task_flags`: other flags for some)."""
  procs = {}
  for job, i in launcher.tasks(spec):
    name = f"{job}:{i}"
    env = dict(ENV, TF_CONFIG=launcher.tf_config_for(spec, job, i))
    procs[name] = warm_python.Popen(
        [sys.executable, "scripts/run.py", *(task_flags or {}).get(name, flags)], cwd=ROOT,
        env=env, start_new_session=True,
        stdout=subprocess.DEVNULL, text=True,
        stderr=open(tmp_path / f"{tag}_{job}{i}.err", "w"))  # pylint: disable=consider-using-with
  return procs


def _latest_step(model_dir):
  state = model_dir / "checkpoint"
  if not state.exists():
    return -1
  m = re.search(r'model\.ckpt-(\d+)"', state.read_text().split("\n")[0])
  return int(m.group(1)) if m else -1


def _long_mlp_run(model_dir, save_every: int):
  """Flags of a multi_replica MLP run too long to end by itself, saving every `save_every`."""
  return ["--params", "configs/params_mlp.yaml", "--model_dir", str(model_dir),
          "--execution_strategy", "multi_replica", "--max_steps", "100000",
          "--params_override", f"runconfig.save_checkpoints_steps={save_every}",
          "--params_override", "runconfig.log_step_count_steps=1000"]


def _wait_for_checkpoint(model_dir, procs, after: int, timeout: float = 240):
  """Until the newest checkpoint is past step `after` (or a task ended, or time is up)."""
  deadline = time.monotonic() + timeout
  while _latest_step(model_dir) <= after and time.monotonic() < deadline \
      and all(p.poll() is None for p in procs.values()):
    time.sleep(0.1)


@pytest.mark.slow
def test_worker_stopped_mid_run_stops_the_chief_and_the_rerun_resumes(tmp_path):
  model_dir = tmp_path / "m"
  spec = launcher.local_spec(2)
  flags = _long_mlp_run(model_dir, save_every=50)
  procs = _task_procs(tmp_path, spec, flags, "first")
  try:
    _wait_for_checkpoint(model_dir, procs, after=0)
    assert _latest_step(model_dir) > 0, (tmp_path / "first_chief0.err").read_text()[-3000:]
    # SIGTERM: the coordination service's preemption notifier must not swallow it; the
    # worker stops at the end of its step (exit 143), as Ctrl-C stops it.
    procs["worker:0"].send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    assert procs["worker:0"].wait(timeout=20) == 128 + signal.SIGTERM
    code = procs["chief:0"].wait(timeout=60)
    stopped_after = time.monotonic() - t0
  finally:
    _kill_groups(procs.values())
  err = (tmp_path / "first_chief0.err").read_text()
  lines = [l for l in err.splitlines() if "left the cluster" in l]
  assert code == 3 and len(lines) == 1, err[-3000:]
  assert f"worker:0 ({spec['worker'][0]}) left the cluster" in lines[0]
  assert stopped_after < 30  # peer lost after 5 s of refused connections, probed each second
  step = _latest_step(model_dir)
  assert step > 0 and f"model.ckpt-{step}" in lines[0]
  # The same commands again, to a few steps further: both resume from that checkpoint.
  flags[flags.index("100000")] = str(step + 20)
  procs = _task_procs(tmp_path, spec, flags, "rerun")
  try:
    codes = {n: p.wait(timeout=240) for n, p in procs.items()}
  finally:
    _kill_groups(procs.values())
  # TensorFlow's own log: the chief's in <model_dir>/cerebras_tf.log, each other task's in
  # cerebras_tf.<task>.log beside it.
  for name in ("cerebras_tf.log", "cerebras_tf.worker0.log"):
    text = (model_dir / name).read_text()
    assert re.search(rf"Restoring parameters from .*model\.ckpt-{step}\b", text), text[-3000:]
  assert codes == {"chief:0": 0, "worker:0": 0}
  assert _latest_step(model_dir) == step + 20


@pytest.mark.slow
def test_sigterm_on_the_chief_saves_at_the_step_and_the_worker_names_it(tmp_path):
  """A scheduler stopping the chief (SIGTERM): it finishes its step, saves a checkpoint there
  and names it (exit 143), and the worker stops naming the same checkpoint. Before, the chief
  died at once and the resume point was the last periodic save."""
  model_dir = tmp_path / "m"
  spec = launcher.local_spec(2)
  procs = _task_procs(tmp_path, spec, _long_mlp_run(model_dir, save_every=100000), "term")
  try:
    _wait_for_checkpoint(model_dir, procs, after=-1)
    time.sleep(2)  # some steps past the step-0 checkpoint
    procs["chief:0"].send_signal(signal.SIGTERM)
    codes = {n: p.wait(timeout=60) for n, p in procs.items()}
  finally:
    _kill_groups(procs.values())
  step = _latest_step(model_dir)
  chief = (tmp_path / "term_chief0.err").read_text()
  worker = (tmp_path / "term_worker0.err").read_text()
  assert codes == {"chief:0": 143, "worker:0": 3} and step > 0, (chief[-2000:], worker[-2000:])
  assert f"error: terminated (SIGTERM); the same command resumes from step {step:,}" in chief
  assert f"(latest: model.ckpt-{step})" in worker
  # The rerun with the worker on a model_dir of its own (hosts without a shared filesystem):
  # the chief restored, the worker initialized and waited for initial values the chief never
  # broadcast, and both hung (26 minutes in the trial, until SIGKILL). Now both say why.
  alone = tmp_path / "worker_only"
  procs = _task_procs(tmp_path, spec, _long_mlp_run(model_dir, save_every=100000), "apart",
                      {"worker:0": _long_mlp_run(alone, save_every=100000)})
  try:
    codes = {n: p.wait(timeout=120) for n, p in procs.items()}
  finally:
    _kill_groups(procs.values())
  expected = (f"error: the tasks would resume from different checkpoints (chief:0 from "
              f"model.ckpt-{step} in {model_dir}; worker:0 from no checkpoint in {alone}): every "
              f"host must see the chief's model_dir (a shared filesystem: NFS, or a bucket "
              f"mounted with gcsfuse); put it on shared storage, or copy the chief's model_dir "
              f"to the others, then rerun")
  for task in ("chief0", "worker0"):
    err = (tmp_path / f"apart_{task}.err").read_text()
    assert err.strip().splitlines()[-1] == expected, err[-2000:]
  assert codes == {"chief:0": 2, "worker:0": 2}


def _script_on_every_task(spec, script: str, *args):
  """Runs `python -c script args` as each task of `spec` (its TF_CONFIG set): a user's own
  Python program on every host. Returns each task's (stdout, stderr)."""
  procs = [warm_python.Popen([sys.executable, "-c", script, *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(ENV, TF_CONFIG=launcher.tf_config_for(spec, job, i)),
                            text=True, start_new_session=True)
           for job, i in launcher.tasks(spec)]
  try:
    return [p.communicate(timeout=240) for p in procs]
  finally:
    _kill_groups(procs)


_KERAS_SCRIPT = """\
import sys, numpy as np, tensorflow as tf
from cerebras_tf import CerebrasEstimator, CSConfig, CSRunConfig
from cerebras_tf.runtime import strategies
if sys.argv[2] == "formed":
  strategies.form_cluster()
inp = tf.keras.Input((8,), name="x")
model = tf.keras.Model(inp, tf.keras.layers.Dense(2)(inp))
model.compile(tf.keras.optimizers.legacy.SGD(0.1),
              tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
def input_fn(params):
  x = np.random.RandomState(0).randn(64, 8).astype("float32"); y = (x.sum(1) > 0).astype("int32")
  return tf.data.Dataset.from_tensor_slices(({"x": x}, y)).repeat().batch(params["batch_size"])
est = CerebrasEstimator.from_keras_model(model, params={"batch_size": 16}, config=CSRunConfig(
    model_dir=sys.argv[1], cs_config=CSConfig(execution_strategy="multi_replica")))
est.train(input_fn, max_steps=3, use_cs=True)
print("STEP", est.get_variable_value("global_step"))
est.evaluate(input_fn, steps=1)
"""


@pytest.mark.slow
def test_a_keras_script_on_two_workers_forms_the_cluster_first_or_is_told_to(tmp_path):
  """A Python script that builds its Keras model, then trains on 2 workers: building the model
  started TensorFlow, and MultiWorkerMirroredStrategy raised "Collective ops must be
  configured at program startup" on every task. Now each task says what to call, and the
  script that calls it at its top trains on both, then evaluates, each task into its own
  eval directory."""
  spec = launcher.local_spec(2)
  for how in ("late", "formed"):
    outs = _script_on_every_task(spec, _KERAS_SCRIPT, str(tmp_path / how), how)
    for (job, i), (out, err) in zip(launcher.tasks(spec), outs):
      if how == "late":
        assert f"ConfigError: {job}:{i} ({spec[job][i]}): TensorFlow already started in this " \
               f"process" in err and "strategies.form_cluster() at the top" in err, err[-2000:]
      else:
        assert "STEP 3" in out, err[-3000:]
  # Each task's evaluation has its own events (they shared model_dir/eval, and the events of
  # tasks evaluating in the same second clobbered each other).
  assert sorted(d for d in os.listdir(tmp_path / "formed") if d.startswith("eval")) == [
      "eval", "eval_worker_0"]


_TRAIN_AND_EVALUATE_SCRIPT = """\
import sys, numpy as np, tensorflow as tf
from cerebras_tf import CerebrasEstimator, CSConfig, CSRunConfig
def input_fn(params):
  x = np.random.RandomState(0).randn(64, 8).astype("float32"); y = (x.sum(1) > 0).astype("int32")
  return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(params["batch_size"])
def model_fn(features, labels, mode, params):
  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(
      labels, tf.compat.v1.layers.dense(features, 2))
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=tf.compat.v1.train
      .GradientDescentOptimizer(0.1).minimize(loss, tf.compat.v1.train.get_global_step()))
est = CerebrasEstimator(model_fn, params={"batch_size": 16}, use_cs=True, config=CSRunConfig(
    model_dir=sys.argv[1], cs_config=CSConfig(execution_strategy="multi_replica")))
tf.estimator.train_and_evaluate(est, tf.estimator.TrainSpec(input_fn, max_steps=3),
                                tf.estimator.EvalSpec(input_fn, steps=1))
"""


@pytest.mark.slow
def test_train_and_evaluate_on_two_workers_is_told_the_calls_that_work(tmp_path):
  """tf.estimator.train_and_evaluate with TF_CONFIG starts a server of its own on the task's
  port before it calls train; the strategy's server then could not start, and every task
  said its peer "did not join within 120s" (wrong: both had joined). Now each names the
  port, why it is taken and what to call instead."""
  spec = launcher.local_spec(2)
  outs = _script_on_every_task(spec, _TRAIN_AND_EVALUATE_SCRIPT, str(tmp_path))
  for (job, i), (_, err) in zip(launcher.tasks(spec), outs):
    assert (f"ConfigError: {job}:{i} ({spec[job][i]}): cannot serve this task's address "
            f"{spec[job][i]}: tf.estimator.train_and_evaluate started a server of its own "
            f"there") in err, err[-2000:]
    assert "did not join" not in err


@pytest.mark.slow
def test_task_that_never_joins_is_named(tmp_path):
  spec = launcher.local_spec(2)
  env = dict(ENV, TF_CONFIG=launcher.tf_config_for(spec, "chief", 0),
             CEREBRAS_TF_FORMATION_TIMEOUT_S="5")
  proc = warm_python.Popen([sys.executable, "scripts/run.py",
                           *_run_flags(tmp_path / "m", "--execution_strategy", "multi_replica")],
                          cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, start_new_session=True)
  try:
    _, err = proc.communicate(timeout=120)
  finally:
    _kill_groups([proc])
  # TensorFlow forms the cluster holding the GIL: the watchdog process names the missing task
  # and ends this one with exit code 2 (peers.exit_on_signal).
  assert proc.returncode == 2, err[-3000:]  # our code: a SIGKILL's 137 reads as out-of-memory
  assert re.search(rf"^error: cluster formation: worker:0 \({spec['worker'][0]}\) did not join "
                   r"within 5s \(this task is chief:0", err, re.M), err[-3000:]
  # The watchdog is gone too: it ends right after it signalled the task (the task's exit does not
  # wait for it), so give it a few seconds under a loaded machine.
  deadline = time.monotonic() + 10
  while group_members(proc.pid) and time.monotonic() < deadline:
    time.sleep(0.2)
  assert not group_members(proc.pid)


@pytest.mark.slow
def test_sigterm_on_the_launcher_stops_every_task(tmp_path):
  proc = subprocess.Popen([sys.executable, "scripts/launch.py", "--workers", "2", "--",
                           *_run_flags(tmp_path / "m", "--execution_strategy", "multi_replica",
                                       steps=100000)],
                          cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, start_new_session=True)
  out, pids = "", []
  try:
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
      line = proc.stdout.readline()
      out += line
      pids += [int(p) for p in re.findall(r"pid (\d+)", line) if line.startswith("launch:")]
      if "[worker:0]" in line and re.search(r"step \d+\S*  loss ", line):
        break
    assert len(pids) == 2 and proc.poll() is None, out[-3000:]
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=60)
    out += rest
  finally:
    _kill_groups([proc])
  assert proc.returncode == 143, out[-3000:]
  assert "launch: SIGTERM received; stopping every task" in out
  assert not [p for p in pids if _alive(p)]
  assert not [m for p in pids for m in group_members(p)]


@pytest.mark.parametrize("cluster,task,fragment", [
    ({"worker": ["a:1", "b:1"]}, {"type": "worker", "index": 0}, "and no chief"),
    ({"chief": ["a:1"], "worker": ["b:1"]}, {"type": "worker", "index": 1},
     "task.index 1 must be an int from 0 to 0"),
    ({"chief": ["a:1"], "worker": ["a:1"]}, {"type": "worker", "index": 0},
     "worker:0 and chief:0 have the same address a:1")])
def test_bad_cluster_is_one_line(cluster, task, fragment):
  with pytest.raises(ConfigError, match=re.escape(fragment)) as err:
    tf_config.parse(json.dumps({"cluster": cluster, "task": task}))
  assert "\n" not in str(err.value)


def test_bad_cluster_exits_2_before_tensorflow_starts():
  env = dict(ENV, TF_CONFIG=json.dumps({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
                                        "task": {"type": "worker", "index": 0}}))
  proc = subprocess.run([sys.executable, "scripts/run.py", "--params", "configs/params_mlp.yaml",
                         "--model_dir", "/tmp/unused-cerebras-tf", "--max_steps", "1"],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2
  assert [l for l in proc.stderr.splitlines() if "error" in l.lower()] == [
      "error: TF_CONFIG names 2 worker(s) and no chief: tf.estimator needs one 'chief' task "
      "(it writes checkpoints); make the first worker the chief, e.g. scripts/launch.py "
      "--print_tf_config"]


@pytest.mark.slow
def test_a_pipelined_params_file_trains_on_two_workers(tmp_path, one_process):
  # The shipped configs say execution_strategy: pipelined; launched on 2 workers, the chief
  # failed at its first step: the input pipeline's position was saved by a checkpoint
  # listener, which tf.estimator refuses under a distribution strategy. The position is
  # saved by one-replica runs only; this one trains, as a data-parallel pair, to the losses
  # of one process. (The command after `--` is typed as a user runs it alone.)
  code, out = _launch(tmp_path, "pipelined2", "--workers", "2", "--", "scripts/run.py",
                      *_run_flags(tmp_path / "m", "--execution_strategy", "pipelined"))
  assert code == 0, out[-4000:]
  np.testing.assert_allclose(_losses(out, "[chief:0]"), one_process, rtol=RTOL)
  assert os.path.exists(tmp_path / "m" / f"model.ckpt-{STEPS}.index")


@pytest.mark.parametrize("typed", [
    [], ["scripts/run.py"], ["./run.py"], ["python3", "scripts/run.py"],
    ["/usr/bin/python", "-m", "cerebras_tf"], ["cerebras-run"]])
def test_what_follows_the_double_dash_may_be_the_command_a_user_runs_alone(typed):
  # A hurried user typed the README's `launch.py --workers 2 -- RUN.PY FLAGS` as
  # `-- scripts/run.py --params ...`; each task then got "unexpected argument
  # 'scripts/run.py'" (every task already runs `python -m cerebras_tf`).
  flags = ["--params", "configs/params_mlp.yaml", "--max_steps", "60"]
  assert launcher.run_flags(typed + flags) == flags
  assert launcher.run_flags(["python3", "my_train.py"] + flags) == ["python3", "my_train.py"
                                                                     ] + flags  # left as typed


def test_print_tf_config_gives_every_host_its_task():
  out = subprocess.run([sys.executable, "scripts/launch.py", "--print_tf_config", "h0", "h1:3000",
                        "--ps_hosts", "h2"], cwd=ROOT, env=ENV, capture_output=True, text=True,
                       timeout=60).stdout
  configs = [json.loads(line.split("=", 1)[1].strip("'")) for line in out.splitlines()
             if line.startswith("export TF_CONFIG=")]
  cluster = {"chief": ["h0:2222"], "worker": ["h1:3000"], "ps": ["h2:2222"]}
  assert [c["cluster"] for c in configs] == [cluster] * 3
  assert [c["task"] for c in configs] == [{"type": "chief", "index": 0},
                                          {"type": "worker", "index": 0},
                                          {"type": "ps", "index": 0}]
  for c in configs:  # what each host would be given parses as that task
    parsed = tf_config.parse(json.dumps(c))
    assert parsed.num_workers == 2 and parsed.ps == ["h2:2222"]


def test_each_worker_takes_every_nth_batch():
  ds = tf.data.Dataset.range(12).batch(2)
  ctx = lambda k: tf.distribute.InputContext(3, k, 1)  # noqa: E731
  got = [[b.numpy().tolist() for b in strategies.shard_for_input_pipeline(ds, ctx(k)).take(2)]
         for k in range(3)]
  # step 1 of 3 workers sees batches 0, 1, 2: samples 0..5, the first global batch of 6.
  assert got == [[[0, 1], [6, 7]], [[2, 3], [8, 9]], [[4, 5], [10, 11]]]
  assert strategies.shard_for_input_pipeline(ds, None) is ds


@pytest.mark.parametrize("ended", [False, True])
def test_peer_watch_stands_down_when_the_training_loop_ends(ended, monkeypatch, tmp_path):
  # A peer unreachable for lost_after_s ends this task mid-run; after this task's last step
  # (the hook's end()), a peer that has finished and left is not an error (3-worker runs).
  from cerebras_tf.runtime import multiworker, peers  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(peers, "reachable", lambda address: False)
  cluster = tf_config.parse(json.dumps({
      "cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "127.0.0.1:3"]},
      "task": {"type": "worker", "index": 0}}))
  exits = []
  watch = multiworker.PeerWatch(cluster, str(tmp_path), lost_after_s=1.0,
                                exit_fn=exits.append)
  if ended:
    watch.hook().end(session=None)
  watch.start()
  time.sleep(3.5)
  watch.stop()
  assert exits == ([] if ended else [multiworker.EXIT_PEER_LOST])


def test_a_port_already_taken_is_our_line_alone(tmp_path):
  """Something else listens on the chief's port: stderr was 1.5 kB of gRPC's JSON error text,
  then our line. The port is now tried before gRPC starts: only the line, exit code 2."""
  with socket.socket() as held:
    held.bind(("127.0.0.1", 0))
    held.listen()
    spec = {"chief": [f"127.0.0.1:{held.getsockname()[1]}"],
            "worker": launcher.local_spec(1)["chief"]}
    env = dict(ENV, TF_CONFIG=json.dumps({"cluster": spec, "task": {"type": "chief",
                                                                     "index": 0}}))
    proc = warm_python.run([sys.executable, "scripts/run.py",
                           *_run_flags(tmp_path / "m", "--execution_strategy", "multi_replica")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert proc.stderr.splitlines() == [
      f"error: chief:0 ({spec['chief'][0]}): cannot serve this task's address "
      f"{spec['chief'][0]}: another process on this host, or a server this process already "
      f"started, holds it; free it or give this task another port in TF_CONFIG"], proc.stderr
