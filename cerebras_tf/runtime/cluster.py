"""The weight-streaming cluster: MemoryX weight servers as TensorFlow `ps` tasks.

With no TF_CONFIG, `LocalCluster` launches `num_ps` ps tasks on 127.0.0.1 (free ports, one log
file per task, a readiness timeout that names the task that did not come up) and ends them on
exit, error or Ctrl-C; each task also exits by itself if this process dies, so no orphan is
left. With TF_CONFIG, the `ps` addresses it names are used as they are (a real cluster).

The client (this process) serves the job `localhost`: the compute replicas (one per CS system)
are its devices, the input pipeline runs here, and the graph's variables and optimizer live on
the ps tasks, so updates are synchronous and match the other execution strategies.
"""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional, Set, Tuple

from cerebras_tf.errors import ConfigError, TrainingError
from cerebras_tf.runtime import tf_config
from cerebras_tf.runtime.ckpt_files import list_checkpoints

CLIENT_JOB = "localhost"
# The directory this package is imported from (a checkout or site-packages).
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
READY_TIMEOUT_S = 60.0
MAX_RESTARTS = 3
# How long the client waits for a (restarted) weight server before it gives up cleanly.
SESSION_TIMEOUT_S = 120
# A training step that has not finished after this long (or 20x the longest step so far) is
# stalled: measured once in 158,000 steps of a local weight-streaming run, TensorFlow's client
# rejected a retried RunGraph ("The same RunGraph request was received twice") and waited on
# the weight server forever, both processes idle. CEREBRAS_TF_STALL_TIMEOUT_S overrides it.
STALL_TIMEOUT_S = 600.0
STALL_FACTOR = 20.0
# ... and the processes are idle: in the hang both sat at 0% CPU, while a long checkpoint
# save or an evaluation run inside the step's hooks (train_and_evaluate) keeps them busy.
IDLE_WINDOW_S = float(os.environ.get("CEREBRAS_TF_STALL_IDLE_WINDOW_S", 30.0))
IDLE_CPU_FRACTION = 0.01


def _cpu_seconds(pids: List[int]) -> Optional[float]:
  """User + system CPU seconds the processes have used (Linux /proc); None elsewhere."""
  total = 0.0
  for pid in pids:
    try:
      with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
      return None
    total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
  return total


def free_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _port_open(address: str) -> bool:
  host, port = address.rsplit(":", 1)
  try:
    with socket.create_connection((host, int(port)), timeout=0.5):
      return True
  except OSError:
    return False


def ps_addresses_from_tf_config() -> Optional[List[str]]:
  """The `ps` addresses TF_CONFIG names, None without TF_CONFIG."""
  cluster = tf_config.current()
  if cluster is None:
    return None
  if not cluster.ps:
    raise ConfigError("TF_CONFIG for weight_streaming must name the weight servers in "
                      'cluster.ps, e.g. {"cluster": {"ps": ["host:port"], "chief": '
                      '["host:port"]}, "task": {"type": "chief", "index": 0}}')
  return cluster.ps


class _PortTaken(Exception):
  pass


