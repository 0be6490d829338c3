"""BERT-tiny pretraining: ours vs google-research/bert's run_pretraining.py, on this machine.

Same model and batch (2 layers, hidden 128, 2 heads, filter 512, batch 32, seq 128, 20
predictions, dropout 0.1), same step timing (a hook stamps every step; the first --warmup
steps are dropped), rounds interleaved so machine noise hits both alike, each run in a fresh
process (the same step ran up to 12% apart from one process to the next on this 2-core VM, so a
median over processes, not over rounds in one, is the figure). Four tables, a fifth on request:

  (a) examples/s, ours / google's                                     goal >= 1.5x
      google's runs in a child process with TensorFlow's defaults, as its users run it (on an
      AVX2 CPU that means oneDNN off), with oneDNN forced on and off, and, where the CPU has
      bf16 math (avx512_bf16, AMX), with oneDNN on plus TensorFlow's own bfloat16 rewrite of
      its graph (grappler's auto_mixed_precision_onednn_bfloat16): the fastest is its best
      configuration. Ours runs in float32 and, on such a CPU, as the demo's YAML ships
      (model.mixed_precision: true, bfloat16). Precision is compared like for like: ours fp32
      against google's best fp32 row, ours bf16 against google's best row of all. A last
      google row runs in this process with the settings cerebras_tf uses (oneDNN on), so the
      ratio that is the framework's own shows too.
  (b) our training FLOP/s (compiler LayerGraph flops_per_sample x examples/s) as a fraction
      of this machine's best fp32 matmul FLOP/s (numpy's and TensorFlow's 2048^3, both measured
      in the same run; the higher is the limit), each round against the limit measured right
      after its step, and the median of those fractions                    goal >= 60%
  (c) our input pipeline alone (tokenize + pack + mask) / training consumption  goal >= 5x
  (d) where our step goes: op time by op type over a few traced steps (TF's step stats)
  (e) with --serialized: the largest ops of our fp32 step run one at a time
      (TF_NUM_INTEROP_THREADS=1), each op's own time; (d)'s wall share splits the instants two
      ops overlap evenly, which makes a small op beside a big product look several times its cost
  (f) with --serialized: the products' ceiling, the executed FLOPs over the products' own time
      in (e): the FLOP/s of the step were every other op free, against the same limit as (b)

google-research/bert is never part of this project. The script needs its sources at run time:
--google_bert_dir names a checkout or a bare git repository (e.g. the mirror that
`fetch github:google-research/bert` reports); modeling.py, optimization.py and
run_pretraining.py are copied (git archive) into a temp dir. Its TF 1 code runs on TF 2.15
through tf.compat.v1 with a runtime shim for tf.contrib (layer_norm, tpu, data): nothing in its
files is edited. It reads TFRecords in its own format, written from our data into the temp
dir. Without the sources, (a) is skipped with a message and (b), (c) still run.

    python benchmarks/bench_bert_vs_google.py --google_bert_dir /path/to/bert [--quick] [--fp32_only] [--serialized]
"""

import argparse
import contextlib
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import types


# The google child runs with TensorFlow's own defaults: nothing of ours is imported there.
GOOGLE_CHILD = "--google_child" in sys.argv
if not GOOGLE_CHILD:
  import cerebras_tf  # noqa: F401  first, so its oneDNN default applies (TF reads it at import)
from common import ROOT, has_bf16, machine, median, numpy_matmul_flops_per_sec, print_table, quiet_tf  # noqa: E402

tf = quiet_tf()
tf1 = tf.compat.v1

if not GOOGLE_CHILD:
  # pylint: disable=wrong-import-position
  from cerebras_tf import params as params_lib  # noqa: E402
  from cerebras_tf import runner  # noqa: E402
  from cerebras_models import losses  # noqa: E402
  from cerebras_models.bert import input as input_lib  # noqa: E402
  from cerebras_models.bert import model as bert_model  # noqa: E402

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


