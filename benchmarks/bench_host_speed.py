"""Host training speed of the reference models: this tree vs an earlier commit, and each lever.

Every measurement is a fresh process (TensorFlow reads its oneDNN switch once, at import) that
trains one reference model with CerebrasEstimator.train(use_cs=True) on its shipped YAML and
stamps every step; the first --warmup steps are dropped. Runs are interleaved round by round so
machine noise hits every row alike; the tables give medians.

  (a) before / after: BERT-tiny (the demo's config), Transformer-tiny, GPT-tiny at --before
      (default 0df3b22, the commit before issue 14's levers; its code is taken with
      `git archive`, and TF_ENABLE_ONEDNN_OPTS is left unset, as its users ran it) and at this
      tree.
  (b) BERT-tiny at batch 32 with dropout 0.1 (the goal config), each lever added in turn on this
      tree (a lever is switched off in the child
      by putting back what it replaced; see LEVERS).

    python benchmarks/bench_host_speed.py [--rounds 2] [--steps 60] [--only a|b] [--quick]
        [--models bert_tiny,transformer_tiny,gpt_tiny]   # (a)'s; bert_tiny_bf16: the demo's bf16
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
BEFORE = "0df3b22"

# BERT and the Transformer in float32 on every host: their YAMLs ask for bfloat16 where the CPU
# has it (bench_bf16.py measures that), and these tables compare code, not precisions.
MODELS = {  # name -> (YAML in the tree, overrides) ; shipped recipes, short runs
    "bert_tiny": ("configs/params_bert_tiny_msl128.yaml", ["train_input.batch_size=32",
                                                           "model.mixed_precision=false"]),
    "transformer_tiny": ("configs/params_transformer_tiny.yaml", ["model.mixed_precision=false"]),
    "gpt_tiny": ("configs/params_gpt_tiny.yaml", []),
    # BERT-tiny as the demo trains it on a CPU with bf16 math (on one without, float32 again)
    "bert_tiny_bf16": ("configs/params_bert_tiny_msl128.yaml", ["train_input.batch_size=32",
                                                                "model.mixed_precision=true"]),
    # BERT-tiny in bf16 with google-bert's dropout 0.1 (the demo and bench_bf16.py's BERT-tiny
    # train without; its BERT-small with): what the residual dropout's dtype costs
    "bert_tiny_bf16_dropout": ("configs/params_bert_tiny_msl128.yaml", [
        "train_input.batch_size=32", "model.dropout_rate=0.1", "model.attention_dropout_rate=0.1",
        "model.mixed_precision=true"]),
    # GPT-tiny with model.mixed_precision: true (bfloat16 on a CPU with bf16 math), dropout 0.1
    "gpt_tiny_bf16_dropout": ("configs/params_gpt_tiny.yaml", [
        "model.dropout_rate=0.1", "model.mixed_precision=true"]),
    # The Transformer-tiny as shipped (dropout 0.1; bfloat16 on a CPU with bf16 math)
    "transformer_tiny_bf16": ("configs/params_transformer_tiny.yaml",
                              ["model.mixed_precision=true"]),
    # T5-tiny with model.mixed_precision: true, as shipped otherwise
    "t5_tiny_bf16": ("configs/params_t5_tiny.yaml", ["model.mixed_precision=true"]),
    # (b): issue 14's goal config, google-bert's dropout 0.1 (the demo trains without dropout)
    "bert_tiny_dropout": ("configs/params_bert_tiny_msl128.yaml", [
        "train_input.batch_size=32", "model.dropout_rate=0.1", "model.attention_dropout_rate=0.1",
        "model.mixed_precision=false"]),
}
BEFORE_AFTER = ("bert_tiny", "transformer_tiny", "gpt_tiny")

# Lever rows for (b): (label, environment, switched-off levers). Each row adds one lever.
XLA_FUSIBLE = "--tf_xla_auto_jit=2 --tf_xla_cpu_global_jit --tf_xla_ops_to_cluster=FUSIBLE"
LEVERS = [
    ("none (TF defaults: oneDNN off on AVX2; TF's fused xent op; ten-pass AdamW)",
     {"TF_ENABLE_ONEDNN_OPTS": "0"}, ["xent", "adam", "head", "dropout"]),
    ("+ oneDNN kernels (TF_ENABLE_ONEDNN_OPTS=1)", {"TF_ENABLE_ONEDNN_OPTS": "1"},
     ["xent", "adam", "head", "dropout"]),
    ("+ softmax-based cross-entropy with its own gradient (models/losses.py)",
     {"TF_ENABLE_ONEDNN_OPTS": "1"}, ["adam", "head", "dropout"]),
    ("+ AdamW through the fused ApplyAdam kernel", {"TF_ENABLE_ONEDNN_OPTS": "1"},
     ["head", "dropout"]),
    ("+ MLM output layer and loss with one gradient, no [640, V] d(logits)",
     {"TF_ENABLE_ONEDNN_OPTS": "1"}, ["dropout"]),
    ("+ dropout from half the random numbers, one-multiply gradient (models/dropout.py; kept: "
     "the shipped code)", {"TF_ENABLE_ONEDNN_OPTS": "1"}, []),
    ("+ XLA auto-clustering of element-wise ops (tried, not kept)",
     {"TF_ENABLE_ONEDNN_OPTS": "1", "TF_XLA_FLAGS": XLA_FUSIBLE}, []),
]


# --- child: one measurement -----------------------------------------------------------------

def child(args):
  sys.path.insert(0, args.tree)
  os.chdir(args.tree)
  import cerebras_tf  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  # ^ first, as scripts/run.py does: this tree's TF settings apply (a no-op before issue 14)
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  tf1 = tf.compat.v1
  tf1.logging.set_verbosity(tf1.logging.ERROR)
  from cerebras_tf import params as params_lib  # pylint: disable=import-outside-toplevel
  from cerebras_tf import registry, runner  # pylint: disable=import-outside-toplevel
  switch_off(args.off)
  yaml_file, overrides = MODELS[args.model]
  model_dir = tempfile.mkdtemp(prefix=f"bench_host_{args.model}_")
  params = params_lib.load_params(os.path.join(args.tree, yaml_file), overrides + [
      f"runconfig.model_dir={model_dir}", "runconfig.save_checkpoints_steps=1000000",
      "runconfig.save_summary_steps=1000000", "runconfig.log_step_count_steps=1000000"])
  model_fn, input_fn = registry.get_model(params["model"]["name"]).resolve()
  est = runner.make_estimator(model_fn, params, runner.RunOptions())
  train_input = lambda params: input_fn(params, "train")  # noqa: E731
  est.compile(train_input)

  class Stamp(tf1.train.SessionRunHook):
    wall, cpu = [], []

    def after_run(self, run_context, run_values):
      self.wall.append(time.perf_counter())
      self.cpu.append(time.process_time())

  stamp = Stamp()
  est.train(train_input, max_steps=args.steps, hooks=[stamp], use_cs=True)
  w, c = stamp.wall[args.warmup:], stamp.cpu[args.warmup:]
  batch = params["train_input"]["batch_size"]
  print("RESULT " + json.dumps({
      "examples_per_sec": (len(w) - 1) * batch / (w[-1] - w[0]),
      "cpu_ms_per_step": 1000 * (c[-1] - c[0]) / (len(c) - 1), "batch": batch}))


def switch_off(levers):
  """Puts back what a lever replaced (only the levers this tree has)."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  if not levers:  # also the tree before issue 14, which has no models/losses.py
    return
  from cerebras_models import losses  # pylint: disable=import-outside-toplevel
  if "xent" in levers:  # TF's op, in both loss functions
    losses.onednn_active = lambda: False
  if "head" in levers and hasattr(losses, "dense_sparse_softmax_xent"):
    losses.dense_sparse_softmax_xent = lambda x, table, bias, labels: losses.sparse_softmax_xent(
        tf.nn.bias_add(tf.matmul(x, table, transpose_b=True), bias), labels)
  if "dropout" in levers and hasattr(modeling_dropout(), "dropout"):
    modeling_dropout().dropout = lambda x, rate: tf.nn.dropout(x, rate=rate)
  if "adam" in levers:
    from cerebras_models import optimization  # pylint: disable=import-outside-toplevel
    cls = optimization.AdamWeightDecayOptimizer
    cls._resource_apply_dense = cls._apply  # pylint: disable=protected-access


