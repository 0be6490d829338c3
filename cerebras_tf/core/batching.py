"""The one owner of batch arithmetic: a global batch split over engine replicas, systems, host
replicas and workers, checked once.

The global batch (`train_input.batch_size`) keeps its meaning everywhere: the number of samples
in one optimizer step, all replicas, all systems, all workers together. Everything else is
derived here:

    per_system        = global / num_systems                (weight streaming: each CS system)
    per_micro_batch   = per_system / micro_batches          (weight streaming: one pass of the
                                                             layer loop; gradients accumulate)
    per_engine_replica = global / (num_systems x engine_replicas)   (multi_replica: each copy)
    per_worker        = global / num_workers                (each host of a TF_CONFIG cluster)
    per_host_replica  = global / host_replicas              (what each input_fn call returns)

`host_replicas` counts the data-parallel replicas the host runtime trains, across all workers
(a multiple of num_workers). The input_fn receives `per_host_replica` in the reserved params
key `batch_size` (TPUEstimator's convention); the user's own keys are never rewritten.

Plain Python: the compiler, the engine and the runtime all read a `Batching` from the plan.
"""

import dataclasses
from typing import List, Optional

from cerebras_tf.errors import ParamsError

# The params key through which the framework hands an input_fn its per-replica batch.
RESERVED_PARAMS_KEY = "batch_size"

# A compiler-chosen multi_replica plan's R is the engine's (copies side by side on the wafer).
# The host only has to train the same synchronous update on the same global batch, which any
# number of data-parallel replicas does, so it runs at most this many on the CPU of each worker
# (or one per GPU when it has 2 or more): 64 copies of the graph on 2 cores buy nothing but
# graph-building time. A user who sets csconfig.num_replicas gets exactly that many.
HOST_CPU_REPLICAS = 2

# Batch norm takes its statistics over one replica's samples; below about 16 they are too noisy
# to train with (Wu & He 2018, "Group Normalization", Fig. 1: ResNet-50's error rises steeply
# under 16 images per worker), and at 1 they are the sample's own (a dense feature's variance
# is 0). A compiler-chosen R keeps at least this many per replica for a model with batch norm.
BATCH_NORM_MIN_SAMPLES = 16


class BatchError(ParamsError):
  """A global batch that does not split evenly; the message names every number."""


@dataclasses.dataclass(frozen=True)
class Batching:
  """How one global batch is split. Build it with `split`, which checks it."""

  global_batch: int
  engine_replicas: int = 1   # multi_replica: copies on the wafer of each system (R)
  num_systems: int = 1       # weight streaming: CS systems (csconfig.num_csx)
  host_replicas: int = 1     # data-parallel replicas of the host runtime, all workers
  num_workers: int = 1       # hosts training together (TF_CONFIG chief + workers)
  # Weight streaming: micro-batches each system runs per step, as equal as the per-system batch
  # allows (the compiler's choice, engine/perf.py:ws_cost; need not divide it).
  micro_batches: int = 1

  @property
  def per_system(self) -> int:
    return self.global_batch // self.num_systems

  @property
  def per_micro_batch(self) -> int:
    """Samples in each system's smallest micro-batch (the whole per-system batch without
    micro-batching)."""
    return self.per_system // self.micro_batches

  @property
  def batch_norm_groups(self) -> int:
    """The groups of samples batch norm takes separate statistics over on the engine: every
    replica's (multi_replica), every system's micro-batches (weight streaming)."""
    return self.engine_replicas * self.num_systems * self.micro_batches

  @property
  def batch_norm_samples(self) -> int:
    """The fewest samples one batch norm's statistics cover on the engine."""
    return self.global_batch // self.batch_norm_groups

  @property
  def keeps_batch_norm(self) -> bool:
    """Whether every batch-norm statistic on the engine covers BATCH_NORM_MIN_SAMPLES."""
    return keeps_batch_norm(self.global_batch, self.batch_norm_groups)

  @property
  def per_engine_replica(self) -> int:
    return self.global_batch // (self.num_systems * self.engine_replicas)

  @property
  def per_worker(self) -> int:
    return self.global_batch // self.num_workers

  @property
  def per_host_replica(self) -> int:
    return self.global_batch // self.host_replicas

  @property
  def host_replicas_per_worker(self) -> int:
    return self.host_replicas // self.num_workers

  def to_dict(self) -> dict:
    d = dataclasses.asdict(self)
    d.update(per_system=self.per_system, per_engine_replica=self.per_engine_replica,
             per_worker=self.per_worker, per_host_replica=self.per_host_replica,
             per_micro_batch=self.per_micro_batch)
    return d

  @classmethod
  def from_dict(cls, d: dict) -> "Batching":
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in names})