class OpProfile(tf1.train.SessionRunHook):
  """Op time by op type over `traced` steps (TF step stats; these steps are not timed).

  `by_type` sums each op's own duration; on 2 cores two ops often run at once, so that sum
  exceeds the step and overstates the big multi-threaded products. `wall_by_type` splits each
  instant of the step among the ops running then, so it adds up to the step's busy wall time.
  """

  def __init__(self, traced):
    self.traced, self.step, self.by_type, self.steps = set(traced), 0, {}, 0
    self.wall_by_type, self.wall_us = {}, 0
    self.by_node = {}  # node name -> [op type, microseconds]

  def before_run(self, run_context):
    self.step += 1
    if self.step in self.traced:
      return tf1.train.SessionRunArgs(None, options=tf1.RunOptions(
          trace_level=tf1.RunOptions.FULL_TRACE))
    return None

  def after_run(self, run_context, run_values):
    if self.step not in self.traced:
      return
    self.steps += 1
    spans = []
    for dev in run_values.run_metadata.step_stats.dev_stats:
      for node in dev.node_stats:
        label = node.timeline_label.split(" = ")[-1].split("(")[0] or node.node_name
        head = "cls/predictions" in node.node_name or "softmax_xent" in node.node_name
        key = (label, head)
        self.by_type[key] = self.by_type.get(key, 0) + node.all_end_rel_micros
        self.by_node.setdefault(node.node_name, [label, 0])[1] += node.all_end_rel_micros
        if node.all_end_rel_micros > 0:
          spans.append((node.all_start_micros, node.all_start_micros + node.all_end_rel_micros,
                        key))
    self._share_wall(spans)

  def _share_wall(self, spans):
    """Adds each instant between the first start and the last end, split evenly among the
    ops running then, to wall_by_type (idle instants to no one)."""
    if not spans:
      return
    edges = sorted((t, i, k) for start, end, key in spans for t, i, k in
                   ((start, 1, key), (end, -1, key)))
    running, last = {}, edges[0][0]
    self.wall_us += max(end for _, end, _ in spans) - last
    for t, change, key in edges:
      live = [k for k, n in running.items() if n > 0]
      for k in live:
        self.wall_by_type[k] = self.wall_by_type.get(k, 0) + (t - last) / len(live)
      running[key] = running.get(key, 0) + change
      last = t


def run_ours(steps, warmup, bf16=False, profile=None):
  """(examples/s, compile result) of CerebrasEstimator.train(use_cs=True).

  With `profile` (an OpProfile), its traced steps come after the timed ones.
  """
  model_dir = tempfile.mkdtemp(prefix="bench_bert_ours_")
  params = our_params(model_dir, bf16)
  est = runner.make_estimator(bert_model.model_fn, params, runner.RunOptions())
  tf1.logging.set_verbosity(tf1.logging.ERROR)
  train_input = lambda params: input_lib.input_fn(params, "train")  # noqa: E731
  result = est.compile(train_input)  # timed steps exclude the compile, as for google's graph
  timer = StepTimer()
  hooks = [timer] + ([profile] if profile else [])
  est.train(train_input, max_steps=steps + (len(profile.traced) if profile else 0), hooks=hooks,
            use_cs=True)
  timer.times = timer.times[:steps]
  shutil.rmtree(model_dir, ignore_errors=True)
  return timer.examples_per_sec(warmup), result


@contextlib.contextmanager
def training_batches():
  """(session, next batch) of our training input_fn in a graph of its own, seeded."""
  params = our_params(tempfile.gettempdir())
  with tf.Graph().as_default():
    tf1.set_random_seed(1)
    it = tf1.data.make_initializable_iterator(input_lib.input_fn(params, "train"))
    with tf1.Session() as sess:
      sess.run([it.initializer, tf1.tables_initializer()])
      yield sess, it.get_next()