def modeling_dropout():
  import importlib  # pylint: disable=import-outside-toplevel
  try:
    return importlib.import_module("cerebras_models.dropout")
  except ModuleNotFoundError:  # a tree before the lever
    return None


# --- parent ---------------------------------------------------------------------------------

def measure(tree, model, env_over, off, steps, warmup):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=tree)
  env.pop("TF_ENABLE_ONEDNN_OPTS", None)
  env.pop("TF_XLA_FLAGS", None)
  env.update(env_over)
  cmd = [sys.executable, os.path.abspath(__file__), "--child", "--tree", tree, "--model", model,
         "--steps", str(steps), "--warmup", str(warmup)] + (["--off", *off] if off else [])
  out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
  for line in out.stdout.splitlines():
    if line.startswith("RESULT "):
      return json.loads(line[len("RESULT "):])
  raise RuntimeError(f"{model} in {tree} failed:\n{out.stderr[-3000:]}")


def export_tree(commit):
  dest = tempfile.mkdtemp(prefix=f"bench_host_{commit}_")
  archive = subprocess.run(["git", "-C", TREE, "archive", commit], capture_output=True,
                           check=True).stdout
  subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
  data = os.path.join(TREE, "data_cache")
  os.symlink(os.path.realpath(data), os.path.join(dest, "data_cache"))
  if os.path.isdir(os.path.join(dest, "models")):
    # The package `cerebras_models` is the tree's models/ (setup.py maps it): without this link
    # the venv's editable install handed the child this tree's models, not the commit's.
    os.symlink("models", os.path.join(dest, "cerebras_models"))
  return dest


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  ap.add_argument("--tree", default=TREE, help=argparse.SUPPRESS)
  ap.add_argument("--off", nargs="*", default=[], help=argparse.SUPPRESS)
  ap.add_argument("--model", default="bert_tiny", help=argparse.SUPPRESS)
  ap.add_argument("--before", default=BEFORE)
  ap.add_argument("--rounds", type=int, default=2)
  ap.add_argument("--steps", type=int, default=60)
  ap.add_argument("--warmup", type=int, default=15)
  ap.add_argument("--only", choices=["a", "b"])
  ap.add_argument("--models", default=",".join(BEFORE_AFTER),
                  help=f"(a)'s models, comma-separated, of {', '.join(MODELS)}")
  ap.add_argument("--quick", action="store_true", help="1 round of 40 steps (first 10 dropped)")
  args = ap.parse_args()
  if args.child:
    return child(args)
  if args.quick:
    args.rounds, args.steps, args.warmup = 1, 40, 10

  from common import machine, median, print_table  # pylint: disable=import-outside-toplevel
  title = (f"{args.steps} steps (first {args.warmup} dropped) x {args.rounds} rounds, "
           f"interleaved; {machine()}")
  if args.only != "b":
    models = args.models.split(",")
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
      ap.error(f"--models: unknown {', '.join(unknown)}; known: {', '.join(MODELS)}")
    before = export_tree(args.before)
    runs = {}
    for _ in range(args.rounds):
      for model in models:
        for label, tree in (("before", before), ("after", TREE)):
          runs.setdefault((model, label), []).append(
              measure(tree, model, {}, [], args.steps, args.warmup))
    rows = []
    for model in models:
      b = median([r["examples_per_sec"] for r in runs[(model, "before")]])
      a = median([r["examples_per_sec"] for r in runs[(model, "after")]])
      bc = median([r["cpu_ms_per_step"] for r in runs[(model, "before")]])
      ac = median([r["cpu_ms_per_step"] for r in runs[(model, "after")]])
      rows.append((model, runs[(model, "after")][0]["batch"], f"{b:.1f}", f"{a:.1f}",
                   f"{a / b:.2f}x", f"{bc:.0f} -> {ac:.0f}"))
    print_table(f"(a) host examples/s, {args.before} vs this tree, shipped YAMLs, use_cs=True; "
                + title, ["model", "batch", f"before ({args.before})", "after", "ratio",
                          "CPU ms per step"], rows)
  if args.only != "a":
    runs = {}
    for _ in range(args.rounds):
      for label, env, off in LEVERS:
        runs.setdefault(label, []).append(
            measure(TREE, "bert_tiny_dropout", env, off, args.steps, args.warmup))
    base = median([r["examples_per_sec"] for r in runs[LEVERS[0][0]]])
    rows = []
    prev = base
    for label, _, _ in LEVERS:
      rate = median([r["examples_per_sec"] for r in runs[label]])
      cpu = median([r["cpu_ms_per_step"] for r in runs[label]])
      rows.append((label, f"{rate:.1f}", f"{rate / prev:.2f}x", f"{rate / base:.2f}x",
                   f"{cpu:.0f}"))
      if "not kept" not in label:
        prev = rate
    print_table("(b) BERT-tiny (demo config at batch 32 with google-bert's dropout 0.1, seq 128),"
                " levers added in turn; " + title,
                ["lever", "examples/s", "vs previous kept row", "vs none", "CPU ms per step"],
                rows)
  return 0


if __name__ == "__main__":
  sys.exit(main())
