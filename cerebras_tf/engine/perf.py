"""The analytical performance model: Plan -> Performance (samples/s, utilization, bottleneck).

Pure function of (plan, graph, engine, options); no TensorFlow, no state.

Pipelined mode (one replica, layers side by side, samples streamed through):
  * layer i on c_i cores spends, per sample,
      t_i = flops_i / (c_i * FLOP/s per core * efficiency) + tokens * L_tok / clock
    The second term is a per-layer, per-token latency that more cores do not shorten (a token's
    activation vector fans out across the layer's region and its partial sums reduce along a
    chain of cores; see `pipelined_token_latency_cycles` in the engine YAML). It is why small
    models saturate: past a point extra cores buy nothing, and copies (multi_replica) help;
  * the pipeline runs at the slowest layer's rate 1 / max_i t_i (compute samples/s), which
    names the layer;
  * the host feeds `io_links x link bandwidth / input bytes per sample` samples/s (the sum of
    the layers' io_bytes);
  * samples/s = min(compute, io); a step of `batch` samples takes batch / samples/s (steady
    state: the pipeline keeps streaming across steps, so fill and drain are hidden);
  * utilization = samples/s * FLOPs per sample / peak FLOP/s of the wafer.
Multi-replica: R such pipelines side by side, each on its own slab of the grid with B/R of the
batch, plus a gradient all-reduce between the slabs at the end of every step.
Weight streaming: see `ws_cost`.
VTS (options.vts): the FLOPs of linear layers scale by token_fraction, of quadratic ones by
token_sq_fraction, of per-sequence ones ("none") not at all; a layer whose FLOPs are a share q
token-pair work (`Layer.pair_share`, e.g. a value projection that absorbed the attention
core) scales by (1 - q) token_fraction + q token_sq_fraction. The per-token latency scales by
token_fraction in every layer (only real tokens stream). The padded rate is reported beside.
`efficiency` is the calibration constant fitted to published measured runs (engine YAML).
"""

import dataclasses
import math
from typing import List, Optional, Sequence, Tuple

from cerebras_tf.core import ir
from cerebras_tf.core import batching, plans


def _not_fit(plan: plans.Plan) -> plans.Performance:
  return plans.Performance(samples_per_sec=0.0, step_time_s=math.inf, utilization=0.0,
                          bottleneck=f"does not fit: {plan.reason}",
                          compute_samples_per_sec=0.0, io_samples_per_sec=0.0)


def io_samples_per_sec(graph: ir.LayerGraph, engine) -> float:
  """Samples/s the host links can feed (inf when the graph declares no input bytes)."""
  io_bytes = sum(l.io_bytes for l in graph.layers)
  return engine.io_bytes_per_s / io_bytes if io_bytes > 0 else math.inf


def tokens_per_sample(graph: ir.LayerGraph) -> float:
  """Positions a sample carries through a layer (1 for non-sequence models)."""
  return float(graph.seq_len) if graph.seq_len > 0 else 1.0


def vts_scale(layer: ir.Layer, options: Optional[plans.PlanOptions], vts: bool = True):
  """(FLOPs factor, token factor) of a layer under VTS; (1, 1) when VTS is off."""
  if options is None or not options.vts or not vts:
    return 1.0, 1.0
  if layer.token_scaling == "none":
    # Fixed positions (BERT's 20 masked-LM predictions): the FLOPs stay, but only the sample's
    # real tokens stream through the region (`layer_tokens`), so the latency shrinks.
    return 1.0, options.token_fraction
  q = layer.pair_share or (1.0 if layer.token_scaling == "quadratic" else 0.0)
  return ((1.0 - q) * options.token_fraction + q * options.token_sq_fraction,
          options.token_fraction)


def vts_notes(sps: float, padded: float, options: plans.PlanOptions) -> Tuple[str, ...]:
  """Report lines for VTS: the two rates, the fractions, and where the lengths came from."""
  if not options.vts:
    return ()
  out = (f"VTS: {sps:,.1f} samples/s on real tokens vs {padded:,.1f} padded "
         f"(token_fraction {options.token_fraction:.3f}, token_sq_fraction "
         f"{options.token_sq_fraction:.3f})",)
  if options.vts_source:
    out += (f"VTS {options.vts_source}",)
  return out


