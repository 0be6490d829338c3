"""Weight-streaming execution: weights live in MemoryX, stream in layer by layer (seed 003).

The model of the hardware (pure Python, no TensorFlow):

* MemoryX holds the weights and runs the optimizer: its capacity must hold the graph's state
  (weights, gradients and optimizer slots; Adam in fp32 is seed 003's "four scalar values per
  parameter ... single precision", 16 bytes). It must be within the engine's MemoryX range
  (cs2: 4 TB to 2.4 PB, 120T parameters); the plan notes the configuration it needs.
* `num_csx` systems each run the whole model on B / num_csx samples; SwarmX broadcasts the
  weights to all of them and reduces their gradients on the way back (a tree of depth
  ceil(log2 num_csx)). The global batch must divide evenly.
* Each system's whole usable grid computes one layer at a time. Activations stay on the wafer:
  micro-batching when a batch's do not fit, recomputing each block's activations in its
  backward pass when that runs faster or is the only way to fit; the streamed weights of the
  largest layer, double-buffered, must fit in half the SRAM. The batch limit: a micro-batch
  (with `micro_batching=False`, as releases before 2.0 ran by default, the whole per-system
  batch) whose largest layer's working set (input, output, attention probabilities) does not
  fit beside the weights is refused, with the largest that fits (`perf.ws_cost`; the R1.7.1
  modelzoo GPT-J config: "batch size 512 ... doesn't fit on system yet", 65 per system does).
* Per layer: time = max(compute, stream-in, stream-out) + SwarmX latency; the cost model and the
  bottleneck are `engine/perf.py:ws_cost` (shared with the simulator, so the plan's per-layer
  times and the prediction agree).
* Unstructured weight sparsity (`options.sparsity`) skips zero weights in the GEMMs but not
  the 4-cycle partial-sum step per output feature, nor attention and elementwise work, so the
  speedup saturates (Amdahl; seed 003).
"""

import math

from cerebras_tf.core import ir
from cerebras_tf.core import batching, plans
from cerebras_tf.engine import conv, perf
from cerebras_tf.compiler.plan import base

_GB = 1e9
_TB = 1e12


def _conv_detail(layer: ir.Layer, engine, graph: ir.LayerGraph, options) -> str:
  """An image layer's tiling and halo on the whole grid (it runs alone on it), else ""."""
  c = conv.layer_cost(layer, engine.usable_cores, engine, graph.dtype_bytes,
                      perf.training(options))
  return conv.describe(c) if c is not None else ""


