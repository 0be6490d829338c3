"""The TensorFlow runtime for a plan: host devices, the tf.distribute strategy, the RunConfig.

  pipelined         one device, TF's default strategy
  multi_replica     tf.distribute.MirroredStrategy over the plan's host replicas (logical CPU
                    devices carved out of the host CPU, or GPUs); MultiWorkerMirroredStrategy
                    when TF_CONFIG names a chief and workers
  weight_streaming  variables and optimizer on ps tasks (MemoryX, runtime/cluster.py), compute
                    on one device per CS system in this process

How many host replicas, and each one's batch, are the plan's (`plan.batching`, derived once in
core/batching.py at compile time from what `host_devices` reports); this module only builds
them. Facts from TF 2.15 on one CPU (shared/TF215_NOTES.md): logical CPUs must be configured
before the runtime starts; the default all-reduce can hang across logical CPUs, so reduction
goes to one device; a session_config hides the logical devices unless it sets device_count.
"""

import contextlib
import dataclasses
import functools
import os
from typing import Callable, ContextManager, Optional

import tensorflow as tf

from cerebras_tf.core import batching, plans
from cerebras_tf.errors import ConfigError
from cerebras_tf.runtime import cluster as cluster_lib
from cerebras_tf.runtime import hooks, multiworker, peers
from cerebras_tf.runtime import tf_config


def reserve_logical_cpus(count: int) -> None:
  """Splits the host CPU into `count` logical devices (no-op if there are enough already).

  The one place the framework configures devices. Raises ConfigError when TensorFlow's runtime
  already started with fewer.
  """
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
          f"this run needs {count} CPU devices but TensorFlow already started with {have} "
          f"(building a Keras model or running any TF op starts it); call "
          f"cerebras_tf.runtime.strategies.reserve_logical_cpus({count}) before that, or run "
          f"in a fresh process (scripts/run.py does)") from e


def host_devices(cs_config) -> dict:
  """What this host can train with: {"num_workers", "host_devices"} for the compiler.

  Reserves the logical CPUs the configured strategy may use first (so call it before anything
  starts TensorFlow's runtime; CerebrasEstimator.compile does). A plan that cannot get them
  (TensorFlow already started with one CPU: a notebook, a Keras model built first) is planned
  for the devices there are, with an INFO line: the host's replica count is an implementation
  detail (the same update on the same global batch) unless the user set
  csconfig.num_replicas, which plans for the devices it asked for, so compiling works anywhere
  and training raises the ConfigError that says how to fix it.
  """
  cluster = tf_config.current()
  workers = cluster.num_workers if cluster is not None and cluster.multi_worker else 1
  gpus = len(tf.config.list_physical_devices("GPU"))
  if workers > 1:  # MultiWorkerMirroredStrategy: each worker's own devices (one CPU, or GPUs)
    return {"num_workers": workers, "host_devices": max(1, gpus)}
  if gpus >= 2:
    return {"num_workers": 1, "host_devices": gpus}
  strategy = cs_config.execution_strategy
  modes = plans.modes_of(strategy)  # what the compiler may plan: one mode, or all for auto
  want = 1
  if any(m.replicates for m in modes):
    want = cs_config.num_replicas or batching.HOST_CPU_REPLICAS
  if any(m.streams_weights for m in modes):
    # The host trains the systems' shares on at most HOST_CPU_REPLICAS devices
    # (batching.host_replicas): a device per system would be num_csx configs for nothing.
    want = max(want, min(cs_config.num_csx, batching.HOST_CPU_REPLICAS))
  if want < batching.HOST_CPU_REPLICAS:
    # A run on one device reserves the default data-parallel count too while it still can,
    # so a notebook that trains pipelined and then multi_replica needs no new process.
    with contextlib.suppress(ConfigError):
      reserve_logical_cpus(batching.HOST_CPU_REPLICAS)
  elif want > 1:
    try:
      reserve_logical_cpus(want)
    except ConfigError:
      if cs_config.num_replicas is not None and not all(m.streams_weights for m in modes):
        return {"num_workers": 1, "host_devices": want}
      # INFO, not WARNING: the update is the same on any number of host devices, and most
      # plans auto picks here (pipelined) use one; a data-parallel plan logs its own line.
      have = logical_cpu_count()
      tf.compat.v1.logging.info(
          "cerebras_tf: TensorFlow already started with %d CPU device(s); %s the host trains "
          "on the devices it has (the same update on the same global batch); for %d host "
          "replicas, run in a fresh process or call "
          "cerebras_tf.runtime.strategies.reserve_logical_cpus(%d) first", have,
          "if auto picks a data-parallel mode" if len(modes) > 1
          else f"the {strategy} plan is data-parallel:", want, want)
  return {"num_workers": 1, "host_devices": logical_cpu_count()}


