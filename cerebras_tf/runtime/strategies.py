"""The TensorFlow runtime for each execution strategy.

  pipelined         one device, TF's default strategy (the plan has one replica)
  multi_replica     tf.distribute.MirroredStrategy over the host's replicas (`host_replicas`:
                    R when csconfig.num_replicas fixes it, else at most 2, or one per GPU):
                    GPUs when there are enough, otherwise logical CPU devices carved out of
                    the host CPU; MultiWorkerMirroredStrategy when TF_CONFIG names several
                    workers
  weight_streaming  parameter-server training (runtime/cluster.py)

Facts from TF 2.15 on one CPU (shared/TF215_NOTES.md): logical CPUs must be configured before
the runtime starts; the default all-reduce can hang across logical CPUs, so reduction goes to
one device; a session_config hides the logical devices unless it sets device_count.
"""

import json
import os
from typing import Optional

import tensorflow as tf

from cerebras_tf.errors import ConfigError


def configure_logical_cpus(count: int) -> None:
  """Splits the host CPU into `count` logical devices (no-op if there are enough already)."""
  cpus = tf.config.list_physical_devices("CPU")
  try:
    current = tf.config.get_logical_device_configuration(cpus[0]) or []
    if len(current) >= count:
      return
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration()] * count)
  except RuntimeError as e:
    have = len(tf.config.list_logical_devices("CPU"))
    if have < count:
      raise ConfigError(
          f"multi_replica needs {count} CPU devices but TensorFlow already started with {have}; "
          f"run in a fresh process (scripts/run.py does) or call "
          f"cerebras_tf.runtime.strategies.configure_logical_cpus({count}) first") from e


def _tf_config() -> dict:
  raw = os.environ.get("TF_CONFIG")
  if not raw:
    return {}
  try:
    cfg = json.loads(raw)
  except ValueError as e:
    raise ConfigError(f"TF_CONFIG is not valid JSON ({e}); expected "
                      '{"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", "index": 0}}') from e
  if not isinstance(cfg, dict) or not isinstance(cfg.get("cluster", {}), dict):
    raise ConfigError("TF_CONFIG must be a JSON object with a 'cluster' mapping and a 'task'")
  return cfg


# A multi_replica plan's R is the engine's: copies side by side on the wafer. The host only has
# to train the same synchronous update on the same global batch, which any number of
# data-parallel replicas does (tests/test_execution_modes.py: R = 2 matches one device). So
# when the compiler chose R, the host runs at most this many replicas on logical CPUs (or one
# per GPU when there are 2 or more): 64 copies of the graph on 2 cores buy nothing but
# graph-building time. A user who sets csconfig.num_replicas gets exactly that many.
HOST_CPU_REPLICAS = 2


def host_replicas(plan_replicas: int, global_batch: int, forced: bool, num_gpus: int) -> int:
  """Data-parallel replicas the host trains a multi_replica plan of `plan_replicas` with.

  Args:
    plan_replicas: R of the plan (engine copies).
    global_batch: the plan's global batch (the host keeps it; each replica gets B / count).
    forced: R came from csconfig.num_replicas (the user's number: kept as is).
    num_gpus: physical GPUs on the host.

  Returns:
    R when forced or R <= 1; else the largest divisor of the batch that is at most
    min(R, num_gpus if num_gpus >= 2 else HOST_CPU_REPLICAS).
  """
  if forced or plan_replicas <= 1:
    return plan_replicas
  count = min(plan_replicas, num_gpus if num_gpus >= 2 else HOST_CPU_REPLICAS)
  while count > 1 and global_batch % count:
    count -= 1
  return max(1, count)


def multi_worker() -> bool:
  """TF_CONFIG names more than one worker (MultiWorkerMirroredStrategy spans hosts)."""
  cluster = _tf_config().get("cluster", {})
  return len(cluster.get("worker", [])) + len(cluster.get("chief", [])) > 1


def mirrored_strategy(num_replicas: int) -> tf.distribute.Strategy:
  """Data-parallel replicas on this host (or across hosts when TF_CONFIG says so)."""
  cfg = _tf_config()
  workers = cfg.get("cluster", {}).get("worker", [])
  if len(workers) + len(cfg.get("cluster", {}).get("chief", [])) > 1:
    return tf.distribute.experimental.MultiWorkerMirroredStrategy()
  gpus = tf.config.list_physical_devices("GPU")
  if len(gpus) >= num_replicas:
    devices = [f"/gpu:{i}" for i in range(num_replicas)]
  else:
    configure_logical_cpus(num_replicas)
    devices = [f"/cpu:{i}" for i in range(num_replicas)]
  return tf.distribute.MirroredStrategy(
      devices, cross_device_ops=tf.distribute.ReductionToOneDevice(reduce_to_device="/cpu:0"))


def session_config(num_devices: int) -> tf.compat.v1.ConfigProto:
  """A session config that keeps `num_devices` logical CPUs visible."""
  return tf.compat.v1.ConfigProto(allow_soft_placement=True,
                                  device_count={"CPU": max(1, num_devices)})


def num_replicas_in_sync() -> int:
  """Replicas the current graph is being built for (1 outside a distribution strategy)."""
  ctx = tf.distribute.get_replica_context()
  return ctx.num_replicas_in_sync if ctx is not None else 1