class LocalCluster:
  """Launches and owns `num_ps` ps tasks on 127.0.0.1. Use as a context manager.

  Attributes (after __enter__):
    cluster: {"localhost": [client address], "ps": [...]} for tf.train.ClusterSpec.
    procs: the ps task processes.
  """

  def __init__(self, num_ps: int, log_dir: str, ready_timeout_s: float = READY_TIMEOUT_S,
               ps_addresses: Optional[List[str]] = None, client_job: str = CLIENT_JOB,
               client_address: Optional[str] = None):
    self.num_ps = num_ps
    self.log_dir = log_dir
    self.ready_timeout_s = ready_timeout_s
    self.external = ps_addresses is not None
    self.client_job = client_job
    # With TF_CONFIG the client is its own task (the ps tasks know it by that address).
    self.cluster: Dict[str, List[str]] = {
        client_job: [client_address or f"127.0.0.1:{free_port()}"],
        "ps": list(ps_addresses) if ps_addresses else
              [f"127.0.0.1:{free_port()}" for _ in range(num_ps)]}
    self.procs: List[subprocess.Popen] = []
    # Weight servers run the restore ops of the client's graph (warm starts, a model_fn's own
    # init_from_checkpoint): relative paths in it must mean what they mean to the client.
    self._cwd = os.getcwd()
    self._logs = []
    self._log_paths: Dict[int, str] = {}  # the file each ps task's latest start logs to
    self._closing = threading.Event()
    self.restarts = 0
    self.failed: Optional[str] = None
    self._training_dir: Optional[str] = None  # the model_dir of the training call under way
    self._step_started: Optional[float] = None  # monotonic time the running step began
    self._longest_step = 0.0
    self.stalls = 0
    # ps tasks killed on purpose (a stall, a new working directory): restarted, not counted
    # as crashes.
    self._killed_on_purpose: Set[int] = set()

  def __enter__(self) -> "LocalCluster":
    for attempt in range(3):
      try:
        if not self.external:
          self._launch()
        self._wait_ready()
        return self
      except _PortTaken as e:
        self.close()
        if attempt == 2:
          raise ConfigError(str(e)) from None
        # Another process took a port between our probe and the server's bind: new ports.
        self.cluster["ps"] = [f"127.0.0.1:{free_port()}" for _ in range(self.num_ps)]
        self.procs, self._closing = [], threading.Event()
      except BaseException:
        self.close()
        raise
    raise AssertionError("unreachable")

  def __exit__(self, *exc) -> None:
    self.close()

  def _launch(self) -> None:
    for i in range(self.num_ps):
      self.procs.append(self._start(i))
    self._watchdog = threading.Thread(target=self._watch, daemon=True)
    self._watchdog.start()

  def log_path(self, i: int) -> str:
    """Where ps task `i` logs: under the log_dir of the training call that last started it."""
    return self._log_paths.get(i, os.path.join(self.log_dir, f"ps_{i}.log"))

  def _start(self, i: int) -> subprocess.Popen:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    # In the client's directory, importing this package from where the client did (-P: not
    # whatever the user's directory holds).
    env["PYTHONPATH"] = os.pathsep.join([_PACKAGE_ROOT] + [p for p in [env.get("PYTHONPATH")] if p])
    # The current call's log_dir (client_for moves it to each call's model_dir), made again if
    # gone: a notebook that deleted the first run's model_dir still restarts its servers.
    os.makedirs(self.log_dir, exist_ok=True)
    self._log_paths[i] = os.path.join(self.log_dir, f"ps_{i}.log")
    log = open(self._log_paths[i], "a")
    self._logs.append(log)
    return subprocess.Popen(
        [sys.executable, "-P", "-m", "cerebras_tf.runtime.server", "--cluster",
         json.dumps(self.cluster), "--job", "ps", "--index", str(i), "--parent", str(os.getpid())],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=self._cwd)

  def _watch(self) -> None:
    """Restarts a weight server that died, on the same port, up to MAX_RESTARTS times.

    The client's session then fails with Unavailable/Aborted, which tf's MonitoredSession
    recovers from by recreating the session: the variables come back from the last checkpoint.
    """
    while not self._closing.wait(0.5):
      for i, p in enumerate(self.procs):
        if p.poll() is None or self._closing.is_set():
          continue
        if i in self._killed_on_purpose:
          self._killed_on_purpose.discard(i)
          self.procs[i] = self._start(i)
          continue
        if self.restarts >= MAX_RESTARTS:
          if self.failed is None:
            self.failed = (f"weight server ps:{i} died {self.restarts + 1} times (last exit "
                           f"code {p.returncode}); see {self.log_path(i)}")
            timer = threading.Timer(SESSION_TIMEOUT_S, self._abandon)
            timer.daemon = True
            timer.start()
          continue
        self.restarts += 1
        print(f"cerebras_tf: weight server ps:{i} exited with code {p.returncode}; restarting it "
              f"({self.restarts}/{MAX_RESTARTS}); training resumes from the last checkpoint",
              file=sys.stderr, flush=True)
        self.procs[i] = self._start(i)

  def follow_cwd(self) -> None:
    """Between training calls: a process that changed directory (a notebook's os.chdir, a
    test suite) gets its local weight servers restarted there, so relative paths in the next
    graph mean what they mean to the client. They hold no state between calls: the next
    session restores the variables from the checkpoint, as always."""
    cwd = os.getcwd()
    if self.external or cwd == self._cwd:
      return
    self._cwd = cwd
    old = list(self.procs)
    for i, p in enumerate(old):
      self._killed_on_purpose.add(i)
      try:
        os.killpg(p.pid, signal.SIGKILL)
      except (ProcessLookupError, PermissionError):
        pass
    deadline = time.monotonic() + self.ready_timeout_s
    while any(self.procs[i] is p for i, p in enumerate(old)) and time.monotonic() < deadline:
      time.sleep(0.1)  # the watchdog starts each one again, in self._cwd
    self._wait_ready()

  @contextlib.contextmanager
  def training(self, model_dir: str):
    """Marks a training call under way (the weight-streaming runtime's scope) and watches its
    steps (`step_started` / `step_finished`, called by a session hook) for a stall."""
    self._training_dir = model_dir
    self._step_started, self._longest_step = None, 0.0
    done = threading.Event()
    watch = threading.Thread(target=self._watch_steps, args=(done,), daemon=True)
    watch.start()
    try:
      yield
    finally:
      done.set()
      watch.join()
      self._training_dir = None

  def step_started(self) -> None:
    self._step_started = time.monotonic()

  def step_finished(self) -> None:
    if self._step_started is not None:
      self._longest_step = max(self._longest_step, time.monotonic() - self._step_started)
    self._step_started = None

  def stall_limit_s(self) -> float:
    floor = float(os.environ.get("CEREBRAS_TF_STALL_TIMEOUT_S", STALL_TIMEOUT_S))
    return max(floor, STALL_FACTOR * self._longest_step)

  def _watch_steps(self, done: threading.Event) -> None:
    """A step stalled on the weight servers: ours are killed (the restart watch brings them
    back and TensorFlow's session recovers from the last checkpoint, as after a crash);
    external ones cannot be, so the run ends with one line, its checkpoints intact."""
    samples: List[Tuple[float, Optional[float]]] = []  # (monotonic time, CPU seconds used)
    while not done.wait(1.0):
      now = time.monotonic()
      samples = [x for x in samples if now - x[0] <= IDLE_WINDOW_S] + [
          (now, _cpu_seconds([os.getpid()] + self.alive()))]
      started = self._step_started
      if started is None or now - started < self.stall_limit_s():
        continue
      (then, used_then), (_, used_now) = samples[0], samples[-1]
      if used_then is not None and used_now is not None and (
          now - then < IDLE_WINDOW_S / 2
          or used_now - used_then > IDLE_CPU_FRACTION * (now - then)):
        continue  # busy (saving, evaluating): slow, not stalled
      waited = now - started
      self._step_started = None  # one action per stalled step
      self.stalls += 1
      if self.external or self.stalls > MAX_RESTARTS:
        self.failed = (f"no training step finished in {waited:.0f}s (stall {self.stalls}): the "
                       f"weight servers {', '.join(self.cluster['ps'])} stopped answering")
        self._abandon()
        continue
      print(f"cerebras_tf: no training step finished in {waited:.0f}s (the weight servers "
            f"stopped answering); restarting them ({self.stalls}/{MAX_RESTARTS}); training "
            "resumes from the last checkpoint", file=sys.stderr, flush=True)
      for i, p in enumerate(self.procs):
        if p.poll() is None:
          self._killed_on_purpose.add(i)
          try:
            os.killpg(p.pid, signal.SIGKILL)
          except (ProcessLookupError, PermissionError):
            pass

  def _abandon(self) -> None:
    """A weight server is gone for good and a training call is still under way
    SESSION_TIMEOUT_S later: TensorFlow cannot end that call (closing its session waits on the
    dead task with no deadline, measured: forever), so say why in one line, end the other
    weight servers and exit. The checkpoints are the client's, written before: intact."""
    model_dir = self._training_dir
    if model_dir is None or self._closing.is_set():
      return
    kept = list_checkpoints(model_dir)
    saved = (f"checkpoints up to {os.path.basename(kept[-1])} in {model_dir} are intact" if kept
             else "no checkpoint was written")
    print(f"error: {self.failed}; training stopped (TensorFlow cannot end a session whose "
          f"weight server is gone or stalled, so this process exits); {saved}; fix what stops "
          f"the weight server and rerun the same command to resume", file=sys.stderr, flush=True)
    self.close()
    os._exit(TrainingError.exit_code)  # pylint: disable=protected-access

  def _wait_ready(self) -> None:
    deadline = time.monotonic() + self.ready_timeout_s
    for i, address in enumerate(self.cluster["ps"]):
      while not _port_open(address):
        proc = self.procs[i] if i < len(self.procs) else None
        if proc is not None and proc.poll() is not None:
          log_path = self.log_path(i)
          with open(log_path, errors="replace") as fh:
            if "in use" in fh.read().lower():
              raise _PortTaken(f"weight server ps:{i} could not bind {address}: the port is "
                               f"already in use (3 attempts with fresh ports); see {log_path}")
          raise ConfigError(f"weight server ps:{i} ({address}) exited with code {proc.returncode} "
                            f"before it came up; see {self.log_path(i)}")
        if time.monotonic() > deadline:
          raise ConfigError(f"weight server ps:{i} ({address}) did not come up within "
                            f"{self.ready_timeout_s:.0f}s; check the address/port"
                            + (f" and {self.log_path(i)}" if proc else ""))
        time.sleep(0.1)

  def close(self) -> None:
    self._closing.set()
    for p in self.procs:
      if p.poll() is None:
        try:
          os.killpg(p.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
          pass
    for p in self.procs:
      try:
        p.wait(timeout=10)
      except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    for log in self._logs:
      log.close()
    self._logs = []

  def alive(self) -> List[int]:
    """Pids of ps tasks still running."""
    return [p.pid for p in self.procs if p.poll() is None]


class Client:
  """This process's side of the cluster: its own server (job `localhost`) and placements."""

  def __init__(self, cluster: LocalCluster, replicas: int):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    self.cluster = cluster.cluster
    self.local = cluster
    self.job = cluster.client_job
    self._server = tf.distribute.Server(tf.train.ClusterSpec(self.cluster), job_name=self.job,
                                        task_index=0, start=True)
    # The server has every logical CPU of this process: a later run on more systems fits.
    self.replicas = max(replicas, len(tf.config.list_logical_devices("CPU")))

  @property
  def target(self) -> str:
    return self._server.target

  def device(self, k: int) -> str:
    return f"/job:{self.job}/replica:0/task:0/device:CPU:{k}"

  def device_fn(self):
    """Variables (and so the optimizer's updates) round-robin on the ps tasks; compute here."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    return tf.compat.v1.train.replica_device_setter(
        ps_tasks=len(self.cluster["ps"]), ps_device="/job:ps", worker_device=self.device(0))

  def strategy(self, replicas: int):
    """Synchronous data parallelism over `replicas` devices; variables on ps task 0."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    dist = tf.compat.v1.distribute.experimental.CentralStorageStrategy(
        compute_devices=[self.device(k) for k in range(replicas)],
        parameter_device="/job:ps/task:0/device:CPU:0")
    # Its input pipeline defaults to /job:localhost; with TF_CONFIG this client is another job.
    dist.extended._worker_device = self.device(0)  # pylint: disable=protected-access
    return dist