def split(global_batch: int, *, engine_replicas: int = 1, num_systems: int = 1,
          host_replicas: Optional[int] = None, num_workers: int = 1,
          micro_batches: int = 1) -> Batching:
  """The one divisibility check of the batch.

  Args:
    global_batch: samples per optimizer step, everything together.
    engine_replicas: R (multi_replica); 1 otherwise.
    num_systems: CS systems (weight streaming); 1 otherwise.
    host_replicas: host data-parallel replicas across all workers (None: one per worker).
    num_workers: hosts of the cluster.
    micro_batches: weight streaming's micro-batches per system and step (need not divide the
      per-system batch; at most one per sample).

  Raises:
    BatchError: a count is not a positive int, the global batch does not divide by the
      product it must split into (one line naming the numbers and a batch that would), or
      more micro-batches than a system has samples.
  """
  host_replicas = num_workers if host_replicas is None else host_replicas
  counts = {"engine replicas (R)": engine_replicas, "CS systems (num_csx)": num_systems,
            "host replicas": host_replicas, "workers": num_workers,
            "micro-batches": micro_batches}
  for what, n in counts.items():
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
      raise BatchError(f"the number of {what} must be an int >= 1, got {n!r}")
  if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < 1:
    raise BatchError(f"global batch size must be an int >= 1, got {global_batch!r}")
  if host_replicas % num_workers:
    raise BatchError(f"{host_replicas} host replicas cannot be spread evenly over {num_workers} "
                     f"workers")
  engine = " x ".join(w for w in (f"{num_systems} CS systems (num_csx)" if num_systems > 1 else "",
                                  f"{engine_replicas} replicas (num_replicas)"
                                  if engine_replicas > 1 else "") if w)
  for what, n in ((engine, num_systems * engine_replicas),
                  (f"{num_workers} workers", num_workers),
                  (f"{host_replicas} host replicas", host_replicas)):
    if global_batch % n:
      raise BatchError(
          f"global batch size {global_batch} does not split evenly over {what}: each needs "
          f"batch / {n} samples; use a multiple of {n} (e.g. {_round_up(global_batch, n)}) "
          f"as the global batch (train_input.batch_size, or params['batch_size'] in Python)")
  if micro_batches > global_batch // num_systems:
    raise BatchError(f"{micro_batches} micro-batches of a per-system batch of "
                     f"{global_batch // num_systems} leave some empty; use at most "
                     f"{global_batch // num_systems} (one sample each)")
  return Batching(global_batch, engine_replicas, num_systems, host_replicas, num_workers,
                  micro_batches)


def divides(global_batch: int, count: int) -> bool:
  """Whether `count` replicas (or systems) can each take an equal share of the batch."""
  return count >= 1 and global_batch % count == 0


def host_replicas(engine_replicas: int, num_systems: int, global_batch: int, *,
                  forced: bool = False, devices_per_worker: int = HOST_CPU_REPLICAS,
                  num_workers: int = 1) -> int:
  """How many data-parallel replicas the host trains the plan with, across all workers.

  multi_replica with a forced R (the user's csconfig.num_replicas) runs exactly R on one
  worker. A compiler-chosen R, or weight streaming's systems: each worker runs the largest
  count <= min(R or num_csx, devices_per_worker) that keeps the batch divisible (the same
  synchronous update on the same global batch; batch norm's groups may differ, which
  training says). Anything else is one replica per worker.
  """
  shares = max(engine_replicas, num_systems)
  if shares <= 1:
    return num_workers
  if forced and num_workers == 1 and engine_replicas > 1:
    return engine_replicas
  per_worker = min(shares, max(1, devices_per_worker))
  while per_worker > 1 and not divides(global_batch, per_worker * num_workers):
    per_worker -= 1
  return per_worker * num_workers


def keeps_batch_norm(global_batch: int, groups: int) -> bool:
  """Whether a batch split into `groups` equal groups (replicas, systems' micro-batches) gives
  each group's batch-norm statistics BATCH_NORM_MIN_SAMPLES samples (one group always does:
  its statistics are the whole batch's, however small)."""
  return groups == 1 or global_batch // groups >= BATCH_NORM_MIN_SAMPLES


def most_groups_keeping_batch_norm(global_batch: int, limit: int) -> int:
  """The most groups (replicas, systems), at most `limit`, that split the batch evenly and
  keep BATCH_NORM_MIN_SAMPLES samples each (1 when the batch itself is smaller)."""
  return max(n for n in divisors(global_batch, limit) if keeps_batch_norm(global_batch, n))


def smallest_micro_batch_keeping_batch_norm(per_system: int) -> int:
  """The smallest micro-batch whose equal split of `per_system` keeps BATCH_NORM_MIN_SAMPLES
  samples in each (the whole per-system batch when it has fewer)."""
  return -(-per_system // max(1, per_system // BATCH_NORM_MIN_SAMPLES))


def divisors(global_batch: int, limit: int) -> List[int]:
  """Replica counts from 1 to `limit` that split the batch evenly."""
  return [r for r in range(1, max(1, limit) + 1) if divides(global_batch, r)]


def _round_up(x: int, n: int) -> int:
  return -(-x // n) * n


def input_batch_size(params: dict, section: dict) -> int:
  """The batch an input_fn should build: the framework's per-replica batch (the reserved key)
  when it passed one, else its params section's global batch (a direct call, plain Estimator)."""
  if params.get(RESERVED_PARAMS_KEY):
    return int(params[RESERVED_PARAMS_KEY])
  return int(section["batch_size"])
