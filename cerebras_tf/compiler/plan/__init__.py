"""Planners by execution strategy: `get_planner("pipelined").plan(graph, engine, options)`.

`auto` plans every strategy and keeps the fastest one that fits. A new strategy is a module
beside these with a `base.Planner` subclass, added to `PLANNERS` (or `register_planner`).
"""

import dataclasses
from typing import Callable, Dict

from cerebras_tf.compiler.plan import advisor, base
from cerebras_tf.compiler.plan.multi_replica import MultiReplicaPlanner
from cerebras_tf.compiler.plan.pipelined import PipelinedPlanner
from cerebras_tf.compiler.plan.weight_streaming import WeightStreamingPlanner
from cerebras_tf.core import batching, plans
from cerebras_tf.engine import perf, report
from cerebras_tf.errors import ParamsError

# The planner of each execution mode (core/plans.MODES: what the mode is, which every layer
# asks instead of comparing names).
PLANNERS: Dict[str, Callable[[], base.Planner]] = {
    PipelinedPlanner.strategy: PipelinedPlanner,
    MultiReplicaPlanner.strategy: MultiReplicaPlanner,
    WeightStreamingPlanner.strategy: WeightStreamingPlanner,
}


def register_planner(strategy: str, factory: Callable[[], base.Planner]) -> None:
  """Registers (or replaces) the planner factory of a strategy."""
  PLANNERS[strategy] = factory


def available_strategies():
  """Every strategy with a planner, plus "auto"."""
  return tuple(PLANNERS) + (plans.AUTO,)


def get_planner(strategy: str) -> base.Planner:
  """The planner for an execution strategy.

  Raises:
    ParamsError: unknown strategy (lists the choices).
  """
  if strategy == plans.AUTO:
    return AutoPlanner()
  if strategy not in PLANNERS:
    raise ParamsError(f"unknown execution_strategy {strategy!r}; choices: "
                      f"{', '.join(available_strategies())}")
  return PLANNERS[strategy]()


def trivial(engine, options: plans.PlanOptions):
  """(plan, performance) of a model with no layer to place (no trainable variable: a model_fn
  that only counts steps, say). tf.estimator trains it; so does the engine, in one step's
  fixed overhead: the plan is pipelined, on one replica, placing nothing."""
  split = batching.split(int(options.batch_size))
  the_plan = plans.Plan(
      execution_strategy=plans.PIPELINED, engine=engine.name, fits=True, batching=split,
      memory_needed_bytes=0, memory_available_bytes=int(engine.usable_sram_bytes), layers=(),
      reason="no layer with weights: nothing to place on the wafer")
  step = engine.pipelined_step_overhead_s
  sps = split.global_batch / step if step > 0 else float("inf")
  performance = plans.Performance(
      samples_per_sec=sps, step_time_s=step, utilization=0.0,
      bottleneck=f"per-step overhead (no layer to compute: the host's {step * 1e3:g} ms a step, "
                 f"assumed)", compute_samples_per_sec=float("inf"), io_samples_per_sec=sps)
  return the_plan, performance


# Pipelined predictions are within -7%..+3% of published runs (specs/fidelity_bands.yaml): a
# predicted gain under 5% is not evidence that the other strategy is faster. The advisor's
# threshold, so auto picks a strategy exactly when the advisor would suggest it.
AUTO_MIN_GAIN = advisor.MIN_GAIN


class AutoPlanner(base.Planner):
  """Plans every available strategy; returns the fastest predicted plan that fits.

  A later strategy (pipelined, then multi_replica, then weight_streaming) replaces an earlier
  one only when it is at least AUTO_MIN_GAIN faster: a gain inside the simulator's own error
  is not worth R replicas of a sliver of the batch and their all-reduce (a multi_replica plan
  with R = 1 never displaces pipelined). `plan.reason` says why the winner
  won, e.g. "pipelined needs 3,162.0 GB of SRAM, 37.1 GB available; weight_streaming at 21.6
  samples/s" or "multi_replica (R=4) 1.70x faster than pipelined". With nothing fitting, the
  pipelined plan (its reason names the numbers) is returned.
  """

  strategy = plans.AUTO

  def plan(self, graph, engine, options):
    results = []  # (strategy, plan or None, samples/s, why not)
    for s in PLANNERS:
      opts = dataclasses.replace(options, execution_strategy=s)
      try:
        p = get_planner(s).plan(graph, engine, opts)
      except batching.BatchError as e:  # e.g. num_csx does not divide the batch: not a candidate
        results.append((s, None, 0.0, str(e)))
        continue
      sps = perf.simulate(p, graph, engine, opts).samples_per_sec if p.fits else 0.0
      results.append((s, p, sps, "" if p.fits else p.reason))
    fitting = [r for r in results if r[1] is not None and r[1].fits]
    tried = "; ".join(f"{s}: {sps:,.1f} samples/s" if p is not None and p.fits else
                      f"{s}: {why}" for s, p, sps, why in results)
    if not fitting:
      chosen = next((p for _, p, _, _ in results if p is not None), None)
      if chosen is None:
        raise ParamsError(f"auto: no strategy could be planned ({tried})")
      return dataclasses.replace(chosen, notes=chosen.notes + (f"auto: nothing fits ({tried})",))
    best, close = fitting[0], []
    for r in fitting[1:]:
      if r[2] >= best[2] * AUTO_MIN_GAIN:
        best = r
      elif r[2] > best[2]:
        close.append(r)
    close = [r for r in close if r[2] > best[2]]
    s, chosen, sps, _ = best
    # The first candidate is the baseline the others are measured against (pipelined).
    first = results[0][0]
    pipe = results[0]
    label = chosen.label
    if s == first and close:
      other = max(close, key=lambda r: r[2])
      reason = (f"{first} at {sps:,.1f} samples/s; {other[1].label} would be "
                f"{other[2] / sps:.3f}x, under the {AUTO_MIN_GAIN - 1:.0%} a change of "
                f"strategy must gain")
    elif s == first:
      reason = f"{first} at {sps:,.1f} samples/s is the fastest that fits"
    elif pipe[1] is not None and pipe[1].fits and pipe[2] > 0:
      reason = (f"{label} {sps / pipe[2]:.2f}x faster than {first} ({sps:,.1f} vs "
                f"{pipe[2]:,.1f} samples/s)")
    elif pipe[1] is not None:
      p = pipe[1]
      reason = (f"{first} needs {p.memory_needed_bytes / 1e9:,.1f} GB of SRAM, "
                f"{p.memory_available_bytes / 1e9:.1f} GB available; {label} at {sps:,.1f} "
                f"samples/s")
    else:
      reason = f"{label} at {sps:,.1f} samples/s"
    return dataclasses.replace(chosen, reason=reason, notes=chosen.notes + (
        f"auto: chose {chosen.execution_strategy} ({chosen.reason}); tried {tried}",))


report.register_advisor(
    lambda graph, plan, performance, engine, options: advisor.report_lines(
        graph, plan, performance, engine, options, get_planner))