def layer_tokens(layer: ir.Layer, graph: ir.LayerGraph) -> float:
  """Tokens per sample that stream through a layer: the padded sequence, for every layer.

  Per-sequence heads ("none") work on fewer positions, but the IR does not say how many and
  the sample still streams through their region; VTS leaves their FLOPs unscaled and scales
  this streaming by token_fraction like every other layer's (`vts_scale`).
  """
  del layer
  return tokens_per_sample(graph)


def pipelined_sample_time(layer: ir.Layer, cores: float, graph: ir.LayerGraph, engine,
                          options: Optional[plans.PlanOptions] = None, vts: bool = True,
                          strategy: str = plans.PIPELINED) -> float:
  """Seconds a layer on `cores` cores spends per sample in a pipeline (see module docstring).

  0 for a layer without FLOPs (it only holds memory); inf for a layer with FLOPs but no cores.
  """
  if layer.flops <= 0:
    return 0.0
  if cores <= 0:
    return math.inf
  fs, ts = vts_scale(layer, options, vts)
  rate = engine.flops_per_core_per_s * engine.efficiency(strategy)
  latency = layer_tokens(layer, graph) * ts * engine.pipelined_token_latency_cycles
  return layer.flops * fs / (cores * rate) + latency / engine.clock_hz


def layer_rates(plan: plans.Plan, graph: ir.LayerGraph, engine,
                options: Optional[plans.PlanOptions] = None, vts: bool = True,
                replica: int = 0) -> List[float]:
  """Samples/s each placed layer of one replica sustains (inf for layers without FLOPs)."""
  out = []
  for p, l in zip(replica_layers(plan, replica), graph.layers):
    t = pipelined_sample_time(l, p.cores, graph, engine, options, vts)
    out.append(1.0 / t if t > 0 else math.inf)
  return out


def replica_layers(plan: plans.Plan, replica: int = 0) -> List[plans.LayerPlacement]:
  """The placements of one replica, in program order."""
  return [p for p in plan.layers if p.replica == replica]


def _timeline(plan, graph, engine, step_s, io_sps, options=None) -> Tuple[plans.TimelineEvent, ...]:
  """One steady-state step: each layer's fwd and bwd busy time, offset by the fill latency.

  In the hardware a layer interleaves forward and backward work sample by sample; the trace
  draws each layer's per-step forward busy time, then its backward busy time, starting when the
  first sample reaches it (sum of the per-sample forward latencies of the layers before it).
  Multi-replica: replica 0's layers (the copies run the same schedule).
  """
  batch = plan.batch_size // max(1, plan.num_replicas)
  events = [plans.TimelineEvent("step", "step", 0.0, step_s)]
  if math.isfinite(io_sps):
    events.append(plans.TimelineEvent("host input", "io", 0.0, plan.batch_size / io_sps))
  offset = 0.0
  for p, l in zip(replica_layers(plan, 0), graph.layers):
    if p.cores <= 0 or l.flops <= 0:
      continue
    t = pipelined_sample_time(l, p.cores, graph, engine, options)
    tf, tb = t * l.fwd_flops / l.flops, t * l.bwd_flops / l.flops
    if tf > 0:
      events.append(plans.TimelineEvent("fwd", p.name, offset, batch * tf))
    if tb > 0:
      events.append(plans.TimelineEvent("bwd", p.name, offset + batch * tf, batch * tb))
    offset += tf
  return tuple(events)


def pipeline_rate(plan: plans.Plan, graph: ir.LayerGraph, engine,
                  options: Optional[plans.PlanOptions] = None, vts: bool = True,
                  replica: int = 0) -> Tuple[float, int]:
  """(samples/s of one replica's pipeline, index of its slowest layer)."""
  rates = layer_rates(plan, graph, engine, options, vts, replica)
  slowest = min(range(len(rates)), key=lambda i: (rates[i], i))
  return rates[slowest], slowest


