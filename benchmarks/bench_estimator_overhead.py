"""Estimator overhead: plain tf.estimator vs CerebrasEstimator(use_cs=False / use_cs=True).

Same model, same steps, interleaved rounds in one process so machine noise hits all three
alike; the compile for use_cs=True is done (and cached) before the timed calls.
Goals (steady state: steps after the first --warmup, timed by a hook): use_cs=False >= 0.97x
plain, use_cs=True (cached compile) >= 0.95x plain. The whole train() call is shown beside:
it adds per-call fixed costs (graph, session, the input-pipeline checkpoint use_cs saves with
the model) that a 300-step call exaggerates.

    python benchmarks/bench_estimator_overhead.py [--rounds 3 --steps 600 --warmup 100]
"""

import argparse
import tempfile
import time

from common import Timer, machine, median, print_table, quiet_tf

tf = quiet_tf()

from cerebras_tf import CerebrasEstimator, CSConfig, CSRunConfig  # noqa: E402
from cerebras_models.mlp.model import input_fn, model_fn  # noqa: E402

PARAMS = {"batch_size": 128, "input_dim": 256, "num_classes": 16, "hidden_sizes": [512, 512],
          "learning_rate": 1e-3, "num_examples": 8192}


def _train_input(params):
  return input_fn(params, tf.estimator.ModeKeys.TRAIN)


class StepTimer(tf.compat.v1.train.SessionRunHook):
  """Stamps the end of every step."""

  def __init__(self):
    self.times = []

  def after_run(self, run_context, run_values):
    self.times.append(time.perf_counter())


def run_once(kind: str, steps: int, warmup: int):
  """(steady-state examples/s, whole-call examples/s)."""
  model_dir = tempfile.mkdtemp(prefix=f"bench_{kind}_")
  timer = StepTimer()
  kw = dict(model_dir=model_dir, tf_random_seed=1, save_checkpoints_steps=10**9,
            save_summary_steps=10**9, log_step_count_steps=10**9)
  if kind == "plain":
    est = tf.estimator.Estimator(model_fn, config=tf.estimator.RunConfig(**kw), params=PARAMS)
    call = lambda: est.train(_train_input, max_steps=steps, hooks=[timer])  # noqa: E731
  else:
    # pipelined: one device, like the plain Estimator (the default, auto, would pick
    # multi_replica for this MLP and train it on 2 host replicas).
    config = CSRunConfig(cs_config=CSConfig(execution_strategy="pipelined"), **kw)
    est = CerebrasEstimator(model_fn, config=config, params=PARAMS,
                            compile_dir=tempfile.gettempdir() + "/bench_compile_cache")
    use_cs = kind == "use_cs=True"
    if use_cs:
      est.compile(_train_input)  # cached for the timed call
    call = lambda: est.train(_train_input, max_steps=steps, hooks=[timer],  # noqa: E731
                             use_cs=use_cs)
  with Timer() as t:
    call()
  steady = timer.times[warmup:]
  return ((len(steady) - 1) * PARAMS["batch_size"] / (steady[-1] - steady[0]),
          steps * PARAMS["batch_size"] / t.seconds)


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--rounds", type=int, default=3)
  ap.add_argument("--steps", type=int, default=600)
  ap.add_argument("--warmup", type=int, default=100, help="steps left out of the steady state")
  args = ap.parse_args()
  kinds = ("plain", "use_cs=False", "use_cs=True")
  results = {k: [] for k in kinds}
  for _ in range(args.rounds):
    for k in kinds:
      results[k].append(run_once(k, args.steps, args.warmup))
  steady = {k: median([r[0] for r in v]) for k, v in results.items()}
  whole = {k: median([r[1] for r in v]) for k, v in results.items()}
  goals = {"plain": "-", "use_cs=False": ">= 0.97", "use_cs=True": ">= 0.95"}
  rows = [(k, f"{steady[k]:,.0f}", f"{steady[k] / steady['plain']:.3f}", goals[k],
           f"{whole[k]:,.0f}", f"{whole[k] / whole['plain']:.3f}") for k in kinds]
  print_table(f"Estimator overhead (MLP 256-512-512-16, batch 128, {args.steps} steps, the first "
              f"{args.warmup} left out of the steady state, x {args.rounds} rounds; {machine()})",
              ["estimator", "steady examples/s (median)", "ratio to plain", "goal",
               "whole train() examples/s", "ratio"], rows)


if __name__ == "__main__":
  main()
