"""TF_CONFIG, read and checked in one place (plain Python: the CLI checks it before TF starts).

tf.estimator.RunConfig parses TF_CONFIG itself and fails with a bare JSONDecodeError, TypeError
or ValueError; `parse` checks the same shape first and raises one ConfigError line instead.
Everything else (the runtime, the weight-server cluster, the batch split) reads `current()`.
"""

import dataclasses
import json
import os
from typing import Dict, List, Optional

from cerebras_tf.errors import ConfigError

_EXAMPLE = ('{"cluster": {"chief": ["host0:port"], "worker": ["host1:port"]}, '
            '"task": {"type": "chief", "index": 0}}')


@dataclasses.dataclass(frozen=True)
class TFConfig:
  """The cluster this process belongs to and which task it is."""

  cluster: Dict[str, List[str]]
  task_type: Optional[str]
  task_index: int

  @property
  def num_workers(self) -> int:
    """Hosts that train (chief + workers)."""
    return len(self.cluster.get("chief", [])) + len(self.cluster.get("worker", []))

  @property
  def multi_worker(self) -> bool:
    return self.num_workers > 1

  @property
  def ps(self) -> List[str]:
    return list(self.cluster.get("ps", []))

  @property
  def task(self) -> str:
    """`worker:1 (host:port)`, for messages."""
    address = self.cluster.get(self.task_type, [""] * (self.task_index + 1))[self.task_index]
    return f"{self.task_type}:{self.task_index} ({address})"


def parse(raw: Optional[str]) -> Optional[TFConfig]:
  """Validates TF_CONFIG's text (None or blank: not set) and returns it typed."""
  if raw is None or not raw.strip():
    return None
  shown = raw if len(raw) <= 60 else raw[:57] + "..."
  try:
    cfg = json.loads(raw)
  except ValueError as e:
    raise ConfigError(f"TF_CONFIG is not valid JSON ({e.msg} at char {e.pos}): {shown!r}; "
                      f"expected e.g. {_EXAMPLE}") from None
  if not isinstance(cfg, dict) or not isinstance(cfg.get("cluster", {}), dict):
    raise ConfigError("TF_CONFIG must be a JSON object with a 'cluster' mapping of job name to "
                      f"a list of 'host:port' and a 'task'; got {shown!r}")
  cluster = {}
  for job, tasks in (cfg.get("cluster") or {}).items():
    addresses = list(tasks.values()) if isinstance(tasks, dict) else tasks
    if (not isinstance(addresses, list) or not addresses
        or not all(isinstance(a, str) and _host_port_ok(a) for a in addresses)):
      raise ConfigError(f"TF_CONFIG cluster.{job} must be a non-empty list of 'host:port' "
                        f"strings, got {json.dumps(tasks)[:60]}")
    cluster[job] = addresses
  task = cfg.get("task")
  task_type, index = None, 0
  if cluster:
    if not isinstance(task, dict) or not isinstance(task.get("type"), str):
      raise ConfigError("TF_CONFIG has a cluster but no task {\"type\": JOB, \"index\": N}: "
                        "which task is this process?")
    task_type, index = task["type"], task.get("index", 0)
    if task_type not in cluster:
      raise ConfigError(f"TF_CONFIG task.type {task_type!r} is not a job of the cluster "
                        f"({', '.join(cluster)})")
    if (isinstance(index, bool) or not isinstance(index, int)
        or not 0 <= index < len(cluster[task_type])):
      raise ConfigError(f"TF_CONFIG task.index {index!r} must be an int from 0 to "
                        f"{len(cluster[task_type]) - 1} (tasks of job {task_type!r})")
    seen = {}
    for job, addresses in cluster.items():
      for i, a in enumerate(addresses):
        if a in seen:
          raise ConfigError(f"TF_CONFIG: {job}:{i} and {seen[a]} have the same address {a}; "
                            "every task needs its own host:port")
        seen[a] = f"{job}:{i}"
    workers = cluster.get("worker", [])
    if len(cluster.get("chief", [])) > 1:
      raise ConfigError("TF_CONFIG cluster.chief must have exactly one task")
    if workers and "chief" not in cluster:
      raise ConfigError(f"TF_CONFIG names {len(workers)} worker(s) and no chief: tf.estimator "
                        "needs one 'chief' task (it writes checkpoints); make the first worker "
                        "the chief, e.g. scripts/launch.py --print_tf_config")
  return TFConfig(cluster, task_type, index)


def non_chief_task() -> Optional[TFConfig]:
  """This process's cluster when it is a task other than the chief of a multi-worker cluster
  (the chief alone evaluates for run.py and writes model_dir/eval); None otherwise."""
  cluster = current()
  if cluster is None or not cluster.multi_worker or cluster.task_type == "chief":
    return None
  return cluster


def eval_name_of_this_task() -> Optional[str]:
  """None (model_dir/eval) on the chief or without a cluster; "worker_0" on worker 0, so its
  events go to model_dir/eval_worker_0: tasks evaluating in the same second wrote the same
  event file name into model_dir/eval and clobbered the chief's."""
  cluster = non_chief_task()
  return None if cluster is None else f"{cluster.task_type}_{cluster.task_index}"


def current() -> Optional[TFConfig]:
  """This process's TF_CONFIG, parsed (None when it is not set)."""
  return parse(os.environ.get("TF_CONFIG"))


def _host_port_ok(address: str) -> bool:
  host, sep, port = address.rpartition(":")
  return bool(sep and host and port.isdigit() and 0 < int(port) < 65536)
