"""The compiler's and the engine's shared vocabulary: strategies, plan options, plans, performance.

Pure data; no TensorFlow, no imports from the rest of the package but `core`. A planner
(`compiler/plan/`) maps (LayerGraph, EngineSpec, PlanOptions) to a Plan; the performance model
(`engine/perf.py`) maps a Plan to a Performance. Both serialize to JSON.
"""

import dataclasses
import math
from typing import Optional, Tuple

from cerebras_tf.core.batching import HOST_CPU_REPLICAS, Batching

# Execution strategies. AUTO lets the compiler pick the fastest one that fits.
PIPELINED = "pipelined"
MULTI_REPLICA = "multi_replica"
WEIGHT_STREAMING = "weight_streaming"
AUTO = "auto"
STRATEGIES = (PIPELINED, MULTI_REPLICA, WEIGHT_STREAMING, AUTO)
PHASES = ("train", "eval", "predict")


@dataclasses.dataclass(frozen=True)
class ExecutionMode:
  """What one execution strategy is, in the terms every layer needs. The planner, the
  performance model, the host runtime, the advisor and the reports ask the plan's mode
  (`Plan.mode`, `mode_of(name)`) instead of comparing strategy names."""

  name: str
  replicates: bool = False           # copies of the model side by side on one wafer
  streams_weights: bool = False      # weights off-wafer in MemoryX, on 1..N systems
  saves_input_position: bool = False  # the host run checkpoints the input with the model
  wording: str = ""                  # what it models, for people

  @property
  def data_parallel(self) -> bool:
    """The host trains it as several replicas of the global batch (mirrored, or the
    systems' shares)."""
    return self.replicates or self.streams_weights

  def label(self, replicas: int = 1) -> str:
    """'multi_replica (R=4)', 'pipelined': the mode as a report names a plan of it."""
    return f"{self.name} (R={replicas})" if self.replicates else self.name

  def conflict(self, num_csx: int = 1, num_replicas: Optional[int] = None,
               max_wgt_servers: int = 1, sparsity: float = 0.0,
               micro_batch_size: Optional[int] = None) -> Optional[Tuple[str, str]]:
    """(key, "key value needs ...") for a setting this mode cannot apply, which it would
    otherwise ignore without a word (2 systems asked for, 1 planned); None when all apply."""
    if not self.streams_weights:
      for key, value, off in (("num_csx", num_csx, 1), ("max_wgt_servers", max_wgt_servers, 1),
                              ("sparsity", sparsity, 0.0),
                              ("micro_batch_size", micro_batch_size, None)):
        if value != off:
          return key, (f"{key} {value} needs execution_strategy weight_streaming or auto "
                       f"({self.name} runs on one system, with the weights on the wafer)")
    if not self.replicates and num_replicas is not None and num_replicas > 1:
      return "num_replicas", (f"num_replicas {num_replicas} needs execution_strategy "
                              f"multi_replica or auto, got '{self.name}'")
    return None


MODES = {m.name: m for m in (
    ExecutionMode(PIPELINED, saves_input_position=True,
                  wording="every layer on its own region of the wafer, all weights in SRAM"),
    ExecutionMode(MULTI_REPLICA, replicates=True,
                  wording="R copies of a small model side by side on one wafer"),
    ExecutionMode(WEIGHT_STREAMING, streams_weights=True,
                  wording="weights in MemoryX, streamed layer by layer to N systems"),
)}


def mode_of(strategy: str) -> ExecutionMode:
  """The mode of a strategy name (not `auto`, which is a choice among them)."""
  return MODES[strategy]


def modes_of(strategy: str) -> Tuple[ExecutionMode, ...]:
  """The modes a strategy setting may plan: all of them for `auto`, else its own."""
  return tuple(MODES.values()) if strategy == AUTO else (MODES[strategy],)


def option_conflict(strategy: str, num_csx: int = 1, num_replicas: Optional[int] = None,
                    max_wgt_servers: int = 1, sparsity: float = 0.0,
                    micro_batch_size: Optional[int] = None) -> Optional[Tuple[str, str]]:
  """The chosen strategy's `ExecutionMode.conflict`; `auto` applies each setting to the
  strategy it belongs to. The one rule for CSConfig and the params file."""
  if strategy not in MODES:
    return None
  return MODES[strategy].conflict(num_csx, num_replicas, max_wgt_servers, sparsity,
                                  micro_batch_size)


def fmt_share(x: float) -> str:
  """A share as a percentage with one decimal, or two significant digits below 0.1% (a tiny
  model's utilization is 0.0045%, not "0.0%")."""
  if 0 < x < 1e-3:
    pct = x * 100
    return f"{pct:.{1 - math.floor(math.log10(pct))}f}%"  # fixed point, never 2.2e-06%
  return f"{x:.1%}"


