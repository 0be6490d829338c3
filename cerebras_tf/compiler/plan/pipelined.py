"""Pipelined execution: one replica, every layer on its own rectangle of the core grid.

The model of the hardware (pure Python, no TensorFlow):

* All weights, gradients and optimizer state live in on-wafer SRAM for the whole run.
* Layers form a pipeline: samples stream through the layers in program order forward and back
  in reverse. Layer i starts the forward pass of new samples before the backward pass of an
  earlier one comes back, so it keeps the activations of the samples in flight: one per
  pipeline interval of the round trip from layer i to the end and back (tokens stream past
  position-wise layers; attention holds a whole sample), at most the batch (the pipeline
  drains between steps). Its SRAM need is `state_bytes + activation_bytes * in_flight`
  (`engine/perf.py:pipelined_layer_memory`, the one place this is counted).
* Each layer's region gets cores in proportion to its share of the FLOPs (so every stage runs
  at the same rate), but never fewer than its memory needs (`ceil(bytes / sram_per_core)`);
  the cores freed that way are shared among the others by water-filling.
* Layout: layers are grouped, in order, into vertical strips; strip widths are proportional to
  their cores and each layer gets the full strip width and a share of its height, never fewer
  whole rows than its memory needs; so a strip is never narrower than the memory of all its
  layers, each rounded up to whole rows, needs (`strip_min_width`). Strips are
  walked as a boustrophedon (down, up, down...), so consecutive layers always share an edge:
  inside a strip one lies under the other, across a strip boundary both touch the same end
  row.
* A layer's busy time per step is `batch * (flops_per_sample / (cores * FLOP/s per core *
  efficiency) + tokens * token latency / clock)` (`engine/perf.py:pipelined_sample_time`), with
  `efficiency` and the per-token latency the calibrated constants in the engine YAML. Because
  the latency term does not shrink with cores, small models saturate well below the wafer's
  FLOP/s; multi_replica then places copies (`place_pipeline` on a slab of the grid).

If the whole model needs more SRAM than the usable grid has, the plan says `fits=False` with
bytes needed vs available and suggests weight streaming.
"""

import math
from typing import List, Sequence, Tuple

from cerebras_tf.core import ir
from cerebras_tf.core import batching, plans
from cerebras_tf.engine import conv, perf
from cerebras_tf.compiler.plan import base

_GB = 1e9


def layer_memory_bytes(graph: ir.LayerGraph, engine, options: plans.PlanOptions, batch: int,
                       cores: float = None) -> List[int]:
  """SRAM bytes each layer needs in pipelined mode (state + in-flight activations) for a
  replica of `batch` samples on `cores` cores (default: the whole grid)."""
  return perf.pipelined_layer_memory(graph, engine, options, batch, cores)


def allocate_cores(flops: Sequence[float], floors: Sequence[int], total: int) -> List[float]:
  """Cores per layer: proportional to FLOPs, at least `floors` (water-filling).

  Args:
    flops: FLOPs per sample of each layer.
    floors: minimum cores of each layer (memory).
    total: cores to share.

  Returns:
    Fractional cores per layer summing to `total` (caller checks sum(floors) <= total).
  """
  n = len(flops)
  alloc = [0.0] * n
  free = list(range(n))
  remaining = float(total)
  while free:
    f_sum = sum(flops[i] for i in free)
    share = {i: (remaining * flops[i] / f_sum if f_sum > 0 else remaining / len(free))
             for i in free}
    bound = [i for i in free if share[i] < floors[i]]
    if not bound:
      for i in free:
        alloc[i] = share[i]
      break
    for i in bound:
      alloc[i] = float(floors[i])
      remaining -= floors[i]
    bound_set = set(bound)
    free = [i for i in free if i not in bound_set]
  return alloc


_ROUND_UP_BELOW = 8   # units (rows, columns): shares below this round up, not down


