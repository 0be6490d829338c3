"""bfloat16 mixed precision vs float32: BERT training examples/s and held-out MLM accuracy.

For BERT-tiny (2 x 128) and a BERT-small shape (4 x 512), both at sequence length 128, batch
32: `model.mixed_precision` false and true, each trained --steps steps from the same seed on
the real pretraining data (CerebrasEstimator.train, use_cs=True), the first --warmup steps
left out of the rate; then the held-out masked-LM accuracy over --eval_steps batches.

Goal (issue 42): bf16 >= 1.6x the fp32 examples/s on both shapes, held-out accuracy after the
demo's 3,600 steps within 0.5 points of fp32 -- on a CPU with bf16 math (avx512_bf16 or AMX).
On a CPU without it, `mixed_precision: true` trains in float32 (runtime/precision.py); this
script then forces bfloat16 (CEREBRAS_TF_FORCE_BF16=1) so that the bf16 row is measured, and
the table says "emulated": TensorFlow's bf16 kernels on AVX2 convert to and from float32, so
bf16 is slower there and the speed-up column is not the goal's.

With --rounds N each shape trains N times in each dtype, interleaved (the order alternating
round by round, against the drift of a shared VM, which moved BERT-tiny's fp32 rate by a third
within half an hour); the table gives the median rates and the median and range of the per-round
ratios.

With --stream_error it measures precision instead: a GPT (H 256, 4 heads, sequence 128, random
weights, evaluation graph) in bfloat16 against the same weights in float32, the final hidden
state's relative difference, with the residual stream the host uses (float32) and with the
16-bit one the engine's trace builds (tracing_for_engine), at 4, 12 and 24 layers.

    python benchmarks/bench_bf16.py [--steps 3600 --eval_steps 100] [--shapes tiny,small]
        [--rounds 3] [--quick]
    python benchmarks/bench_bf16.py --stream_error
"""

import argparse
import contextlib
import dataclasses
import os
import shutil
import statistics
import tempfile
import time

import numpy as np

import cerebras_tf  # noqa: F401  first, so its oneDNN default applies (TF reads it at import)
from common import ROOT, has_bf16, machine, print_table, quiet_tf  # noqa: E402

tf = quiet_tf()
tf1 = tf.compat.v1

# pylint: disable=wrong-import-position
from cerebras_tf import params as params_lib  # noqa: E402
from cerebras_tf import runner  # noqa: E402
from cerebras_tf.runtime import precision  # noqa: E402
from cerebras_models.gpt import modeling as gpt_modeling  # noqa: E402
from cerebras_models.bert import input as input_lib  # noqa: E402
from cerebras_models.bert import model as bert_model  # noqa: E402
from cerebras_models.data import acquire  # noqa: E402

BATCH = 32
SHAPES = {"tiny": "params_bert_tiny_msl128.yaml", "small": "params_bert_small_msl128.yaml"}


class StepTimer(tf1.train.SessionRunHook):
  """Stamps the end of every training step."""

  def __init__(self):
    self.times = []

  def after_run(self, run_context, run_values):
    self.times.append(time.perf_counter())

  def examples_per_sec(self, warmup: int) -> float:
    t = self.times[warmup:]
    return (len(t) - 1) * BATCH / (t[-1] - t[0]) if len(t) > 1 else float("nan")


def bench_params(shape, model_dir, bf16, steps):
  """The shape's YAML at batch 32 on the prepared data, `steps` steps, no checkpoints between."""
  data = acquire.default_data_dir()
  overrides = [f"runconfig.model_dir={model_dir}", f"model.mixed_precision={str(bf16).lower()}",
               f"train_input.batch_size={BATCH}", f"runconfig.max_steps={steps}",
               "runconfig.save_checkpoints_steps=1000000", "runconfig.log_step_count_steps=1000000",
               "runconfig.save_summary_steps=1000000"]
  for section in ("train_input", "eval_input"):
    overrides += [f"{section}.data_dir={data}",
                  f"{section}.vocab_file={data}/vocab/bert_uncased_vocab.txt"]
  return params_lib.load_params(os.path.join(ROOT, "configs", SHAPES[shape]), overrides)


def run(shape, bf16, steps, warmup, eval_steps):
  """(examples/s, held-out masked-LM accuracy) of one training of `shape`."""
  model_dir = tempfile.mkdtemp(prefix=f"bench_bf16_{shape}_")
  try:
    params = bench_params(shape, model_dir, bf16, steps)
    est = runner.make_estimator(bert_model.model_fn, params, runner.RunOptions())
    tf1.logging.set_verbosity(tf1.logging.ERROR)
    train_input = lambda params: input_lib.input_fn(params, "train")  # noqa: E731
    eval_input = lambda params: input_lib.input_fn(params, "eval")  # noqa: E731
    timer = StepTimer()
    est.train(train_input, max_steps=steps, hooks=[timer], use_cs=True)
    metrics = est.evaluate(eval_input, steps=eval_steps, use_cs=True)
    return timer.examples_per_sec(warmup), float(metrics["masked_lm_accuracy"])
  finally:
    shutil.rmtree(model_dir, ignore_errors=True)