def allreduce_time_s(graph: ir.LayerGraph, engine, replicas: int) -> float:
  """Seconds to all-reduce one replica's gradients among `replicas` slabs on the wafer.

  Ring all-reduce along the row of slabs: 2 (R-1)/R of the gradient bytes cross each slab
  boundary, whose bandwidth is one fabric link per grid row (grid_height x 32 bits x clock).
  """
  if replicas <= 1:
    return 0.0
  grad = sum(l.grad_bytes for l in graph.layers)
  return 2.0 * (replicas - 1) / replicas * grad / engine.fabric_cross_section_bytes_per_s


def _pipelined_like(plan, graph, engine, options, vts):
  """(samples/s, compute samples/s, io samples/s, slowest layer name) of a (multi-)pipeline."""
  r = max(1, plan.num_replicas)
  compute_sps, slowest = pipeline_rate(plan, graph, engine, options, vts)
  if r > 1 and compute_sps > 0 and math.isfinite(compute_sps):
    per = plan.batch_size / r
    step = per / compute_sps + allreduce_time_s(graph, engine, r)
    compute_sps = plan.batch_size / step
  io_sps = io_samples_per_sec(graph, engine)
  if not math.isfinite(compute_sps) and not math.isfinite(io_sps):
    compute_sps = io_sps = 0.0  # nothing to do: no FLOPs, no input
  name = replica_layers(plan, 0)[slowest].name
  return min(compute_sps, io_sps), compute_sps, io_sps, name


def simulate_pipelined(plan: plans.Plan, graph: ir.LayerGraph, engine,
                       options: plans.PlanOptions) -> plans.Performance:
  """Performance of a pipelined or multi-replica Plan (see the module docstring)."""
  if not plan.fits:
    return _not_fit(plan)
  sps, compute_sps, io_sps, slow = _pipelined_like(plan, graph, engine, options, True)
  padded = _pipelined_like(plan, graph, engine, options, False)[0] if options.vts else sps
  if compute_sps <= io_sps:
    bottleneck = f"compute: {slow}"
    if plan.num_replicas > 1:
      bottleneck += f" (each of {plan.num_replicas} replicas)"
  else:
    bottleneck = f"io: {engine.io_description}"
  step = plan.batch_size / sps if sps > 0 else math.inf
  flops = sum(l.flops * vts_scale(l, options)[0] for l in graph.layers)
  util = sps * flops / engine.peak_flops
  notes = []
  if plan.num_replicas > 1:
    notes.append(f"gradient all-reduce between {plan.num_replicas} replicas: "
                 f"{allreduce_time_s(graph, engine, plan.num_replicas) * 1e3:.3f} ms per step")
  notes.extend(vts_notes(sps, padded, options))
  return plans.Performance(
      samples_per_sec=sps, step_time_s=step, utilization=util, bottleneck=bottleneck,
      compute_samples_per_sec=compute_sps, io_samples_per_sec=io_sps,
      timeline=_timeline(plan, graph, engine, step, io_sps, options) if sps > 0 else (),
      padded_samples_per_sec=padded, notes=tuple(notes))


# ---------------------------------------------------------------------------------------------
# Weight streaming.
#
# Per system: the whole usable grid works on one layer at a time for its b = B / num_csx
# samples (split into micro-batches of m when their activations do not fit, see `ws_cost`).
# For each layer and micro-batch:
#   compute    = m * flops_eff / (cores * FLOP/s per core * efficiency)
#                + 3 passes (fwd, dX, dW) * sqrt(params) output features * partial-sum cycles
#                  (seed 003: 4 cycles per output feature, paid whatever the sparsity)
#                flops_eff = GEMM FLOPs * (1 - sparsity) + the other FLOPs (attention, norms)
#                + recomputed forward FLOPs when not even one sample's activations fit
#   stream-in  = 2 (fwd + bwd) * weight bytes streamed / MemoryX bandwidth
#   stream-out = gradient bytes / MemoryX bandwidth on the last micro-batch (gradients are
#                accumulated on the wafer and reduced through SwarmX once per step)
#   latency    = SwarmX tree depth ceil(log2 num_csx) * hop latency, twice per micro-batch
#                (weights broadcast for fwd and bwd) and once more per step (gradient reduce)
#   time       = max(compute, stream-in, stream-out) + latency; the max names the bound.
# Per step, each layer also pays a fixed `weight_streaming_layer_overhead_s` (fitted; the
# per-layer step cost the FLOPs do not explain: the layer's gradient reduce and optimizer update
# before its next forward, kernel switches). It does not shrink with the per-system batch,
# so it is what bends the scaling of smaller models across systems.
# The sqrt(params) proxy for output features is exact for square matrices (the IR does not
# record matrix shapes). Sparse weights stream as (value, index) pairs: (1 - s) * 4 bytes.
# ---------------------------------------------------------------------------------------------

