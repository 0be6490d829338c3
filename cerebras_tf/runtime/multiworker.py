"""Data parallel over the hosts of a TF_CONFIG cluster: MultiWorkerMirroredStrategy under
tf.estimator, the way TensorFlow's own distribute coordinator runs it, plus cluster faults.

Why tf.estimator stalls on its own (TF 2.15): `Estimator.train` supports MWMS only inside
`train_and_evaluate`'s distribute coordinator. Without its *worker context*, every non-chief
task builds a `WorkerSessionCreator` and waits for the chief to initialize variables that, in
MWMS, each worker owns (they are mirrored, not shared), while the chief blocks in the first
collective: nobody ever steps. With the worker context every task initializes (or restores)
its own copy, initial values are broadcast from the chief, only the chief writes `model_dir`
(the others save to `model_dir/tmp_worker_N`), and `Estimator.train` works unchanged.

Faults TensorFlow leaves to the user, handled here:
  * formation: a task that does not join within `FORMATION_TIMEOUT_S` is named
    (`worker:1 (host:port)`), one line, instead of a wait of an hour (runtime/peers.py);
  * a peer that dies mid-run leaves the others blocked in a collective forever; a watch
    thread probes the peers and ends this task with one line naming the lost one (the
    checkpoints are written atomically by the chief, so the last one is intact);
  * MWMS's coordination service installs a SIGTERM handler (the preemption notifier) that
    swallows SIGTERM; the default action is restored, so SIGTERM stops a task.
"""

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from typing import Callable, Dict, Iterator, Optional

import tensorflow as tf
from tensorflow.python.distribute import distribute_coordinator as dc
from tensorflow.python.distribute import multi_worker_util
from tensorflow.python.eager import context as eager_context
from tensorflow.tsl.protobuf import coordination_config_pb2

from cerebras_tf.errors import ConfigError
from cerebras_tf.runtime import checkpoints, peers, tf_config

# How long a task waits for every other task to join the cluster.
FORMATION_TIMEOUT_S = float(os.environ.get("CEREBRAS_TF_FORMATION_TIMEOUT_S", 120))
# A peer is gone when its port refuses connections this long while this task trains.
PEER_LOST_S = float(os.environ.get("CEREBRAS_TF_PEER_LOST_S", 5))
EXIT_PEER_LOST = 3


def _training_spec(cluster: tf_config.TFConfig):
  return multi_worker_util.normalize_cluster_spec(
      {job: cluster.cluster[job] for job in peers.TRAINING_JOBS if job in cluster.cluster})


# One strategy per cluster and task in a process: later train calls (train_and_eval's rounds)
# reuse the one formed first.
_formed: Dict[str, tf.distribute.Strategy] = {}


