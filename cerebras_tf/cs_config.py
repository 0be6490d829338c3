"""CSConfig and cs_ip parsing: plain Python (no TensorFlow), so the CLI can validate early."""

import collections
import re
from typing import Optional

from cerebras_tf import schema
from cerebras_tf.core import plans
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


class CSConfig(collections.namedtuple(
    "CSConfig", schema.ENGINE_KEYS,
    defaults=[schema.CSCONFIG_FIELDS[k].default for k in schema.ENGINE_KEYS])):
  """How the model runs on the engine: the `csconfig` keys of a params file (but
  `multireplica` and `compile_dir`), declared once in schema.CSCONFIG_FIELDS with their
  types, defaults and help (docs/reference/params.md).

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
    micro_batch_size: samples per weight-streaming micro-batch; None lets the compiler pick
      the fastest that fits.
  """

  def __new__(cls, *args, **kwargs):
    # Each setting is checked by its params-schema Field: one rule for YAML, flags and Python.
    given = super().__new__(cls, *args, **kwargs)._asdict()
    checked = {}
    for key, value in given.items():
      field = schema.CSCONFIG_FIELDS[key]
      try:
        checked[key] = field.check(value)
      except ValueError as e:
        hint = schema.suggest(value, field.choices or (schema.ENGINES if key == "engine" else ()))
        raise ConfigError(f"CSConfig {key} {e}{hint}") from None
    conflict = plans.option_conflict(
        checked["execution_strategy"], checked["num_csx"], checked["num_replicas"],
        checked["max_wgt_servers"], checked["sparsity"], checked["micro_batch_size"])
    if conflict:
      raise ConfigError(f"CSConfig {conflict[1]}")
    return super().__new__(cls, **checked)

  def replace(self, **kwargs) -> "CSConfig":
    return CSConfig(**{**self._asdict(), **kwargs})
