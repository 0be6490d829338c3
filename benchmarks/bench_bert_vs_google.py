"""BERT-tiny pretraining: ours vs google-research/bert's run_pretraining.py, on this machine.

Same model and batch (2 layers, hidden 128, 2 heads, filter 512, batch 32, seq 128, 20
predictions, dropout 0.1), same step timing (a hook stamps every step; the first --warmup
steps are dropped), rounds interleaved so machine noise hits both alike. Three tables:

  (a) examples/s, ours / google's                                     goal >= 1.2x
  (b) our training FLOP/s (compiler LayerGraph flops_per_sample x examples/s) as a fraction
      of this machine's fp32 matmul FLOP/s, measured in the same run        goal >= 50%
  (c) our input pipeline alone (tokenize + pack + mask) / training consumption  goal >= 5x

google-research/bert is never part of this project. The script needs its sources at run time:
--google_bert_dir names a checkout or a bare git repository (e.g. the mirror that
`fetch github:google-research/bert` reports); modeling.py, optimization.py and
run_pretraining.py are copied (git archive) into a temp dir. Its TF 1 code runs on TF 2.15
through tf.compat.v1 with a runtime shim for tf.contrib (layer_norm, tpu, data): nothing in its
files is edited. It reads TFRecords in its own format, written from our data into the temp
dir. Without the sources, (a) is skipped with a message and (b), (c) still run.

    python benchmarks/bench_bert_vs_google.py --google_bert_dir /path/to/bert [--quick]
"""

import argparse
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import types

from common import ROOT, machine, median, print_table, quiet_tf

tf = quiet_tf()
tf1 = tf.compat.v1

from cerebras_tf import params as params_lib  # noqa: E402  pylint: disable=wrong-import-position
from cerebras_tf import runner  # noqa: E402  pylint: disable=wrong-import-position
from cerebras_tf.models.bert import input as input_lib  # noqa: E402  pylint: disable=wrong-import-position
from cerebras_tf.models.bert import model as bert_model  # noqa: E402  pylint: disable=wrong-import-position

BATCH, SEQ, PREDS = 32, 128, 20
CONFIG = os.path.join(ROOT, "configs", "params_bert_tiny_msl128.yaml")
GOOGLE_FILES = ("modeling.py", "optimization.py", "run_pretraining.py")
DEFAULT_MIRROR = "/work/.mirror/google-research+bert/repo"


class StepTimer(tf1.train.SessionRunHook):
  """Stamps the end of every training step."""

  def __init__(self):
    self.times = []

  def after_run(self, run_context, run_values):
    self.times.append(time.perf_counter())

  def examples_per_sec(self, warmup: int) -> float:
    t = self.times[warmup:]
    return (len(t) - 1) * BATCH / (t[-1] - t[0])


# --- ours ----------------------------------------------------------------------------------

def our_params(model_dir, bf16=False):
  return params_lib.load_params(CONFIG, [
      f"runconfig.model_dir={model_dir}", "model.dropout_rate=0.1",
      "model.attention_dropout_rate=0.1", f"model.mixed_precision={str(bf16).lower()}",
      f"train_input.batch_size={BATCH}", "runconfig.save_checkpoints_steps=1000000",
      "runconfig.log_step_count_steps=1000000", "runconfig.save_summary_steps=1000000",
      "optimizer.learning_rate=0.0001"])


def run_ours(steps, warmup, bf16=False):
  """(examples/s, compile result) of CerebrasEstimator.train(use_cs=True)."""
  model_dir = tempfile.mkdtemp(prefix="bench_bert_ours_")
  params = our_params(model_dir, bf16)
  est = runner.make_estimator(bert_model.model_fn, params, runner.RunOptions())
  tf1.logging.set_verbosity(tf1.logging.ERROR)
  train_input = lambda params: input_lib.input_fn(params, "train")  # noqa: E731
  result = est.compile(train_input)  # timed steps exclude the compile, as for google's graph
  timer = StepTimer()
  est.train(train_input, max_steps=steps, hooks=[timer], use_cs=True)
  shutil.rmtree(model_dir, ignore_errors=True)
  return timer.examples_per_sec(warmup), result


def input_pipeline_examples_per_sec(batches=60, warmup=10):
  params = our_params(tempfile.gettempdir())
  with tf.Graph().as_default():
    tf1.set_random_seed(1)
    it = tf1.data.make_initializable_iterator(input_lib.input_fn(params, "train"))
    nxt = it.get_next()
    with tf1.Session() as sess:
      sess.run([it.initializer, tf1.tables_initializer()])
      for _ in range(warmup):
        sess.run(nxt)
      t0 = time.perf_counter()
      for _ in range(batches):
        sess.run(nxt)
      return batches * BATCH / (time.perf_counter() - t0)