def strategy(cluster: tf_config.TFConfig,
             formation_timeout_s: float = FORMATION_TIMEOUT_S) -> tf.distribute.Strategy:
  """MultiWorkerMirroredStrategy for this task; returns once every training task joined.

  The first call must come before anything starts TensorFlow's eager context: collectives
  can be configured only before it, and building a tf.cond or a while loop in any graph
  starts it (strategies.form_cluster calls this before the compiler traces the model_fn).

  A task that does not join within `formation_timeout_s` is named on stderr by a watchdog
  process, which then ends this one (TensorFlow forms the cluster holding the GIL, and its
  own registration timeout did not fire in a 40 s probe).
  """
  key = json.dumps([cluster.cluster, cluster.task_type, cluster.task_index], sort_keys=True)
  if key in _formed:
    return _formed[key]
  spec = _training_spec(cluster)
  ctx = eager_context.context()
  if ctx.coordination_service is None:
    # What MWMS would configure itself, with a registration timeout to match ours.
    ctx.configure_coordination_service(
        service_type="standalone",
        service_leader=multi_worker_util.coordination_leader(spec),
        cluster_register_timeout_in_ms=int(formation_timeout_s * 1000),
        coordinated_jobs=[coordination_config_pb2.CoordinatedJob(name=job,
                                                                 num_tasks=spec.num_tasks(job))
                          for job in peers.TRAINING_JOBS if job in spec.jobs])
  if peers.port_taken(cluster.cluster[cluster.task_type][cluster.task_index]):
    raise ConfigError(_port_taken_message(cluster))
  sigterm = signal.getsignal(signal.SIGTERM)
  restore_sigint = peers.exit_on_signal()  # the watchdog's stop: exit code 2, not 137
  watchdog = subprocess.Popen(  # pylint: disable=consider-using-with
      [sys.executable, "-m", "cerebras_tf.runtime.peers", "--formation_watch", str(os.getpid()),
       str(formation_timeout_s)], stdin=subprocess.PIPE,
      cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
  try:
    dist = tf.distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=tf.distribute.cluster_resolver.SimpleClusterResolver(
            spec, task_type=cluster.task_type, task_id=cluster.task_index, rpc_layer="grpc"))
  except tf.errors.OpError as e:
    if "Could not start gRPC server" in e.message:
      raise ConfigError(_port_taken_message(cluster)) from None
    raise ConfigError(f"{peers.formation_message(cluster, formation_timeout_s)} "
                      f"[{' '.join(e.message.split())[:200]}]") from None
  except RuntimeError as e:
    if "configured at program startup" not in str(e):
      raise
    raise ConfigError(
        f"{cluster.task}: TensorFlow already started in this process (building a Keras "
        f"model, or running any TF op, starts it) and a multi-worker run must form its "
        f"cluster before that: call cerebras_tf.runtime.strategies.form_cluster() at the top "
        f"of the script, before the model is built (scripts/run.py needs nothing)") from e
  finally:
    watchdog.stdin.close()
    watchdog.wait()
    restore_sigint()
  # The coordination service's preemption notifier catches SIGTERM and keeps the process
  # alive; a user (or the launcher) that sends SIGTERM means stop.
  signal.signal(signal.SIGTERM, sigterm if callable(sigterm) else signal.SIG_DFL)
  _formed[key] = dist
  return dist


def _port_taken_message(cluster: tf_config.TFConfig) -> str:
  """This task's own address could not be served: something holds its port. Under
  tf.estimator.train_and_evaluate that is the executor's own server for TF_CONFIG's task
  (between-graph training, started before it calls train)."""
  address = cluster.cluster[cluster.task_type][cluster.task_index]
  inside = any(f.filename.endswith(os.path.join("estimator", "training.py"))
               and f.name in ("run_chief", "run_worker", "run_master")
               for f in traceback.extract_stack())
  why = ("tf.estimator.train_and_evaluate started a server of its own there for TF_CONFIG's "
         "task; on the engine's data-parallel runtime call est.train(...) and "
         "est.evaluate(...) in turn instead (scripts/run.py --mode train_and_eval does)"
         if inside else "another process on this host, or a server this process already "
         "started, holds it; free it or give this task another port in TF_CONFIG")
  return f"{cluster.task}: cannot serve this task's address {address}: {why}"


class PeerWatch:
  """Ends this task, with one line, when another training task stops answering mid-run.

  A collective op waits for a dead peer forever (MonitoredSession retries on Unavailable),
  so there is no error to catch: the watch probes each peer's port once a second.
  """

  def __init__(self, cluster: tf_config.TFConfig, model_dir: str,
               lost_after_s: float = PEER_LOST_S,
               exit_fn: Callable[[int], None] = os._exit):  # pylint: disable=protected-access
    self._peers = [t for t in peers.training_tasks(cluster) if t != cluster.task]
    self._me = cluster.task
    self._model_dir = model_dir
    self._lost_after_s = lost_after_s
    self._exit = exit_fn
    self._stop = threading.Event()
    self._thread: Optional[threading.Thread] = None

  def start(self) -> "PeerWatch":
    self._thread = threading.Thread(target=self._run, daemon=True, name="cerebras_tf-peers")
    self._thread.start()
    return self

  def stop(self) -> None:
    self._stop.set()
    if self._thread is not None:
      self._thread.join(5)

  def hook(self) -> tf.compat.v1.train.SessionRunHook:
    """Stands the watch down once this task's training loop has ended normally: no collective
    follows, and a peer that took its last step too may leave (a 3-worker run's slower task
    called a finished peer lost, bench_multiworker)."""
    return _StandDownAtEnd(self._stop)

  def _run(self) -> None:
    down_since = {}
    while not self._stop.wait(1.0):
      now = time.monotonic()
      for peer in self._peers:
        if peers.reachable(peers.address_of(peer)):
          down_since.pop(peer, None)
          continue
        down_since.setdefault(peer, now)
        if now - down_since[peer] >= self._lost_after_s and not self._stop.is_set():
          latest = tf.train.latest_checkpoint(self._model_dir)
          print(f"error: {peer} left the cluster (not reachable for {self._lost_after_s:.0f}s); "
                f"{self._me} stops too. Checkpoints in {self._model_dir} are intact (latest: "
                f"{os.path.basename(latest) if latest else 'none'}); rerun the same commands "
                f"on every host to resume", file=sys.stderr, flush=True)
          self._exit(EXIT_PEER_LOST)
          return


