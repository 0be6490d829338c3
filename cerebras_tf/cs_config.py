"""CSConfig and cs_ip parsing: plain Python (no TensorFlow), so the CLI can validate early."""

import collections
import json
import re
from typing import Optional

from cerebras_tf.compiler.plan import base as plan_base
from cerebras_tf.errors import ConfigError

DEFAULT_CS_PORT = 9000

_HOST_RE = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,62})(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62}))*$")
_IPV4_RE = re.compile(r"^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$")


def parse_cs_ip(cs_ip: Optional[str]) -> Optional[str]:
  """Validates `host[:port]` and returns it normalized as `host:port` (default port 9000).

  None or "" means: no remote system, the embedded simulated engine serves.
  """
  if cs_ip is None or cs_ip == "":
    return None
  if not isinstance(cs_ip, str):
    raise ConfigError(f"cs_ip must be a string 'host[:port]', got {type(cs_ip).__name__} {cs_ip!r}")
  text = cs_ip.strip()
  host, sep, port_text = text.rpartition(":")
  if not sep:
    host, port_text = text, str(DEFAULT_CS_PORT)
  if not port_text.isdigit() or not 0 < int(port_text) < 65536:
    raise ConfigError(f"cs_ip {cs_ip!r}: port must be a number from 1 to 65535 (format host[:port], e.g. 10.0.0.5:9000)")
  m = _IPV4_RE.match(host)
  if m:
    if any(int(g) > 255 for g in m.groups()):
      raise ConfigError(f"cs_ip {cs_ip!r}: {host} is not a valid IPv4 address (each part 0-255)")
  elif not _HOST_RE.match(host) or host.replace(".", "").isdigit():
    raise ConfigError(f"cs_ip {cs_ip!r}: {host!r} is not a valid host name or IPv4 address (format host[:port])")
  return f"{host}:{int(port_text)}"


_TF_CONFIG_EXAMPLE = ('{"cluster": {"ps": ["host:port"]}, "task": {"type": "chief", "index": 0}}')


def check_tf_config(raw: Optional[str]) -> Optional[dict]:
  """Validates the TF_CONFIG environment variable's text (None or "": not set).

  tf.estimator.RunConfig parses TF_CONFIG itself and fails with a bare JSONDecodeError or
  TypeError; this checks the same shape first and raises one ConfigError line instead.
  """
  if raw is None or not raw.strip():
    return None
  shown = raw if len(raw) <= 60 else raw[:57] + "..."
  try:
    cfg = json.loads(raw)
  except ValueError as e:
    raise ConfigError(f"TF_CONFIG is not valid JSON ({e.msg} at char {e.pos}): {shown!r}; "
                      f"expected e.g. {_TF_CONFIG_EXAMPLE}") from None
  if not isinstance(cfg, dict) or not isinstance(cfg.get("cluster", {}), dict):
    raise ConfigError("TF_CONFIG must be a JSON object with a 'cluster' mapping of job name to "
                      f"a list of 'host:port' and a 'task'; got {shown!r}")
  cluster = cfg.get("cluster") or {}
  for job, tasks in cluster.items():
    addresses = list(tasks.values()) if isinstance(tasks, dict) else tasks
    if (not isinstance(addresses, list) or not addresses
        or not all(isinstance(a, str) and _host_port_ok(a) for a in addresses)):
      raise ConfigError(f"TF_CONFIG cluster.{job} must be a non-empty list of 'host:port' "
                        f"strings, got {json.dumps(tasks)[:60]}")
  task = cfg.get("task")
  if cluster:
    if not isinstance(task, dict) or not isinstance(task.get("type"), str):
      raise ConfigError("TF_CONFIG has a cluster but no task {\"type\": JOB, \"index\": N}: "
                        "which task is this process?")
    index = task.get("index", 0)
    if task["type"] not in cluster:
      raise ConfigError(f"TF_CONFIG task.type {task['type']!r} is not a job of the cluster "
                        f"({', '.join(cluster)})")
    if (isinstance(index, bool) or not isinstance(index, int)
        or not 0 <= index < len(cluster[task["type"]])):
      raise ConfigError(f"TF_CONFIG task.index {index!r} must be an int from 0 to "
                        f"{len(cluster[task['type']]) - 1} (tasks of job {task['type']!r})")
  return cfg


def _host_port_ok(address: str) -> bool:
  host, sep, port = address.rpartition(":")
  return bool(sep and host and port.isdigit() and 0 < int(port) < 65536)


class CSConfig(collections.namedtuple("CSConfig", [
    "execution_strategy", "engine", "num_csx", "max_wgt_servers", "num_replicas",
    "sparsity", "vts"])):
  """How the model runs on the engine.

  Attributes:
    execution_strategy: "pipelined", "multi_replica", "weight_streaming" or "auto" (the
      default, as in the params schema: the compiler plans each, keeps the fastest predicted
      one that fits and says why in report.txt; training then runs that mode).
    engine: engine model name ("cs1", "cs2", "cs3") or a path to an engine YAML.
    num_csx: number of systems (weight streaming; >= 1).
    max_wgt_servers: MemoryX weight servers (weight streaming; >= 1).
    num_replicas: multi_replica copies; None lets the compiler choose.
    sparsity: unstructured weight sparsity in [0, 1) (weight streaming).
    vts: cost only real (unpadded) tokens (variable tensor shape).
  """

  def __new__(cls, execution_strategy=plan_base.AUTO, engine="cs2", num_csx=1,
              max_wgt_servers=1, num_replicas=None, sparsity=0.0, vts=False):
    if execution_strategy not in plan_base.STRATEGIES:
      raise ConfigError(f"execution_strategy {execution_strategy!r} is not one of {', '.join(plan_base.STRATEGIES)}")
    if not isinstance(engine, str) or not engine:
      raise ConfigError(f"engine must be an engine name such as 'cs2' or a path to an engine YAML, got {engine!r}")
    for key, value in (("num_csx", num_csx), ("max_wgt_servers", max_wgt_servers)):
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{key} must be an integer >= 1, got {value!r}")
    if num_replicas is not None and (isinstance(num_replicas, bool) or not isinstance(num_replicas, int) or num_replicas < 1):
      raise ConfigError(f"num_replicas must be an integer >= 1 or None (compiler picks), got {num_replicas!r}")
    if isinstance(sparsity, bool) or not isinstance(sparsity, (int, float)) or not 0.0 <= sparsity < 1.0:
      raise ConfigError(f"sparsity must be a number in [0, 1), got {sparsity!r}")
    return super().__new__(cls, execution_strategy, engine, int(num_csx), int(max_wgt_servers),
                           num_replicas, float(sparsity), bool(vts))

  def replace(self, **kwargs) -> "CSConfig":
    return CSConfig(**{**self._asdict(), **kwargs})
