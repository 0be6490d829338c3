"""How much memory this process can still get for a training run (plain Python, Linux /proc
and cgroup files, and the process's own rlimits; None where none of them say, and the caller
skips its check).

The least of what each limit leaves is what counts: the machine's MemAvailable; the memory
cgroup the process runs in (v2 `memory.max` - `memory.current`, v1 `memory.limit_in_bytes` -
`memory.usage_in_bytes`, each level up to the root, as a container or a scheduler's job sets
it); and the process's address-space and data rlimits (`ulimit -v`, `ulimit -d`) less what it
already maps. Reading only the machine's memory let a job under `ulimit -v` 4 GiB start a 4.3 GB
model and end in a 167-line ResourceExhaustedError.

`check_holds` compares that with what a compiled model needs here before a training run starts.
"""

import os
import resource
from typing import Iterable, List, Optional, Tuple

from cerebras_tf.core import ir, plans
from cerebras_tf.errors import FitError
from cerebras_tf.runtime import tf_config

# cgroup v1 writes "no limit" as the largest page-aligned int64 (9223372036854771712).
_NO_LIMIT = 2 ** 62


def _read_int(path: str) -> Optional[int]:
  try:
    with open(path, encoding="ascii") as fh:
      text = fh.read().strip()
  except OSError:
    return None
  if not text.isdigit():
    return None  # cgroup v2's "max" means no limit
  value = int(text)
  return value if value < _NO_LIMIT else None


def _mem_available(meminfo: str) -> Optional[int]:
  try:
    with open(meminfo, encoding="ascii") as fh:
      for line in fh:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) * 1024
  except (OSError, ValueError, IndexError):
    return None
  return None


def _cgroup_paths(proc_cgroup: str) -> Tuple[Optional[str], Optional[str]]:
  """(v2 path, v1 memory path) of this process's cgroups, from /proc/self/cgroup."""
  v2 = v1 = None
  try:
    with open(proc_cgroup, encoding="utf-8") as fh:
      for line in fh:
        parts = line.rstrip("\n").split(":", 2)
        if len(parts) != 3:
          continue
        if parts[0] == "0" and parts[1] == "":
          v2 = parts[2]
        elif "memory" in parts[1].split(","):
          v1 = parts[2]
  except OSError:
    pass
  return v2, v1


def _levels(root: str, path: Optional[str]) -> List[str]:
  """root/path and each directory above it up to root (a parent's limit binds its children);
  just root when the path is unknown (in a container the namespace's root is its own)."""
  out = []
  parts = [p for p in (path or "").split("/") if p]
  for i in range(len(parts), -1, -1):
    out.append(os.path.join(root, *parts[:i]))
  return out


def _cgroup_left(dirs: Iterable[str], limit_file: str, usage_file: str) -> Optional[int]:
  found = None
  for d in dirs:
    limit, used = _read_int(os.path.join(d, limit_file)), _read_int(os.path.join(d, usage_file))
    if limit is not None and used is not None:
      left = max(0, limit - used)
      found = left if found is None else min(found, left)
  return found


def _status_bytes(status: str, key: str) -> Optional[int]:
  try:
    with open(status, encoding="ascii") as fh:
      for line in fh:
        if line.startswith(key + ":"):
          return int(line.split()[1]) * 1024
  except (OSError, ValueError, IndexError):
    return None
  return None


def _rlimit_left(status: str, rlimits) -> Optional[int]:
  """What `ulimit -v` (RLIMIT_AS, against VmSize) and `ulimit -d` (RLIMIT_DATA, against VmData)
  leave this process."""
  found = None
  for which, key in ((resource.RLIMIT_AS, "VmSize"), (resource.RLIMIT_DATA, "VmData")):
    soft = rlimits(which)[0]
    if soft in (resource.RLIM_INFINITY, -1) or soft >= _NO_LIMIT:
      continue
    used = _status_bytes(status, key) or 0
    left = max(0, soft - used)
    found = left if found is None else min(found, left)
  return found


def available_bytes(meminfo: str = "/proc/meminfo", cgroup: str = "/sys/fs/cgroup",
                    proc_cgroup: str = "/proc/self/cgroup", status: str = "/proc/self/status",
                    rlimits=resource.getrlimit) -> Optional[int]:
  """The least that MemAvailable, this process's memory cgroup (v2 or v1) and its rlimits
  leave; None when none of them is known."""
  v2, v1 = _cgroup_paths(proc_cgroup)
  left = [_mem_available(meminfo),
          _cgroup_left(_levels(cgroup, v2), "memory.max", "memory.current"),
          _cgroup_left(_levels(os.path.join(cgroup, "memory"), v1),
                       "memory.limit_in_bytes", "memory.usage_in_bytes"),
          _rlimit_left(status, rlimits)]
  known = [n for n in left if n is not None]
  return min(known) if known else None


def check_holds(graph: ir.LayerGraph, plan: plans.Plan) -> None:
  """TensorFlow runs the numerics on this machine, in float32: weights, gradients and optimizer
  slots (a copy per host replica), and the activations the gradient reads, for this worker's
  share of the batch. A model whose state cannot fit here made the weight server segfault on
  allocation, four restarts and minutes later; a 2048x2048 CNN at batch 16 (21 GB of kept
  activations, 24 GB free) ended in an allocator dump and a segfault (exit 139). Weight
  streaming with a TF_CONFIG cluster's own weight servers keeps the state on their hosts.

  The activations counted are a lower bound (TensorFlow's backward pass needs more on top: the
  CNN above peaked at about 1.4x), so only a run that cannot fit is refused.

  Args:
    graph, plan: a compile's traced graph (state and kept-activation bytes) and its plan (the
      batch split over this worker's host replicas; weight streaming).
  Raises:
    FitError: naming both sizes, what is available, and what to lower.
  """
  cluster = tf_config.current()
  remote_state = plan.mode.streams_weights and cluster and cluster.ps
  batching_ = plan.batching
  copies = max(1, batching_.host_replicas_per_worker)
  state = 0 if remote_state else graph.state_bytes * copies
  activations = graph.host_activation_bytes * batching_.per_worker
  need, have = state + activations, available_bytes()
  if have is None or need <= have:
    return
  parts = []
  if state:
    parts.append(f"{_fmt_bytes(state)} for {graph.num_params:,} float32 parameters with "
                 f"their gradients and {graph.optimizer} state"
                 f"{f', {copies} host replicas' if copies > 1 else ''}")
  if activations:
    parts.append(f"{_fmt_bytes(activations)} at least for the activations the gradient "
                 f"reads, {batching_.per_worker} samples a step")
  fix = ("make the model smaller" if state > have
         else "lower train_input.batch_size (params['batch_size']), or the input size")
  raise FitError(
      f"training this model on this machine needs about {_fmt_bytes(need)} of memory "
      f"(TensorFlow runs the numerics here: {'; '.join(parts)}), and {_fmt_bytes(have)} "
      f"is available; the engine's answers (fit, speed, placement) need no training "
      f"(--compile_only, or CerebrasEstimator.compile); to train here, {fix}")


def _fmt_bytes(n: float) -> str:
  """As the reports print memory (engine/report.fmt_bytes): '115.01 KB', '512 B'."""
  return f"{n:.0f} B" if n < 1e3 else plans.fmt_gb(n)
