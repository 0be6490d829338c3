#!/usr/bin/env python3
"""Compiles models people bring (models/cnn/foreign.py) for the engine.

    python benchmarks/bench_foreign_models.py [--batch 32] [--engine cs2] [--models ResNet50,U-Net]
    python benchmarks/bench_foreign_models.py --quick   # U-Net, LSTM LM and MobileNetV2 only

For each model: parameters, GFLOPs per sample (forward + backward, from the lowered graph),
the execution strategy chosen, whether it fits, the predicted samples/s, the bottleneck, and the
time on this host of the conversion (CerebrasEstimator.from_keras_model) and of the compile; or the refusal with every op the engine has no kernel for. The
table in the README ("Bring your own model (Keras)") is this script's output.
"""

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402  pylint: disable=wrong-import-position

tf = common.quiet_tf()

from cerebras_tf import CerebrasEstimator, CSConfig, CSRunConfig  # noqa: E402  pylint: disable=wrong-import-position
from cerebras_tf.errors import CompileError  # noqa: E402  pylint: disable=wrong-import-position
from cerebras_models.cnn import foreign  # noqa: E402  pylint: disable=wrong-import-position


def compile_one(name: str, batch: int, engine: str) -> list:
  build, what = foreign.SUITE[name]
  model = build()
  tmp = tempfile.mkdtemp(prefix="foreign_")
  try:
    t0 = time.perf_counter()
    est = CerebrasEstimator.from_keras_model(model, config=CSRunConfig(
        model_dir=tmp, cs_config=CSConfig(engine=engine)))
    convert = f"{time.perf_counter() - t0:.1f}"
    t0 = time.perf_counter()
    try:
      result = est.compile(foreign.input_fn_for(model, batch))
    except CompileError as e:
      return [name, what, f"{model.count_params():,}", "-", "-", "refused", "-", str(e),
              convert, f"{time.perf_counter() - t0:.1f}"]
    seconds = time.perf_counter() - t0
    g, plan, perf = result.graph, result.plan, result.performance
    return [name, what, f"{g.num_params:,}", f"{g.flops_per_sample / 1e9:.2f}",
            plan.execution_strategy, "yes" if plan.fits else f"no: {plan.reason}",
            f"{perf.samples_per_sec:,.0f}" if plan.fits else "-", perf.bottleneck,
            convert, f"{seconds:.1f}"]
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
    tf.keras.backend.clear_session()


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--engine", default="cs2")
  parser.add_argument("--models", default=",".join(foreign.SUITE))
  parser.add_argument("--quick", action="store_true", help="the three fastest models only")
  args = parser.parse_args(argv)
  if args.quick:
    args.models = "U-Net,LSTM LM,MobileNetV2"
  rows = [compile_one(n.strip(), args.batch, args.engine) for n in args.models.split(",")]
  common.print_table(
      f"Foreign models on {args.engine}, global batch {args.batch} ({common.machine()})",
      ["model", "as built", "params", "GFLOP/sample (fwd+bwd)", "strategy", "fits",
       "samples/s (simulated)", "bottleneck", "from_keras_model s", "compile s"], rows)
  return 0


if __name__ == "__main__":
  sys.exit(main())
