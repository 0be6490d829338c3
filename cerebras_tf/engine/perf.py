"""The analytical performance model: Plan -> Performance (samples/s, utilization, bottleneck).

Pure function of (plan, graph, engine, options); no TensorFlow, no state (beyond `ws_cost`'s memo
of its last results).

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
  * a training step of B samples takes B / rate + the drain (`drain_s`): the weights update
    between steps, so the step ends only when its last sample's backward is back at layer 0,
    a round trip of one token hop per layer each way plus the whole per-sample time of every
    sequence barrier (attention needs a sample's whole sequence). The bubble is what makes
    samples/s grow with the batch; a fixed `pipelined_step_overhead_s` is added per step;
  * batch norm in training is a batch barrier (`batch_barrier`): no sample leaves it before
    the replica's whole batch has arrived (its statistics), and its backward waits for the
    batch's sums of dy and dy * x_hat. The pipeline then runs as segments ending at each batch
    norm, one after another: B / rate becomes B * sum over segments of the segment's slowest
    per-sample time (`pipelined_busy_s`), and every layer up to the last barrier keeps all B
    samples' activations. Per-sample norms (layer, group) are no barrier;
  * samples/s = min(B / step, io);
  * memory: a layer keeps the activations of the samples between its forward and its backward:
    1 + round trip / interval of them, at most B (`in_flight_samples`,
    `pipelined_layer_memory`: the one place a pipelined plan's activations are counted);
  * utilization = samples/s * FLOPs per sample / peak FLOP/s of the wafer.
Eval / predict (options.phase): forward FLOPs only, weights only (no gradients or optimizer
state), one sample in flight per layer, no drain.
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
import re
from typing import Dict, List, Optional, Sequence, Tuple

from cerebras_tf.core import ir
from cerebras_tf.core import batching, plans
from cerebras_tf.engine import conv


def _not_fit(plan: plans.Plan) -> plans.Performance:
  return plans.Performance(samples_per_sec=0.0, step_time_s=math.inf, utilization=0.0,
                          bottleneck=f"does not fit: {plan.reason}",
                          compute_samples_per_sec=0.0, io_samples_per_sec=0.0)


def training(options: Optional[plans.PlanOptions]) -> bool:
  """True unless the options ask for a forward-only step (eval / predict)."""
  return options is None or getattr(options, "phase", "train") == "train"


def layer_flops(layer: ir.Layer, options: Optional[plans.PlanOptions] = None) -> float:
  """FLOPs per sample of a step: forward + backward when training, forward only otherwise."""
  return layer.flops if training(options) else layer.fwd_flops


def layer_state_bytes(layer: ir.Layer, options: Optional[plans.PlanOptions] = None) -> int:
  """Bytes a layer holds for the whole run: weights, gradients and optimizer state when
  training; the weights alone for eval / predict."""
  return layer.state_bytes if training(options) else layer.weight_bytes


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


def sequence_barrier(layer: ir.Layer) -> bool:
  """True for a layer that needs a sample's whole sequence before it can hand anything on.

  Token-pair work (attention: each query reads every key forward; each key's gradient sums
  over every query backward) cannot start on a sample until all its tokens have arrived, so
  the sample's tokens stop streaming there. Position-wise layers pass each token on as soon as
  it is done.
  """
  return layer.token_scaling == "quadratic" or layer.pair_share > 0


def batch_barrier(layer: ir.Layer, options: Optional[plans.PlanOptions] = None) -> bool:
  """True for a layer that needs the replica's whole batch before it hands any sample on: a
  batch norm while training (forward-only steps normalize with the moving statistics)."""
  return training(options) and layer.has_batch_norm


def batch_segments(graph: ir.LayerGraph, options: Optional[plans.PlanOptions] = None
                   ) -> List[range]:
  """The layers' indices cut after each batch barrier: segments that run one after another."""
  # = the layers where batch_barrier(layer, options) holds, read off the graph's cached list.
  cuts = [i + 1 for i in graph.batch_norm_indices] if training(options) else []
  bounds = [0] + [c for c in cuts if c < len(graph.layers)] + [len(graph.layers)]
  return [range(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


def pipelined_busy_s(times: Sequence[float], graph: ir.LayerGraph, batch: float,
                     options: Optional[plans.PlanOptions] = None) -> float:
  """Seconds a pipeline needs for `batch` samples given its layers' per-sample `times`:
  batch x the slowest time, or, cut by batch barriers, the segments' such times in turn."""
  total = 0.0
  for seg in batch_segments(graph, options):
    slowest = max((times[i] for i in seg if times[i] > 0), default=0.0)
    total += batch * slowest
  return total


def pipeline_interval_s(times: Sequence[float], graph: ir.LayerGraph,
                        options: Optional[plans.PlanOptions] = None) -> float:
  """A pipeline's time per sample: its slowest layer's, or across batch barriers the
  segments' slowest in turn (layers without cores, inf, left out)."""
  return pipelined_busy_s([t if math.isfinite(t) else 0.0 for t in times], graph, 1, options)


def pipelined_sample_time(layer: ir.Layer, cores: float, graph: ir.LayerGraph, engine,
                          options: Optional[plans.PlanOptions] = None, vts: bool = True) -> float:
  """Seconds a layer on `cores` cores spends per sample in a pipeline (see module docstring).

  0 for a layer without FLOPs (it only holds memory); inf for a layer with FLOPs but no cores.
  """
  flops = layer_flops(layer, options)
  if flops <= 0:
    return 0.0
  if cores <= 0:
    return math.inf
  fs, ts = vts_scale(layer, options, vts)
  rate = engine.flops_per_core_per_s * engine.pipelined_efficiency
  latency = layer_tokens(layer, graph) * ts * engine.pipelined_token_latency_cycles
  cnn = conv.layer_cost(layer, cores, engine, graph.dtype_bytes, training(options))
  if cnn is None:
    return flops * fs / (cores * rate) + latency / engine.clock_hz
  # Image ops: uneven tiles idle some cores; the halo exchange and norm reductions add.
  return (flops * fs / (cores * rate * cnn.tiling_efficiency) + latency / engine.clock_hz +
          cnn.time_extra_s)


def hop_s(engine) -> float:
  """One token's latency through one layer's region (the calibrated per-token latency)."""
  return engine.pipelined_token_latency_cycles / engine.clock_hz


def round_trip_s(times: Sequence[float], graph: ir.LayerGraph, engine,
                 options: Optional[plans.PlanOptions] = None) -> List[float]:
  """Seconds from a sample entering layer i forward until its backward has left layer i.

  Tokens stream from layer to layer, each layer adding one token's latency (`hop_s`) forward
  and one backward; a sequence barrier (`sequence_barrier`) holds the sample for its whole
  per-sample time t_j (forward and backward share). So, with `times` the layers' per-sample
  times, round_trip[i] = sum over j >= i of (2 hops + t_j if j is a barrier). Forward-only
  steps (eval) go one way: one hop per layer, the barriers' forward time.
  """
  train = training(options)
  hop = hop_s(engine) * (2.0 if train else 1.0)
  out = [0.0] * len(graph.layers)
  acc = 0.0
  for i in range(len(graph.layers) - 1, -1, -1):
    acc += hop + (times[i] if sequence_barrier(graph.layers[i]) else 0.0)
    out[i] = acc
  return out


def in_flight_samples(times: Sequence[float], graph: ir.LayerGraph, engine,
                      options: Optional[plans.PlanOptions], batch: int) -> List[int]:
  """Samples whose kept activations layer i holds: 1 + round_trip[i] / interval, at most batch.

  The pipeline admits one sample per interval (the slowest layer's time); layer i keeps a
  sample's activations from its forward until its backward comes back, `round_trip_s` later.
  A step drains (the weights update between steps), so no more than the batch is in flight.
  Forward-only steps keep nothing for a backward: one sample per layer.
  """
  n = len(graph.layers)
  if not training(options):
    return [1] * n
  # Up to the last batch barrier, no backward starts before the whole batch went forward.
  held = graph.batch_norm_indices[-1] + 1 if graph.batch_norm_indices else 0
  interval = max([t for t in times if math.isfinite(t)], default=0.0)
  if interval <= 0:
    return [int(batch) if i < held else 1 for i in range(n)]
  rt = round_trip_s(times, graph, engine, options)
  return [int(batch) if i < held else max(1, min(int(batch), 1 + math.ceil(r / interval - 1e-9)))
          for i, r in enumerate(rt)]


def estimated_sample_times(graph: ir.LayerGraph, engine, options: Optional[plans.PlanOptions],
                           cores: Optional[float] = None) -> List[float]:
  """Per-sample times with the grid (or `cores`) shared in proportion to FLOPs.

  What the layers' times will be before placement decides their exact regions; memory (the
  in-flight samples) is priced from these so that placement does not depend on itself.
  """
  total = sum(layer_flops(l, options) for l in graph.layers)
  cores = engine.usable_cores if cores is None else cores
  return [pipelined_sample_time(l, cores * layer_flops(l, options) / total if total else 0.0,
                                graph, engine, options) for l in graph.layers]


def pipelined_layer_memory(graph: ir.LayerGraph, engine, options: Optional[plans.PlanOptions],
                           batch: int, cores: Optional[float] = None) -> List[int]:
  """SRAM bytes each layer needs pipelined: state + kept activations x samples in flight.

  The one place a pipelined plan's activation memory is counted (pipelined and
  multi_replica planners, the report): `Layer.activation_bytes` is the same quantity for an
  analytic and a traced graph (the tensors a layer hands to other layers, per sample).
  """
  times = estimated_sample_times(graph, engine, options, cores)
  flight = in_flight_samples(times, graph, engine, options, batch)
  return [int(layer_state_bytes(l, options) + math.ceil(l.activation_bytes * k))
          for l, k in zip(graph.layers, flight)]


def replica_layers(plan: plans.Plan, replica: int = 0) -> List[plans.LayerPlacement]:
  """The placements of one replica, in program order."""
  return [p for p in plan.layers if p.replica == replica]


def placed_times(plan: plans.Plan, graph: ir.LayerGraph, engine,
                 options: Optional[plans.PlanOptions] = None, vts: bool = True,
                 replica: int = 0) -> List[float]:
  """Per-sample times of one replica's placed layers."""
  return [pipelined_sample_time(l, p.cores, graph, engine, options, vts)
          for p, l in zip(replica_layers(plan, replica), graph.layers)]


def pe_utilization(flops: float, cores: float, interval: float, engine) -> float:
  """Share of a region's time its cores spend on the layer's FLOPs at the calibrated rate."""
  if flops <= 0 or cores <= 0 or interval <= 0 or not math.isfinite(interval):
    return 0.0
  rate = engine.flops_per_core_per_s * engine.pipelined_efficiency
  return min(1.0, flops / (cores * rate) / interval)


def pipelined_pe_utilization(plan: plans.Plan, graph: ir.LayerGraph, engine,
                             options: Optional[plans.PlanOptions] = None,
                             replica: int = 0) -> Tuple[List[float], float]:
  """(per-layer PE utilization of one replica, their average over the cores they occupy).

  A layer's cores compute its FLOPs for flops / (cores x rate) of every pipeline interval (the
  slowest layer's per-sample time; across batch barriers, the segments' in turn) and wait the
  rest: token latency, a faster layer waiting for the slowest one, or the other segments.
  """
  placed = replica_layers(plan, replica)
  times = placed_times(plan, graph, engine, options, replica=replica)
  interval = pipeline_interval_s(times, graph, options)
  per = [pe_utilization(layer_flops(l, options) * vts_scale(l, options)[0], p.cores, interval,
                        engine) for p, l in zip(placed, graph.layers)]
  cores = sum(p.cores for p in placed)
  avg = sum(u * p.cores for u, p in zip(per, placed)) / cores if cores else 0.0
  return per, avg


def drain_s(plan: plans.Plan, graph: ir.LayerGraph, engine,
            options: Optional[plans.PlanOptions] = None, vts: bool = True) -> float:
  """Seconds a training step waits at its end: the last sample's round trip from layer 0.

  The weights update between steps, so the next step's first forward at layer 0 waits until
  the last sample's backward has come back there. This is what makes pipelined samples/s grow
  with the batch (the bubble is amortized over more samples). Forward-only steps stream on.
  """
  if not training(options):
    return 0.0
  return _drain_from_times(placed_times(plan, graph, engine, options, vts), graph, engine,
                           options)


def _drain_from_times(times, graph, engine, options) -> float:
  """`drain_s` from the layers' per-sample times already at hand."""
  if not training(options) or not graph.layers:
    return 0.0
  return round_trip_s(times, graph, engine, options)[0]


def _timeline(plan, graph, engine, step_s, io_sps, options=None) -> Tuple[plans.TimelineEvent, ...]:
  """One steady-state step: each layer's fwd and bwd busy time, offset by the fill latency.

  In the hardware a layer interleaves forward and backward work sample by sample; the trace
  draws each layer's per-step forward busy time, then its backward busy time, starting when the
  first sample reaches it (sum of the per-sample forward latencies of the layers before it).
  Multi-replica: replica 0's layers (the copies run the same schedule). Across batch barriers
  (`batch_barrier`) the segments' forward passes run in turn, then their backward passes in
  reverse order, each segment taking the batch times its slowest layer's share.
  """
  batch = plan.batch_size // max(1, plan.num_replicas)
  events = [plans.TimelineEvent("step", "step", 0.0, step_s)]
  if math.isfinite(io_sps):
    events.append(plans.TimelineEvent("host input", "io", 0.0, plan.batch_size / io_sps))
  split = {}  # layer index -> (placement, forward, backward seconds per sample)
  for i, (p, l) in enumerate(zip(replica_layers(plan, 0), graph.layers)):
    f = layer_flops(l, options)
    if p.cores > 0 and f > 0:
      t = pipelined_sample_time(l, p.cores, graph, engine, options)
      split[i] = (p, t * l.fwd_flops / f, t - t * l.fwd_flops / f)
  segments = batch_segments(graph, options)
  if len(segments) == 1:
    offset = 0.0
    for p, tf, tb in split.values():
      if tf > 0:
        events.append(plans.TimelineEvent("fwd", p.name, offset, batch * tf))
      if tb > 0:
        events.append(plans.TimelineEvent("bwd", p.name, offset + batch * tf, batch * tb))
      offset += tf
    return tuple(events)
  clock = 0.0
  for phase, order, part in (("fwd", segments, 1), ("bwd", segments[::-1], 2)):
    for seg in order:
      seg = [i for i in (seg if phase == "fwd" else reversed(seg)) if i in split]
      fill = 0.0
      for i in seg:
        p, d = split[i][0], split[i][part]
        if d > 0:
          events.append(plans.TimelineEvent(phase, p.name, clock + fill, batch * d))
        fill += d
      clock += batch * max((split[i][part] for i in seg), default=0.0)
  return tuple(events)


def pipeline_rate(times: Sequence[float]) -> Tuple[float, int]:
  """(samples/s of a pipeline in steady state, index of its slowest layer) from its layers'
  per-sample `times` (a layer without FLOPs, time 0, sustains any rate)."""
  slowest = min(range(len(times)), key=lambda i: (-times[i], i))
  t = times[slowest]
  return (1.0 / t if t > 0 else math.inf), slowest


def allreduce_time_s(graph: ir.LayerGraph, engine, replicas: int) -> float:
  """Seconds to all-reduce one replica's gradients among `replicas` slabs on the wafer.

  Ring all-reduce along the row of slabs: 2 (R-1)/R of the gradient bytes cross each slab
  boundary, whose bandwidth is one fabric link per grid row (grid_height x 32 bits x clock).
  """
  if replicas <= 1:
    return 0.0
  grad = sum(l.grad_bytes for l in graph.layers)
  return 2.0 * (replicas - 1) / replicas * grad / engine.fabric_cross_section_bytes_per_s


def pipelined_step_s(plan, graph, engine, options, vts=True) -> Tuple[float, float, int]:
  """(step seconds on the wafer, steady-state samples/s of one replica, slowest layer index).

  step = per-replica batch / steady rate (`pipelined_busy_s`: segment by segment across batch
  barriers) + drain (training) + all-reduce (R > 1) + the fixed per-step overhead
  (`pipelined_step_overhead_s`).
  """
  r = max(1, plan.num_replicas)
  times = placed_times(plan, graph, engine, options, vts)  # once: the searches call this a lot
  rate, slowest = pipeline_rate(times)
  if rate <= 0 or not math.isfinite(rate):
    return (0.0 if not math.isfinite(rate) else math.inf), rate, slowest
  per = plan.batch_size / r
  step = (pipelined_busy_s(times, graph, per, options) +
          _drain_from_times(times, graph, engine, options) +
          (allreduce_time_s(graph, engine, r) if training(options) else 0.0) +
          engine.pipelined_step_overhead_s)
  return step, rate, slowest


def batch_barrier_notes(plan, graph, engine, options) -> List[str]:
  """What batch norm's barriers cost a training pipeline, against streaming straight through."""
  segments = batch_segments(graph, options)
  if len(segments) <= 1:
    return []
  times = placed_times(plan, graph, engine, options)
  per = plan.batch_size / max(1, plan.num_replicas)
  busy = pipelined_busy_s(times, graph, per, options)
  through = per * max((t for t in times if t > 0), default=0.0)
  if busy <= 0 or through <= 0:
    return []
  norms = [l.name for l in graph.layers if batch_barrier(l, options)]
  return [f"batch norm is a batch barrier in training ({', '.join(norms[:3])}"
          f"{' ...' if len(norms) > 3 else ''}): no sample leaves it before the replica's "
          f"{per:g} have all arrived (its statistics), and its backward waits for their sums; "
          f"the pipeline runs as {len(segments)} segments one after another: "
          f"{busy * 1e3:.3f} ms of work a step against {through * 1e3:.3f} ms streamed straight "
          f"through ({busy / through:.1f}x); per-sample norms (LayerNormalization, "
          f"GroupNormalization) keep one pipeline, and weight streaming runs layer by layer"]


def _pipelined_like(plan, graph, engine, options, vts):
  """(samples/s, compute samples/s, io samples/s, slowest layer name) of a (multi-)pipeline."""
  step, _, slowest = pipelined_step_s(plan, graph, engine, options, vts)
  compute_sps = plan.batch_size / step if step > 0 else math.inf
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
  step = plan.batch_size / sps if sps > 0 else math.inf
  fixed = engine.pipelined_step_overhead_s
  if compute_sps <= io_sps and 0 < step < math.inf and fixed >= 0.5 * step:
    # A small model at a small batch: the wafer is done long before the host's next step.
    bottleneck = (f"per-step overhead ({fixed / step:.0%} of the step: the host's "
                  f"{fixed * 1e3:g} ms a step, assumed; slowest layer {slow})")
  elif compute_sps <= io_sps:
    segments = len(batch_segments(graph, options))
    bottleneck = (f"compute: {slow}" if segments == 1 else
                  f"compute: {segments} batch-norm segments one after another (slowest layer "
                  f"{slow})")
    if plan.num_replicas > 1:
      bottleneck += f" (each of {plan.num_replicas} replicas)"
  else:
    bottleneck = f"io: {engine.io_description}"
  flops = sum(layer_flops(l, options) * vts_scale(l, options)[0] for l in graph.layers)
  util = sps * flops / engine.peak_flops
  notes = []
  drain = drain_s(plan, graph, engine, options)
  if drain > 0 and math.isfinite(step):
    notes.append(f"pipeline drain at the end of each step: {drain * 1e3:.3f} ms "
                 f"({drain / step:.1%} of the step; the last sample's round trip through "
                 f"{sum(1 for l in graph.layers if sequence_barrier(l))} sequence barriers)")
  notes.extend(batch_barrier_notes(plan, graph, engine, options))
  if plan.num_replicas > 1:
    notes.append(f"gradient all-reduce between {plan.num_replicas} replicas: "
                 f"{allreduce_time_s(graph, engine, plan.num_replicas) * 1e3:.3f} ms per step")
  notes.extend(vts_notes(sps, padded, options))
  notes.extend(short_step_note(step, engine.pipelined_step_overhead_s))
  _, pe = pipelined_pe_utilization(plan, graph, engine, options)
  return plans.Performance(
      samples_per_sec=sps, step_time_s=step, utilization=util, bottleneck=bottleneck,
      compute_samples_per_sec=compute_sps, io_samples_per_sec=io_sps,
      timeline=_timeline(plan, graph, engine, step, io_sps, options) if sps > 0 else (),
      padded_samples_per_sec=padded, notes=tuple(notes), pe_utilization=pe)


# ---------------------------------------------------------------------------------------------
# Weight streaming.
#
# Per system: the whole usable grid works on one layer at a time for its b = B / num_csx
# samples, split into k micro-batches of m (see `ws_cost`). For each layer and micro-batch:
#   compute    = m * flops_eff / (cores * FLOP/s per core * efficiency)
#                + passes (3 training: fwd, dX, dW; 1 forward-only) * sqrt(params) output
#                  features * partial-sum cycles (seed 003: 4 cycles per output feature)
#                flops_eff = GEMM FLOPs * (1 - sparsity) + the other FLOPs (attention, norms)
#                + the forward FLOPs again for layers of a recomputed block
#   stream-in  = 2 (fwd + bwd; 1 forward-only) * weight bytes streamed / MemoryX bandwidth
#   stream-out = gradient bytes / MemoryX bandwidth on the last micro-batch (gradients are
#                accumulated on the wafer and reduced through SwarmX once per step)
#   latency    = SwarmX tree depth ceil(log2 num_csx) * hop latency, twice per micro-batch
#                (weights broadcast for fwd and bwd) and once more per step (gradient reduce)
#   time       = max(compute, stream-in, stream-out) + latency; the max names the bound.
# Each layer with work also pays `weight_streaming_layer_overhead_s` per micro-batch, forward-
# only or training alike (setting the grid up for the layer, filling and draining its weight
# broadcast and partial-sum chains), and each step pays `weight_streaming_step_overhead_s` once
# (the host's per-step round trip). Neither shrinks with the batch. The layer cost is FITTED
# on the batch-sweep calibration runs, the only published runs that separate a step's fixed
# part from its per-sample part (BERT-Large on CS-2: 0.13 s of a 0.18-0.30 s step at one
# micro-batch of 512-2048); the step cost is ASSUMED (cs2.yaml). A step under `SHORT_STEP_S`
# that they dominate carries a caveat in the report.
# No per-token floor: a column's tokens do not take single turns on its partial-sum ring. The
# compiler runs several token streams ("lanes") through it at once (published compiles chose
# 6-11 lanes for BERT-Large and Llama-7B on CS-2 and weighed 5-11 for ESM-2), and the
# sweeps' per-sample cost, 85 us a BERT-Large sample at 512-2048, is under half the one-lane
# floor (rows x 4 cycles per token per layer pass, seed 003: 184 us); fitted, it goes to 0.
# The sqrt(params) proxy for output features is exact for square matrices (the IR does not
# record matrix shapes). Sparse weights stream as (value, index) pairs: (1 - s) * 4 bytes.
#
# Memory (`ws_activations`, `ws_cost`): the wafer holds the double-buffered weights of the
# largest layer and the working set of the layer running for one micro-batch (its input, its
# output and its transient `work_bytes`, e.g. attention probabilities). That is the batch limit:
# a micro-batch (without micro-batching, the whole per-system batch) whose working set does not
# fit is refused. The activations kept for backward (all of them, or each block's input when
# the block is recomputed in backward) stay on the wafer when they fit beside; the rest is held
# by the appliance's activation memory (the "Activation pods" of the R2.x cluster logs) and
# crosses the system's I/O links out and back (`spill`). The compiler takes the fastest of:
# the largest micro-batch keeping everything, the largest keeping checkpoints, and the whole
# batch with spill.
# ---------------------------------------------------------------------------------------------

WS_PASSES = 3            # forward, input gradient, weight gradient
_SPARSE_INDEX_BYTES = 2  # seed 003: weights "arrive tagged with an index field"
_BLOCK = re.compile(r"^(.*?(?:^|/)(?:layer|layers|h|block|blocks)_\d+)(?=/|$)")


def block_of(name: str) -> Optional[str]:
  """The repeated block a layer belongs to ("gpt/h_3", "bert/encoder/layer_7"), or None."""
  m = _BLOCK.match(name)
  return m.group(1) if m else None


@dataclasses.dataclass(frozen=True)
class WSActivations:
  """Per-sample bytes a weight-streaming micro-batch needs on the wafer.

  Attributes:
    full: every layer's kept activations (no recomputation).
    minimum: with each block recomputed in its backward pass: each block's input (the smallest
      tensor any of its layers hands on) + the other layers' activations + the largest
      block's own activations (its working set while it is recomputed).
    recompute_flops: forward FLOPs per sample done again when recomputing (the blocks').
    blocks: repeated blocks found in the layer names (0: nothing to recompute).
    working: the largest layer's working set: its input + output + `work_bytes`.
  """

  full: float
  minimum: float
  recompute_flops: float
  blocks: int
  working: float = 0.0


# Head size assumed when a token-pair layer does not state its working set (a graph from
# elsewhere: lower.py measures its Softmax outputs, analytic.py states them): its
# probabilities are pair FLOPs / (4 x head size) elements (Q.K^T and P.V are 2 s^2 d each).
_ASSUMED_HEAD_SIZE = 64
# Attention probabilities are not held whole while the layer runs: the kernel streams them
# one block of keys at a time (blockwise softmax, as FlashAttention computes it), so its
# transient work is heads x queries x this block, not heads x queries x keys. The block is
# ASSUMED (no public figure). That the whole matrix is not held is published: modelzoo
# R2.4's Llama-3.1-8B configs run micro-batches of 20 x 8,192 and 1 x 131,072 tokens
# (validation/published.yaml), whose probabilities for all heads are 90 GB and 1.1 TB.
ATTENTION_KEY_BLOCK = 512
# Likewise a softmax cross-entropy (its logits are the `work_bytes` of the layer it is in,
# the LM head it folds into) reduces them to the loss token block by token block, holding
# one block of logits, not all of them. ASSUMED block; published: the same 8k config's micro-batch of 20 would need 42 GB
# for its logits alone (20 x 8,192 x 128,256 x 2 bytes) on a 44 GB wafer.
LOSS_TOKEN_BLOCK = 512


def layer_work_bytes(layer: ir.Layer, dtype_bytes: int = 2, seq_len: int = 0) -> float:
  """A layer's transient bytes per sample: `layer.work_bytes` (or for a token-pair layer that
  does not say, its attention probabilities from its token-pair FLOPs: heads x s^2 = pair
  FLOPs / (4 x 64)), over `seq_len` tokens only one block of them: ATTENTION_KEY_BLOCK keys
  of a token-pair layer, LOSS_TOKEN_BLOCK tokens' logits of a loss."""
  pairs = sequence_barrier(layer)
  work = layer.work_bytes
  if work <= 0 and pairs:
    work = (layer.pair_share or 1.0) * layer.fwd_flops / (4.0 * _ASSUMED_HEAD_SIZE) * dtype_bytes
  block = ATTENTION_KEY_BLOCK if pairs else LOSS_TOKEN_BLOCK
  if work > 0 and seq_len > block:
    work *= block / seq_len
  return max(work, 0.0)


def ws_activations(graph: ir.LayerGraph,
                   options: Optional[plans.PlanOptions] = None) -> WSActivations:
  """See `WSActivations`. Forward-only steps keep nothing for a backward pass."""
  acts = [l.activation_bytes for l in graph.layers]
  working = 0.0
  seq = graph.seq_len or 0
  for i, l in enumerate(graph.layers):
    prev = acts[i - 1] if i > 0 else 0.0
    working = max(working, prev + acts[i] + layer_work_bytes(l, graph.dtype_bytes, seq))
  if not training(options):
    return WSActivations(0.0, 0.0, 0.0, 0, working)
  groups: Dict[str, List[int]] = {}
  loose = 0.0
  for i, l in enumerate(graph.layers):
    b = block_of(l.name)
    if b is None:
      loose += acts[i]
    else:
      groups.setdefault(b, []).append(i)
  full = float(sum(acts))
  if not groups:
    return WSActivations(full, full, 0.0, 0, working)
  ckpt = sum(min(acts[i] for i in idx) for idx in groups.values())
  work = max(sum(acts[i] for i in idx) for idx in groups.values())
  recompute = sum(graph.layers[i].fwd_flops for idx in groups.values() for i in idx)
  return WSActivations(full, min(full, ckpt + loose + work), recompute, len(groups), working)


@dataclasses.dataclass(frozen=True)
class WSLayerCost:
  """One layer's per-micro-batch costs on one system, seconds."""

  name: str
  compute_s: float
  stream_in_s: float
  stream_out_s: float      # per micro-batch (0: gradients leave once per step)
  grad_out_s: float        # once per step (last micro-batch)
  bound: str               # "compute" | "stream-in" | "stream-out"
  flop_s: float = 0.0      # the FLOPs alone at the calibrated rate

  @property
  def time_s(self) -> float:
    return max(self.compute_s, self.stream_in_s, self.stream_out_s)

  @property
  def pe_utilization(self) -> float:
    """Share of the layer's time the grid spends on its FLOPs (vs partial sums, streaming)."""
    return min(1.0, self.flop_s / self.time_s) if self.time_s > 0 else 0.0


@dataclasses.dataclass(frozen=True)
class WSCost:
  """Weight-streaming step on each of num_csx systems (see the comment block above)."""

  num_csx: int
  per_system_batch: int
  micro_batch: int
  num_micro: int
  recompute_fraction: float       # 1: blocks recomputed in backward; 0: all activations kept
  layers: Tuple[WSLayerCost, ...]
  latency_s: float                # SwarmX tree latency per step
  overhead_s: float               # fixed per-layer (per micro-batch) and per-step overheads
  compute_step_s: float           # the layer loop, all micro-batches, incl. latency
  io_step_s: float                # host input for b samples over the system's links
  step_s: float
  time_by_bound: Tuple[Tuple[str, float], ...]
  fits: bool = True
  why: str = ""                   # why the batch does not fit (fits=False)
  memory_bytes: float = 0.0       # wafer SRAM in use: weight buffers + the micro-batch's
  max_micro_batch: int = 0        # largest micro-batch the wafer holds (recomputing if need be)

  @property
  def samples_per_sec(self) -> float:
    b = self.per_system_batch * self.num_csx
    if not self.fits:
      return 0.0
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


@dataclasses.dataclass(frozen=True)
class _WSLayerTerms:
  """A layer's weight-streaming costs that do not depend on the micro-batch: what `ws_cost`
  prices each candidate micro-batch m from (built once per `ws_cost` call, not per candidate).

  compute(m) = m * flops / rate + partial_sum_s + m * cnn_extra_s, with `flops` the kept
  FLOPs per sample (`flops_redo` when the layer's block is recomputed in backward).
  """

  name: str
  flops: float           # per sample, sparsity- and VTS-scaled
  flops_redo: float      # the same with the block's forward FLOPs again (recompute)
  rate: float            # FLOP/s of the whole grid at the calibrated efficiency
  partial_sum_s: float   # per micro-batch
  cnn_extra_s: float     # per sample (halo exchange, norm reductions); 0 for non-image layers
  is_cnn: bool
  stream_in_s: float
  grad_out_s: float


def _ws_layer_terms(l, graph, engine, options, vts) -> _WSLayerTerms:
  rate = (engine.usable_cores * engine.flops_per_core_per_s *
          engine.weight_streaming_efficiency)
  sp = options.sparsity
  train = training(options)
  fs, _ = vts_scale(l, options, vts)
  g = gemm_fraction(l, graph)
  keep = g * (1.0 - sp) + (1.0 - g)
  redo = l.fwd_flops if block_of(l.name) is not None else 0.0
  lf = layer_flops(l, options)
  passes = WS_PASSES if train else 1
  ps = passes * math.sqrt(l.num_params) * engine.sparsity_partial_sum_cycles \
      if g >= 0.5 else 0.0
  cnn = conv.layer_cost(l, engine.usable_cores, engine, graph.dtype_bytes, train)
  bw = engine.memoryx_bandwidth_bytes_per_s
  stream_in = (2.0 if train else 1.0) * l.num_params * ws_streamed_bytes_per_param(graph, sp) / bw
  grad = (l.grad_bytes * ((1.0 - sp) if sp > 0 else 1.0) / bw) if train else 0.0
  return _WSLayerTerms(l.name, (lf + 0.0) * fs * keep, (lf + redo) * fs * keep, rate,
                       ps / engine.clock_hz, cnn.time_extra_s if cnn else 0.0, cnn is not None,
                       stream_in, grad)


def _has_work(l: ir.Layer) -> bool:
  return l.flops > 0 or l.num_params > 0


# The most a weight-streaming step may slow down to keep batch norm's micro-batch statistics
# at batching.BATCH_NORM_MIN_SAMPLES (when the larger micro-batches' activations must leave the
# wafer): past it the faster micro-batches are taken, and the plan's note and the advisor say
# what keeping them costs. A policy, not a measurement: under 16 samples the statistics are
# noisier (Wu & He 2018, Table 3: ResNet-50's ImageNet error with BN is 23.6% at 32 images a
# worker, 24.8% at 8, 34.7% at 2), not useless, while a spilling step can be orders of
# magnitude slower.
BATCH_NORM_PRICE_LIMIT = 2.0


def ws_max_micro_batch(graph: ir.LayerGraph, engine, options: plans.PlanOptions) -> int:
  """The batch limit: the most samples a micro-batch can have while the largest layer's
  working set (x samples) fits the wafer beside the double-buffered weights (0: not one; the
  per-system batch when no layer states a working set)."""
  per_system = batching.split(int(options.batch_size), num_systems=int(options.num_csx)).per_system
  return _micro_batch_limit(ws_activations(graph, options),
                            ws_weight_buffer_bytes(graph, options.sparsity), engine, per_system)


def _micro_batch_limit(act: WSActivations, wbuf: float, engine, per_system: int) -> int:
  if act.working <= 0:
    return per_system
  return int((float(engine.usable_sram_bytes) - wbuf) // act.working)


# `ws_cost` is pure and a plan's step is priced more than once (the planner, then `simulate`,
# the report): the last results are kept, by the graph's identity (a LayerGraph is immutable;
# the entry holds the graph, so no other graph can take its id) and the other arguments.
_WS_RECENT: Dict[tuple, Tuple[ir.LayerGraph, "WSCost"]] = {}
_WS_RECENT_MAX = 32


def ws_cost(graph: ir.LayerGraph, engine, options: plans.PlanOptions, vts: bool = True,
            micro_batch: Optional[int] = None, keep_batch_norm: bool = True) -> WSCost:
  """The weight-streaming step (see `_ws_cost`), remembered for the last few arguments."""
  key = (id(graph), engine, options, vts, micro_batch, keep_batch_norm)
  hit = _WS_RECENT.get(key)
  if hit is not None and hit[0] is graph:
    return hit[1]
  cost = _ws_cost(graph, engine, options, vts, micro_batch, keep_batch_norm)
  while len(_WS_RECENT) >= _WS_RECENT_MAX:
    _WS_RECENT.pop(next(iter(_WS_RECENT)))
  _WS_RECENT[key] = (graph, cost)
  return cost


def _ws_cost(graph: ir.LayerGraph, engine, options: plans.PlanOptions, vts: bool = True,
             micro_batch: Optional[int] = None, keep_batch_norm: bool = True) -> WSCost:
  """The weight-streaming step (see the comment block above). Pure.

  Micro-batching: the per-system batch b runs as k = ceil(b / m) equal micro-batches
  (gradients accumulate; weights stream again for each). With `options.micro_batch_size` None
  the compiler takes the fastest of: the largest m whose kept activations all fit the wafer,
  the largest m whose block checkpoints fit (each block recomputed in backward: a third more
  forward FLOPs, fewer micro-batches), and the largest m the batch limit allows (m = b when
  it can) with the kept activations that do not fit held off the wafer (`spill`). A training
  step of a model with batch norm takes only micro-batches that leave its statistics
  batching.BATCH_NORM_MIN_SAMPLES samples when one of those runs at most
  BATCH_NORM_PRICE_LIMIT times slower than the fastest (`keep_batch_norm`; the most
  micro-batches that keep them is a candidate too). `micro_batching=False` runs m = b; a
  forced m (the option, or `micro_batch` here) is taken as given. A micro-batch whose working set (the largest layer's
  input, output and transient bytes, x m, beside the double-buffered weights) does not fit
  the wafer gives fits=False and `why`: that is the batch limit.
  """
  split = batching.split(int(options.batch_size), num_systems=int(options.num_csx))
  n, b = split.num_systems, split.per_system
  act = ws_activations(graph, options)
  wbuf = ws_weight_buffer_bytes(graph, options.sparsity)
  sram = float(engine.usable_sram_bytes)
  m_work = _micro_batch_limit(act, wbuf, engine, b)
  depth = math.ceil(math.log2(n)) if n > 1 else 0
  hop = depth * engine.swarmx_hop_latency_s
  working = sum(1 for l in graph.layers if _has_work(l))

  def fit_m(per_sample):
    room = sram - wbuf
    return min(b, int(room // (per_sample + act.working))) if per_sample + act.working > 0 else b

  # The layers' micro-batch-free terms, once: every candidate micro-batch below reuses them.
  terms = [_ws_layer_terms(l, graph, engine, options, vts) for l in graph.layers]

  def schedule(m, recompute):
    m = max(1, min(m, b))
    k = math.ceil(b / m)
    m_eff = b / k  # equal micro-batches
    by = {"compute": 0.0, "stream-in": 0.0, "stream-out": 0.0, "swarmx latency": 0.0}
    total, out = 0.0, []
    for t in terms:
      # This loop runs for every layer of every candidate of every plan (the calibration
      # fit's searches run it ~10^6 times): plain floats, one WSLayerCost built per layer.
      flop_s = m_eff * (t.flops_redo if recompute else t.flops) / t.rate
      compute = flop_s + t.partial_sum_s + (m_eff * t.cnn_extra_s if t.is_cnn else 0.0)
      s_in, s_out, g_out = t.stream_in_s, 0.0, t.grad_out_s
      mid = max(compute, s_in, s_out)
      last = max(compute, s_in, s_out + g_out)
      bound = ("compute" if compute >= max(s_in, s_out + g_out)
               else "stream-in" if s_in >= s_out + g_out
               else "stream-out")
      for count, terms3 in ((k - 1, (compute, s_in, s_out)),
                            (1, (compute, s_in, s_out + g_out))):
        top = max(terms3)
        by[("compute", "stream-in", "stream-out")[terms3.index(top)]] += count * top
      total += (k - 1) * mid + last
      out.append(WSLayerCost(t.name, compute, s_in, s_out, g_out, bound, flop_s))
    passes = 2 if training(options) else 1
    lat = len(graph.layers) * hop * (passes * k + (1 if training(options) else 0))
    # Forward-only steps pay it too: the published eval runs (BERT-Large at 1,024 on CS-3,
    # 0.154 s a step) are as far from their FLOPs as training (cs2.yaml).
    per_layer = k * working * engine.weight_streaming_layer_overhead_s
    fixed = per_layer + engine.weight_streaming_step_overhead_s
    kept = m_eff * (act.minimum if recompute else act.full)
    onwafer = wbuf + m_eff * act.working + kept
    excess = max(0.0, onwafer - sram)
    spill = k * 2.0 * excess / engine.io_bytes_per_s  # out after forward, back for backward
    by["swarmx latency"] = lat
    by["per-layer overhead"] = per_layer
    by["per-step overhead"] = engine.weight_streaming_step_overhead_s
    if spill > 0:
      by["activation spill"] = spill
    compute_step = total + lat + fixed + spill
    io = b * sum(l.io_bytes for l in graph.layers) / engine.io_bytes_per_s
    step = max(compute_step, io)
    if io > compute_step:
      by = {"io": io}
    return WSCost(num_csx=n, per_system_batch=b, micro_batch=int(round(m_eff)), num_micro=k,
                  recompute_fraction=1.0 if recompute else 0.0, layers=tuple(out),
                  latency_s=lat, overhead_s=fixed,
                  compute_step_s=compute_step, io_step_s=io, step_s=step,
                  time_by_bound=tuple(sorted(by.items(), key=lambda kv: -kv[1])),
                  memory_bytes=min(onwafer, sram), max_micro_batch=max(0, min(m_work, b)))

  forced = micro_batch if micro_batch is not None else options.micro_batch_size
  if forced is None and not options.micro_batching:
    forced = b
  if forced is not None:
    m = max(1, min(int(forced), b))
    if m > m_work:
      return _ws_refused(schedule(m, True), m, act, wbuf, engine, options, m_work)
    cands = [schedule(m, False)] + ([schedule(m, True)] if act.blocks else [])
    return min(cands, key=lambda c: c.step_s)
  if m_work < 1:
    return _ws_refused(schedule(1, True), 1, act, wbuf, engine, options, m_work)
  top = min(b, m_work)  # the largest micro-batch whose working set fits: the batch limit
  cands = [schedule(top, False)]
  m_full = fit_m(act.full)
  if 1 <= m_full < top:
    cands.append(schedule(m_full, False))
  if act.blocks:
    cands.append(schedule(top, True))
    m_min = fit_m(act.minimum)
    if 1 <= m_min < top:
      cands.append(schedule(m_min, True))
  if keep_batch_norm and training(options) and graph.batch_norm_layers:
    # Batch norm's statistics are one micro-batch's: keep them batching.BATCH_NORM_MIN_SAMPLES
    # when a candidate that does costs at most BATCH_NORM_PRICE_LIMIT x the fastest (the
    # planner's note says what it paid, or what keeping them would cost).
    m_bn = batching.smallest_micro_batch_keeping_batch_norm(b)
    if m_bn < top:
      cands.append(schedule(m_bn, False))
      if act.blocks:
        cands.append(schedule(m_bn, True))
    kept = [c for c in cands if batching.keeps_batch_norm(n * b, n * c.num_micro)]
    if kept:
      best = min(kept, key=lambda c: (c.step_s, c.num_micro))
      if best.step_s <= BATCH_NORM_PRICE_LIMIT * min(c.step_s for c in cands):
        return best
  return min(cands, key=lambda c: (c.step_s, c.num_micro))


def _ws_refused(cost: WSCost, m: int, act: WSActivations, wbuf: float, engine,
                options: plans.PlanOptions, m_work: int) -> WSCost:
  """`cost` marked as not fitting, with the numbers of the micro-batch limit."""
  gb = 1e9
  need = wbuf + m * act.working
  what = ("per-system batch" if not options.micro_batching and options.micro_batch_size is None
          else "micro-batch")
  why = (f"batch limit: a {what} of {m} sample(s) needs {need / gb:,.1f} GB of wafer SRAM for "
         f"its largest layer ({wbuf / gb:.2f} GB double-buffered weights + {m} x "
         f"{act.working / gb:.3f} GB input, output and working set), "
         f"{engine.usable_sram_bytes / gb:.1f} GB available; the largest that fits is "
         f"{max(0, m_work)}")
  if m_work < 1:
    why += " (not even one sample: shorten the sequence, or narrow the layers)"
  elif what == "per-system batch":
    why += (f" per system: turn micro-batching on (or micro_batch_size <= {m_work}), use more "
            f"systems, or a smaller batch")
  else:
    why += f": use micro_batch_size <= {m_work}"
  return dataclasses.replace(cost, fits=False, why=why, step_s=math.inf,
                             memory_bytes=need, max_micro_batch=max(0, m_work))


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
  if what == "per-step overhead":
    return (f"per-step overhead ({share}: the host's "
            f"{engine.weight_streaming_step_overhead_s * 1e3:g} ms a step, assumed)")
  if what == "per-layer overhead":
    return (f"per-layer overhead ({share}: {cost.num_micro} micro-batch(es) x the layers' "
            f"fixed cost; a bigger micro-batch or fewer systems amortize it)")
  return f"{what} ({share})"


# Below this step time the fixed costs (host step, per-layer cost) may set the pace.
SHORT_STEP_S = 0.01


def short_step_note(step_s: float, fixed_s: float) -> Tuple[str, ...]:
  """A caveat for steps so short that the fixed costs are most of the step: the host's per-step
  cost is assumed (cs2.yaml derives it), and weight streaming's per-layer cost was fitted on
  steps of 0.1-0.3 s, not on steps this short."""
  if step_s >= SHORT_STEP_S or step_s <= 0 or fixed_s < 0.5 * step_s:
    return ()
  return (f"short step ({step_s * 1e3:.2f} ms): {fixed_s / step_s:.0%} of it is fixed cost "
          f"({fixed_s * 1e3:.2f} ms: the host's per-step cost, assumed, and in weight streaming "
          f"the per-layer cost, fitted on 0.1-0.3 s steps), so this rate is as uncertain as "
          f"those are at this scale; published tiny-model runs spent 0.5-5 ms a step",)


def simulate_weight_streaming(plan: plans.Plan, graph: ir.LayerGraph, engine,
                              options: plans.PlanOptions) -> plans.Performance:
  """Performance of a weight-streaming Plan (see `ws_cost`)."""
  if not plan.fits:
    return _not_fit(plan)
  opts = dataclasses.replace(options, num_csx=plan.num_csx, batch_size=plan.batch_size)
  cost = ws_cost(graph, engine, opts)
  if not cost.fits:
    return _not_fit(dataclasses.replace(plan, reason=cost.why))
  padded = ws_cost(graph, engine, opts, vts=False).samples_per_sec if opts.vts else None
  sps = cost.samples_per_sec
  compute_sps = plan.batch_size / cost.compute_step_s if cost.compute_step_s > 0 else math.inf
  io_sps = plan.batch_size / cost.io_step_s if cost.io_step_s > 0 else math.inf
  flops = sum(layer_flops(l, opts) * vts_scale(l, opts)[0] for l in graph.layers)
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
           f"{cost.micro_batch}" + ("; each block's activations recomputed in backward"
                                    if cost.recompute_fraction > 0 else ""),
           "step time by bound: " + ", ".join(f"{k} {v * 1e3:.1f} ms"
                                              for k, v in cost.time_by_bound))
  notes += vts_notes(sps, padded, opts)
  notes += short_step_note(cost.step_s, cost.overhead_s)
  busy = sum(c.time_s for c in cost.layers)
  pe = sum(c.flop_s for c in cost.layers) / busy if busy > 0 else 0.0
  return plans.Performance(
      samples_per_sec=sps, step_time_s=cost.step_s, utilization=util,
      bottleneck=ws_bottleneck(cost, engine), compute_samples_per_sec=compute_sps,
      io_samples_per_sec=io_sps, timeline=tuple(events),
      padded_samples_per_sec=padded if padded is not None else sps, notes=notes,
      pe_utilization=min(1.0, pe))


def simulate(plan: plans.Plan, graph: ir.LayerGraph, engine,
             options: plans.PlanOptions) -> plans.Performance:
  """Predicts the Performance of `plan`: the weight-streaming step when its mode streams the
  weights, else the pipeline's (one, or R side by side).

  Args:
    plan: a Plan from a planner.
    graph: the LayerGraph it was planned from.
    engine: the EngineSpec it was planned for.
    options: the PlanOptions it was planned with.
  """
  fn = simulate_weight_streaming if plan.mode.streams_weights else simulate_pipelined
  return fn(plan, graph, engine, options)