def fmt_gb(nbytes: float) -> str:
  """Memory for a person: '6.62 GB', '8.39 MB', '0.51 KB' (the largest unit it is 1 of),
  where '0.00 GB' told a small model's user nothing."""
  for unit, size in (("GB", 1e9), ("MB", 1e6)):
    if nbytes >= size:
      return f"{nbytes / size:.2f} {unit}"
  return f"{nbytes / 1e3:.2f} KB"


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
  # The host that trains the plan: hosts of the cluster, data-parallel devices on each.
  num_workers: int = 1
  host_devices: int = HOST_CPU_REPLICAS
  # Weight streaming: samples per micro-batch on each system (None: the compiler picks the
  # fastest that fits); micro_batching=False runs each system's whole batch at once (releases
  # before 2.0 did not accumulate gradients by default), so a batch that does not fit is refused.
  micro_batch_size: Optional[int] = None
  micro_batching: bool = True
  # What a step does: "train" (forward + backward + update), "eval" or "predict" (forward only:
  # no gradients, no optimizer state, no activations kept for a backward pass).
  phase: str = "train"


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
  # Share of the layer's cores' time spent on its FLOPs at the calibrated rate (the rest waits
  # on token latency, the pipeline interval, streaming): comparable with the vendor's
  # per-kernel "PE utilization".
  pe_utilization: float = 0.0
  # Image layers: the tiling, halo and per-core memory on this region (engine/conv.py).
  detail: str = ""

  @classmethod
  def from_dict(cls, d: dict) -> "LayerPlacement":
    d = dict(d)
    if d.get("region") is not None:
      d["region"] = Region(**d["region"])
    return cls(**d)


@dataclasses.dataclass(frozen=True)
class Plan:
  """The compiler's placement decision for one execution strategy."""

  execution_strategy: str
  engine: str
  fits: bool
  batching: Batching                 # global batch, R, systems, host replicas, workers
  memory_needed_bytes: int
  memory_available_bytes: int
  layers: Tuple[LayerPlacement, ...]
  reason: str = ""                   # why it does not fit / why it was chosen
  notes: Tuple[str, ...] = ()
  # Why it does not fit, as data (None when it fits); `reason` is the same for people.
  refusal: Optional["Refusal"] = None

  @property
  def mode(self) -> ExecutionMode:
    return MODES[self.execution_strategy]

  @property
  def label(self) -> str:
    """The plan's mode as reports name it: 'multi_replica (R=4)'."""
    return self.mode.label(self.num_replicas)

  # The batching's numbers under the names the reports and the runtime have always used.
  @property
  def batch_size(self) -> int:
    """The global batch."""
    return self.batching.global_batch

  @property
  def num_replicas(self) -> int:
    """Engine replicas (multi_replica's R; 1 otherwise)."""
    return self.batching.engine_replicas

  @property
  def num_csx(self) -> int:
    return self.batching.num_systems

  def to_dict(self) -> dict:
    d = dataclasses.asdict(self)
    d["batching"] = self.batching.to_dict()
    return d

  @classmethod
  def from_dict(cls, d: dict) -> "Plan":
    d = dict(d)
    d["layers"] = tuple(LayerPlacement.from_dict(l) for l in d["layers"])
    d["notes"] = tuple(d.get("notes", ()))
    d["batching"] = Batching.from_dict(d["batching"])
    if d.get("refusal") is not None:
      d["refusal"] = Refusal(**d["refusal"])
    known = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in known})


# Refusal kinds: why a plan does not fit, for code that decides (auto, multi_replica's choice
# of R, the advisor, tests) without reading prose.
SRAM = "sram"            # the wafer's memory
LAYOUT = "layout"        # memory would fit, the regions do not
COLUMNS = "columns"      # more replicas than the grid has columns
MEMORYX = "memoryx"      # weight streaming's off-wafer store
SYSTEMS = "systems"      # more systems than SwarmX connects
BATCH = "batch"          # weight streaming: the (micro-)batch's activations do not fit the wafer
NO_MEMORYX = "no_memoryx"  # the engine has no MemoryX (cs1)


@dataclasses.dataclass(frozen=True)
class Refusal:
  """Why a plan does not fit, as numbers: `needed` vs `available` of `kind` (bytes, cores...)."""

  kind: str
  needed: float = 0.0
  available: float = 0.0
  unit: str = "bytes"


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
  # The layers' PE utilization (LayerPlacement.pe_utilization) averaged over the cores they
  # occupy (pipelined) or the step's layer time (weight streaming).
  pe_utilization: float = 0.0

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)
