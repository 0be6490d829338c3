"""Evaluation speed of the reference models: this tree vs an earlier commit, and the TensorFlow
pattern that made the Transformer's evaluation slow.

  (a) eval examples/s of BERT-tiny (the demo's config: masked-LM loss and accuracy) and
      Transformer-tiny (teacher-forced loss plus greedy decoding for BLEU) on one checkpoint,
      at --before (default e440c12, before evaluation scored BERT's labelled slots alone and the
      Transformer's attention scores became an einsum) and at this tree. Each measurement is a
      fresh process; rounds interleave the two trees; the table gives medians and says whether
      the two trees' metrics are equal. The checkpoint is 2 training steps of this tree: an
      untrained Transformer decodes every sentence to the length limit, its slowest case.
  (b) the attention scores' pattern alone, [32, 4, 128, 32] queries and keys, oneDNN on:
      TF 2.15's remapper fuses BatchMatMul * scale + addend into one oneDNN op, which runs a
      [1, 1, L, L] addend (a causal bias) far slower than any other shape, and BERT's
      [B, 1, 1, L] padding bias somewhat slower than the ops apart; an einsum is not fused.

    python benchmarks/bench_eval_speed.py [--rounds 3] [--only a|b]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TREE = os.path.dirname(HERE)
BEFORE = "e440c12"

MODELS = {  # name -> (YAML in the tree, eval batches)
    "bert_tiny": ("configs/params_bert_tiny_msl128.yaml", 60),
    "transformer_tiny": ("configs/params_transformer_tiny.yaml", 5),
}
WARMUP = 1  # batches whose time is dropped (graph optimization, oneDNN primitives)


# --- child: one evaluation ------------------------------------------------------------------

def child(args):
  sys.path.insert(0, args.tree)
  os.chdir(args.tree)
  import cerebras_tf  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  tf1 = tf.compat.v1
  tf1.logging.set_verbosity(tf1.logging.ERROR)
  from cerebras_tf import params as params_lib  # pylint: disable=import-outside-toplevel
  from cerebras_tf import registry, runner  # pylint: disable=import-outside-toplevel
  yaml_file, batches = MODELS[args.model]
  params = params_lib.load_params(os.path.join(args.tree, yaml_file),
                                  [f"runconfig.model_dir={args.model_dir}"])
  model_fn, input_fn = registry.get_model(params["model"]["name"]).resolve()
  est = runner.make_estimator(model_fn, params, runner.RunOptions())

  class Stamp(tf1.train.SessionRunHook):
    wall = []

    def after_run(self, run_context, run_values):
      self.wall.append(time.perf_counter())

  stamp = Stamp()
  metrics = est.evaluate(lambda params: input_fn(params, "eval"), steps=batches,
                         hooks=[stamp], use_cs=True)
  w = stamp.wall[WARMUP:]
  batch = params["eval_input"]["batch_size"]
  print("RESULT " + json.dumps({
      "examples_per_sec": (len(w) - 1) * batch / (w[-1] - w[0]), "batch": batch,
      "metrics": {k: float(v) for k, v in metrics.items()}}))


def train_checkpoint(model) -> str:
  """A model_dir with 2 training steps of `model` by this tree's scripts/run.py."""
  model_dir = tempfile.mkdtemp(prefix=f"bench_eval_{model}_")
  subprocess.run([sys.executable, os.path.join(TREE, "scripts", "run.py"), "--params",
                  MODELS[model][0], "--mode", "train", "--max_steps", "2", "--model_dir",
                  model_dir], cwd=TREE, capture_output=True, check=True,
                 env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
  return model_dir


def measure(tree, model, model_dir):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=tree)
  cmd = [sys.executable, os.path.abspath(__file__), "--child", "--tree", tree, "--model", model,
         "--model_dir", model_dir]
  out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
  for line in out.stdout.splitlines():
    if line.startswith("RESULT "):
      return json.loads(line[len("RESULT "):])
  raise RuntimeError(f"{model} in {tree} failed:\n{out.stderr[-3000:]}")


# --- (b): the pattern alone ------------------------------------------------------------------

