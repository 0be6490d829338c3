"""Does the demo's pretraining help fine-tuning? BERT-tiny on Rotten Tomatoes, the shipped
fine-tuning recipe (configs/params_bert_tiny_classifier.yaml) from scratch and warm-started
from a pretraining model_dir, over several seeds, scored on dev and test.

Each run is `scripts/run.py --mode train`, then `--mode eval` on dev and on test, in its own
process (the CLI a user runs). The majority baseline is the eval's own
`accuracy_majority_baseline` (the best constant answer on that split, counted from its labels);
`largest_predicted_class_share` 1.0 means the classifier answered one class for everything.

    python benchmarks/bench_bert_transfer.py --pretrained runs/bert_tiny_msl128 \
        [--seeds 1,2,3] [--work /tmp/bert_transfer] [--max_steps N]
    python benchmarks/bench_bert_transfer.py --probe --pretrained DIR[,DIR...]
    python benchmarks/bench_bert_transfer.py --linear_probe --pretrained DIR[,DIR...]
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

from common import ROOT, machine, print_table

PARAMS = os.path.join(ROOT, "configs", "params_bert_tiny_classifier.yaml")
RUN = os.path.join(ROOT, "scripts", "run.py")


def checkpoint_exists(path: str) -> bool:
  """A model_dir with a `checkpoint` state file, or a checkpoint prefix."""
  return os.path.exists(os.path.join(path, "checkpoint")) or os.path.exists(path + ".index")


def parse_eval(stdout: str) -> dict:
  """The last `eval: key=value ...` line of the CLI's summary -> {key: float}."""
  lines = [l for l in stdout.splitlines() if l.startswith("eval: ")]
  if not lines:
    raise RuntimeError("no `eval:` line in the run's output:\n" + stdout[-2000:])
  return {k: float(v) for k, v in re.findall(r"(\w+)=([-+0-9.eE]+|nan|inf)", lines[-1])}


def cli(args, log):
  """Runs scripts/run.py with `args`; its output goes to `log`; returns stdout."""
  out = subprocess.run([sys.executable, RUN, "--params", PARAMS, *args], capture_output=True,
                       text=True, check=False, cwd=ROOT)
  with open(log, "a") as fh:
    fh.write(" ".join(args) + "\n" + out.stdout + out.stderr + "\n")
  if out.returncode:
    raise RuntimeError(f"scripts/run.py {' '.join(args)} failed ({out.returncode}); see {log}")
  return out.stdout


def fine_tune(start: str, pretrained: str, seed: int, work: str, max_steps,
              extra=()) -> dict:
  """One fine-tuning run; returns {"dev": metrics, "test": metrics, "seconds": s}. A run
  already finished in `work` (its result file) is read back, not repeated."""
  model_dir = os.path.join(work, f"{start}-seed{seed}")
  done = model_dir + ".json"
  if os.path.exists(done):
    with open(done) as fh:
      return json.load(fh)
  init = os.path.abspath(pretrained) if start == "pretrained" else "null"
  overrides = [f"model.init_checkpoint={init}", f"runconfig.tf_random_seed={seed}"]
  if max_steps:
    overrides.append(f"runconfig.max_steps={max_steps}")
  overrides += list(extra)  # the recipe changed for both starts alike
  flags = ["--model_dir", model_dir] + [f for o in overrides for f in ("--params_override", o)]
  log = model_dir + ".log"
  t0 = time.perf_counter()
  cli(["--mode", "train", *flags], log)
  seconds = time.perf_counter() - t0
  result = {split: parse_eval(cli(["--mode", "eval", *flags, "--params_override",
                                   f"eval_input.split={split}"], log))
            for split in ("dev", "test")} | {"seconds": seconds}
  with open(done, "w") as fh:
    json.dump(result, fh)
  return result


