"""Compile time: the BERT-Large shape through the whole compiler, from the cache, and the
TF-free planner + simulator alone.

Goals: full compile < 30 s here; planner + simulator < 1 s; a cached compile at most half the
full one. A second table times the TF-free back half (plan, simulate, advise, draw: what
`compile.plan_and_report` does) on BERT-Large and on a Keras ResNet50, whose repeated conv
blocks the planners and the advisor cost many times: with the conv op-cost memo
(`conv.best_op_cost`'s cache) and without it, side by side. The cache key is the traced graph (a key from source code alone returned stale plans
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
from cerebras_tf.compiler import compile as compile_lib  # noqa: E402
from cerebras_tf.core import plans  # noqa: E402
from cerebras_tf.engine import conv, spec  # noqa: E402
from cerebras_models.cnn import foreign  # noqa: E402
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
  back_half(full, engine)


def plan_and_report_s(result, engine, strategy, memo: bool) -> float:
  """Seconds for plan_and_report on `result`'s graph, the conv memo on (cleared first) or off."""
  options = plans.PlanOptions(batch_size=result.plan.batch_size, execution_strategy=strategy)
  cached, uncached = conv.best_op_cost, conv.best_op_cost.__wrapped__
  cached.cache_clear()
  conv.best_op_cost = cached if memo else uncached
  try:
    t = time.perf_counter()
    compile_lib.plan_and_report(result.graph, engine, options, tempfile.mkdtemp())
    return time.perf_counter() - t
  finally:
    conv.best_op_cost = cached


def back_half(bert, engine):
  model = foreign.resnet50()
  est = CerebrasEstimator.from_keras_model(model, config=CSRunConfig(
      model_dir=tempfile.mkdtemp(), cs_config=CSConfig(execution_strategy="weight_streaming")))
  resnet = est.compile(foreign.input_fn_for(model, 8))
  rows = []
  for name, result, strategy in (("BERT-Large msl128", bert, "pipelined"),
                                 ("ResNet50 96x96, batch 8", resnet, "weight_streaming")):
    off = plan_and_report_s(result, engine, strategy, memo=False)
    on = plan_and_report_s(result, engine, strategy, memo=True)
    rows.append((name, strategy, len(result.graph.layers), f"{off:.2f}", f"{on:.2f}",
                 f"{off / on:.2f}x"))
  print_table(f"plan_and_report (plan, simulate, advise, sensitivity, wafer picture); {machine()}",
              ["model", "strategy", "layers", "s, no conv memo", "s, conv memo", "speed-up"], rows)


if __name__ == "__main__":
  main()