def gpt_final_hidden(layers: int, dtype: str, sixteen_bit_stream: bool) -> np.ndarray:
  """[4, 128, 256] float32: a GPT's final hidden state (after ln_f), weights from seed 1."""
  config = gpt_modeling.GPTConfig(vocab_size=1000, hidden_size=256, num_hidden_layers=layers,
                                  num_heads=4, filter_size=1024, max_position_embeddings=128)
  config = dataclasses.replace(config, dtype=dtype)
  ids = np.random.RandomState(0).randint(0, 1000, [4, 128]).astype("int32")
  with tf.Graph().as_default(), (precision.tracing_for_engine() if sixteen_bit_stream
                                 else contextlib.nullcontext()):
    tf1.set_random_seed(1)
    hidden = gpt_modeling.gpt_hidden(tf.constant(ids), tf.ones([4, 128], tf.int32), config,
                                     training=False)
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      return sess.run(tf.cast(hidden.h, tf.float32))


def stream_error() -> None:
  rows = []
  for layers in (4, 12, 24):
    exact = gpt_final_hidden(layers, "float32", False)
    row = [str(layers)]
    for sixteen in (False, True):
      e = gpt_final_hidden(layers, "bfloat16", sixteen) - exact
      row.append(f"{np.sqrt((e ** 2).mean() / (exact ** 2).mean()):.2%} / "
                 f"{np.abs(e).max() / np.abs(exact).max():.2%}")
    rows.append(row)
  print_table(f"GPT in bfloat16 vs float32, the final hidden state's difference, rms / largest "
              f"(each relative to float32's rms / largest); {machine()}",
              ["layers", "float32 residual stream (the host)",
               "bfloat16 residual stream (the engine's trace)"], rows)


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--stream_error", action="store_true",
                  help="a GPT's bf16 error with a float32 and a 16-bit residual stream")
  ap.add_argument("--steps", type=int, default=300, help="training steps per run (the demo: 3600)")
  ap.add_argument("--warmup", type=int, default=20, help="first steps left out of the rate")
  ap.add_argument("--eval_steps", type=int, default=50, help="held-out batches evaluated")
  ap.add_argument("--shapes", default="tiny,small", help="comma-separated: tiny, small")
  ap.add_argument("--rounds", type=int, default=1,
                  help="trainings per dtype and shape, interleaved")
  ap.add_argument("--quick", action="store_true",
                  help="BERT-tiny only, 30 steps, 4 held-out batches: shows it works")
  args = ap.parse_args()
  if args.stream_error:
    return stream_error()
  if args.rounds < 1:
    ap.error(f"--rounds must be at least 1, got {args.rounds}")
  if args.quick:
    args.steps, args.warmup, args.eval_steps, args.shapes = 30, 5, 4, "tiny"
  native = has_bf16()
  if not native:
    os.environ[precision.FORCE_ENV] = "1"  # measure bf16 itself, not the fp32 fallback
  print(f"machine: {machine()}")
  print(f"bf16 math: {'yes' if native else 'no (bf16 rows emulated by TensorFlow: slower)'}")
  print(f"steps {args.steps} (rate after {args.warmup}), batch {BATCH}, seq 128, "
        f"held-out batches {args.eval_steps}, {args.rounds} round(s) per dtype, interleaved")
  rows = []
  for shape in args.shapes.split(","):
    runs = {False: [], True: []}  # bf16 -> [(examples/s, accuracy)] in round order
    for r in range(args.rounds):
      for bf16 in ((False, True) if r % 2 == 0 else (True, False)):
        runs[bf16].append(run(shape, bf16, args.steps, args.warmup, args.eval_steps))
    ratios = [b[0] / f[0] for f, b in zip(runs[False], runs[True])]
    fp32_rate = statistics.median(x[0] for x in runs[False])
    bf16_rate = statistics.median(x[0] for x in runs[True])
    spread = f" ({min(ratios):.2f}-{max(ratios):.2f}x)" if len(ratios) > 1 else ""
    fp32_acc, bf16_acc = runs[False][0][1], runs[True][0][1]  # same seed: every round alike
    rows.append([f"BERT-{shape}", f"{fp32_rate:.1f}", f"{bf16_rate:.1f}"
                 + ("" if native else " (emulated)"),
                 f"{statistics.median(ratios):.2f}x{spread}",
                 f"{100 * fp32_acc:.2f}%", f"{100 * bf16_acc:.2f}%",
                 f"{100 * (bf16_acc - fp32_acc):+.2f}"])
  print_table("bf16 vs fp32 (goal: >= 1.6x, accuracy within 0.5 points, on a CPU with bf16)",
              ["model", "fp32 ex/s", "bf16 ex/s", "bf16 / fp32 (round range)", "fp32 MLM acc",
               "bf16 MLM acc", "gap (points)"], rows)


if __name__ == "__main__":
  main()