def input_pipeline_examples_per_sec(batches=60, warmup=10):
  with training_batches() as (sess, nxt):
    for _ in range(warmup):
      sess.run(nxt)
    t0 = time.perf_counter()
    for _ in range(batches):
      sess.run(nxt)
    return batches * BATCH / (time.perf_counter() - t0)


def head_rows_per_batch(batches=100):
  """(mean rows of the masked-LM output layer a training batch computes, mean real slots): the
  weight-0 padding is left out and the rest rounded up (losses.on_weighted_rows)."""
  with training_batches() as (sess, nxt):
    weights = nxt[0]["masked_lm_weights"]
    real = [int((sess.run(weights) != 0).sum()) for _ in range(batches)]
  computed = [int(losses.rows_computed(n, BATCH * PREDS)) for n in real]
  return sum(computed) / batches, sum(real) / batches


def matmul_flops_per_sec(n=2048, reps=10):
  """TensorFlow's fp32 n^3 matmul FLOP/s (best of 3 timings of `reps`)."""
  a = tf.random.normal([n, n])
  b = tf.random.normal([n, n])
  mm = tf.function(lambda: tf.matmul(a, b))
  mm().numpy()
  best = float("inf")
  for _ in range(3):
    t0 = time.perf_counter()
    for _ in range(reps):
      mm().numpy()
    best = min(best, time.perf_counter() - t0)
  return reps * 2.0 * n ** 3 / best


def numpy_in_child_unpinned():
  """numpy's fp32 matmul FLOP/s with its own kernel for this CPU: OPENBLAS_CORETYPE (and
  OPENBLAS_L2_SIZE) unset for that one process (these machines pin an older kernel on purpose;
  the pin stays everywhere else), and the kernel OpenBLAS then reports."""
  env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
  code = ("import json, sys; sys.path.insert(0, %r); import common; "
          "print('RESULT ' + json.dumps([common.numpy_matmul_flops_per_sec(), "
          "common.blas_kernel()]))" % os.path.dirname(os.path.abspath(__file__)))
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       check=False)
  for line in out.stdout.splitlines():
    if line.startswith("RESULT "):
      return tuple(json.loads(line[len("RESULT "):]))
  raise RuntimeError("numpy child failed:\n" + out.stderr[-3000:])




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


def bf16_rewrite_config():
  """A session config with TensorFlow's bfloat16 graph rewrite for oneDNN on: the float32 graph
  google-bert builds, its matmuls and the ops around them run in bfloat16 (TF's allow/infer
  lists), its variables float32. The nearest thing to mixed precision its code can have."""
  from tensorflow.core.protobuf import rewriter_config_pb2  # pylint: disable=import-outside-toplevel
  rewrites = rewriter_config_pb2.RewriterConfig(
      auto_mixed_precision_onednn_bfloat16=rewriter_config_pb2.RewriterConfig.ON)
  return tf1.ConfigProto(graph_options=tf1.GraphOptions(rewrite_options=rewrites))


def run_google(gb, work_dir, record_file, steps, warmup, bf16_rewrite=False):
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
                         tpu_config=tpu.TPUConfig(iterations_per_loop=10**6),
                         session_config=bf16_rewrite_config() if bf16_rewrite else None)
  est = tpu.TPUEstimator(use_tpu=False, model_fn=model_fn, config=config,
                         train_batch_size=BATCH)
  timer = StepTimer()
  est.train(input_fn, max_steps=steps, hooks=[timer])
  return timer.examples_per_sec(warmup)


def google_in_child(src_dir, work, record_file, steps, warmup, onednn=None, bf16_rewrite=False):
  """google-bert's examples/s in a fresh process: with TensorFlow's defaults (onednn None, as
  its users run it), with oneDNN forced on or off, or with oneDNN on and TF's bfloat16
  rewrite, so the anchor is its best on this host."""
  env = dict(os.environ)
  env.pop("TF_ENABLE_ONEDNN_OPTS", None)  # cerebras_tf set it in this process; TF decides there
  if onednn is not None:
    env["TF_ENABLE_ONEDNN_OPTS"] = "1" if onednn else "0"
  cmd = [sys.executable, os.path.abspath(__file__), "--google_child", "--google_bert_dir", src_dir,
         "--record", record_file, "--work", work, "--steps", str(steps), "--warmup", str(warmup)]
  return child_result(cmd + (["--bf16_rewrite"] if bf16_rewrite else []), env,
                      "google-research/bert")