WS_PASSES = 3            # forward, input gradient, weight gradient
_SPARSE_INDEX_BYTES = 2  # seed 003: weights "arrive tagged with an index field"


@dataclasses.dataclass(frozen=True)
class WSLayerCost:
  """One layer's per-micro-batch costs on one system, seconds."""

  name: str
  compute_s: float
  stream_in_s: float
  stream_out_s: float      # per micro-batch (0: gradients leave once per step)
  grad_out_s: float        # once per step (last micro-batch)
  bound: str               # "compute" | "stream-in" | "stream-out"


@dataclasses.dataclass(frozen=True)
class WSCost:
  """Weight-streaming step on each of num_csx systems (see the comment block above)."""

  num_csx: int
  per_system_batch: int
  micro_batch: int
  num_micro: int
  recompute_fraction: float       # share of forward FLOPs recomputed (0 = all kept)
  layers: Tuple[WSLayerCost, ...]
  latency_s: float                # SwarmX tree latency per step
  overhead_s: float               # fixed per-layer step overhead, summed
  compute_step_s: float           # the layer loop, all micro-batches, incl. latency
  io_step_s: float                # host input for b samples over the system's links
  step_s: float
  time_by_bound: Tuple[Tuple[str, float], ...]

  @property
  def samples_per_sec(self) -> float:
    b = self.per_system_batch * self.num_csx
    return b / self.step_s if self.step_s > 0 else math.inf


def gemm_fraction(layer: ir.Layer, graph: ir.LayerGraph) -> float:
  """Share of a layer's FLOPs that multiply its own weights (what sparsity can skip).

  A dense layer does 6 FLOPs per weight per token (fwd 2, bwd 4); embeddings (gathers) and
  attention (no weights) do far less, so they count as dense work.
  """
  if layer.kind != "matmul" or layer.num_params <= 0 or layer.flops <= 0:
    return 0.0
  return min(1.0, 6.0 * layer.num_params * layer_tokens(layer, graph) / layer.flops)


def ws_streamed_bytes_per_param(graph: ir.LayerGraph, sparsity: float) -> float:
  """Bytes per parameter per pass from MemoryX: fp16 dense, (value, index) pairs sparse."""
  if sparsity > 0:
    return (1.0 - sparsity) * (graph.dtype_bytes + _SPARSE_INDEX_BYTES)
  return float(graph.dtype_bytes)


def ws_weight_buffer_bytes(graph: ir.LayerGraph, sparsity: float = 0.0) -> float:
  """SRAM for streamed weights: the largest layer, double-buffered (one in use, one arriving)."""
  per = ws_streamed_bytes_per_param(graph, sparsity)
  return 2.0 * max((l.num_params * per for l in graph.layers), default=0.0)


def _ws_layer(l, graph, engine, options, m, recompute, vts):
  rate = (engine.usable_cores * engine.flops_per_core_per_s *
          engine.efficiency(plans.WEIGHT_STREAMING))
  sp = options.sparsity
  fs, _ = vts_scale(l, options, vts)
  g = gemm_fraction(l, graph)
  keep = g * (1.0 - sp) + (1.0 - g)
  flops = (l.flops + recompute * l.fwd_flops) * fs * keep
  ps = WS_PASSES * math.sqrt(l.num_params) * engine.sparsity_partial_sum_cycles \
      if g >= 0.5 else 0.0
  compute = m * flops / rate + ps / engine.clock_hz
  bw = engine.memoryx_bandwidth_bytes_per_s
  stream_in = 2.0 * l.num_params * ws_streamed_bytes_per_param(graph, sp) / bw
  stream_out = 0.0
  grad = l.grad_bytes * ((1.0 - sp) if sp > 0 else 1.0) / bw
  return WSLayerCost(l.name, compute, stream_in, stream_out, grad, "")


