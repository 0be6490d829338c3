"""The advisor: what to change to go faster or to fit, each suggestion planned and simulated.

Every suggestion is a change of the plan options (strategy, replicas, systems, batch, micro-
batch, VTS) that the advisor has actually planned and simulated; `Advice.options` is what to
compile to get `Advice.samples_per_sec` (tests/engine/test_report_advice.py compiles them).
Pure Python; registered with `engine/report.py` by `compiler/plan/__init__.py`, so report.txt
gets the lines without the engine knowing a planner.
"""

import dataclasses
import math
from typing import List, Optional, Tuple

from cerebras_tf.core import batching, ir, plans
from cerebras_tf.engine import perf

MIN_GAIN = 1.05   # suggest a change that buys at least 5% (or makes the model fit); auto's too
MAX_ADVICE = 4


@dataclasses.dataclass(frozen=True)
class Advice:
  """One suggestion: the changed options, what it predicts, and why."""

  label: str                       # e.g. "execution_strategy: multi_replica (R=4)"
  options: plans.PlanOptions       # compile with these to get the prediction
  fits: bool
  samples_per_sec: float
  speedup: float                   # vs the current plan (inf when the current one does not fit)
  why: str = ""

  def line(self) -> str:
    gain = ("fits" if not math.isfinite(self.speedup) else f"{self.speedup:.2f}x"
            if self.speedup >= 0.1 else f"{1 / self.speedup:,.0f}x slower")
    return (f"{self.label} -> {self.samples_per_sec:,.1f} samples/s ({gain})"
            + (f"; {self.why}" if self.why else ""))


def _try(graph, engine, options, get_planner) -> Optional[plans.Plan]:
  try:
    return get_planner(options.execution_strategy).plan(graph, engine, options)
  except batching.BatchError:
    return None