def attention_scores_ms(reps=3):
  """{form: ms a run, the best of `reps` timings} for softmax(scores) with scores from each
  form, in one process."""
  os.environ["TF_ENABLE_ONEDNN_OPTS"] = "1"  # before TensorFlow's import: the fusion is oneDNN's
  import numpy as np  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  tf1 = tf.compat.v1
  b, n, length, d = 32, 4, 128, 32
  forms = {
      "matmul * scale + bias [1, 1, L, L] (causal)":
          ((1, 1, length, length), lambda q, k: tf.matmul(q, k, transpose_b=True) * 0.17),
      "einsum * scale + bias [1, 1, L, L] (causal; models/transformer now)":
          ((1, 1, length, length), lambda q, k: tf.einsum("bnqd,bnkd->bnqk", q, k) * 0.17),
      "matmul * scale + bias [B, 1, 1, L] (padding; BERT before)":
          ((b, 1, 1, length), lambda q, k: tf.matmul(q, k, transpose_b=True) * 0.17),
      "einsum * scale + bias [B, 1, 1, L] (padding; models/bert now)":
          ((b, 1, 1, length), lambda q, k: tf.einsum("bnqd,bnkd->bnqk", q, k) * 0.17),
      "matmul + bias [1, 1, L, L], no scale":
          ((1, 1, length, length), lambda q, k: tf.matmul(q, k, transpose_b=True)),
  }
  rng = np.random.default_rng(0)
  out = {}
  for label, (bias_shape, scores) in forms.items():
    with tf.Graph().as_default():
      # Variables and a fed bias: from constants, grappler folded the einsum's product away
      # (1.8 ms against 5.3 with variables) and the table compared unequal work.
      q = tf1.get_variable("q", initializer=rng.standard_normal((b, n, length, d), np.float32))
      k = tf1.get_variable("k", initializer=rng.standard_normal((b, n, length, d), np.float32))
      bias = tf1.placeholder(tf.float32, bias_shape)
      total = tf.reduce_sum(tf.nn.softmax(scores(q, k) + bias))
      feed = {bias: rng.standard_normal(bias_shape).astype(np.float32)}
      with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(total, feed)
        t = time.perf_counter()
        sess.run(total, feed)
        # ~0.3 s a timing, the best of `reps`: a fast form's one run is a few ms, where one
        # scheduling hiccup doubled it (the BERT row read 10.3, 6.5 and 5.3 ms in three runs).
        runs = max(1, int(0.3 / (time.perf_counter() - t)))
        best = float("inf")
        for _ in range(reps):
          t = time.perf_counter()
          for _ in range(runs):
            sess.run(total, feed)
          best = min(best, (time.perf_counter() - t) / runs)
        out[label] = best * 1e3
  return out


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  ap.add_argument("--tree", default=TREE, help=argparse.SUPPRESS)
  ap.add_argument("--model", default="bert_tiny", help=argparse.SUPPRESS)
  ap.add_argument("--model_dir", help=argparse.SUPPRESS)
  ap.add_argument("--before", default=BEFORE)
  ap.add_argument("--rounds", type=int, default=3)
  ap.add_argument("--only", choices=["a", "b"])
  args = ap.parse_args()
  if args.child:
    return child(args)

  from bench_host_speed import export_tree  # pylint: disable=import-outside-toplevel
  from common import machine, median, print_table  # pylint: disable=import-outside-toplevel
  if args.only != "b":
    before = export_tree(args.before)
    dirs = {model: train_checkpoint(model) for model in MODELS}
    runs = {}
    for _ in range(args.rounds):
      for model in MODELS:
        for label, tree in (("before", before), ("after", TREE)):
          runs.setdefault((model, label), []).append(measure(tree, model, dirs[model]))
    rows = []
    for model, (_, batches) in MODELS.items():
      b = median([r["examples_per_sec"] for r in runs[(model, "before")]])
      a = median([r["examples_per_sec"] for r in runs[(model, "after")]])
      same = runs[(model, "before")][0]["metrics"] == runs[(model, "after")][0]["metrics"]
      rows.append((model, runs[(model, "after")][0]["batch"], batches, f"{b:.1f}", f"{a:.1f}",
                   f"{a / b:.2f}x", "yes" if same else "NO"))
    print_table(f"(a) eval examples/s, {args.before} vs this tree, shipped YAMLs, use_cs=True; "
                f"first {WARMUP} batch dropped, {args.rounds} rounds interleaved; {machine()}",
                ["model", "batch", "batches", f"before ({args.before})", "after", "ratio",
                 "metrics equal"], rows)
  if args.only != "a":
    ms = attention_scores_ms()
    fastest = min(ms.values())
    print_table(f"(b) softmax of attention scores, queries and keys [32, 4, 128, 32], oneDNN on, "
                f"one process; {machine()}", ["scores", "ms a run", "vs the fastest"],
                [(label, f"{v:.1f}", f"{v / fastest:.1f}x") for label, v in ms.items()])
  return 0


if __name__ == "__main__":
  sys.exit(main())
