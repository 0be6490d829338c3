"""EngineSpec: the figures of one wafer-scale engine, loaded from cerebras_tf/engine/specs/<name>.yaml.

Pure Python (no TensorFlow). Every figure in the YAML carries its public source in a comment;
this module only reads, checks and derives. Errors are one-line `ParamsError`s naming the file
and the key.
"""

import dataclasses
import functools
import os
from typing import Any, Dict, Optional, Tuple

import yaml

from cerebras_tf.errors import ParamsError

# The engine YAMLs are package data beside this module (setup.py package_data), so a wheel
# install finds them as a checkout does.
CONFIG_DIR = os.path.normpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "specs"))


@dataclasses.dataclass(frozen=True)
class CalibrationPoint:
  """One published measurement that an achieved-efficiency constant was fitted to.

  Attributes:
    model: e.g. "BERT-Large MSL128".
    engine: "cs2".
    strategy: execution strategy of the measured run ("pipelined", "weight_streaming").
    num_csx: systems used by the measured run.
    batch_size: global batch of the measured run.
    seq_len: sequence length.
    measured_samples_per_sec: the published throughput.
    source: URL / title where the number is published.
    implied_efficiency: achieved fraction of the per-core peak on the cores the model used,
      as this simulator's model computes it (what the constant is fitted from).
    implied_utilization: achieved FLOP/s / peak FLOP/s of all systems used.
  """

  model: str
  engine: str
  strategy: str
  num_csx: int
  batch_size: int
  seq_len: int
  measured_samples_per_sec: float
  source: str
  implied_efficiency: float = 0.0
  implied_utilization: float = 0.0
  notes: str = ""


@dataclasses.dataclass(frozen=True)
class EngineSpec:
  """One engine (CS-1, CS-2, CS-3). Units are in the field names (bytes, Hz, bits/s...).

  `peak_flops` is the dense fp16 peak of the whole wafer (cores * FLOPs/cycle/core * clock);
  planners place layers only on the usable `grid_width x grid_height` cores.
  """

  name: str
  source_path: str
  description: str
  cores: int
  grid_width: int
  grid_height: int
  sram_per_core_bytes: int
  sram_total_bytes: float
  clock_hz: float
  flops_per_core_per_cycle: float
  peak_flops: float
  sram_bandwidth_bytes_per_s: float
  fabric_bandwidth_bits_per_s: float
  io_links: int
  io_link_bits_per_s: float
  memoryx_min_bytes: float
  memoryx_max_bytes: float
  memoryx_bandwidth_bytes_per_s: float
  swarmx_max_systems: int
  sparsity_partial_sum_cycles: float
  pipelined_efficiency: float
  weight_streaming_efficiency: float
  calibration_points: Tuple[CalibrationPoint, ...] = ()
  # Added with the multi-replica / weight-streaming models; defaults keep old YAMLs loadable.
  fabric_link_bits_per_cycle: float = 32.0
  memoryx_max_params: float = 0.0            # 0 = no stated limit
  swarmx_hop_latency_s: float = 1e-6         # one level of the SwarmX broadcast/reduce tree
  sparsity_max_speedup: float = 0.0          # 0 = no stated ceiling
  pipelined_token_latency_cycles: float = 0.0  # per layer, per token: see cs2.yaml
  weight_streaming_layer_overhead_s: float = 0.0  # per layer, per micro-batch: see cs2.yaml
  pipelined_step_overhead_s: float = 0.0          # per step: see cs2.yaml
  weight_streaming_step_overhead_s: float = 0.0   # per step: see cs2.yaml
  # R1.x releases' weight-streaming efficiency, for reading historical figures (0: as R2).
  weight_streaming_efficiency_r1: float = 0.0

  @property
  def usable_cores(self) -> int:
    """Cores a program can use (the SDK's fabric dims)."""
    return self.grid_width * self.grid_height

  @property
  def usable_sram_bytes(self) -> int:
    """SRAM of the usable cores, bytes: what a placement can fill."""
    return self.usable_cores * self.sram_per_core_bytes

  @property
  def flops_per_core_per_s(self) -> float:
    """Dense fp16 peak of one core, FLOP/s."""
    return self.flops_per_core_per_cycle * self.clock_hz

  @property
  def fabric_cross_section_bytes_per_s(self) -> float:
    """Bytes/s across a full-height vertical cut of the grid (one link per row)."""
    return self.grid_height * self.fabric_link_bits_per_cycle / 8.0 * self.clock_hz

  @property
  def io_bytes_per_s(self) -> float:
    """Host-to-wafer input bandwidth, bytes/s (all links)."""
    return self.io_links * self.io_link_bits_per_s / 8.0

  @property
  def io_description(self) -> str:
    return f"{self.io_links} x {self.io_link_bits_per_s / 1e9:g} GbE host links"

  def summary(self) -> Dict[str, Any]:
    """The figures reports print (JSON-friendly)."""
    return {
        "name": self.name, "source_path": self.source_path, "cores": self.cores,
        "grid": [self.grid_width, self.grid_height], "usable_cores": self.usable_cores,
        "sram_per_core_bytes": self.sram_per_core_bytes,
        "usable_sram_bytes": self.usable_sram_bytes, "clock_hz": self.clock_hz,
        "flops_per_core_per_cycle": self.flops_per_core_per_cycle,
        "peak_flops": self.peak_flops, "io_bytes_per_s": self.io_bytes_per_s,
        "pipelined_efficiency": self.pipelined_efficiency,
        "weight_streaming_efficiency": self.weight_streaming_efficiency,
        "pipelined_token_latency_cycles": self.pipelined_token_latency_cycles,
        "memoryx_bandwidth_bytes_per_s": self.memoryx_bandwidth_bytes_per_s,
        "swarmx_hop_latency_s": self.swarmx_hop_latency_s,
        "weight_streaming_layer_overhead_s": self.weight_streaming_layer_overhead_s,
        "pipelined_step_overhead_s": self.pipelined_step_overhead_s,
        "weight_streaming_step_overhead_s": self.weight_streaming_step_overhead_s,
    }