class WeightStreamingPlanner(base.Planner):
  """Plans weight streaming over `num_csx` systems (see the module docstring)."""

  strategy = plans.WEIGHT_STREAMING

  def plan(self, graph: ir.LayerGraph, engine, options: plans.PlanOptions) -> plans.Plan:
    """Checks MemoryX capacity, SwarmX size and wafer memory; costs every layer.

    Raises:
      BatchError: num_csx < 1, or a global batch that num_csx does not divide.
    """
    split = batching.split(int(options.batch_size), num_systems=options.num_csx)
    batch, n = split.global_batch, split.num_systems
    state = graph.state_bytes
    mx_need = max(float(state), engine.memoryx_min_bytes)
    wbuf = perf.ws_weight_buffer_bytes(graph, options.sparsity)
    act = perf.ws_activations(graph, options)
    acts = act.full
    avail = int(engine.usable_sram_bytes)
    notes = [f"MemoryX: {state / _GB:,.1f} GB of weights, gradients and optimizer state "
             f"({graph.num_params / 1e9:.2f}B params); needs a {mx_need / _TB:g} TB+ MemoryX "
             f"(range {engine.memoryx_min_bytes / _TB:g} TB - {engine.memoryx_max_bytes / _TB:g}"
             f" TB); the optimizer runs there",
             f"SwarmX: {n} system(s), tree depth {math.ceil(math.log2(n)) if n > 1 else 0}; "
             f"per-system batch {split.per_system}",
             f"wafer: {wbuf / _GB:.2f} GB double-buffered weights of the largest layer + "
             f"{act.working / _GB:.3f} GB per sample for the largest layer's working set; "
             f"{acts / _GB:.3f} GB kept activations per sample ({act.minimum / _GB:.3f} GB "
             f"recomputing each of {act.blocks} blocks in backward)"]
    why, refusal = "", None
    if engine.memoryx_max_bytes < 1e9:
      why = f"{engine.name} has no MemoryX (weight streaming needs CS-2 or later)"
      refusal = plans.Refusal(plans.NO_MEMORYX, state, engine.memoryx_max_bytes)
    elif state > engine.memoryx_max_bytes:
      why = (f"needs {state / _TB:,.1f} TB of MemoryX, the largest {engine.name} MemoryX holds "
             f"{engine.memoryx_max_bytes / _TB:,.1f} TB")
      refusal = plans.Refusal(plans.MEMORYX, state, engine.memoryx_max_bytes)
    elif engine.memoryx_max_params and graph.num_params > engine.memoryx_max_params:
      why = (f"{graph.num_params:,} parameters exceed MemoryX's "
             f"{engine.memoryx_max_params:,.0f}")
      refusal = plans.Refusal(plans.MEMORYX, graph.num_params, engine.memoryx_max_params,
                              "parameters")
    elif n > engine.swarmx_max_systems:
      why = f"num_csx {n} exceeds SwarmX's {engine.swarmx_max_systems} systems for {engine.name}"
      refusal = plans.Refusal(plans.SYSTEMS, n, engine.swarmx_max_systems, "systems")
    elif wbuf > avail / 2:
      why = (f"the largest layer's streamed weights need {wbuf / _GB:.1f} GB double-buffered, "
             f"more than half the wafer's {avail / _GB:.1f} GB SRAM")
      refusal = plans.Refusal(plans.SRAM, wbuf, avail / 2)
    if why:
      placements = tuple(plans.LayerPlacement(name=l.name, cores=0, region=None,
                                             memory_bytes=0, flops=l.flops * batch,
                                             time_s=0.0) for l in graph.layers)
      return plans.Plan(execution_strategy=plans.WEIGHT_STREAMING, engine=engine.name,
                       fits=False, batching=split,
                       memory_needed_bytes=int(state), memory_available_bytes=int(
                           engine.memoryx_max_bytes), layers=placements,
                       reason=why, notes=tuple(notes), refusal=refusal)
    cost = perf.ws_cost(graph, engine, options)
    if not cost.fits:
      placements = tuple(plans.LayerPlacement(name=l.name, cores=0, region=None,
                                             memory_bytes=0, flops=l.flops * split.per_system,
                                             time_s=0.0) for l in graph.layers)
      return plans.Plan(execution_strategy=plans.WEIGHT_STREAMING, engine=engine.name,
                       fits=False, batching=split, memory_needed_bytes=int(cost.memory_bytes),
                       memory_available_bytes=avail, layers=placements, reason=cost.why,
                       notes=tuple(notes), refusal=plans.Refusal(
                           plans.BATCH, cost.memory_bytes, avail))
    need = int(cost.memory_bytes)
    k = cost.num_micro
    split = batching.split(batch, num_systems=n, micro_batches=k)
    placements = tuple(
        plans.LayerPlacement(
            name=c.name, cores=engine.usable_cores, region=None,
            memory_bytes=int(l.num_params * perf.ws_streamed_bytes_per_param(
                graph, options.sparsity) + l.activation_bytes * cost.micro_batch),
            flops=perf.layer_flops(l, options) * split.per_system,
            time_s=(k - 1) * max(c.compute_s, c.stream_in_s, c.stream_out_s) +
            max(c.compute_s, c.stream_in_s, c.stream_out_s + c.grad_out_s),
            pe_utilization=c.pe_utilization,
            detail=_conv_detail(l, engine, graph, options))
        for c, l in zip(cost.layers, graph.layers))
    bounds = {}
    for c in cost.layers:
      bounds[c.bound] = bounds.get(c.bound, 0) + 1
    notes.append(f"micro-batch {cost.micro_batch} ({k} per step; the largest layer's working "
                 f"set fits up to {cost.max_micro_batch}): the fastest of keeping every "
                 f"activation, keeping block checkpoints, or holding what does not fit off the "
                 f"wafer" +
                 ("; each block's activations are recomputed in backward (fewer, larger "
                  "micro-batches)" if cost.recompute_fraction else ""))
    notes.append("layers bound by " + ", ".join(f"{v} {b}" for b, v in sorted(bounds.items())))
    if options.sparsity:
      notes.append(f"unstructured sparsity {options.sparsity:.0%}: zero weights skipped and not "
                   f"streamed; the {engine.sparsity_partial_sum_cycles:g}-cycle partial sum per "
                   f"output feature and attention/elementwise work are not (Amdahl)")
    if perf.training(options) and graph.batch_norm_layers:
      notes.append(_batch_norm_note(graph, engine, options, split, cost))
    reason = (f"fits: {state / _GB:,.1f} GB of state in MemoryX; {n} x {engine.name}, "
              f"micro-batch {cost.micro_batch} of per-system batch {split.per_system}")
    return plans.Plan(execution_strategy=plans.WEIGHT_STREAMING, engine=engine.name, fits=True,
                     batching=split, memory_needed_bytes=need,
                     memory_available_bytes=avail, layers=placements, reason=reason,
                     notes=tuple(notes))


