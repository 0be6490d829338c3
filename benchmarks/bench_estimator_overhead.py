"""Estimator overhead: plain tf.estimator vs CerebrasEstimator(use_cs=False / use_cs=True).

Same model, same steps, interleaved rounds in one process so machine noise hits all three
alike; the compile for use_cs=True is done (and cached) before the timed calls.
Goals: use_cs=False >= 0.97x plain, use_cs=True (cached compile) >= 0.95x plain.

    python benchmarks/bench_estimator_overhead.py [--rounds 3 --steps 300]
"""

import argparse
import tempfile

from common import Timer, machine, median, print_table, quiet_tf

tf = quiet_tf()

from cerebras_tf import CerebrasEstimator, CSConfig, CSRunConfig  # noqa: E402
from models.mlp.model import input_fn, model_fn  # noqa: E402

PARAMS = {"batch_size": 128, "input_dim": 256, "num_classes": 16, "hidden_sizes": [512, 512],
          "learning_rate": 1e-3, "num_examples": 8192}


def _train_input(params):
  return input_fn(params, tf.estimator.ModeKeys.TRAIN)


def run_once(kind: str, steps: int) -> float:
  model_dir = tempfile.mkdtemp(prefix=f"bench_{kind}_")
  kw = dict(model_dir=model_dir, tf_random_seed=1, save_checkpoints_steps=10**9,
            save_summary_steps=10**9, log_step_count_steps=10**9)
  if kind == "plain":
    est = tf.estimator.Estimator(model_fn, config=tf.estimator.RunConfig(**kw), params=PARAMS)
    call = lambda: est.train(_train_input, max_steps=steps)  # noqa: E731
  else:
    # pipelined: one device, like the plain Estimator (the default, auto, would pick
    # multi_replica for this MLP and train it on 2 host replicas).
    config = CSRunConfig(cs_config=CSConfig(execution_strategy="pipelined"), **kw)
    est = CerebrasEstimator(model_fn, config=config, params=PARAMS,
                            compile_dir=tempfile.gettempdir() + "/bench_compile_cache")
    use_cs = kind == "use_cs=True"
    if use_cs:
      est.compile(_train_input)  # cached for the timed call
    call = lambda: est.train(_train_input, max_steps=steps, use_cs=use_cs)  # noqa: E731
  with Timer() as t:
    call()
  return steps * PARAMS["batch_size"] / t.seconds


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--rounds", type=int, default=3)
  ap.add_argument("--steps", type=int, default=300)
  args = ap.parse_args()
  kinds = ("plain", "use_cs=False", "use_cs=True")
  results = {k: [] for k in kinds}
  for _ in range(args.rounds):
    for k in kinds:
      results[k].append(run_once(k, args.steps))
  base = median(results["plain"])
  goals = {"plain": "-", "use_cs=False": ">= 0.97", "use_cs=True": ">= 0.95"}
  rows = [(k, f"{median(v):,.0f}", f"{median(v) / base:.3f}", goals[k]) for k, v in results.items()]
  print_table(f"Estimator overhead (MLP 256-512-512-16, batch 128, {args.steps} steps x "
              f"{args.rounds} rounds; {machine()})",
              ["estimator", "examples/s (median)", "ratio to plain", "goal"], rows)


if __name__ == "__main__":
  main()