def reserve_default_cpus() -> None:
  """Reserves batching.HOST_CPU_REPLICAS logical CPUs while TensorFlow's runtime has not
  started (nothing once it has). Called when the estimator module is imported: a script that
  imports cerebras_tf and then builds its Keras model (from_keras_model needs it built, and
  building it starts the runtime) still trains data-parallel plans on as many host replicas
  as a fresh process would. Ops run on the first CPU device unless placed."""
  with contextlib.suppress(ConfigError):
    reserve_logical_cpus(batching.HOST_CPU_REPLICAS)


def form_cluster(cs_config=None) -> None:
  """Forms this task's MultiWorkerMirroredStrategy now when TF_CONFIG names several workers
  (nothing otherwise, or for weight_streaming): a tf.cond or while loop in the traced model
  (gradient accumulation, an RNN), a Keras model or any TF op starts TensorFlow's eager
  context, after which collectives cannot be configured. Training calls it before the
  compiler traces the model_fn; a script that builds a Keras model first calls it at its top.
  """
  cluster = tf_config.current()
  streams = cs_config is not None and all(
      m.streams_weights for m in plans.modes_of(cs_config.execution_strategy))
  if cluster is not None and cluster.multi_worker and not streams:
    multiworker.strategy(cluster)


def logical_cpu_count() -> int:
  return len(tf.config.list_logical_devices("CPU"))


def mirrored_strategy(num_replicas: int) -> tf.distribute.Strategy:
  """Data-parallel replicas on this host, on GPUs when there are enough, else logical CPUs."""
  gpus = tf.config.list_physical_devices("GPU")
  if len(gpus) >= num_replicas:
    devices = [f"/gpu:{i}" for i in range(num_replicas)]
  else:
    reserve_logical_cpus(num_replicas)
    devices = [f"/cpu:{i}" for i in range(num_replicas)]
  return tf.distribute.MirroredStrategy(
      devices, cross_device_ops=tf.distribute.ReductionToOneDevice(reduce_to_device="/cpu:0"))


def quick_session_config(
    base: Optional[tf.compat.v1.ConfigProto] = None) -> tf.compat.v1.ConfigProto:
  """A copy of `base` (the user's session config, or tf.estimator's default) with the TFG
  graph optimizer off; the rest is the user's.

  In TF 2.15 each session's first run sends every graph and function through Grappler, which
  first converts it to MLIR and back (tfg: consolidate attributes, sort, infer shapes, export).
  That round trip was 640 of Grappler's 1,523 ms in a 6-step BERT-tiny run (meta_optimizer's
  VLOG; Grappler's own passes, fusions included, still run). Off, the run took 11.6 s of CPU
  instead of 12.3 (3 runs each, AVX-512 host; issue 42), and its losses differed from the
  default's only as much as two default runs differ from each other (1e-4, oneDNN's threads).
  """
  config = tf.compat.v1.ConfigProto()
  if base is not None:
    config.CopyFrom(base)
  config.graph_options.rewrite_options.disable_tfg_optimizer = True
  return config


def session_config(num_devices: int,
                   base: Optional[tf.compat.v1.ConfigProto] = None) -> tf.compat.v1.ConfigProto:
  """A copy of the user's session config (`base`: thread counts, ...) that also keeps
  `num_devices` logical CPUs visible and allows soft placement (and starts quickly,
  `quick_session_config`); the rest is the user's."""
  config = quick_session_config(base)
  config.allow_soft_placement = True
  config.device_count["CPU"] = max(1, num_devices)
  return config


def num_replicas_in_sync() -> int:
  """Replicas the current graph is being built for (1 outside a distribution strategy)."""
  ctx = tf.distribute.get_replica_context()
  return ctx.num_replicas_in_sync if ctx is not None else 1


@dataclasses.dataclass(frozen=True)
class Runtime:
  """How the host trains a plan: the RunConfig to train with and what it means."""

  config: tf.estimator.RunConfig
  replicas: int              # data-parallel replicas of this worker
  per_replica_batch: int     # what each input_fn call must return
  description: str
  # Entered around Estimator.train: the cluster's worker context (multi-worker), the weight
  # servers' watch of the training call (weight streaming), else nothing.
  # It yields the hooks the train call adds (a list), or None.
  scope: Callable[[], ContextManager] = contextlib.nullcontext