def _batch_norm_note(graph: ir.LayerGraph, engine, options: plans.PlanOptions,
                     split: batching.Batching, cost: perf.WSCost) -> str:
  """What batch norm's statistics cover on the engine: one micro-batch of one system. Kept at
  batching.BATCH_NORM_MIN_SAMPLES or more: what that costs against the fastest micro-batch.
  Under it: the setting that caused it, and what keeping it would take."""
  low = batching.BATCH_NORM_MIN_SAMPLES
  norms = graph.batch_norm_layers
  shown = ", ".join(norms[:3]) + (" ..." if len(norms) > 3 else "")
  per, b = split.batch_norm_samples, split.per_system
  head = (f"batch normalization ({shown}) takes its statistics over one micro-batch on one "
          f"system: {per} sample(s)")
  if split.keeps_batch_norm:
    head += (f" (the per-system batch of {b} runs as {split.micro_batches} micro-batches)"
             if split.micro_batches > 1 else "")
    free = perf.ws_cost(graph, engine, options, keep_batch_norm=False)
    if free.fits and free.step_s < cost.step_s:
      head += (f"; micro-batches of {free.micro_batch} would run "
               f"{cost.step_s / free.step_s:.2f}x faster ({free.samples_per_sec:,.1f} "
               f"samples/s) with statistics of {b // free.num_micro} sample(s): "
               f"csconfig.micro_batch_size={free.micro_batch} forces them")
    return head
  head += (f", under {low} (Wu & He 2018): training is noisier than batch "
           f"{split.global_batch} says")
  if b < low and split.num_systems > 1:
    fewer = batching.most_groups_keeping_batch_norm(split.global_batch, split.num_systems)
    return (head + f"; num_csx={split.num_systems} leaves each system {b}: num_csx <= {fewer}, "
            f"or a global batch of {low * split.num_systems}")
  if options.micro_batch_size is not None and cost.max_micro_batch >= low:
    return head + (f"; micro_batch_size={options.micro_batch_size} forces it: "
                   f"micro_batch_size >= {low} (the wafer holds {cost.max_micro_batch}), or "
                   f"leave it to the compiler")
  m = batching.smallest_micro_batch_keeping_batch_norm(b)
  if b >= low and m <= cost.max_micro_batch:
    kept = perf.ws_cost(graph, engine, options, micro_batch=m)
    return head + (f"; micro-batches of {m} would keep them but run "
                   f"{kept.step_s / cost.step_s:.1f}x slower ({kept.samples_per_sec:,.1f} "
                   f"samples/s: their activations do not all fit the wafer, over "
                   f"{perf.BATCH_NORM_PRICE_LIMIT:g}x is not taken unasked): "
                   f"csconfig.micro_batch_size={m} forces them")
  return head + (f"; the wafer holds at most {cost.max_micro_batch} sample(s) of the largest "
                 f"layer's working set a micro-batch: smaller inputs, or a norm without batch "
                 f"statistics (GroupNormalization, LayerNormalization)")
