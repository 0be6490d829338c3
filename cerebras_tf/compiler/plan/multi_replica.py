"""Multi-replica execution: R copies of a pipelined layout, trained data-parallel on one wafer.

Why it helps (seed 004: "smaller models ... do not use the whole area of our Wafer-Scale
Engine ... we copy the model until the wafer is completely filled"; BERT-Base 1.7x): in the
pipelined model (`engine/perf.py`) every layer pays a per-token latency that more cores do not
shorten, so a small model's pipeline saturates long before it uses the wafer's FLOP/s. Cutting
the grid into R vertical slabs (each `grid_width // R` columns, full height) and placing one
pipelined replica per slab (`pipelined.place_pipeline`) runs R such pipelines at once, each on
B/R samples of the global batch B. A step ends with a ring all-reduce of the gradients across
the slab boundaries (`perf.allreduce_time_s`).

Choosing R (unless `options.num_replicas` forces it): every R from 1 up to what the SRAM
allows (each replica's state and in-flight activations must fit its slab) that divides the
global batch, and leaves a model with batch norm `batching.BATCH_NORM_MIN_SAMPLES` samples a
replica (its statistics are one replica's), is planned and simulated; R is the largest one
that still gains at least `MIN_GAIN` over the best smaller R on the wafer's time (a copy that
buys less is not worth its memory and all-reduce; the host's per-step overhead, the same for
every R, is left out of the comparison). The predicted speedup over one replica goes in
`plan.notes`, and so does why each larger R was not taken: "memory" (R copies need more SRAM
than the wafer, or one copy more than its slab), "layout" (the memory would fit but the slab's
strips cannot be laid out, e.g. the slab is too narrow for the strips' rounding to whole
rows), "batch norm" (a replica would see fewer than 16 samples) or "no gain".
"""

import dataclasses
import math
from typing import Tuple

from cerebras_tf.core import ir
from cerebras_tf.core import batching, plans
from cerebras_tf.engine import perf
from cerebras_tf.compiler.plan import base
from cerebras_tf.compiler.plan import pipelined

MIN_GAIN = 0.02   # a further replica must add 2% samples/s to be worth it
_GB = 1e9