def probe(checkpoint, sentences: int = 256) -> list:
  """What the classifier's warm start hands fine-tuning, on `sentences` dev sentences: how
  much the pooled output (what the classifier reads) differs between sentences, how saturated
  its tanh is, and the norm of the classification loss's gradient that reaches the encoder and
  embeddings through it (the fresh head at its initial weights). checkpoint None: random init.
  Returns table rows."""
  # TensorFlow only here: the fine-tuning table runs the CLI in child processes.
  import numpy as np  # pylint: disable=import-outside-toplevel
  from common import quiet_tf  # pylint: disable=import-outside-toplevel
  tf = quiet_tf()
  from cerebras_tf import params as params_lib  # pylint: disable=import-outside-toplevel
  from cerebras_models.bert import heads, modeling  # pylint: disable=import-outside-toplevel
  from cerebras_models.bert import input as input_lib  # pylint: disable=import-outside-toplevel
  from cerebras_tf.runtime import checkpoints  # pylint: disable=import-outside-toplevel
  tf1 = tf.compat.v1
  params = params_lib.load_params(PARAMS)
  params["eval_input"]["batch_size"] = sentences
  graph = tf1.Graph()
  with graph.as_default():
    tf1.set_random_seed(1)
    it = tf1.data.make_initializable_iterator(
        input_lib.input_fn(params, tf.estimator.ModeKeys.EVAL))
    features, labels = it.get_next()
    config = modeling.BertConfig.from_params(params["model"])
    out = modeling.bert_model(features["token_ids"], features["segment_ids"],
                              features["padding_mask"], config, training=False)
    loss, _ = heads.classification_loss(
        heads.classifier_logits(out["pooled_output"], 2, config, False), labels)
    restored = checkpoints.init_matching(checkpoint) if checkpoint else {}
    backbone = [v for v in tf1.trainable_variables()
                if v.op.name.startswith(("bert/encoder", "bert/embeddings"))]
    grad_norm = tf.linalg.global_norm([tf.convert_to_tensor(g)
                                       for g in tf.gradients(loss, backbone)])
    with tf1.Session() as sess:
      sess.run([tf1.global_variables_initializer(), tf1.tables_initializer(), it.initializer])
      pooled, first, norm = sess.run([out["pooled_output"], out["sequence_output"][:, 0, :],
                                      grad_norm])
  def spread(x):  # mean over dimensions of the std over sentences; mean pairwise cosine
    unit = x / (np.linalg.norm(x, axis=1, keepdims=True) + 1e-12)
    cos = (unit @ unit.T)[~np.eye(len(x), dtype=bool)].mean()
    return f"{x.std(axis=0).mean():.4f}", f"{cos:.4f}"
  name = checkpoint or "random init"
  pooler = "restored" if "bert/pooler/dense/kernel" in restored else "fresh"
  return [[name, pooler, *spread(pooled), f"{(np.abs(pooled) > 0.99).mean():.3f}",
           *spread(first), f"{norm:.3g}"]]