def _apportion(ideal: Sequence[float], minimum: Sequence[int], total: int) -> List[int]:
  """Integers >= minimum summing to total, close to `ideal` (largest remainder).

  Returns [] when sum(minimum) > total.
  """
  if sum(minimum) > total:
    return []
  # Small shares round up: a layer whose ideal is 1.9 rows loses half its cores at 1 row and
  # becomes the pipeline's slowest stage; the units come back from the large ones (1 of 400).
  out = [max(m, int(math.ceil(x)) if x < _ROUND_UP_BELOW else int(math.floor(x)))
         for x, m in zip(ideal, minimum)]
  diff = total - sum(out)
  # Relative remainders: a 1-unit shortfall hurts a small layer's rate more than a big one's.
  rel = lambda i: (ideal[i] - out[i]) / max(ideal[i], 1e-12)
  order = sorted(range(len(out)), key=lambda i: (-rel(i), i))
  k = 0
  while diff > 0:  # hand out the missing units to the biggest remainders
    out[order[k % len(out)]] += 1
    diff -= 1
    k += 1
  while diff < 0:  # take back, one unit at a time, where it hurts least: from the layer that
    # keeps the largest share of its ideal after losing it (1 of 400 rows, not 1 of 2)
    cand = [i for i in range(len(out)) if out[i] > minimum[i]]
    if not cand:
      return []
    i = max(cand, key=lambda j: ((out[j] - 1) / max(ideal[j], 1e-12), -j))
    out[i] -= 1
    diff += 1
  return out