def replica_need(graph, engine, options, r) -> int:
  """SRAM one of r replicas needs: its state + in-flight activations on a 1/r slab."""
  per = max(1, int(options.batch_size) // r)
  slab = max(1, engine.grid_width // r) * engine.grid_height
  return int(sum(pipelined.layer_memory_bytes(graph, engine, options, per, slab)))


def _copies(placed, r: int, slab_w: int) -> Tuple[plans.LayerPlacement, ...]:
  """Replica 0's placements and their copies: replica k is replica 0 moved k slabs right."""
  out = list(placed)
  for k in range(1, r):
    for p in placed:
      g = p.region
      out.append(plans.LayerPlacement(**{**p.__dict__, "replica": k, "region": plans.Region(
          g.x + k * slab_w, g.y, g.w, g.h)}))
  return tuple(out)


def _with_copies(plan: plans.Plan, engine) -> plans.Plan:
  """A Plan from `_plan_r(..., copies=False)` with its other replicas' placements added."""
  r = plan.num_replicas
  if not plan.fits or r <= 1 or any(p.replica for p in plan.layers):
    return plan
  return dataclasses.replace(plan, layers=_copies(plan.layers, r, engine.grid_width // r))


def _plan_r(graph, engine, options, r, need=None, copies=True):
  """The Plan with r replicas, or a not-fitting Plan with the reason. With copies=False a
  fitting plan holds replica 0's placements only (all a rate needs: the replicas run alike;
  the search prices every R so, and `_with_copies` completes the one it takes)."""
  split = batching.split(int(options.batch_size), engine_replicas=r)
  slab_w = engine.grid_width // r
  slab_bytes = slab_w * engine.grid_height * engine.sram_per_core_bytes
  if need is None:
    need = replica_need(graph, engine, options, r)
  placements, why, refusal = [], "", None
  if slab_w < 1:
    why = f"{r} replicas need {r} columns, the grid has {engine.grid_width}"
    refusal = plans.Refusal(plans.COLUMNS, r, engine.grid_width, "columns")
  elif need > slab_bytes:
    why = (f"one replica needs {need / _GB:.2f} GB of SRAM, a 1/{r} slab "
           f"({slab_w} x {engine.grid_height} cores) has {slab_bytes / _GB:.2f} GB")
    refusal = plans.Refusal(plans.SRAM, need, slab_bytes)
  else:
    # The slabs are alike: replica k is replica 0 moved k slabs right.
    placed, why = pipelined.place_pipeline(graph, engine, options, split.per_engine_replica,
                                           slab_w, engine.grid_height)
    if placed:
      placements = list(_copies(placed, r if copies else 1, slab_w))
    else:
      refusal = plans.Refusal(plans.LAYOUT, need, slab_bytes)
  fits = bool(placements)
  if not fits:
    mem = pipelined.layer_memory_bytes(graph, engine, options, split.per_engine_replica,
                                       max(1, slab_w) * engine.grid_height)
    placements = [plans.LayerPlacement(name=l.name, cores=0, region=None, memory_bytes=m,
                                      flops=perf.layer_flops(l, options) *
                                      split.per_engine_replica, time_s=0.0)
                  for l, m in zip(graph.layers, mem)]
  used = sum(p.cores for p in placements if not p.replica) * (r if fits else 1)
  reason = (f"fits: {r} replica(s) of {plans.fmt_gb(need)} SRAM each, per-replica batch "
            f"{split.per_engine_replica}, on {used:,} of {engine.usable_cores:,} cores"
            if fits else why)
  return plans.Plan(execution_strategy=plans.MULTI_REPLICA, engine=engine.name, fits=fits,
                   batching=split, memory_needed_bytes=need * r,
                   memory_available_bytes=engine.usable_sram_bytes,
                   layers=tuple(placements), reason=reason, refusal=refusal)


class MultiReplicaPlanner(base.Planner):
  """Plans R pipelined copies side by side (see the module docstring)."""

  strategy = plans.MULTI_REPLICA

  def plan(self, graph: ir.LayerGraph, engine, options: plans.PlanOptions) -> plans.Plan:
    """Picks (or takes) R, places R replicas, and notes the predicted speedup over R = 1.

    Raises:
      BatchError: `options.num_replicas` is not a positive integer or does not divide the
        global batch (names both numbers).
    """
    batch = int(options.batch_size)
    need = replica_need(graph, engine, options, 1)
    forced = options.num_replicas
    if forced is not None:
      batching.split(batch, engine_replicas=forced)

    # R is judged on the wafer's time: the host's fixed per-step overhead is the same for
    # every R, so it must not hide what a copy buys the wafer (nor decide R for a model whose
    # step the host dominates).
    wafer = dataclasses.replace(engine, pipelined_step_overhead_s=0.0)

    def rate(p):
      return perf.simulate(p, graph, wafer, options).samples_per_sec if p.fits else 0.0

    one = _plan_r(graph, engine, options, 1)
    one_sps = rate(one)
    notes = [f"replicas side by side on vertical slabs of {engine.grid_width} // R columns; "
             f"gradients all-reduced across slab boundaries each step"]
    if forced is not None:
      chosen = _plan_r(graph, engine, options, forced)
      sps = rate(chosen)
      notes.append(f"num_replicas={forced} forced by the params")
    else:
      limit = min(engine.grid_width, batch)
      max_r = min(limit, max(1, engine.usable_sram_bytes // max(need, 1)))
      chosen, sps, tried = one, one_sps, ["R=1 %.0f" % one_sps]
      refused = []  # (r, why) for every R > 1 that was not taken, in order
      norms = bool(graph.batch_norm_layers)
      for r in range(2, max_r + 1):
        if not batching.divides(batch, r):
          continue
        if norms and not batching.keeps_batch_norm(batch, r):
          refused.append((r, f"batch norm: {batch // r} sample(s) a replica, under "
                             f"{batching.BATCH_NORM_MIN_SAMPLES} (and so for any larger R; "
                             f"csconfig.num_replicas forces it)"))
          break
        p = _plan_r(graph, engine, options, r, copies=False)
        s = rate(p)
        if not p.fits:
          refused.append((r, f"{_KIND_WORD[p.refusal.kind]}: {p.reason}"))
          continue
        tried.append(f"R={r} {s:.0f}")
        if s > sps * (1 + MIN_GAIN):
          chosen, sps = p, s
        else:
          refused.append((r, f"no gain: {s:,.0f} samples/s is not {MIN_GAIN:.0%} more than "
                             f"R={chosen.num_replicas}'s {sps:,.0f}"))
      # The first R past the SRAM bound (R copies need R x one replica's memory) is not
      # placed; name it so the user sees memory, not the compiler's taste, stopped there.
      beyond = next((r for r in range(max_r + 1, limit + 1) if batching.divides(batch, r)
                     and (not norms or batching.keeps_batch_norm(batch, r))), None)
      if beyond is not None:
        refused.append((beyond, f"memory: {beyond} replicas of {need / _GB:.2f} GB need "
                                f"{beyond * need / _GB:.2f} GB, the wafer has "
                                f"{engine.usable_sram_bytes / _GB:.2f} GB (and so for any "
                                f"larger R)"))
      notes.append(f"compiler chose R={chosen.num_replicas}: the largest R dividing batch "
                   f"{batch} that fits{', keeps batch norm its samples' if norms else ''} "
                   f"and still gains >= {MIN_GAIN:.0%} (wafer samples/s, "
                   f"without the host's per-step overhead: {', '.join(tried)})")
      chosen = _with_copies(chosen, engine)
      larger = [f"R={r} {why}" for r, why in refused if r > chosen.num_replicas]
      if larger:
        notes.append("larger R rejected: " + "; ".join(larger))
      else:
        notes.append(f"no larger R to try: R must divide the batch ({batch}) and be at most "
                     f"{limit} (batch, {engine.grid_width} columns)")
    if chosen.fits and one_sps > 0:
      sps = perf.simulate(chosen, graph, engine, options).samples_per_sec
      one_sps = rate(one) and perf.simulate(one, graph, engine, options).samples_per_sec
      speed = sps / one_sps
      notes.append(f"predicted speedup over 1 replica: {speed:.2f}x ({sps:,.1f} vs "
                   f"{one_sps:,.1f} samples/s)")
      share = _saturation(perf.replica_layers(one, 0), graph, engine, options)
      notes.append(
          f"why copies gain: {share:.0%} of one replica's slowest-layer time is per-token latency ({engine.pipelined_token_latency_cycles:g} cycles per token per "
          f"layer), which more cores per layer do not shorten; R copies each run their own "
          f"stream of B/R samples")
    norms = graph.batch_norm_layers
    if norms and chosen.fits and chosen.num_replicas > 1:
      per = chosen.batching.per_engine_replica
      notes.append(
          f"batch normalization ({', '.join(norms[:3])}{' ...' if len(norms) > 3 else ''}) "
          f"takes its statistics over one replica's {per} sample(s), not the batch of {batch}"
          f"{': those of 1 sample are its own' if per == 1 else ''}; csconfig.num_replicas "
          f"sets R (fewer replicas, more samples each), pipelined keeps the whole batch")
    return dataclasses.replace(chosen, notes=tuple(notes) + chosen.notes)


# How the notes name a refused R's reason.
_KIND_WORD = {plans.LAYOUT: "layout", plans.COLUMNS: "columns", plans.SRAM: "memory"}


def _saturation(placements, graph, engine, options) -> float:
  """Share of the slowest layer's per-sample time that is token latency (not compute)."""
  worst, share = 0.0, 0.0
  for p, l in zip(placements, graph.layers):
    t = perf.pipelined_sample_time(l, p.cores, graph, engine, options)
    if t > worst:
      lat = perf.pipelined_sample_time(l, math.inf, graph, engine, options)
      worst, share = t, lat / t
  return share