def matmul_flops_per_sec(n=2048, reps=10):
  a = tf.random.normal([n, n])
  b = tf.random.normal([n, n])
  mm = tf.function(lambda: tf.matmul(a, b))
  mm().numpy()
  t0 = time.perf_counter()
  for _ in range(reps):
    mm().numpy()
  return reps * 2.0 * n ** 3 / (time.perf_counter() - t0)


# --- google-research/bert ------------------------------------------------------------------

def acquire_google_bert(src, dest):
  """Copies google-bert's three files from a checkout or a bare git repo into `dest`."""
  if all(os.path.exists(os.path.join(src, f)) for f in GOOGLE_FILES):
    for f in GOOGLE_FILES:
      shutil.copy(os.path.join(src, f), dest)
    return dest
  archive = subprocess.run(["git", "--git-dir", src, "archive", "HEAD", *GOOGLE_FILES],
                           capture_output=True, check=True).stdout
  subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
  return dest


def _contrib_layer_norm(inputs, begin_norm_axis=-1, begin_params_axis=-1, scope=None):
  """tf.contrib.layers.layer_norm as google-bert calls it (variables LayerNorm/{beta,gamma})."""
  del begin_norm_axis, begin_params_axis  # google-bert only normalizes the last axis
  with tf1.variable_scope(scope, "LayerNorm"):
    width = inputs.shape[-1]
    beta = tf1.get_variable("beta", [width], initializer=tf1.zeros_initializer())
    gamma = tf1.get_variable("gamma", [width], initializer=tf1.ones_initializer())
    mean, var = tf.nn.moments(inputs, [-1], keepdims=True)
    return tf.nn.batch_normalization(inputs, mean, var, beta, gamma, 1e-12)


def import_google_bert(src_dir):
  """Imports google-bert with `tensorflow` seen as tf.compat.v1 plus a tf.contrib shim."""
  tpu = tf1.estimator.tpu
  tf1.contrib = types.SimpleNamespace(
      layers=types.SimpleNamespace(layer_norm=_contrib_layer_norm),
      tpu=types.SimpleNamespace(TPUEstimator=tpu.TPUEstimator, RunConfig=tpu.RunConfig,
                                TPUConfig=tpu.TPUConfig, TPUEstimatorSpec=tpu.TPUEstimatorSpec,
                                InputPipelineConfig=tpu.InputPipelineConfig,
                                CrossShardOptimizer=tf1.tpu.CrossShardOptimizer),
      data=types.SimpleNamespace(parallel_interleave=tf1.data.experimental.parallel_interleave,
                                 map_and_batch=tf1.data.experimental.map_and_batch))
  real_tf = sys.modules["tensorflow"]
  sys.modules["tensorflow"] = tf1
  sys.path.insert(0, src_dir)
  try:
    return {name: importlib.import_module(name)
            for name in ("modeling", "optimization", "run_pretraining")}
  finally:
    sys.path.remove(src_dir)
    sys.modules["tensorflow"] = real_tf


def write_google_records(path, num_batches=40):
  """Our pipeline's masked batches as google-bert's pretraining TFRecords."""
  params = our_params(tempfile.gettempdir())
  params["train_input"].update(shuffle=False)

  def ints(v):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(x) for x in v]))

  with tf.Graph().as_default(), tf.io.TFRecordWriter(path) as writer:
    tf1.set_random_seed(1)
    it = tf1.data.make_initializable_iterator(input_lib.input_fn(params, "train"))
    nxt = it.get_next()
    with tf1.Session() as sess:
      sess.run([it.initializer, tf1.tables_initializer()])
      for _ in range(num_batches):
        f, _ = sess.run(nxt)
        for i in range(BATCH):
          feats = {
              "input_ids": ints(f["token_ids"][i]), "input_mask": ints(f["padding_mask"][i]),
              "segment_ids": ints(f["segment_ids"][i]),
              "masked_lm_positions": ints(f["masked_lm_positions"][i]),
              "masked_lm_ids": ints(f["masked_lm_ids"][i]),
              "masked_lm_weights": tf.train.Feature(float_list=tf.train.FloatList(
                  value=f["masked_lm_weights"][i].tolist())),
              "next_sentence_labels": ints([f["next_sentence_label"][i]])}
          writer.write(tf.train.Example(features=tf.train.Features(
              feature=feats)).SerializeToString())