def child_result(cmd, env, who):
  """The JSON a child benchmark process prints on its RESULT line."""
  out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
  for line in out.stdout.splitlines():
    if line.startswith("RESULT "):
      return json.loads(line[len("RESULT "):])
  raise RuntimeError(f"{who} child failed:\n" + out.stderr[-3000:])


def ours_in_child(steps, warmup, bf16, traced, serialized=False):
  """Ours in a fresh process, as google's rows run: {examples_per_sec, flops_per_sample,
  profile: [[op type, in the MLM head, microseconds], ...], nodes: {name: [op type, us]},
  profiled_steps}. `serialized`: TF_NUM_INTEROP_THREADS=1, so one op runs at a time and each
  op's duration is its own (the step is then slower, and not timed for table (a))."""
  cmd = [sys.executable, os.path.abspath(__file__), "--ours_child", "--steps", str(steps),
         "--warmup", str(warmup)] + (["--bf16"] if bf16 else []) + (["--traced"] if traced else [])
  env = dict(os.environ, TF_NUM_INTEROP_THREADS="1") if serialized else None
  return child_result(cmd, env, "cerebras_tf")


def ours_child(args):
  profile = OpProfile(range(args.steps + 1, args.steps + 4)) if args.traced else None
  rate, result = run_ours(args.steps, args.warmup, args.bf16, profile)
  flops = result.graph.flops_per_sample if result.graph is not None else float("nan")
  print("RESULT " + json.dumps({
      "examples_per_sec": rate, "flops_per_sample": flops,
      "profile": [[label, head, us] for (label, head), us in profile.by_type.items()]
                 if profile else [],
      "wall_profile": [[label, head, us] for (label, head), us in
                       profile.wall_by_type.items()] if profile else [],
      "traced_wall_us": profile.wall_us if profile else 0,
      "nodes": profile.by_node if profile else {},
      "profiled_steps": profile.steps if profile else 0}))


def google_child(args):
  from tensorflow.python.util import _pywrap_util_port  # pylint: disable=import-outside-toplevel
  gb = import_google_bert(args.google_bert_dir)
  rate = run_google(gb, args.work, args.record, args.steps, args.warmup, args.bf16_rewrite)
  print("RESULT " + json.dumps({"examples_per_sec": rate,
                                "onednn": bool(_pywrap_util_port.IsMklEnabled())}))


def op_rows(profile, top=12):
  """(op type, wall ms per step, share of the step's wall, op time ms per step, of which in the
  MLM head) rows, largest wall share first; the wall columns split each instant among the ops
  running then (OpProfile)."""
  def by_label(table):
    out, head = {}, {}
    for (label, in_head), us in table.items():
      out[label] = out.get(label, 0) + us
      if in_head:
        head[label] = head.get(label, 0) + us
    return out, head

  wall, wall_head = by_label(profile.wall_by_type)
  op_time, _ = by_label(profile.by_type)
  busy, n = sum(wall.values()), profile.steps
  ranked = sorted(wall, key=lambda label: -wall[label])
  ms = lambda us: f"{us / n / 1000:.1f}"  # noqa: E731
  rows = [(label, ms(wall[label]), f"{wall[label] / busy:.1%}", ms(op_time.get(label, 0)),
           f"{wall_head.get(label, 0) / wall[label]:.0%}") for label in ranked[:top]]
  rest = ranked[top:]
  rows.append(("(all other op types)", ms(sum(wall[label] for label in rest)),
               f"{sum(wall[label] for label in rest) / busy:.1%}",
               ms(sum(op_time.get(label, 0) for label in rest)), ""))
  rows.append(("the traced step (first op's start to last op's end; its idle instants are "
               "in no row)", ms(profile.wall_us), f"{busy / profile.wall_us:.1%} busy",
               ms(sum(op_time.values())), f"{sum(wall_head.values()) / busy:.0%}"))
  return rows