def advise(graph: ir.LayerGraph, engine, options: plans.PlanOptions, plan: plans.Plan,
           performance: Optional[plans.Performance], get_planner) -> List[Advice]:
  """Up to MAX_ADVICE suggestions, best first, each planned and simulated.

  Args:
    graph, engine, options, plan, performance: the compiled model and its prediction.
    get_planner: `compiler.plan.get_planner` (passed in: this module is imported by it).
  """
  base = performance.samples_per_sec if performance is not None and plan.fits else 0.0
  b = plan.batch_size
  cands = []  # (label, options, why)
  for s, mode in plans.MODES.items():
    if mode is plan.mode:
      continue
    if mode.streams_weights:
      cands.append((f"execution_strategy: {s}",
                    dataclasses.replace(options, execution_strategy=s, num_replicas=None,
                                        num_csx=max(1, plan.num_csx)), ""))
      continue
    # One system, weights on the wafer: the weight-streaming settings go back to their
    # defaults, and the label says so (plans.option_conflict refuses them with this mode).
    reset = {"num_csx": 1, "max_wgt_servers": 1, "sparsity": 0.0}
    changed = [f"{k}: {v:g}" for k, v in reset.items() if getattr(options, k) != v]
    cands.append((f"execution_strategy: {s}" + (f" with {', '.join(changed)}" if changed else ""),
                  dataclasses.replace(options, execution_strategy=s, num_replicas=None, **reset),
                  ""))
  if plan.mode.streams_weights:
    n = plan.num_csx * 2
    if n <= engine.swarmx_max_systems:
      nb = b if b % n == 0 else (b // n + 1) * n
      cands.append((f"num_csx: {n}" + (f", batch {nb}" if nb != b else ""),
                    dataclasses.replace(options, num_csx=n, batch_size=nb),
                    "weight streaming splits the batch across systems"))
  if plan.fits:
    cands.append((f"batch: {2 * b}", dataclasses.replace(options, batch_size=2 * b),
                  "amortizes the per-step drain / per-layer costs; mind the critical batch "
                  "size for convergence"))
  elif plan.refusal is not None and plan.refusal.kind == plans.BATCH:
    if not options.micro_batching:
      cands.append(("micro_batching: on", dataclasses.replace(options, micro_batching=True),
                    "runs the batch in micro-batches that fit"))
    if b > 1:
      cands.append((f"batch: {max(1, b // 2)}",
                    dataclasses.replace(options, batch_size=max(1, b // 2)), ""))
  if graph.seq_len > 1 and not options.vts:
    cands.append(("vts: true (if half the tokens are padding: token_fraction 0.5)",
                  dataclasses.replace(options, vts=True, token_fraction=0.5,
                                      token_sq_fraction=0.3),
                  "costs only real tokens; the compiler measures the fractions from the data"))
  fix = _batch_norm_fix(graph, engine, plan, options)   # correctness: shown even when slower
  if fix is not None:
    cands.append((*fix, ""))
  norms = bool(graph.batch_norm_layers) and perf.training(options)

  def for_batch_norm(opts):
    return fix is not None and opts is fix[1]
  out = []
  for label, opts, why in cands:
    p = _try(graph, engine, opts, get_planner)
    if p is None or not p.fits:
      continue
    if p.mode.replicates and p.num_replicas == 1 and not for_batch_norm(opts):
      continue  # one replica is the pipelined plan, suggested (or current) as itself
    if norms and not p.batching.keeps_batch_norm and (
        for_batch_norm(opts) or plan.batching.keeps_batch_norm):
      continue  # speed bought with batch-norm statistics of a few samples is not advice
    if for_batch_norm(opts):
      group = "a replica" if p.mode.replicates else "a micro-batch"
      why = (f"batch norm over {p.batching.batch_norm_samples} samples {group}, not "
             f"{plan.batching.batch_norm_samples}")
    sps = perf.simulate(p, graph, engine, opts).samples_per_sec
    label = label.replace(p.execution_strategy, p.label, 1)
    speed = sps / base if base > 0 else math.inf
    if base > 0 and speed < MIN_GAIN and not for_batch_norm(opts):
      continue
    out.append(Advice(label, opts, True, sps, speed, why))
  # The batch-norm change first: it is about the numbers the model learns, not speed.
  out.sort(key=lambda a: (not for_batch_norm(a.options), -a.samples_per_sec))
  return out[:MAX_ADVICE]


def _batch_norm_fix(graph: ir.LayerGraph, engine, plan: plans.Plan,
                    options: plans.PlanOptions) -> Optional[Tuple[str, plans.PlanOptions]]:
  """For a training plan whose batch-norm statistics cover fewer than
  batching.BATCH_NORM_MIN_SAMPLES samples on the engine: (label, options) of the setting
  that gives them that many, or None. A forced multi_replica R: the largest R dividing the
  batch that keeps 16 a replica (1 when the batch itself is smaller). Weight streaming: the
  most systems that keep 16 each when num_csx is the cause, else the faster of the largest
  micro-batch the wafer holds and the smallest whose statistics keep 16."""
  if not graph.batch_norm_layers or not perf.training(options) or not plan.fits:
    return None
  split, b = plan.batching, plan.batch_size
  if split.keeps_batch_norm:
    return None
  if plan.mode.replicates:
    r = batching.most_groups_keeping_batch_norm(b, plan.num_replicas - 1)
    return f"num_replicas: {r}", dataclasses.replace(options, num_replicas=r)
  if not plan.mode.streams_weights:
    return None
  low = batching.BATCH_NORM_MIN_SAMPLES
  if split.num_systems > 1 and split.per_system < low:
    n = batching.most_groups_keeping_batch_norm(b, split.num_systems - 1)
    return f"num_csx: {n}", dataclasses.replace(options, num_csx=n)
  # The largest micro-batch the wafer holds (fewest per-layer costs) and the smallest that
  # keeps 16 (least spilled activations): whichever runs faster.
  per = split.per_system
  limit = perf.ws_max_micro_batch(graph, engine, options)
  sizes = {m for m in (min(per, limit), batching.smallest_micro_batch_keeping_batch_norm(per))
           if 1 <= m <= limit and per // -(-per // m) >= low}
  if not sizes:
    return None   # nothing the wafer holds keeps 16: the plan's note says what would
  m = min(sizes, key=lambda m: perf.ws_cost(
      graph, engine, dataclasses.replace(options, micro_batch_size=m)).step_s)
  return f"micro_batch_size: {m}", dataclasses.replace(options, micro_batch_size=m)


def report_lines(graph, plan, performance, engine, options, get_planner) -> List[str]:
  """report.txt lines: "advice: ..." per suggestion, or that nothing tried helps."""
  advice = advise(graph, engine, options, plan, performance, get_planner)
  if not advice:
    return ["advice: nothing tried (other strategies, 2x batch, 2x systems, VTS) gains 5%"]
  return ["advice: " + a.line() for a in advice]