def strip_min_width(floors: Sequence[int], height: int) -> int:
  """Fewest columns w on which layers stacked in one strip all get their memory.

  Each layer of a strip w columns wide takes whole rows, `max(1, ceil(floor / w))` of them,
  and the strip's layers share its `height` rows, so w must satisfy
  `sum(max(1, ceil(floor_i / w))) <= height`: the memory of every layer in the strip plus
  the rounding of each to whole rows, not only the largest layer's `ceil(floor / height)`.
  The row count only falls as w grows; bisection between the memory bound
  `ceil(sum(floors) / height)` and `max(floors)` (one row each; callers keep a strip to at
  most `height` layers).
  """
  rows = lambda w: sum(max(1, -(-f // w)) for f in floors)
  lo = max(1, -(-sum(floors) // height))
  hi = max(lo, max(floors, default=1))
  while lo < hi:
    mid = (lo + hi) // 2
    if rows(mid) <= height:
      hi = mid
    else:
      lo = mid + 1
  return lo


def layout(cores: Sequence[float], floors: Sequence[int], width: int,
           height: int) -> Tuple[List[plans.Region], str]:
  """Places layers (in order) as a boustrophedon of vertical strips on a width x height grid.

  Args:
    cores: target cores per layer (fractional, sums to about width * height).
    floors: minimum cores per layer.
    width, height: the usable grid.

  Returns:
    (regions in layer order, "") or ([], why it failed).
  """
  n = len(cores)
  total = float(sum(cores))
  if n > width * height:
    return [], f"{n} layers but only {width * height} cores"
  k = max(1, min(width, n, int(round(math.sqrt(n)))))
  # Each layer goes to the strip that holds its midpoint on the cumulative core axis.
  strip_of, cum = [], 0.0
  for c in cores:
    strip_of.append(min(k - 1, int((cum + c / 2.0) / (total / k))))
    cum += c
  groups: List[List[int]] = []
  for i, s in enumerate(strip_of):
    if not groups or strip_of[groups[-1][0]] != s:
      groups.append([])
    groups[-1].append(i)
  # A strip needs one row per layer; split strips taller than the grid (only with tiny grids).
  split: List[List[int]] = []
  for g in groups:
    split += [g[j:j + height] for j in range(0, len(g), height)]
  groups = split
  if len(groups) > width:
    return [], f"{len(groups)} strips needed but the grid is {width} columns wide"
  strip_cores = [sum(cores[i] for i in g) for g in groups]
  min_w = [strip_min_width([floors[i] for i in g], height) for g in groups]
  if sum(min_w) > width:
    return [], (f"the strips' memory needs {sum(min_w)} columns (at least "
                f"{', '.join(map(str, min_w))}), the grid is {width} wide")
  widths = _apportion([c / height for c in strip_cores], min_w, width)
  if not widths:
    return [], "the layers' memory does not fit the strips of the grid"
  regions: List[plans.Region] = [None] * n  # type: ignore[list-item]
  x = 0
  for s, (g, w) in enumerate(zip(groups, widths)):
    ideal = [height * cores[i] / strip_cores[s] if strip_cores[s] > 0 else height / len(g)
             for i in g]
    mins = [max(1, math.ceil(floors[i] / w)) for i in g]
    heights = _apportion(ideal, mins, height)
    if not heights:
      return [], (f"strip {s} ({w} columns) cannot hold the memory of "
                  f"{len(g)} layers starting at #{g[0]}")
    order = list(zip(g, heights))
    y = 0 if s % 2 == 0 else height
    for i, h in order:
      if s % 2 == 0:
        regions[i] = plans.Region(x, y, w, h)
        y += h
      else:
        y -= h
        regions[i] = plans.Region(x, y, w, h)
    x += w
  return regions, ""


# A layer gets no more cores than make its compute time this fraction of its token latency:
# past that point a further core buys under ~5% (the latency term does not shrink), so the
# compiler leaves the rest of the wafer idle - room for multi_replica's copies.
SATURATION = 0.05


def useful_cores(graph: ir.LayerGraph, engine, options: plans.PlanOptions) -> List[float]:
  """Cores past which each layer's per-sample time stops improving (inf: no token latency)."""
  rate = engine.flops_per_core_per_s * engine.pipelined_efficiency
  out = []
  for l in graph.layers:
    lat = perf.pipelined_sample_time(l, math.inf, graph, engine, options)
    out.append(perf.layer_flops(l, options) / (rate * SATURATION * lat) if lat > 0 else math.inf)
  return out


def place_pipeline(graph: ir.LayerGraph, engine, options: plans.PlanOptions, batch: int,
                   width: int, height: int):
  """Places one pipelined replica on the `width x height` slab at the grid's left edge.

  Returns:
    (placements, "") or ((), why it does not fit).
  """
  layers = graph.layers
  cores = width * height
  mem = layer_memory_bytes(graph, engine, options, batch, cores)
  floors = [max(1, math.ceil(m / engine.sram_per_core_bytes)) for m in mem]
  if sum(floors) > cores:
    return (), f"needs {sum(floors):,} cores for its memory, {cores:,} available"
  useful = sum(max(u, f) for u, f in zip(useful_cores(graph, engine, options), floors))
  if useful < cores:  # a small model: use only the columns it can keep busy
    width = min(width, max(math.ceil(useful / height), int(math.sqrt(len(layers))) + 2))
    cores = width * height
  target = allocate_cores([perf.layer_flops(l, options) for l in layers], floors, cores)
  regions, why = layout(target, floors, width, height)
  if not regions:
    return (), f"cannot lay out {len(layers)} layers on the {width} x {height} grid: {why}"
  cnn = [conv.layer_cost(l, r.cores, engine, graph.dtype_bytes, perf.training(options))
         for l, r in zip(layers, regions)]
  # A conv whose output- and spatial-tilings all overflow a core (a 3x3x512->512 filter is
  # 72 KB with its state) splits its input channels too (conv.py `split_candidates`, costed
  # by its partial-sum tree). One that overflows even so (a region too small to spread it)
  # is not refused: the region holds the layer's memory in aggregate (the floors above); the
  # report's detail says so.
  times = [perf.pipelined_sample_time(l, r.cores, graph, engine, options)
           for l, r in zip(layers, regions)]
  interval = perf.pipeline_interval_s(times, graph, options)
  out = []
  for l, m, r, t, c in zip(layers, mem, regions, times, cnn):
    f = perf.layer_flops(l, options)
    out.append(plans.LayerPlacement(
        name=l.name, cores=r.cores, region=r, memory_bytes=m, flops=f * batch,
        time_s=batch * t,
        pe_utilization=perf.pe_utilization(f * perf.vts_scale(l, options)[0], r.cores,
                                           interval, engine),
        detail=("" if c is None else conv.describe(c) + (
            "" if c.fits else "; filters overflow a core at every output, spatial and "
            "input-channel tiling of this region: priced as if the region's memory held them"))))
  return tuple(out), ""


class PipelinedPlanner(base.Planner):
  """Plans one replica with all state on the wafer (see the module docstring)."""

  strategy = plans.PIPELINED

  def plan(self, graph: ir.LayerGraph, engine, options: plans.PlanOptions) -> plans.Plan:
    """Places every layer of `graph` on `engine`'s usable grid.

    Args:
      graph: the model (per-sample FLOPs and bytes).
      engine: `EngineSpec` (grid, SRAM per core, FLOP/s per core, calibrated efficiency).
      options: batch_size is the global batch; num_csx > 1 is ignored (one system).

    Returns:
      A Plan; `fits=False` with a reason when the SRAM is too small.
    """
    split = batching.split(int(options.batch_size))
    batch = split.global_batch
    layers = graph.layers
    mem = layer_memory_bytes(graph, engine, options, batch)
    need = int(sum(mem))
    avail = int(engine.usable_sram_bytes)
    total_cores = engine.usable_cores
    flight = perf.in_flight_samples(perf.estimated_sample_times(graph, engine, options), graph,
                                    engine, options, batch)
    held = ("; the whole batch up to the last batch norm"
            if len(perf.batch_segments(graph, options)) > 1 else "")
    notes = [f"in-flight activations: layer 0 holds {flight[0] if flight else 0} samples, the "
             f"last layer {flight[-1] if flight else 0} (1 + its round trip / the pipeline "
             f"interval, at most the batch {batch}{held})",
             f"efficiency {engine.pipelined_efficiency:.3f} of per-core peak, "
             f"{engine.pipelined_token_latency_cycles:g} cycles per token per layer (calibrated)"]
    if not perf.training(options):
      notes.append(f"{options.phase}: forward only (weights, no gradients or optimizer state)")
    if options.num_csx > 1:
      notes.append(f"pipelined runs on one system; num_csx={options.num_csx} ignored")

    def unplaced(reason: str, kind: str) -> plans.Plan:
      placements = tuple(
          plans.LayerPlacement(name=l.name, cores=0, region=None, memory_bytes=m,
                              flops=perf.layer_flops(l, options) * batch, time_s=0.0)
          for l, m in zip(layers, mem))
      return plans.Plan(execution_strategy=plans.PIPELINED, engine=engine.name, fits=False,
                       batching=split, memory_needed_bytes=need,
                       memory_available_bytes=avail, layers=placements, reason=reason,
                       notes=tuple(notes), refusal=plans.Refusal(kind, need, avail))

    if not layers:
      return unplaced("the graph has no layers", plans.LAYOUT)
    if need > avail:
      state = sum(perf.layer_state_bytes(l, options) for l in layers)
      what = ("weights, gradients and optimizer state" if perf.training(options)
              else "weights")
      return unplaced(f"needs {need / _GB:.1f} GB of SRAM ({state / _GB:.1f} GB {what} "
                      f"+ {(need - state) / _GB:.1f} GB in-flight "
                      f"activations), {avail / _GB:.1f} GB available "
                      f"({total_cores:,} usable cores x {engine.sram_per_core_bytes // 1024} KB)"
                      f"; use execution_strategy: weight_streaming", plans.SRAM)
    placements, why = place_pipeline(graph, engine, options, batch, engine.grid_width,
                                     engine.grid_height)
    if not placements:
      return unplaced(f"{why}; use execution_strategy: weight_streaming", plans.LAYOUT)
    used = sum(p.cores for p in placements)
    reason = (f"fits: {plans.fmt_gb(need)} of {avail / _GB:.1f} GB SRAM; {len(layers)} layers "
              f"on {used:,} of {total_cores:,} cores")
    return plans.Plan(execution_strategy=plans.PIPELINED, engine=engine.name, fits=True,
                     batching=split, memory_needed_bytes=need,
                     memory_available_bytes=avail, layers=placements, reason=reason,
                     notes=tuple(notes))