def node_rows(nodes, steps, top=15, unit="ops"):
  """(op, op type, ms per step, share of the step's op time) rows of the `top` largest nodes,
  then the rest and the sum; `nodes`: {node name: [op type, microseconds over `steps`]}."""
  total = sum(us for _, us in nodes.values())
  ranked = sorted(nodes.items(), key=lambda kv: -kv[1][1])
  ms = lambda us: f"{us / steps / 1000:.2f}"  # noqa: E731
  rows = [(name, label, ms(us), f"{us / total:.1%}") for name, (label, us) in ranked[:top]]
  rest = sum(us for _, (_, us) in ranked[top:])
  rows.append((f"(the other {len(ranked) - top} {unit})", "", ms(rest), f"{rest / total:.1%}"))
  rows.append(("the step, one op at a time", "", ms(total), "100%"))
  return rows


def by_op_type(nodes):
  """{node: [op type, us]} -> {op type: ["<n> ops", their summed us]}."""
  summed, count = {}, {}
  for label, us in nodes.values():
    summed[label] = summed.get(label, 0) + us
    count[label] = count.get(label, 0) + 1
  return {label: [f"{count[label]} ops", us] for label, us in summed.items()}


PRODUCT_OPS = ("MatMul", "Einsum")  # op types containing these are products (oneDNN's too)


def ceiling_rows(nodes, steps, executed_per_step, limit):
  """Table (f): what the serialized step's products alone would reach. Nearly all of the
  executed FLOPs are products, so the executed FLOPs over the products' own time bound the
  step's FLOP/s were every other op free; below 60% of the limit, no cut outside the products
  meets the goal on this host."""
  products = sum(us for label, us in nodes.values() if any(k in label for k in PRODUCT_OPS))
  total = sum(us for _, us in nodes.values())
  ms = lambda us: us / steps / 1000  # noqa: E731
  bound = executed_per_step / (ms(products) / 1000)
  return [("the step one op at a time: op time ms per step", f"{ms(total):.1f}", "-"),
          ("... of which the products (MatMul, BatchMatMul, Einsum, fused or not)",
           f"{ms(products):.1f} ({products / total:.0%})", "-"),
          ("executed GFLOP per step", f"{executed_per_step / 1e9:.2f}", "-"),
          ("GFLOP/s were the step its products alone (executed FLOPs / the products' time)",
           f"{bound / 1e9:.1f}", "-"),
          ("... as a fraction of the fp32 limit: the most any cut outside the products can give",
           f"**{bound / limit:.1%}**", ">= 60% needed"),
          ("at the executed FLOP/s of 60% of the limit, a step would take (ms)",
           f"{executed_per_step / (0.6 * limit) * 1000:.1f}", "-")]


