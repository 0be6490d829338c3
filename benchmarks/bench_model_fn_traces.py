"""How often train(use_cs=True) calls the model_fn, and what each call costs.

A train() call on the engine traces the model_fn twice: once for the compiler (capture.py: a
graph fed by placeholders, without the input pipeline, the runtime's distribution strategy or
device placement; on a cache hit this trace is what the cache key is computed from, so it
also tells whether the model changed), then once by tf.estimator for the graph it trains,
built in its own graph under the plan's runtime (MirroredStrategy replicas, weight servers'
device_fn), which the compiler's graph cannot be. This prints each call's time beside the
whole train() call, for a first call (compile) and a second one (compile cache hit).

    python benchmarks/bench_model_fn_traces.py [--steps 20]
"""

import argparse
import functools
import os
import tempfile
import time

from common import ROOT, machine, print_table, quiet_tf

tf = quiet_tf()

from tensorflow_estimator.python.estimator.util import fn_args  # noqa: E402

from cerebras_tf import params as params_lib, runner  # noqa: E402

MODELS = {
    "mlp": ("configs/params_mlp.yaml", []),
    "bert_tiny": ("configs/params_bert_tiny_msl128.yaml", ["train_input.batch_size=32"]),
}


def timed_factory(calls):
  """runner.make_estimator with the model_fn's calls timed into `calls`."""
  def factory(model_fn, params, opts):
    @functools.wraps(model_fn)
    def timed(features, labels, mode, params, config):
      t = time.perf_counter()
      given = dict(features=features, labels=labels, mode=mode, params=params, config=config)
      try:
        return model_fn(**{k: v for k, v in given.items() if k in fn_args(model_fn)})
      finally:
        calls.append(time.perf_counter() - t)
    return runner.make_estimator(timed, params, opts)
  return factory


def measure(name: str, steps: int):
  path, overrides = MODELS[name]
  data = os.environ.get("CEREBRAS_TF_DATA_DIR")  # the prepared data, if not in ./data_cache
  if data and name.startswith("bert"):
    vocab = f"{data}/vocab/bert_uncased_vocab.txt"
    overrides = overrides + [f"{s}.{k}={v}" for s in ("train_input", "eval_input")
                             for k, v in (("data_dir", data), ("vocab_file", vocab))]
  model_dir = tempfile.mkdtemp(prefix=f"traces_{name}_")
  params = params_lib.load_params(f"{ROOT}/{path}", overrides + [
      f"runconfig.model_dir={model_dir}", "csconfig.execution_strategy=pipelined",
      "runconfig.save_checkpoints_steps=1000000"])
  rows = []
  for round_, label in ((1, "first (compiles)"), (2, "second (cache hit)")):
    calls = []
    t = time.perf_counter()
    runner.run(params, runner.RunOptions(mode="train", max_steps=steps * round_),
               estimator_factory=timed_factory(calls))
    total = time.perf_counter() - t
    rows.append([name, label, len(calls), " + ".join(f"{c:.3f}" for c in calls), f"{total:.2f}",
                 f"{100 * calls[0] / total:.1f}%" if len(calls) > 1 else "-"])
  return rows


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--models", default=",".join(MODELS))
  args = parser.parse_args()
  print(f"host: {machine()}; train(use_cs=True), pipelined, {args.steps} steps a call")
  rows = []
  for name in args.models.split(","):
    rows += measure(name, args.steps)
  print_table("model_fn calls per train(use_cs=True) call",
              ["model", "train() call", "model_fn calls", "each call (s)", "train() (s)",
               "the compile's trace (the extra call) of train()"], rows)


if __name__ == "__main__":
  main()
