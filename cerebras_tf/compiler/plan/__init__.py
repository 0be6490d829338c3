"""Planners by execution strategy: `get_planner("pipelined").plan(graph, engine, options)`.

Each strategy module registers its Planner class here. `multi_replica` and `weight_streaming`
live in `multi_replica.py` / `weight_streaming.py` beside `pipelined.py` and are imported on
first use, so adding one is: write the module, subclass `base.Planner`, add it to `_MODULES`.
`auto` plans every available strategy and keeps the fastest one that fits.
"""

import importlib
from typing import Callable, Dict

from cerebras_tf.compiler.plan import base
from cerebras_tf.errors import ParamsError

# strategy -> (module, class name); imported lazily so a missing module only fails when used.
_MODULES = {
    base.PIPELINED: ("cerebras_tf.compiler.plan.pipelined", "PipelinedPlanner"),
    base.MULTI_REPLICA: ("cerebras_tf.compiler.plan.multi_replica", "MultiReplicaPlanner"),
    base.WEIGHT_STREAMING: ("cerebras_tf.compiler.plan.weight_streaming",
                            "WeightStreamingPlanner"),
}
_REGISTRY: Dict[str, Callable[[], base.Planner]] = {}


def register_planner(strategy: str, factory: Callable[[], base.Planner]) -> None:
  """Registers (or replaces) the planner factory of a strategy."""
  _REGISTRY[strategy] = factory


def _load(strategy: str):
  if strategy in _REGISTRY:
    return _REGISTRY[strategy]
  module, cls = _MODULES[strategy]
  try:
    factory = getattr(importlib.import_module(module), cls)
  except (ImportError, AttributeError):
    return None
  _REGISTRY[strategy] = factory
  return factory


def available_strategies():
  """Strategies whose planner can be built now (plus "auto")."""
  return tuple(s for s in _MODULES if _load(s) is not None) + (base.AUTO,)


def get_planner(strategy: str) -> base.Planner:
  """The planner for an execution strategy.

  Raises:
    ParamsError: unknown strategy, or one whose planner is not available (lists choices).
  """
  if strategy == base.AUTO:
    return AutoPlanner()
  if strategy not in _MODULES and strategy not in _REGISTRY:
    raise ParamsError(f"unknown execution_strategy {strategy!r}; choices: "
                      f"{', '.join(base.STRATEGIES)}")
  factory = _load(strategy)
  if factory is None:
    raise ParamsError(f"execution_strategy {strategy!r} has no planner in this version; "
                      f"available: {', '.join(available_strategies())}")
  return factory()


class AutoPlanner(base.Planner):
  """Plans every available strategy; returns the fastest predicted plan that fits.

  Ties keep the earlier strategy (pipelined, then multi_replica, then weight_streaming), so a
  multi_replica plan with R = 1 never displaces pipelined. `plan.reason` says why the winner
  won, e.g. "pipelined needs 3,162.0 GB of SRAM, 37.1 GB available; weight_streaming at 21.6
  samples/s" or "multi_replica (R=4) 1.70x faster than pipelined". With nothing fitting, the
  pipelined plan (its reason names the numbers) is returned.
  """

  strategy = base.AUTO

  def plan(self, graph, engine, options):
    import dataclasses  # pylint: disable=import-outside-toplevel
    from cerebras_tf.engine import perf  # pylint: disable=import-outside-toplevel
    results = []  # (strategy, plan or None, samples/s, why not)
    for s in available_strategies():
      if s == base.AUTO:
        continue
      opts = dataclasses.replace(options, execution_strategy=s)
      try:
        p = get_planner(s).plan(graph, engine, opts)
      except ParamsError as e:  # e.g. a batch num_csx does not divide: not a candidate
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
    best = fitting[0]
    for r in fitting[1:]:
      if r[2] > best[2]:
        best = r
    s, chosen, sps, _ = best
    pipe = next((r for r in results if r[0] == base.PIPELINED), None)
    label = f"{s} (R={chosen.num_replicas})" if s == base.MULTI_REPLICA else s
    if s == base.PIPELINED:
      reason = f"pipelined at {sps:,.1f} samples/s is the fastest that fits"
    elif pipe is not None and pipe[1] is not None and pipe[1].fits and pipe[2] > 0:
      reason = f"{label} {sps / pipe[2]:.2f}x faster than pipelined ({sps:,.1f} vs {pipe[2]:,.1f} samples/s)"
    elif pipe is not None and pipe[1] is not None:
      p = pipe[1]
      reason = (f"pipelined needs {p.memory_needed_bytes / 1e9:,.1f} GB of SRAM, "
                f"{p.memory_available_bytes / 1e9:.1f} GB available; {label} at {sps:,.1f} "
                f"samples/s")
    else:
      reason = f"{label} at {sps:,.1f} samples/s"
    return dataclasses.replace(chosen, reason=reason, notes=chosen.notes + (
        f"auto: chose {chosen.execution_strategy} ({chosen.reason}); tried {tried}",))
