"""What every planner returns, and the planner interface.

Pure data; no TensorFlow. A planner maps (LayerGraph, EngineSpec, PlanOptions) to a Plan; the
performance model (`engine/perf.py`) maps a Plan to a Performance. Both serialize to JSON.
"""

import abc
import dataclasses
from typing import Dict, List, Optional, Tuple

# Execution strategies. AUTO lets the compiler pick the fastest one that fits.
PIPELINED = "pipelined"
MULTI_REPLICA = "multi_replica"
WEIGHT_STREAMING = "weight_streaming"
AUTO = "auto"
STRATEGIES = (PIPELINED, MULTI_REPLICA, WEIGHT_STREAMING, AUTO)


@dataclasses.dataclass(frozen=True)
class PlanOptions:
  """What the user asked for (from params `csconfig` / CSConfig / flags)."""

  batch_size: int                    # global batch size (all replicas, all systems)
  execution_strategy: str = PIPELINED
  num_csx: int = 1                   # systems (weight streaming)
  num_replicas: Optional[int] = None  # multi_replica: None = compiler picks
  max_wgt_servers: int = 1           # MemoryX servers (weight streaming)
  sparsity: float = 0.0              # unstructured weight sparsity (weight streaming)
  vts: bool = False                  # variable tensor shape (cost real tokens only)
  # With vts, measured from the input data by the compiler: E[len]/S and E[len^2]/S^2 over
  # samples (len = real tokens, S = padded length). 1.0 means every token is real.
  token_fraction: float = 1.0
  token_sq_fraction: float = 1.0
  # Where those came from, for the report (compiler/tokens.py:describe).
  vts_source: str = ""


@dataclasses.dataclass(frozen=True)
class Region:
  """A rectangle of cores on the grid: columns [x, x+w), rows [y, y+h)."""

  x: int
  y: int
  w: int
  h: int

  @property
  def cores(self) -> int:
    return self.w * self.h


@dataclasses.dataclass(frozen=True)
class LayerPlacement:
  """Where one layer runs and what it costs there (per step unless said otherwise)."""

  name: str
  cores: int
  region: Optional[Region]           # None when a strategy does not place spatially
  memory_bytes: int                  # SRAM the layer needs in its region
  flops: float                       # fwd+bwd FLOPs per step (whole batch on this replica)
  time_s: float                      # the layer's busy time per step
  replica: int = 0


@dataclasses.dataclass(frozen=True)
class Plan:
  """The compiler's placement decision for one execution strategy."""

  execution_strategy: str
  engine: str
  fits: bool
  batch_size: int                    # global
  num_replicas: int
  num_csx: int
  memory_needed_bytes: int
  memory_available_bytes: int
  layers: Tuple[LayerPlacement, ...]
  reason: str = ""                   # why it does not fit / why it was chosen
  notes: Tuple[str, ...] = ()

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class TimelineEvent:
  """One span of the simulated step, for the Perfetto/chrome trace."""

  name: str
  track: str                         # e.g. "compute", "io", "stream-in", "layer_3"
  start_s: float
  dur_s: float


@dataclasses.dataclass(frozen=True)
class Performance:
  """What the performance model predicts for a Plan."""

  samples_per_sec: float
  step_time_s: float
  utilization: float                 # achieved FLOP/s / peak FLOP/s
  bottleneck: str                    # e.g. "compute: bert/encoder/layer_3", "io: 12x100GbE"
  compute_samples_per_sec: float
  io_samples_per_sec: float
  timeline: Tuple[TimelineEvent, ...] = ()
  # With options.vts: samples/s if every sample were padded to the full sequence (the
  # samples_per_sec above then counts real tokens only). Without vts it equals samples_per_sec.
  padded_samples_per_sec: float = 0.0
  notes: Tuple[str, ...] = ()        # model details worth a line in report.txt

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)


class Planner(abc.ABC):
  """Maps a LayerGraph onto an engine for one execution strategy.

  Implementations are pure functions of their inputs (no TensorFlow, no global state), so the
  same (graph, engine, options) always gives the same Plan.
  """

  strategy: str = ""

  @abc.abstractmethod
  def plan(self, graph, engine, options: PlanOptions) -> Plan:
    """Returns the Plan; a model that does not fit gives `fits=False` and a reason, not a raise.

    Args:
      graph: `cerebras_tf.compiler.ir.LayerGraph`.
      engine: `cerebras_tf.engine.spec.EngineSpec`.
      options: what the user asked for (batch size, strategy, systems...).
    """