# Package data beside the engine YAMLs that is not an engine (report.txt's error bands).
NOT_ENGINES = ("fidelity_bands.yaml",)


def engine_path(name_or_path: str) -> str:
  """Resolves "cs2" to <repo>/cerebras_tf/engine/specs/cs2.yaml; a path is returned as is."""
  if not isinstance(name_or_path, str) or not name_or_path:
    raise ParamsError(f"engine must be a name like 'cs2' or a YAML path, got {name_or_path!r}")
  if os.sep in name_or_path or name_or_path.endswith((".yaml", ".yml")):
    return name_or_path
  return os.path.join(CONFIG_DIR, name_or_path + ".yaml")


def available_engines() -> Tuple[str, ...]:
  if not os.path.isdir(CONFIG_DIR):
    return ()
  return tuple(sorted(f[:-5] for f in os.listdir(CONFIG_DIR)
                      if f.endswith(".yaml") and f not in NOT_ENGINES))


class _Reader:
  """Typed access to a nested YAML mapping with one-line errors naming file and key."""

  def __init__(self, path: str, data: Dict[str, Any]):
    self.path = path
    self.data = data

  def _get(self, key: str):
    node: Any = self.data
    for part in key.split("."):
      if not isinstance(node, dict) or part not in node:
        raise ParamsError(f"{self.path}: missing key '{key}'")
      node = node[part]
    return node

  def number(self, key: str, positive: bool = True, default: Optional[float] = None) -> float:
    try:
      v = self._get(key)
    except ParamsError:
      if default is not None:
        return default
      raise
    if isinstance(v, str):  # YAML 1.1 reads "40e9" as a string
      try:
        v = float(v)
      except ValueError:
        pass
    if isinstance(v, bool) or not isinstance(v, (int, float)):
      raise ParamsError(f"{self.path}: key '{key}' must be a number, got {v!r}")
    if positive and not v > 0:
      raise ParamsError(f"{self.path}: key '{key}' must be > 0, got {v!r}")
    return float(v)

  def integer(self, key: str) -> int:
    v = self.number(key)
    if v != int(v):
      raise ParamsError(f"{self.path}: key '{key}' must be an integer, got {v!r}")
    return int(v)

  def string(self, key: str, default: Optional[str] = None) -> str:
    try:
      v = self._get(key)
    except ParamsError:
      if default is not None:
        return default
      raise
    if not isinstance(v, str) or not v:
      raise ParamsError(f"{self.path}: key '{key}' must be a non-empty string, got {v!r}")
    return v


