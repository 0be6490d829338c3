"""A Keras model's mixed-precision policy on this CPU: what a 16-bit type costs where TensorFlow
emulates it, and whether the training call says so.

A model brought from a GPU is often built under `mixed_float16`; TensorFlow 2.15 trains it as
written, emulating float16 on every CPU (its oneDNN products take float32 and bfloat16 only,
so avx512_fp16 does not help) and bfloat16 where the CPU lacks avx512_bf16/AMX-BF16.
Measured side by side in one process, float32 the anchor:
(a) a 1024^3 matmul in each compute dtype; (b) a Keras MLP 256-512-512-16, batch 128, through
`CerebrasEstimator.from_keras_model(...).train(use_cs=True)` under each policy, rounds
interleaved, and the warning of compiler/lints.say_emulated_products counted; (c) a Keras
ResNet-style CNN (64x64x3 images, 4 residual stages of 3x3 convolutions, batch normalization,
global average pooling, batch 32) the same way: a convolution's product, where (b) is mostly
the Estimator's per-step overhead. No goal: the figures back the warning's numbers and what
`mixed_bfloat16` buys a Keras model where the CPU has bf16 math (docs/performance.md, mixed
precision).

    python benchmarks/bench_keras_policies.py [--steps 60] [--rounds 2] [--cnn_steps 30]
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
CNN_BATCH, CNN_IMAGE, CNN_STAGES = 32, 64, ((32, 1), (64, 2), (128, 2), (256, 2))
# A policy this CPU emulates trains the CNN at ~1 example/s: 4 steps timed after 2, not 20 after 10.
EMULATED_CNN_STEPS, EMULATED_CNN_WARMUP = 6, 2


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


def image_input_fn(params=None):
  rng = np.random.RandomState(0)
  x = rng.rand(256, CNN_IMAGE, CNN_IMAGE, 3).astype("float32")
  y = rng.randint(0, 10, 256).astype("int32")
  return tf.data.Dataset.from_tensor_slices(({"image": x}, y)).repeat().batch(CNN_BATCH)


def mlp():
  """A Keras MLP 256-512-512-16 (built under the global policy)."""
  inputs = tf.keras.Input((256,), name="x")
  h = tf.keras.layers.Dense(512, activation="relu")(inputs)
  h = tf.keras.layers.Dense(512, activation="relu")(h)
  return tf.keras.Model(inputs, tf.keras.layers.Dense(16, dtype="float32")(h))


def cnn():
  """A ResNet-style CNN: a 3x3 stem, then per stage two 3x3 convolutions with batch
  normalization and a residual (a 1x1 projection where the shape changes), global average
  pooling and float32 logits, as a user writes one under a mixed policy."""
  layers = tf.keras.layers
  inputs = tf.keras.Input((CNN_IMAGE, CNN_IMAGE, 3), name="image")
  x = layers.Conv2D(CNN_STAGES[0][0], 3, padding="same")(inputs)
  for filters, stride in CNN_STAGES:
    y = layers.Conv2D(filters, 3, stride, padding="same", use_bias=False)(x)
    y = layers.ReLU()(layers.BatchNormalization()(y))
    y = layers.BatchNormalization()(layers.Conv2D(filters, 3, padding="same", use_bias=False)(y))
    if stride != 1 or x.shape[-1] != filters:
      x = layers.Conv2D(filters, 1, stride, use_bias=False)(x)
    x = layers.ReLU()(x + y)
  x = layers.GlobalAveragePooling2D()(x)
  return tf.keras.Model(inputs, layers.Dense(10, dtype="float32")(x))


def examples_per_sec(build, policy: str, data, batch: int, steps: int, said: _Said,
                     warmup: int = WARMUP) -> float:
  """`build()`'s Keras model under `policy`, trained `steps` steps through
  from_keras_model with use_cs=True: examples/s after the first `warmup` steps."""
  tf.keras.mixed_precision.set_global_policy(policy)
  try:
    model = build()
    model.compile("adam", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  finally:
    tf.keras.mixed_precision.set_global_policy("float32")
  stamps = _Stamps()
  est = CerebrasEstimator.from_keras_model(model, config=CSRunConfig(
      model_dir=tempfile.mkdtemp(prefix="bench_keras_policies_"), save_checkpoints_steps=None,
      save_checkpoints_secs=None, log_step_count_steps=None))
  said.lines.clear()
  est.train(data, max_steps=steps, hooks=[stamps], use_cs=True)
  t = stamps.times[warmup:]
  return (len(t) - 1) * batch / (t[-1] - t[0])


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--steps", type=int, default=60)
  ap.add_argument("--rounds", type=int, default=2)
  ap.add_argument("--cnn_steps", type=int, default=30, help="(c)'s steps a call; 0 leaves (c) out")
  args = ap.parse_args()
  said = _Said()
  logging.getLogger("tensorflow").addHandler(said)
  emulated = precision.emulated_dtypes()
  gflops = matmul_gflops(list(POLICIES.values()))
  models = {"mlp": (mlp, input_fn, BATCH, args.steps)}
  if args.cnn_steps:
    models["cnn"] = (cnn, image_input_fn, CNN_BATCH, args.cnn_steps)
  rates = {m: {p: [] for p in POLICIES} for m in models}
  warned = {m: {p: [] for p in POLICIES} for m in models}  # the warning's lines, each call
  for _ in range(args.rounds):
    for name, (build, data, batch, steps) in models.items():
      for policy, dtype in POLICIES.items():
        short = name == "cnn" and dtype in emulated  # ~30 s a step in float16 (1 example/s)
        n, warmup = (EMULATED_CNN_STEPS, EMULATED_CNN_WARMUP) if short else (steps, WARMUP)
        rates[name][policy].append(
            examples_per_sec(build, policy, data, batch, n, said, warmup=warmup))
        warned[name][policy].append(len(said.lines))
  base_mm = gflops["float32"]
  print_table(f"(a) a 1024^3 matmul by compute dtype, the best of 5 rounds interleaved; "
              f"{machine()}",
              ["dtype", "this CPU", "GFLOP/s", "ratio to float32"],
              [(d, "emulated" if d in emulated else "native", f"{g:.1f}", f"{g / base_mm:.3f}")
               for d, g in gflops.items()])
  titles = {
      "mlp": f"(b) a Keras MLP 256-512-512-16 under each policy, batch {BATCH}",
      "cnn": f"(c) a Keras ResNet-style CNN ({CNN_IMAGE}x{CNN_IMAGE}x3, stages "
             f"{'-'.join(str(f) for f, _ in CNN_STAGES)}) under each policy, batch {CNN_BATCH}"}
  for name, (_, _, _, steps) in models.items():
    base_rate = median(rates[name]["float32"])
    short = (f" ({EMULATED_CNN_STEPS}, first {EMULATED_CNN_WARMUP} dropped, where this CPU "
             f"emulates the policy's dtype)" if name == "cnn" else "")
    print_table(f"{titles[name]}, from_keras_model, train(use_cs=True), {steps} steps (first "
                f"{WARMUP} dropped){short} x {args.rounds} rounds interleaved; {machine()}",
                ["policy", "examples/s (median)", "each round", "ratio to float32",
                 "each training call's warning (lints.say_emulated_products; a new model each)"],
                [(p, _rate(median(r)), ", ".join(map(_rate, r)),
                  f"{median(r) / base_rate:.3f}", _said(warned[name][p]))
                 for p, r in rates[name].items()])


def _rate(x: float) -> str:
  return f"{x:,.0f}" if x >= 10 else f"{x:.2f}"


def _said(counts: list) -> str:
  if len(set(counts)) == 1:
    return {1: "said once", 0: "none"}.get(counts[0], str(counts[0]))
  return ", ".join(map(str, counts))


if __name__ == "__main__":
  main()