def linear_probe(checkpoint, lambdas=(0.1, 1.0, 10.0, 100.0, 1000.0)) -> list:
  """How much about a sentence's polarity the checkpoint's features hold, before fine-tuning:
  the mean over real tokens of the embedding output and of every layer's output (the
  classifier's `pooling: mean` input and what lies under it), standardized, a ridge
  classifier fit on the train split, the best dev accuracy over `lambdas`. checkpoint None:
  random init. Returns one table row."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  from common import quiet_tf  # pylint: disable=import-outside-toplevel
  tf = quiet_tf()
  from cerebras_tf import params as params_lib  # pylint: disable=import-outside-toplevel
  from cerebras_models.bert import modeling  # pylint: disable=import-outside-toplevel
  from cerebras_models.bert import input as input_lib  # pylint: disable=import-outside-toplevel
  from cerebras_tf.runtime import checkpoints  # pylint: disable=import-outside-toplevel
  tf1 = tf.compat.v1

  def features(split):
    params = params_lib.load_params(PARAMS, overrides=["model.init_checkpoint=null"])
    params["eval_input"].update(split=split, batch_size=256)
    with tf1.Graph().as_default():
      tf1.set_random_seed(1)
      it = tf1.data.make_initializable_iterator(
          input_lib.input_fn(params, tf.estimator.ModeKeys.EVAL))
      feats, labels = it.get_next()
      out = modeling.bert_model(feats["token_ids"], feats["segment_ids"], feats["padding_mask"],
                                modeling.BertConfig.from_params(params["model"]), training=False)
      mask = tf.cast(feats["padding_mask"], tf.float32)[..., tf.newaxis]
      pooled = [tf.reduce_sum(x * mask, 1) / tf.reduce_sum(mask, 1)
                for x in [out["embedding_output"], *out["all_encoder_layers"]]]
      if checkpoint:
        checkpoints.init_matching(checkpoint)
      xs, ys = [], []
      with tf1.Session() as sess:
        sess.run([tf1.global_variables_initializer(), tf1.tables_initializer(), it.initializer])
        while True:
          try:
            x, y = sess.run([tf.concat(pooled, 1), labels])
          except tf.errors.OutOfRangeError:
            break
          xs.append(x)
          ys.append(y)
    return np.concatenate(xs), np.concatenate(ys)

  (x_train, y_train), (x_dev, y_dev) = features("train"), features("dev")
  mu, sd = x_train.mean(0), x_train.std(0) + 1e-6
  a = np.c_[(x_train - mu) / sd, np.ones(len(x_train))]
  b = np.c_[(x_dev - mu) / sd, np.ones(len(x_dev))]
  accuracy = {lam: float(np.mean((b @ np.linalg.solve(a.T @ a + lam * np.eye(a.shape[1]),
                                                       a.T @ (2.0 * y_train - 1)) > 0) == y_dev))
              for lam in lambdas}
  best = max(accuracy, key=accuracy.get)
  return [checkpoint or "random init", a.shape[1] - 1, len(a), f"{100 * accuracy[best]:.1f}",
          best]


LINEAR_PROBE_HEADER = ["checkpoint", "features", "train sentences", "dev accuracy %",
                       "ridge lambda"]


PROBE_HEADER = ["warm start", "pooler", "pooled std over sentences", "pooled mean cosine",
                "pooled share |tanh| > 0.99", "[CLS] output std", "[CLS] mean cosine",
                "grad norm into backbone"]


def mean_spread(xs):
  """'mean ± sample std (min-max)' in percent."""
  pct = [100 * x for x in xs]
  sd = statistics.stdev(pct) if len(pct) > 1 else 0.0
  return f"{statistics.mean(pct):.1f} ± {sd:.1f} ({min(pct):.1f}-{max(pct):.1f})"


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--pretrained", default=os.path.join(ROOT, "runs", "bert_tiny_msl128"),
                  help="the demo's model_dir (its latest checkpoint is the warm start; "
                       "default: where `python3 dev.py demo` writes it)")
  ap.add_argument("--quick", action="store_true", help="one seed")
  ap.add_argument("--probe", action="store_true",
                  help="only measure what the warm start hands fine-tuning (in this process): "
                       "random init, then each comma-separated --pretrained")
  ap.add_argument("--linear_probe", action="store_true",
                  help="only a linear probe of the pooled features (random init, then each "
                       "comma-separated --pretrained): does pretraining hold polarity?")
  ap.add_argument("--seeds", default="1,2,3")
  ap.add_argument("--work", default="/tmp/bench_bert_transfer",
                  help="model_dirs, logs and each run's result (a finished run is not redone: "
                       "use a new --work for a new checkpoint)")
  ap.add_argument("--max_steps", type=int, default=None, help="default: the YAML's")
  ap.add_argument("--starts", default="scratch,pretrained")
  ap.add_argument("--params_override", action="append", default=[],
                  help="KEY=VALUE for the fine-tuning recipe of every run (repeatable), e.g. "
                       "another learning-rate schedule; use a new --work with it")
  args = ap.parse_args()
  for ckpt in args.pretrained.split(","):
    if not checkpoint_exists(ckpt):
      sys.exit(f"bench_bert_transfer: no checkpoint in {ckpt}: run `python3 dev.py demo` "
               "first, or pass --pretrained <model_dir>")
  if args.linear_probe:
    rows = [linear_probe(ckpt) for ckpt in [None, *args.pretrained.split(",")]]
    print(f"\nhost: {machine()}; ridge on the train split's pooled features, dev scored")
    print_table("what the pretrained features hold about polarity (linear probe)",
                LINEAR_PROBE_HEADER, rows)
    return
  if args.probe:
    rows = [r for ckpt in [None, *args.pretrained.split(",")] for r in probe(ckpt)]
    print(f"\nhost: {machine()}; {len(rows)} checkpoints, 256 dev sentences")
    print_table("what the warm start hands the classifier", PROBE_HEADER, rows)
    return
  os.makedirs(args.work, exist_ok=True)
  seeds = [int(s) for s in args.seeds.split(",")][:1 if args.quick else None]
  starts = args.starts.split(",")
  results = {s: [] for s in starts}
  rows = []
  for seed in seeds:
    for start in starts:
      r = fine_tune(start, args.pretrained, seed, args.work, args.max_steps,
                    args.params_override)
      results[start].append(r)
      rows.append([start, seed, f"{100 * r['dev']['accuracy']:.1f}",
                   f"{100 * r['test']['accuracy']:.1f}", f"{r['dev']['f1']:.3f}",
                   f"{r['dev']['largest_predicted_class_share']:.2f}",
                   f"{r['seconds']:.0f}"])
      print("  " + " | ".join(str(c) for c in rows[-1]), flush=True)
  print(f"\nhost: {machine()}; recipe {os.path.relpath(PARAMS, ROOT)}"
        + (f", max_steps {args.max_steps}" if args.max_steps else "")
        + "".join(f", {o}" for o in args.params_override)
        + f"; warm start {args.pretrained}")
  print_table("BERT-tiny on Rotten Tomatoes, each run", ["start", "seed", "dev acc %",
              "test acc %", "dev F1", "dev largest predicted class share", "train s"], rows)
  first = next(iter(results.values()))[0]
  summary = [[start, len(rs), mean_spread([r["dev"]["accuracy"] for r in rs]),
              mean_spread([r["test"]["accuracy"] for r in rs])] for start, rs in results.items()]
  summary.append(["majority class (best constant answer)", "-",
                  f"{100 * first['dev']['accuracy_majority_baseline']:.2f}",
                  f"{100 * first['test']['accuracy_majority_baseline']:.2f}"])
  print_table("mean ± std (min-max) over seeds", ["start", "seeds", "dev acc %", "test acc %"],
              summary)


if __name__ == "__main__":
  main()