@contextlib.contextmanager
def _weight_streaming_scope(local: cluster_lib.LocalCluster, model_dir: str):
  with local.training(model_dir):
    yield [hooks.StepWatchHook(local)]


def runtime_for(plan: plans.Plan, config, model_dir: str, cs_config) -> Runtime:
  """The RunConfig (a `replace()` of `config`) that trains `plan` on this host."""
  if config.train_distribute is not None:
    # The plan decides the host's replicas (the engine's distribution semantics); a
    # strategy of the user's own broke input checkpointing in one-device runs.
    tf.compat.v1.logging.warning(
        "cerebras_tf: config.train_distribute (%s) is not used with use_cs=True: the %s plan "
        "decides how the host trains (use_cs=False trains with your strategy)",
        type(config.train_distribute).__name__, plan.execution_strategy)
    config = config.replace(train_distribute=None)
  b = plan.batching
  local = b.host_replicas_per_worker
  chosen_by = ("auto" if len(plans.modes_of(cs_config.execution_strategy)) > 1
               else "the compiler")
  if plan.mode.replicates and b.engine_replicas != b.host_replicas:
    tf.compat.v1.logging.info(
        "cerebras_tf: multi_replica plan: R=%d replicas on the engine (chosen by %s); the host "
        "trains them as %d replica(s) of %d samples: the same global batch %d and synchronous "
        "update (csconfig.num_replicas fixes R on both)", b.engine_replicas, chosen_by,
        b.host_replicas, b.per_host_replica, b.global_batch)
  if plan.mode.streams_weights and b.num_systems != b.host_replicas:
    tf.compat.v1.logging.info(
        "cerebras_tf: weight-streaming plan: %d systems on the engine; the host trains their "
        "shares as %d replica(s) of %d samples: the same global batch %d and synchronous "
        "update", b.num_systems, b.host_replicas, b.per_host_replica, b.global_batch)
  multi_worker = b.num_workers > 1
  sess = session_config(local, config.session_config)
  scope = contextlib.nullcontext
  if plan.mode.streams_weights:
    reserve_logical_cpus(local)  # one compute device per CS system
    client = cluster_lib.client_for(cs_config.max_wgt_servers,
                                    os.path.join(model_dir, "cluster_logs"), local)
    placement = ({"device_fn": client.device_fn()} if local == 1
                 else {"train_distribute": client.strategy(local)})
    # Fail cleanly (checkpoints intact) rather than wait 2 h for a weight server that is gone.
    new = config.replace(session_config=sess,
                         session_creation_timeout_secs=cluster_lib.SESSION_TIMEOUT_S,
                         **placement).with_master(client.target)
    where = f"{len(client.cluster['ps'])} weight server(s) {', '.join(client.cluster['ps'])}"
    scope = functools.partial(_weight_streaming_scope, client.local, model_dir)
  elif multi_worker:
    cluster = tf_config.current()
    dist = multiworker.strategy(cluster)
    new = config.replace(train_distribute=dist, session_config=sess)
    where = (f"{cluster.task} of {', '.join(peers.training_tasks(cluster))}; "
             + ", ".join(dist.extended.worker_devices))
    scope = lambda: multiworker.worker_context(dist, cluster, model_dir,  # noqa: E731
                                               new.session_config)
  elif local > 1:
    dist = mirrored_strategy(local)
    new = config.replace(train_distribute=dist, session_config=sess)
    where = ", ".join(dist.extended.worker_devices)
  else:
    return Runtime(config.replace(session_config=quick_session_config(config.session_config)),
                   1, b.per_host_replica, "one device")
  description = (f"{plan.execution_strategy} runtime: {b.host_replicas} replica(s) of {b.per_host_replica} "
                 f"samples over {b.num_workers} worker(s); {where}")
  tf.compat.v1.logging.info("cerebras_tf: %s", description)
  return Runtime(new, local, b.per_host_replica, description, scope)


def shard_for_input_pipeline(dataset, input_context):
  """This worker's share of an input_fn's per-replica batches, for an input_fn that does not
  take `input_context` itself.

  Each worker runs the input_fn; taking every n-th batch (worker k: batches k, k+n, ...) makes
  one step of n workers see the same samples as one step of one process with the same global
  batch and seed.
  """
  if (input_context is None or input_context.num_input_pipelines <= 1
      or not isinstance(dataset, tf.data.Dataset)):
    return dataset
  return dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