class _StandDownAtEnd(tf.compat.v1.train.SessionRunHook):

  def __init__(self, stop: threading.Event):
    self._stop = stop

  def end(self, session):
    del session
    self._stop.set()


# Each train call of a process is one round of the restore check (train_and_eval has several).
_restore_round = itertools.count()


def check_same_restore(cluster: tf_config.TFConfig, model_dir: str,
                       timeout_s: float = FORMATION_TIMEOUT_S) -> None:
  """Refuses (ConfigError, on every task) a cluster whose tasks would start from different
  checkpoints, before any of them starts.

  Each task restores from the model_dir it sees; only the chief writes checkpoints. On hosts
  that do not share the model_dir, a rerun restores the chief only, the others initialize and
  wait for the chief to broadcast initial values it never sends: every task hung, silently.
  The tasks trade the checkpoint they would restore through the coordination service's
  key-value store (set up when the cluster formed) and compare them.
  """
  ctx = eager_context.context()
  n = next(_restore_round)
  latest = checkpoints.latest(model_dir)
  mine = f"{os.path.basename(latest) if latest else 'no checkpoint'}|{model_dir}"
  me = f"{cluster.task_type}:{cluster.task_index}"
  ctx.set_config_key_value(f"cerebras_tf/restore/{n}/{me}", mine)
  views = {}
  deadline = time.monotonic() + timeout_s
  for task in peers.training_tasks(cluster):
    name = task.split(" ", 1)[0]
    while name not in views:
      try:  # short waits: a blocked get holds the GIL, and the peer watch needs it
        views[name] = ctx.get_config_key_value(f"cerebras_tf/restore/{n}/{name}", 1000)
      except tf.errors.DeadlineExceededError:
        if time.monotonic() > deadline:
          raise ConfigError(f"{cluster.task}: {name} did not say which checkpoint it "
                            f"resumes from within {timeout_s:.0f}s") from None
  starts = {name: view.split("|", 1) for name, view in views.items()}
  if len({ckpt for ckpt, _ in starts.values()}) > 1:
    seen = "; ".join(f"{name} from {ckpt} in {where}" for name, (ckpt, where) in starts.items())
    raise ConfigError(
        f"the tasks would resume from different checkpoints ({seen}): every host must see the "
        f"chief's model_dir (a shared filesystem: NFS, or a bucket mounted with gcsfuse); put "
        f"it on shared storage, or copy the chief's model_dir to the others, then rerun")


@contextlib.contextmanager
def worker_context(dist: tf.distribute.Strategy, cluster: tf_config.TFConfig, model_dir: str,
                   session_config) -> Iterator[list]:
  """Runs `Estimator.train` as one task of the cluster (what train_and_evaluate's coordinator
  does), with the peers watched; yields the hooks the train call must add."""
  spec = _training_spec(cluster)
  ctx = dc._WorkerContext(dist, spec, cluster.task_type, cluster.task_index,  # pylint: disable=protected-access
                          session_config=session_config, rpc_layer="grpc")
  watch = PeerWatch(cluster, model_dir).start()
  try:
    check_same_restore(cluster, model_dir)
    with ctx:
      yield [watch.hook()]
  finally:
    watch.stop()