def run_google(gb, work_dir, record_file, steps, warmup):
  config_file = os.path.join(work_dir, "bert_config.json")
  with open(config_file, "w") as f:
    json.dump({"vocab_size": 30522, "hidden_size": 128, "num_hidden_layers": 2,
               "num_attention_heads": 2, "intermediate_size": 512, "hidden_act": "gelu",
               "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
               "max_position_embeddings": 512, "type_vocab_size": 2,
               "initializer_range": 0.02}, f)
  rp = gb["run_pretraining"]
  model_fn = rp.model_fn_builder(
      bert_config=gb["modeling"].BertConfig.from_json_file(config_file), init_checkpoint=None,
      learning_rate=1e-4, num_train_steps=steps, num_warmup_steps=min(10, steps),
      use_tpu=False, use_one_hot_embeddings=False)
  input_fn = rp.input_fn_builder([record_file], SEQ, PREDS, is_training=True)
  model_dir = tempfile.mkdtemp(prefix="bench_bert_google_", dir=work_dir)
  tpu = tf1.estimator.tpu
  config = tpu.RunConfig(model_dir=model_dir, save_checkpoints_steps=10**6,
                         save_summary_steps=10**6, log_step_count_steps=10**6,
                         tpu_config=tpu.TPUConfig(iterations_per_loop=10**6))
  est = tpu.TPUEstimator(use_tpu=False, model_fn=model_fn, config=config,
                         train_batch_size=BATCH)
  timer = StepTimer()
  est.train(input_fn, max_steps=steps, hooks=[timer])
  return timer.examples_per_sec(warmup)


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--google_bert_dir", default=os.environ.get("GOOGLE_BERT_DIR",
                                                             DEFAULT_MIRROR))
  ap.add_argument("--rounds", type=int, default=2)
  ap.add_argument("--steps", type=int, default=80)
  ap.add_argument("--warmup", type=int, default=15)
  ap.add_argument("--bf16", action="store_true", help="ours in bfloat16 mixed precision")
  ap.add_argument("--quick", action="store_true", help="1 round of 40 steps")
  args = ap.parse_args()
  if args.quick:
    args.rounds, args.steps, args.warmup = 1, 40, 10

  work = tempfile.mkdtemp(prefix="bench_bert_vs_google_")
  gb, why = None, ""
  if args.google_bert_dir and os.path.exists(args.google_bert_dir):
    try:
      gb = import_google_bert(acquire_google_bert(args.google_bert_dir, work))
      record_file = os.path.join(work, "pretrain.tfrecord")
      write_google_records(record_file)
    except (subprocess.CalledProcessError, ImportError, OSError) as e:
      gb, why = None, f"could not load google-research/bert from {args.google_bert_dir}: {e}"
  else:
    why = ("google-research/bert not found: pass --google_bert_dir (a checkout or the bare "
           "mirror that `fetch github:google-research/bert` reports)")

  ours, google, result = [], [], None
  for _ in range(args.rounds):
    if gb is not None:
      google.append(run_google(gb, work, record_file, args.steps, args.warmup))
    rate, result = run_ours(args.steps, args.warmup, args.bf16)
    ours.append(rate)
  pipeline = input_pipeline_examples_per_sec()
  matmul = matmul_flops_per_sec()
  shutil.rmtree(work, ignore_errors=True)

  ours_rate = median(ours)
  precision = "bf16" if args.bf16 else "fp32"
  title = (f"BERT-tiny pretraining, batch {BATCH}, seq {SEQ}, {args.steps} steps (first "
           f"{args.warmup} dropped) x {args.rounds} rounds; {machine()}")
  if gb is not None:
    ratio = ours_rate / median(google)
    print_table("(a) ours vs google-research/bert run_pretraining.py: " + title,
                ["implementation", "examples/s (median)", "ratio", "goal"],
                [("google-research/bert (tf.compat.v1, fp32)", f"{median(google):.1f}", "1.00",
                  "-"),
                 (f"cerebras_tf BERT ({precision}, use_cs=True)", f"{ours_rate:.1f}",
                  f"{ratio:.2f}", ">= 1.2")])
  else:
    print(f"\n(a) skipped: {why}\n")
  flops = result.graph.flops_per_sample if result.graph is not None else float("nan")
  achieved = flops * ours_rate
  print_table("(b) training FLOP/s vs this machine's fp32 matmul: " + title,
              ["quantity", "value", "goal"],
              [("training GFLOP per example (compiler LayerGraph, fwd+bwd)", f"{flops / 1e9:.3f}",
                "-"),
               ("our training GFLOP/s", f"{achieved / 1e9:.1f}", "-"),
               ("fp32 2048^3 matmul GFLOP/s", f"{matmul / 1e9:.1f}", "-"),
               ("fraction", f"{achieved / matmul:.1%}", ">= 50%")])
  print_table("(c) input pipeline (tokenize, pack, mask) vs training consumption: " + title,
              ["quantity", "examples/s", "goal"],
              [("input pipeline alone", f"{pipeline:.0f}", "-"),
               ("training consumes", f"{ours_rate:.1f}", "-"),
               ("ratio", f"{pipeline / ours_rate:.1f}x", ">= 5x")])


if __name__ == "__main__":
  main()