def ws_cost(graph: ir.LayerGraph, engine, options: plans.PlanOptions, vts: bool = True,
            micro_batch: Optional[int] = None) -> WSCost:
  """The weight-streaming step (see the comment block above). Pure.

  Micro-batching: activations kept for backward are `sum(activation_bytes)` per sample; the
  SRAM left after the double-buffered weights holds m_fit samples. If the per-system batch b
  does not fit, it runs as ceil(b / m_fit) equal micro-batches (gradients accumulate on the
  wafer; weights stream again for each). If not even one sample fits (m_fit = 0), micro-batches
  of one keep the share of activations that fits and recompute the rest from checkpoints
  (costed as that share of the forward FLOPs again).

  Args:
    micro_batch: force a micro-batch size (tests); None lets the model choose.
  """
  split = batching.split(int(options.batch_size), num_systems=int(options.num_csx))
  n, b = split.num_systems, split.per_system
  acts = sum(l.activation_bytes for l in graph.layers)
  room = engine.usable_sram_bytes - ws_weight_buffer_bytes(graph, options.sparsity)
  m_fit = int(room // acts) if acts > 0 else b
  depth = math.ceil(math.log2(n)) if n > 1 else 0
  hop = depth * engine.swarmx_hop_latency_s

  def schedule(m, recompute):
    m = max(1, min(m, b))
    k = math.ceil(b / m)
    m_eff = b / k  # equal micro-batches
    layers = tuple(_ws_layer(l, graph, engine, options, m_eff, recompute, vts)
                   for l in graph.layers)
    by = {"compute": 0.0, "stream-in": 0.0, "stream-out": 0.0, "swarmx latency": 0.0}
    total, out = 0.0, []
    for c in layers:
      mid = max(c.compute_s, c.stream_in_s, c.stream_out_s)
      last = max(c.compute_s, c.stream_in_s, c.stream_out_s + c.grad_out_s)
      bound = ("compute" if c.compute_s >= max(c.stream_in_s, c.stream_out_s + c.grad_out_s)
               else "stream-in" if c.stream_in_s >= c.stream_out_s + c.grad_out_s
               else "stream-out")
      for count, terms in ((k - 1, (c.compute_s, c.stream_in_s, c.stream_out_s)),
                           (1, (c.compute_s, c.stream_in_s, c.stream_out_s + c.grad_out_s))):
        name = ("compute", "stream-in", "stream-out")[terms.index(max(terms))]
        by[name] += count * max(terms)
      total += (k - 1) * mid + last
      out.append(dataclasses.replace(c, bound=bound))
    lat = len(graph.layers) * hop * (2 * k + 1)
    fixed = len(graph.layers) * engine.weight_streaming_layer_overhead_s
    by["swarmx latency"] = lat
    by["per-layer step overhead"] = fixed
    compute_step = total + lat + fixed
    io = b * sum(l.io_bytes for l in graph.layers) / engine.io_bytes_per_s
    step = max(compute_step, io)
    if io > compute_step:
      by = {"io": io}
    return WSCost(num_csx=n, per_system_batch=b, micro_batch=int(round(m_eff)), num_micro=k,
                  recompute_fraction=recompute, layers=tuple(out), latency_s=lat,
                  overhead_s=fixed,
                  compute_step_s=compute_step, io_step_s=io, step_s=step,
                  time_by_bound=tuple(sorted(by.items(), key=lambda kv: -kv[1])))

  if micro_batch is not None:
    return schedule(micro_batch, 0.0)
  if m_fit >= 1:
    return schedule(m_fit, 0.0)
  kept = max(0.0, room) / acts if acts > 0 else 1.0
  return schedule(1, 1.0 - kept)


def ws_bottleneck(cost: WSCost, engine) -> str:
  """One line naming what bounds the weight-streaming step."""
  total = sum(t for _, t in cost.time_by_bound) or 1.0
  what, t = cost.time_by_bound[0]
  share = f"{t / total:.0%} of the step"
  if what == "compute":
    big = max(cost.layers, key=lambda c: c.compute_s)
    return f"compute ({share}; largest layer {big.name})"
  if what == "stream-in":
    return (f"stream-in: weights from MemoryX at "
            f"{engine.memoryx_bandwidth_bytes_per_s / 1e12:g} TB/s ({share})")
  if what == "stream-out":
    return (f"stream-out: gradients through SwarmX to MemoryX at "
            f"{engine.memoryx_bandwidth_bytes_per_s / 1e12:g} TB/s ({share})")
  if what == "io":
    return f"io: {engine.io_description}"
  return f"{what} ({share})"


def simulate_weight_streaming(plan: plans.Plan, graph: ir.LayerGraph, engine,
                              options: plans.PlanOptions) -> plans.Performance:
  """Performance of a weight-streaming Plan (see `ws_cost`)."""
  if not plan.fits:
    return _not_fit(plan)
  opts = dataclasses.replace(options, num_csx=plan.num_csx, batch_size=plan.batch_size)
  cost = ws_cost(graph, engine, opts)
  padded = ws_cost(graph, engine, opts, vts=False).samples_per_sec if opts.vts else None
  sps = cost.samples_per_sec
  compute_sps = plan.batch_size / cost.compute_step_s if cost.compute_step_s > 0 else math.inf
  io_sps = plan.batch_size / cost.io_step_s if cost.io_step_s > 0 else math.inf
  flops = sum(l.flops * vts_scale(l, opts)[0] for l in graph.layers)
  util = sps * flops / (engine.peak_flops * cost.num_csx)
  events = [plans.TimelineEvent("step", "step", 0.0, cost.step_s)]
  t = 0.0
  for c in cost.layers:  # one micro-batch: the layers one after another
    d = max(c.compute_s, c.stream_in_s, c.stream_out_s)
    events.append(plans.TimelineEvent("compute", c.name, t, c.compute_s))
    if c.stream_in_s > 0:
      events.append(plans.TimelineEvent("stream-in", "stream-in", t, c.stream_in_s))
    t += d
  notes = (f"per system: batch {cost.per_system_batch} in {cost.num_micro} micro-batch(es) of "
           f"{cost.micro_batch}" + (f"; {cost.recompute_fraction:.0%} of activations recomputed"
                                    if cost.recompute_fraction > 0 else ""),
           "step time by bound: " + ", ".join(f"{k} {v * 1e3:.1f} ms"
                                              for k, v in cost.time_by_bound))
  notes += vts_notes(sps, padded, opts)
  return plans.Performance(
      samples_per_sec=sps, step_time_s=cost.step_s, utilization=util,
      bottleneck=ws_bottleneck(cost, engine), compute_samples_per_sec=compute_sps,
      io_samples_per_sec=io_sps, timeline=tuple(events),
      padded_samples_per_sec=padded if padded is not None else sps, notes=notes)


_SIMULATORS = {plans.PIPELINED: simulate_pipelined, plans.MULTI_REPLICA: simulate_pipelined,
               plans.WEIGHT_STREAMING: simulate_weight_streaming}


def register_simulator(strategy: str, fn) -> None:
  """Lets another strategy's module plug its performance model in."""
  _SIMULATORS[strategy] = fn


def simulate(plan: plans.Plan, graph: ir.LayerGraph, engine,
             options: plans.PlanOptions) -> plans.Performance:
  """Predicts the Performance of `plan` (dispatches on plan.execution_strategy).

  Args:
    plan: a Plan from a planner.
    graph: the LayerGraph it was planned from.
    engine: the EngineSpec it was planned for.
    options: the PlanOptions it was planned with.
  """
  fn = _SIMULATORS.get(plan.execution_strategy)
  if fn is None:
    raise NotImplementedError(f"no performance model for {plan.execution_strategy!r}")
  return fn(plan, graph, engine, options)