def _points(r: _Reader) -> Tuple[CalibrationPoint, ...]:
  raw = r.data.get("calibration", {}).get("points", []) or []
  if not isinstance(raw, list):
    raise ParamsError(f"{r.path}: key 'calibration.points' must be a list")
  fields = {f.name for f in dataclasses.fields(CalibrationPoint)}
  out = []
  for i, p in enumerate(raw):
    key = f"calibration.points[{i}]"
    if not isinstance(p, dict):
      raise ParamsError(f"{r.path}: key '{key}' must be a mapping")
    unknown = sorted(set(p) - fields)
    if unknown:
      raise ParamsError(f"{r.path}: key '{key}.{unknown[0]}' is unknown; "
                        f"known: {', '.join(sorted(fields))}")
    missing = [f for f in ("model", "engine", "strategy", "num_csx", "batch_size", "seq_len",
                           "measured_samples_per_sec", "source") if f not in p]
    if missing:
      raise ParamsError(f"{r.path}: key '{key}.{missing[0]}' is missing")
    pr = _Reader(r.path, {"p": p})
    out.append(CalibrationPoint(
        model=str(p["model"]), engine=str(p["engine"]), strategy=str(p["strategy"]),
        num_csx=pr.integer("p.num_csx"), batch_size=pr.integer("p.batch_size"),
        seq_len=pr.integer("p.seq_len"),
        measured_samples_per_sec=pr.number("p.measured_samples_per_sec"),
        source=str(p["source"]),
        implied_efficiency=pr.number("p.implied_efficiency", positive=False, default=0.0),
        implied_utilization=pr.number("p.implied_utilization", positive=False, default=0.0),
        notes=str(p.get("notes", ""))))
  return tuple(out)


def file_stamp(path: str) -> Optional[tuple]:
  """(inode, size, mtime ns) of `path`, None when it is missing: a cache key that changes when
  the file is rewritten, so a cached parse never outlives an edit."""
  try:
    st = os.stat(path)
  except OSError:
    return None
  return st.st_ino, st.st_size, st.st_mtime_ns


def load_engine(name_or_path: str) -> EngineSpec:
  """Loads and validates an engine YAML; the same unchanged file is parsed once a process
  (PyYAML's pure-Python parse of cs2.yaml takes 11 ms, paid at every compile before).

  Args:
    name_or_path: "cs1" | "cs2" | "cs3" (resolved under cerebras_tf/engine/specs/) or a YAML path.

  Raises:
    ParamsError: unknown engine, unreadable file, missing or malformed key (one line).
  """
  path = engine_path(name_or_path)
  stamp = file_stamp(path)
  if stamp is None or not os.path.isfile(path):
    choices = ", ".join(available_engines()) or "none found in " + CONFIG_DIR
    raise ParamsError(f"unknown engine {name_or_path!r}: no file {path}; choices: {choices}")
  return _load_engine(path, stamp)


