"""Compile time: the BERT-Large shape through the whole compiler, from the cache, and the
TF-free planner + simulator alone.

Goals: full compile < 30 s here; planner + simulator < 1 s; a cached compile at most half the
full one. The cache key is the traced graph (a key from source code alone returned stale plans
for input_fns and Keras models defined elsewhere), so a hit still traces; it skips lowering,
planning and rendering.

    python benchmarks/bench_compile.py
"""

import os
import tempfile
import time

from common import ROOT, machine, print_table, quiet_tf

quiet_tf()

from cerebras_tf import CerebrasEstimator, CSConfig, CSRunConfig  # noqa: E402
from cerebras_tf.core import plans  # noqa: E402
from cerebras_tf.engine import spec  # noqa: E402
from cerebras_tf.params import load_params  # noqa: E402
from cerebras_tf.registry import get_model  # noqa: E402


def main():
  params = load_params(os.path.join(ROOT, "configs", "params_bert_large_msl128.yaml"))
  model_fn, input_fn = get_model("bert").resolve()
  compile_dir = tempfile.mkdtemp(prefix="bench_compile_")

  def estimator():
    # pipelined, as the config says (the default CSConfig is auto, which plans all three).
    config = CSRunConfig(model_dir=tempfile.mkdtemp(),
                         cs_config=CSConfig(execution_strategy="pipelined"))
    return CerebrasEstimator(model_fn, config=config, params=params, compile_dir=compile_dir)

  train_input = lambda params: input_fn(params, "train")  # noqa: E731
  t = time.perf_counter()
  full = estimator().compile(train_input)
  full_s = time.perf_counter() - t
  t = time.perf_counter()
  cached = estimator().compile(train_input)
  cached_s = time.perf_counter() - t
  assert cached.cached
  engine = spec.load_engine("cs2")
  options = plans.PlanOptions(batch_size=full.plan.batch_size)
  from cerebras_tf.compiler import plan as plan_lib  # pylint: disable=import-outside-toplevel
  from cerebras_tf.engine import perf  # pylint: disable=import-outside-toplevel
  t = time.perf_counter()
  for _ in range(10):
    p = plan_lib.get_planner("pipelined").plan(full.graph, engine, options)
    perf.simulate(p, full.graph, engine, options)
  plan_s = (time.perf_counter() - t) / 10
  n = len(full.graph.layers)
  print_table(f"Compile time, BERT-Large msl128 batch {full.plan.batch_size} ({n} layers, "
              f"{full.graph.num_params / 1e6:.0f}M params) on cs2; {machine()}",
              ["stage", "seconds", "goal", "ratio to goal"],
              [("full compile (capture, lower, plan, simulate, reports)", f"{full_s:.1f}", "< 30",
                f"{full_s / 30:.2f}"),
               ("cached compile (new estimator, on-disk cache; traces)", f"{cached_s:.2f}",
                "< 0.5x full", f"{cached_s / (0.5 * full_s):.2f}"),
               ("planner + simulator alone", f"{plan_s:.3f}", "< 1", f"{plan_s:.3f}")])
  print(f"\n(fits: {full.plan.fits}, predicted {full.performance.samples_per_sec:,.0f} samples/s, "
        f"utilization {full.performance.utilization:.1%})")


if __name__ == "__main__":
  main()
