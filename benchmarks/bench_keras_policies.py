"""A Keras model's mixed-precision policy on this CPU: what a 16-bit type costs where TensorFlow
emulates it, and whether the training call says so.

A model brought from a GPU is often built under `mixed_float16`; TensorFlow 2.15 trains it as
written, emulating float16 on every CPU (its oneDNN products take float32 and bfloat16 only,
so avx512_fp16 does not help) and bfloat16 where the CPU lacks avx512_bf16/AMX-BF16.
Measured side by side in one process, float32 the anchor:
(a) a 1024^3 matmul in each compute dtype; (b) a Keras MLP 256-512-512-16, batch 128, through
`CerebrasEstimator.from_keras_model(...).train(use_cs=True)` under each policy, rounds
interleaved, and the warning of compiler/lints.say_emulated_products counted. No goal: the
figures back the warning's numbers (docs/performance.md, mixed precision).

    python benchmarks/bench_keras_policies.py [--steps 60] [--rounds 2]
"""

import argparse
import logging
import tempfile
import time

import numpy as np

import cerebras_tf  # noqa: F401  first, so its oneDNN default applies (TF reads it at import)
from common import machine, median, print_table, quiet_tf  # noqa: E402

tf = quiet_tf()
tf1 = tf.compat.v1

# pylint: disable=wrong-import-position
from cerebras_tf import CerebrasEstimator, CSRunConfig  # noqa: E402
from cerebras_tf.runtime import precision  # noqa: E402

POLICIES = {"float32": "float32", "mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}
BATCH, WARMUP = 128, 10


def matmul_gflops(dtypes, n: int = 1024, reps: int = 5, rounds: int = 5) -> dict:
  """{dtype: the best n^3 matmul GFLOP/s}, the dtypes timed in turn in each round."""
  calls = {}
  for dtype in dtypes:
    a = tf.cast(tf.random.normal([n, n]), dtype)
    b = tf.cast(tf.random.normal([n, n]), dtype)
    calls[dtype] = tf.function(lambda a=a, b=b: tf.matmul(a, b))
    calls[dtype]().numpy()
  best = {d: float("inf") for d in dtypes}
  for _ in range(rounds):
    for dtype, mm in calls.items():
      times = 1 if dtype == "float16" else reps  # 2 s a call there
      t0 = time.perf_counter()
      for _ in range(times):
        mm().numpy()
      best[dtype] = min(best[dtype], (time.perf_counter() - t0) / times)
  return {d: 2 * n ** 3 / t / 1e9 for d, t in best.items()}


class _Stamps(tf1.train.SessionRunHook):
  def __init__(self):
    self.times = []

  def after_run(self, run_context, run_values):
    self.times.append(time.perf_counter())


class _Said(logging.Handler):
  def __init__(self):
    super().__init__()
    self.lines = []

  def emit(self, record):
    if "which TensorFlow emulates on this CPU" in record.getMessage():
      self.lines.append(record.getMessage())


def input_fn(params=None):
  rng = np.random.RandomState(0)
  x = rng.randn(4096, 256).astype("float32")
  y = (x[:, 0] > 0).astype("int32")
  return tf.data.Dataset.from_tensor_slices(({"x": x}, y)).repeat().batch(BATCH)


def mlp_examples_per_sec(policy: str, steps: int, said: _Said) -> float:
  tf.keras.mixed_precision.set_global_policy(policy)
  try:
    inputs = tf.keras.Input((256,), name="x")
    h = tf.keras.layers.Dense(512, activation="relu")(inputs)
    h = tf.keras.layers.Dense(512, activation="relu")(h)
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(16, dtype="float32")(h))
    model.compile("adam", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  finally:
    tf.keras.mixed_precision.set_global_policy("float32")
  stamps = _Stamps()
  est = CerebrasEstimator.from_keras_model(model, config=CSRunConfig(
      model_dir=tempfile.mkdtemp(prefix="bench_keras_policies_"), save_checkpoints_steps=None,
      save_checkpoints_secs=None, log_step_count_steps=None))
  said.lines.clear()
  est.train(input_fn, max_steps=steps, hooks=[stamps], use_cs=True)
  t = stamps.times[WARMUP:]
  return (len(t) - 1) * BATCH / (t[-1] - t[0])


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--steps", type=int, default=60)
  ap.add_argument("--rounds", type=int, default=2)
  args = ap.parse_args()
  said = _Said()
  logging.getLogger("tensorflow").addHandler(said)
  emulated = precision.emulated_dtypes()
  gflops = matmul_gflops(list(POLICIES.values()))
  rates = {p: [] for p in POLICIES}
  warned = {p: [] for p in POLICIES}  # the warning's lines in each training call
  for _ in range(args.rounds):
    for policy in POLICIES:
      rates[policy].append(mlp_examples_per_sec(policy, args.steps, said))
      warned[policy].append(len(said.lines))
  base_mm, base_rate = gflops["float32"], median(rates["float32"])
  print_table(f"(a) a 1024^3 matmul by compute dtype, the best of 5 rounds interleaved; "
              f"{machine()}",
              ["dtype", "this CPU", "GFLOP/s", "ratio to float32"],
              [(d, "emulated" if d in emulated else "native", f"{g:.1f}", f"{g / base_mm:.3f}")
               for d, g in gflops.items()])
  print_table(f"(b) a Keras MLP 256-512-512-16 under each policy, batch {BATCH}, "
              f"from_keras_model, train(use_cs=True), {args.steps} steps (first {WARMUP} "
              f"dropped) x {args.rounds} rounds interleaved; {machine()}",
              ["policy", "examples/s (median)", "each round", "ratio to float32",
               "each training call's warning (lints.say_emulated_products; a new model each)"],
              [(p, f"{median(r):,.0f}", ", ".join(f"{x:,.0f}" for x in r),
                f"{median(r) / base_rate:.3f}",
                {1: "said once", 0: "none"}.get(set(warned[p]).pop(), "?")
                if len(set(warned[p])) == 1 else ", ".join(map(str, warned[p])))
               for p, r in rates.items()])


if __name__ == "__main__":
  main()