@functools.lru_cache(maxsize=32)
def _load_engine(path: str, stamp: tuple) -> EngineSpec:  # pylint: disable=unused-argument
  """load_engine's parse and checks; `stamp` (file_stamp) only keys the cache."""
  try:
    with open(path) as fh:
      data = yaml.safe_load(fh)
  except (OSError, yaml.YAMLError) as e:
    raise ParamsError(f"{path}: cannot read engine YAML: {str(e).splitlines()[0]}") from None
  if not isinstance(data, dict):
    raise ParamsError(f"{path}: must be a mapping of engine figures")
  r = _Reader(path, data)
  cores = r.integer("cores")
  gw, gh = r.integer("grid.width"), r.integer("grid.height")
  if gw * gh > cores:
    raise ParamsError(f"{path}: key 'grid': {gw} x {gh} = {gw * gh} cores exceeds cores={cores}")
  clock = r.number("clock_hz")
  fpc = r.number("flops_per_core_per_cycle")
  peak = r.number("peak_fp16_flops")
  derived = cores * fpc * clock
  if abs(peak - derived) > 0.01 * derived:
    raise ParamsError(f"{path}: key 'peak_fp16_flops' = {peak:.4g} but cores * "
                      f"flops_per_core_per_cycle * clock_hz = {derived:.4g}")
  effs = {}
  for k in ("pipelined_efficiency", "weight_streaming_efficiency"):
    effs[k] = r.number("calibration." + k)
    if effs[k] > 1:
      raise ParamsError(f"{path}: key 'calibration.{k}' must be in (0, 1], got {effs[k]}")
  return EngineSpec(
      name=r.string("name"), source_path=os.path.abspath(path),
      description=r.string("description", default=""),
      cores=cores, grid_width=gw, grid_height=gh,
      sram_per_core_bytes=r.integer("sram_per_core_bytes"),
      sram_total_bytes=r.number("sram_total_bytes"),
      clock_hz=clock, flops_per_core_per_cycle=fpc, peak_flops=peak,
      sram_bandwidth_bytes_per_s=r.number("sram_bandwidth_bytes_per_s"),
      fabric_bandwidth_bits_per_s=r.number("fabric_bandwidth_bits_per_s"),
      io_links=r.integer("io.links"), io_link_bits_per_s=r.number("io.link_bits_per_s"),
      memoryx_min_bytes=r.number("memoryx.min_bytes"),
      memoryx_max_bytes=r.number("memoryx.max_bytes"),
      memoryx_bandwidth_bytes_per_s=r.number("memoryx.bandwidth_bytes_per_s"),
      swarmx_max_systems=r.integer("swarmx.max_systems"),
      sparsity_partial_sum_cycles=r.number("sparsity.partial_sum_overhead_cycles"),
      pipelined_efficiency=effs["pipelined_efficiency"],
      weight_streaming_efficiency=effs["weight_streaming_efficiency"],
      calibration_points=_points(r),
      fabric_link_bits_per_cycle=r.number("fabric_link_bits_per_cycle", default=32.0),
      memoryx_max_params=r.number("memoryx.max_params", positive=False, default=0.0),
      swarmx_hop_latency_s=r.number("swarmx.hop_latency_s", default=1e-6),
      sparsity_max_speedup=r.number("sparsity.max_speedup", positive=False, default=0.0),
      pipelined_token_latency_cycles=r.number("calibration.pipelined_token_latency_cycles",
                                              positive=False, default=0.0),
      weight_streaming_layer_overhead_s=r.number(
          "calibration.weight_streaming_layer_overhead_s", positive=False, default=0.0),
      pipelined_step_overhead_s=r.number("calibration.pipelined_step_overhead_s",
                                         positive=False, default=0.0),
      weight_streaming_step_overhead_s=r.number("calibration.weight_streaming_step_overhead_s",
                                                positive=False, default=0.0),
      weight_streaming_efficiency_r1=r.number("calibration.weight_streaming_efficiency_r1",
                                              positive=False, default=0.0))