def anchor_rows(google, google_onednn, google_by, google_bf16, google_same, ours_fp32,
                ours_bf16):
  """Table (a): google's configurations, its best fp32 and (with bf16 runs) its best of all,
  each against ours in float32 and, with bf16 runs, ours in bfloat16. Medians over rounds."""
  each = lambda rates: ", ".join(f"{x:.1f}" for x in rates)  # noqa: E731
  fp32, bf16 = median(ours_fp32), median(ours_bf16) if ours_bf16 else None

  def row(name, rates, goal="-", rate=None, only=None):
    """`only` ("fp32" or "bf16"): an anchor row, that precision's ratio in bold, the other '-'."""
    rate = median(rates) if rate is None else rate
    cell = lambda ours, which: ("-" if only not in (None, which)  # noqa: E731
                                else f"**{ours / rate:.2f}**" if only else f"{ours / rate:.2f}")
    cells = [name, f"{rate:.1f}", each(rates), cell(fp32, "fp32")]
    if bf16:
      cells.append(cell(bf16, "bf16"))
    return tuple(cells + [goal])

  g_on, g_off, g = median(google_by[True]), median(google_by[False]), median(google)
  best_fp32 = max(g, g_on, g_off)
  rows = [row("google-research/bert, TensorFlow's defaults (child process; oneDNN "
              f"{'on' if google_onednn else 'off'} there)", google),
          row("google-research/bert, TF_ENABLE_ONEDNN_OPTS=1 (child)", google_by[True]),
          row("google-research/bert, TF_ENABLE_ONEDNN_OPTS=0 (child)", google_by[False])]
  if bf16:
    rows.append(row("google-research/bert, oneDNN on + TF's bfloat16 graph rewrite "
                    "(auto_mixed_precision_onednn_bfloat16; child)", google_bf16))
  rows.append(row("**the anchor in float32: the fastest of the three fp32 rows**", [],
                  ">= 1.5 (ours fp32)", rate=best_fp32, only="fp32"))
  if bf16:
    rows.append(row("**the anchor: its fastest row of all**", [], ">= 1.5 (ours bf16)",
                    rate=max(best_fp32, median(google_bf16)), only="bf16"))
  rows.append(row("google-research/bert with cerebras_tf's TF settings (this process, oneDNN "
                  "on, fp32)", google_same))
  rows.append(row("cerebras_tf BERT, fp32 (use_cs=True; child)", ours_fp32))
  if bf16:
    rows.append(row("cerebras_tf BERT, bf16 as the demo's YAML ships (model.mixed_precision: "
                    "true; child)", ours_bf16))
  return rows


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--google_bert_dir", default=os.environ.get("GOOGLE_BERT_DIR",
                                                             DEFAULT_MIRROR))
  ap.add_argument("--rounds", type=int, default=3)
  ap.add_argument("--steps", type=int, default=80)
  ap.add_argument("--warmup", type=int, default=15)
  ap.add_argument("--fp32_only", action="store_true",
                  help="no bf16 rows even where the CPU has bf16 math (half the run time)")
  ap.add_argument("--quick", action="store_true", help="1 round of 40 steps")
  ap.add_argument("--serialized", action="store_true",
                  help="also table (e): our fp32 step's largest ops with one op at a time "
                       "(TF_NUM_INTEROP_THREADS=1), each op's own time; one more child")
  ap.add_argument("--google_child", action="store_true", help=argparse.SUPPRESS)
  ap.add_argument("--ours_child", action="store_true", help=argparse.SUPPRESS)
  ap.add_argument("--traced", action="store_true", help=argparse.SUPPRESS)
  ap.add_argument("--bf16", action="store_true", help=argparse.SUPPRESS)  # ours' child
  ap.add_argument("--bf16_rewrite", action="store_true", help=argparse.SUPPRESS)  # google's
  ap.add_argument("--record", help=argparse.SUPPRESS)
  ap.add_argument("--work", help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.google_child:
    return google_child(args)
  if args.ours_child:
    return ours_child(args)
  if args.quick:
    args.rounds, args.steps, args.warmup = 1, 40, 10

  work = tempfile.mkdtemp(prefix="bench_bert_vs_google_")
  gb, why = None, ""
  if args.google_bert_dir and os.path.exists(args.google_bert_dir):
    try:
      src = acquire_google_bert(args.google_bert_dir, work)
      gb = import_google_bert(src)
      record_file = os.path.join(work, "pretrain.tfrecord")
      write_google_records(record_file)
    except (subprocess.CalledProcessError, ImportError, OSError) as e:
      gb, why = None, f"could not load google-research/bert from {args.google_bert_dir}: {e}"
  else:
    why = ("google-research/bert not found: pass --google_bert_dir (a checkout or the bare "
           "mirror that `fetch github:google-research/bert` reports)")

  bf16 = has_bf16() and not args.fp32_only
  ours = {"fp32": [], "bf16": []}
  google, google_same, google_bf16, child = [], [], [], None
  google_onednn = None
  google_by = {True: [], False: []}  # oneDNN forced on / off in the child
  # (TensorFlow's, numpy's, numpy's own kernel's) fp32 matmul FLOP/s right after each round's
  # fp32 child: this VM's speed moves 15-17% within an hour, and a limit measured once, minutes
  # after the steps, moved the fraction with it (issue 42).
  round_matmuls, np_kernel = [], None
  for r in range(args.rounds):
    if gb is not None:
      run = lambda **kw: google_in_child(src, work, record_file, args.steps,  # noqa: E731
                                         args.warmup, **kw)["examples_per_sec"]
      first = google_in_child(src, work, record_file, args.steps, args.warmup)
      google.append(first["examples_per_sec"])
      google_onednn = first["onednn"]
      for onednn in (True, False):
        google_by[onednn].append(run(onednn=onednn))
      if bf16:
        google_bf16.append(run(onednn=True, bf16_rewrite=True))
      google_same.append(run_google(gb, work, record_file, args.steps, args.warmup))
    # fp32's child is kept: its FLOPs and (last round) its op profile make tables (b) and (d)
    child = ours_in_child(args.steps, args.warmup, False, traced=r == args.rounds - 1)
    ours["fp32"].append(child["examples_per_sec"])
    own, np_kernel = numpy_in_child_unpinned()
    round_matmuls.append((matmul_flops_per_sec(), numpy_matmul_flops_per_sec(), own))
    if bf16:
      ours["bf16"].append(ours_in_child(args.steps, args.warmup, True,
                                        traced=False)["examples_per_sec"])
  serial = ours_in_child(args.steps, args.warmup, False, traced=True,
                         serialized=True) if args.serialized else None
  pipeline = input_pipeline_examples_per_sec()
  matmul_tf, matmul_np, matmul_np_own = (max(col) for col in zip(*round_matmuls))
  round_limits = [max(each) for each in round_matmuls]
  matmul = max(round_limits)
  shutil.rmtree(work, ignore_errors=True)

  ours_rate = median(ours["fp32"])
  title = (f"BERT-tiny pretraining, batch {BATCH}, seq {SEQ}, {args.steps} steps (first "
           f"{args.warmup} dropped) x {args.rounds} rounds; {machine()}")
  if gb is not None:
    print_table("(a) ours vs google-research/bert run_pretraining.py in its best TensorFlow "
                "configuration on this host: " + title,
                ["implementation", "examples/s (median)", "each run", "ours fp32 / this row"]
                + (["ours bf16 / this row"] if bf16 else []) + ["goal"],
                anchor_rows(google, google_onednn, google_by, google_bf16, google_same,
                            ours["fp32"], ours["bf16"]))
  else:
    print(f"\n(a) skipped: {why}\n")
  flops = child["flops_per_sample"]
  rows, real_rows = head_rows_per_batch()
  model = our_params(tempfile.gettempdir())["model"]
  # the output layer's three [rows, H] x [H, V] products: 6 H V FLOPs a row, fwd + bwd
  skipped = (BATCH * PREDS - rows) / BATCH * 6 * model["hidden_size"] * model["vocab_size"]
  executed = flops - skipped
  profile = OpProfile([])
  profile.steps = child["profiled_steps"]
  profile.by_type = {(label, head): us for label, head, us in child["profile"]}
  profile.wall_by_type = {(label, head): us for label, head, us in child["wall_profile"]}
  profile.wall_us = child["traced_wall_us"]
  achieved = executed * ours_rate
  paired = [executed * rate / limit for rate, limit in zip(ours["fp32"], round_limits)]
  print_table("(b) training FLOP/s vs this machine's best fp32 matmul: " + title,
              ["quantity", "value", "goal"],
              [("the model's training GFLOP per example (compiler LayerGraph, fwd+bwd; the "
                f"masked-LM output layer on all {PREDS} slots, as google-bert computes it)",
                f"{flops / 1e9:.3f}", "-"),
               (f"masked-LM slots with a label: {real_rows:.1f} of {BATCH * PREDS} a batch; "
                f"output-layer rows computed: {rows:.1f} (rounded up, losses.rows_computed)",
                f"{rows / (BATCH * PREDS):.1%}", "-"),
               ("training GFLOP per example we execute (the model's, less 6 H V a row left out)",
                f"{executed / 1e9:.3f}", "-"),
               ("our training GFLOP/s executed", f"{achieved / 1e9:.1f}", "-"),
               ("the model's GFLOP/s (its GFLOP per example x our examples/s)",
                f"{flops * ours_rate / 1e9:.1f}", "-"),
               ("fp32 2048^3 matmul GFLOP/s (each the best of the rounds), numpy (OpenBLAS, this "
                "machine's "
                f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', 'unset')})",
                f"{matmul_np / 1e9:.1f}", "-"),
               (f"fp32 2048^3 matmul GFLOP/s, numpy with its own kernel (pin unset in a child; "
                f"kernel {np_kernel or 'not reported'})", f"{matmul_np_own / 1e9:.1f}", "-"),
               ("fp32 2048^3 matmul GFLOP/s, TensorFlow", f"{matmul_tf / 1e9:.1f}", "-"),
               ("the fp32 limit: the best of the three", f"{matmul / 1e9:.1f}", "-"),
               ("the fp32 limit of each round (the best of the three right after its step)",
                ", ".join(f"{l / 1e9:.1f}" for l in round_limits), "-"),
               ("our executed training FLOP/s as a fraction of its round's limit "
                "(median; each)", f"**{median(paired):.1%}** ("
                + ", ".join(f"{f:.1%}" for f in paired) + ")", ">= 60%"),
               ("our executed training FLOP/s (median) as a fraction of the best limit of all "
                "rounds", f"{achieved / matmul:.1%}", "-"),
               ("the model's FLOP/s as a fraction of the limit",
                f"{flops * ours_rate / matmul:.1%}", "-")])
  print_table("(c) input pipeline (tokenize, pack, mask) vs training consumption: " + title,
              ["quantity", "examples/s", "goal"],
              [("input pipeline alone", f"{pipeline:.0f}", "-"),
               ("training consumes", f"{ours_rate:.1f}", "-"),
               ("ratio", f"{pipeline / ours_rate:.1f}x", ">= 5x")])
  print_table(f"(d) where our step goes, by op type, {profile.steps} traced steps after the "
              "timed ones (TF step stats; wall: each instant split among the ops running then; "
              "op time: each op's own duration, summed, so two ops at once count twice)",
              ["op type", "wall ms per step", "share of the step's wall", "op time ms per step",
               "of which in the MLM head + loss (wall)"],
              op_rows(profile))
  if serial is not None:
    print_table(f"(e) our fp32 step one op at a time (TF_NUM_INTEROP_THREADS=1; "
                f"{serial['examples_per_sec']:.1f} examples/s so): the largest ops' own time, "
                f"{serial['profiled_steps']} traced steps",
                ["op", "op type", "ms per step", "share of the step's op time"],
                node_rows(serial["nodes"], serial["profiled_steps"]))
    print_table("(e') the same, by op type", ["op type", "ops of it", "ms per step",
                                              "share of the step's op time"],
                node_rows(by_op_type(serial["nodes"]), serial["profiled_steps"], unit="op types"))
    print_table("(f) the products' ceiling: the FLOP/s of a step that were only its products, "
                "from (e)'s serialized op times",
                ["quantity", "value", "goal"],
                ceiling_rows(serial["nodes"], serial["profiled_steps"], executed * BATCH, matmul))
  return 0


if __name__ == "__main__":
  sys.exit(main())
