"""Planner + simulator time: GPT-3 175B weight streaming over 1..16 systems, BERT-Large
pipelined, BERT-Base multi_replica (R search) and auto. Goal: < 10 s total, < 1 s BERT-Large.

Analytic graphs (cerebras_tf/analysis/analytic.py); no TensorFlow. Prints a markdown table.
"""

import time

import common  # noqa: F401  (repo on sys.path)
from common import machine, print_table

from cerebras_tf.analysis import analytic
from cerebras_tf.core import plans
from cerebras_tf.compiler.plan import get_planner
from cerebras_tf.engine import perf, spec


def timed(graph, engine, strategy, batch, **kw):
  opts = plans.PlanOptions(batch_size=batch, execution_strategy=strategy, **kw)
  t0 = time.perf_counter()
  plan = get_planner(strategy).plan(graph, engine, opts)
  pf = perf.simulate(plan, graph, engine, opts)
  return time.perf_counter() - t0, plan, pf


def main():
  cs2 = spec.load_engine("cs2")
  rows, total = [], 0.0
  g3 = analytic.gpt3_175b()
  for n in (1, 2, 4, 8, 16):
    dt, plan, pf = timed(g3, cs2, "weight_streaming", 1536, num_csx=n)
    total += dt
    rows.append([f"GPT-3 175B ({len(g3.layers)} layers)", f"weight_streaming x{n}",
                 f"{dt * 1e3:.1f}", f"{pf.samples_per_sec:,.2f}", plan.fits, "-"])
  for name, g, strat, b in (("BERT-Large", analytic.bert_large(), "pipelined", 1024),
                            ("BERT-Base", analytic.bert_base(), "multi_replica", 256),
                            ("BERT-Base", analytic.bert_base(), "auto", 256)):
    dt, plan, pf = timed(g, cs2, strat, b)
    total += dt
    label = strat + (f" (R={plan.num_replicas})" if plan.num_replicas > 1 else "")
    rows.append([f"{name} ({len(g.layers)} layers)", label, f"{dt * 1e3:.1f}",
                 f"{pf.samples_per_sec:,.1f}", plan.fits,
                 "< 1,000 ms" if strat == "pipelined" else "-"])
  rows.append(["total", "", f"{total * 1e3:.1f}", "", "", "< 10,000 ms"])
  print_table(f"Planner + simulator time on {machine()}",
              ["model", "strategy", "ms", "predicted samples/s", "fits", "goal"], rows)


if __name__ == "__main__":
  main()