_CLIENT: Optional[Client] = None


def client_for(num_ps: int, log_dir: str, replicas: int) -> Client:
  """The process-wide client, launching (or joining, with TF_CONFIG) the cluster on first use.

  One per process: TensorFlow binds a process's devices to the first server it starts.
  """
  global _CLIENT  # pylint: disable=global-statement
  if _CLIENT is not None:
    want_ps = ps_addresses_from_tf_config() or _CLIENT.cluster["ps"]
    if (len(_CLIENT.cluster["ps"]) != (len(want_ps) if _CLIENT.local.external else num_ps)
        or _CLIENT.replicas < replicas or not all(_port_open(a) for a in _CLIENT.cluster["ps"])):
      raise ConfigError("this process already serves a weight-streaming cluster of another shape "
                        "or one whose weight servers died; start a new process to change it")
    _CLIENT.local.log_dir = log_dir  # a server started from now on logs with this call
    _CLIENT.local.follow_cwd()
    return _CLIENT
  import atexit  # pylint: disable=import-outside-toplevel
  cfg = tf_config.current()
  if cfg is None:
    local = LocalCluster(num_ps, log_dir)
  else:
    if cfg.num_workers > 1:
      raise ConfigError("weight_streaming over TF_CONFIG trains on one host: name one 'chief' "
                        "(this client) and the weight servers in 'ps', no 'worker' tasks")
    local = LocalCluster(num_ps, log_dir, ps_addresses=ps_addresses_from_tf_config(),
                         client_job=cfg.task_type,
                         client_address=cfg.cluster[cfg.task_type][cfg.task_index])
  local.__enter__()
  atexit.register(local.close)
  try:
    _CLIENT = Client(local, replicas)
  except BaseException:
    local.close()
    raise
  return _CLIENT
