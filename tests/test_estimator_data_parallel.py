"""CerebrasEstimator under data parallelism (compiler/lints.py's data-parallel lints, the host's
replicas against the plan's): per-replica counters, clipping, summed losses, batch norm's
groups, a model_fn's own train_distribute, and input_fns that do not return a dataset.
"""

import logging
import os
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from cerebras_tf import CerebrasEstimator, CSConfig
from cerebras_tf.errors import ConfigError
from cerebras_tf.runtime import checkpoints, strategies
from cerebras_models.mlp.model import model_fn
from estimator_fixtures import PARAMS, ROOT, config_in, train_input_fn
import warm_python


def test_auto_multi_replica_falls_back_to_one_device(tmp_path, monkeypatch, caplog):
  """auto picks multi_replica for this MLP at batch 256 (R copies fit the wafer and gain 12%,
  more than the 5% auto asks; at batch 16 they gain 0.7% and auto keeps pipelined); the host asks
  for 2 logical CPUs. When TensorFlow already runs with one CPU (a notebook), auto plans the
  host side for one device, with an INFO line, and trains; so does an explicit multi_replica
  (the host's replica count is the user's only with csconfig.num_replicas, which keeps the
  error). The plan carries the host's numbers (plan.batching), the runtime reads them."""
  asked = []

  def no_devices(count):
    asked.append(count)
    raise ConfigError(f"this run needs {count} CPU devices but TensorFlow already started "
                      f"with 1")
  monkeypatch.setattr(strategies, "reserve_logical_cpus", no_devices)
  monkeypatch.setattr(strategies, "logical_cpu_count", lambda: 1)
  caplog.set_level(logging.INFO, logger="tensorflow")
  params = dict(PARAMS, batch_size=256)
  est = CerebrasEstimator(model_fn, config=config_in(tmp_path), params=params)
  est.train(train_input_fn, max_steps=2, use_cs=True)
  plan = est.compile(train_input_fn).plan
  assert plan.execution_strategy == "multi_replica" and plan.num_replicas > 2
  assert plan.reason.startswith(f"multi_replica (R={plan.num_replicas}) ")
  assert plan.batching.host_replicas == 1 and plan.batching.per_host_replica == 256
  assert asked[0] == 2 and checkpoints.current_step(est.model_dir) == 2
  logged = caplog.text
  assert f"R={plan.num_replicas} replicas on the engine (chosen by auto); the host trains them " \
         f"as 1 replica(s) of 256 samples" in logged
  assert "TensorFlow already started with 1 CPU device(s); if auto picks a data-parallel " \
         "mode the host trains on the devices it has" in logged
  assert "for 2 host replicas, run in a fresh process" in logged
  caplog.clear()
  explicit = CerebrasEstimator(model_fn, config=config_in(
      tmp_path / "mr", cs_config=CSConfig(execution_strategy="multi_replica")), params=params)
  explicit.train(train_input_fn, max_steps=2, use_cs=True)
  assert explicit.compile(train_input_fn).plan.batching.host_replicas == 1
  assert "the multi_replica plan is data-parallel: the host trains on the devices it has" \
      in caplog.text
  forced = CerebrasEstimator(model_fn, config=config_in(tmp_path / "mr2", cs_config=CSConfig(
      execution_strategy="multi_replica", num_replicas=2)), params=params)
  with pytest.raises(ConfigError, match="needs 2 CPU devices"):
    forced.train(train_input_fn, max_steps=2, use_cs=True)


def test_numpy_input_fn_trains_and_multi_replica_asks_for_a_dataset(tmp_path):
  """tf.compat.v1.estimator.inputs.numpy_input_fn (queues, tensors) trains pipelined; in
  multi_replica tf.distribute raised "input_fn must return a tf.data.Dataset or a callable"."""
  x = np.random.RandomState(0).randn(64, PARAMS["input_dim"]).astype("float32")
  y = (x[:, 0] > 0).astype("int32")
  numpy_fn = tf.compat.v1.estimator.inputs.numpy_input_fn(
      x={"x": x}, y=y, batch_size=PARAMS["batch_size"], num_epochs=None, shuffle=False)
  est = CerebrasEstimator(model_fn, config=config_in(tmp_path, cs_config=CSConfig(
      execution_strategy="pipelined")), params=PARAMS)
  est.train(numpy_fn, max_steps=3, use_cs=True)
  assert est.get_variable_value("global_step") == 3
  # multi_replica needs 2 logical CPUs before TensorFlow starts: a fresh process.
  script = textwrap.dedent("""\
      import sys, numpy as np, tensorflow as tf
      from cerebras_tf import CerebrasEstimator, CSConfig, CSRunConfig
      from cerebras_tf.errors import ConfigError
      from cerebras_models.mlp import model as mlp
      x = np.zeros((64, 32), np.float32); y = np.zeros(64, np.int32)
      fn = tf.compat.v1.estimator.inputs.numpy_input_fn(x={"x": x}, y=y, batch_size=16,
                                                        num_epochs=None, shuffle=False)
      params = {"input_dim": 32, "num_classes": 4, "hidden_sizes": [8], "learning_rate": 0.01,
                "batch_size": 16}
      est = CerebrasEstimator(mlp.model_fn, params=params, config=CSRunConfig(
          model_dir=sys.argv[1], cs_config=CSConfig(execution_strategy="multi_replica",
                                                    num_replicas=2)))
      try:
        est.train(fn, max_steps=3, use_cs=True)
      except ConfigError as e:
        print("REFUSED", e)
      """)
  proc = warm_python.run([sys.executable, "-c", script, str(tmp_path / "mr")], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, check=False,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
  assert "REFUSED the input_fn returned a tuple of tensors, not a tf.data.Dataset: " \
         "multi_replica splits a dataset" in proc.stdout, proc.stdout + proc.stderr[-2000:]


# Model_fns as users port them from one device, trained on 2 host replicas: one fresh process
# (multi_replica needs its 2 CPUs before TF starts) runs every trial, written to a file so that
# warnings can name its lines; each test reads the lines its trial printed, "<trial> ...".
_REPLICA_PRELUDE = """\
import logging, sys, numpy as np, tensorflow as tf
from cerebras_tf import CerebrasEstimator, CSConfig, CSRunConfig
said = []
logging.getLogger("tensorflow").addHandler(type("H", (logging.Handler,), {
    "emit": lambda self, r: said.append(r.getMessage())})())
def input_fn(params):
  x = np.ones((200, 8), np.float32); y = np.zeros(200, np.int32)
  return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(params["batch_size"])
def dense(features, zero=False):
  return tf.compat.v1.layers.dense(features, 2, kernel_initializer=(
      tf.compat.v1.zeros_initializer() if zero else None))
def sgd(loss, rate=0.1):
  return tf.compat.v1.train.GradientDescentOptimizer(rate).minimize(
      loss, tf.compat.v1.train.get_global_step())
def trial(name, model_fn, *steps, strategy="multi_replica", replicas=2, batch=20, **cs):
  # Trains to each of `steps` on a new model_dir; a refusal is printed, not raised.
  said.clear()
  est = CerebrasEstimator(model_fn, params={"batch_size": batch}, config=CSRunConfig(
      model_dir=f"{sys.argv[1]}/{name}", cs_config=CSConfig(
          execution_strategy=strategy,
          num_replicas=replicas if strategy == "multi_replica" else None, **cs)))
  try:
    for s in steps:
      est.train(input_fn, max_steps=s, use_cs=True)
  except Exception as e:  # the trial's own lines say what the test expects
    print(name.split("/")[0], "REFUSED", type(e).__name__, " ".join(str(e).split()))
  return est
def warned(text):
  return [m for m in said if text in m]
"""


_REPLICA_TRIALS = {}


_REPLICA_TRIALS["autograph"] = """
from tensorflow.python.autograph.impl import api as autograph_api
converted = []
_convert = autograph_api._convert_actual  # each conversion autograph is asked for, cached or not
def _record(entity, program_ctx):
  converted.append(f"{getattr(entity, '__module__', '')}:{getattr(entity, '__qualname__', '')}")
  return _convert(entity, program_ctx)
autograph_api._convert_actual = _record
def users_model_fn(features, labels, mode, params):
  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, dense(features))
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=sgd(loss))
for STRATEGY in ("multi_replica", "pipelined"):
  converted.clear()
  trial(f"autograph/{STRATEGY}", users_model_fn, 2, strategy=STRATEGY)
  print("autograph", STRATEGY, "USER", any(c.endswith(":users_model_fn") for c in converted),
        "OURS", sorted({c for c in converted if c.startswith("cerebras_tf")}))
def tensor_if_model_fn(features, labels, mode, params):
  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, dense(features))
  if tf.reduce_sum(features) > 0:  # a Python if on a tensor: only autograph makes it a tf.cond
    loss = loss * 1.0
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=sgd(loss))
for NAME, CLS in (("plain", tf.estimator.Estimator), ("ours", CerebrasEstimator)):
  for MIRRORED in (True, False):
    dist = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"], cross_device_ops=
        tf.distribute.ReductionToOneDevice(reduce_to_device="/cpu:0")) if MIRRORED else None
    est = CLS(tensor_if_model_fn, params={"batch_size": 20}, config=CSRunConfig(
        model_dir=f"{sys.argv[1]}/tensor_if/{NAME}{MIRRORED}", train_distribute=dist))
    try:
      est.train(input_fn, max_steps=2)
      print("tensor_if", NAME, MIRRORED, "TRAINED")
    except Exception as e:  # what the test compares between the two estimators
      print("tensor_if", NAME, MIRRORED, "FAILED", type(e).__name__)
"""


_REPLICA_TRIALS["counter"] = """
for AGGREGATION in ("NONE", "SUM"):
  def model_fn(features, labels, mode, params):
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, dense(features))
    seen = tf.compat.v1.get_variable(
        "examples_seen", [], tf.float32, tf.zeros_initializer(), trainable=False,
        aggregation=getattr(tf.VariableAggregation, AGGREGATION))
    count = tf.compat.v1.assign_add(seen, tf.cast(tf.shape(features)[0], tf.float32))
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=tf.group(sgd(loss), count))
  est = trial(f"counter/{AGGREGATION}", model_fn, 10)
  print("counter", AGGREGATION, "SEEN", est.get_variable_value("examples_seen"), "SAID",
        bool(warned("examples_seen is written by the training step with aggregation NONE")))
"""


_REPLICA_TRIALS["saver"] = """
def model_fn(features, labels, mode, params):
  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, dense(features))
  step = tf.compat.v1.train.AdamOptimizer(0.1).minimize(
      loss, tf.compat.v1.train.get_global_step())
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=step,
      scaffold=tf.compat.v1.train.Scaffold(saver=tf.compat.v1.train.Saver()))
est = trial("saver", model_fn, 4, 8)
print("saver STEP", est.get_variable_value("global_step"), "SAID",
      warned("written by the training step"))
"""


_REPLICA_TRIALS["clip"] = """
for HOW in ("own", "reference"):
  def model_fn(features, labels, mode, params):
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, dense(features))
    opt = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    if HOW == "own":
      grads_and_vars = opt.compute_gradients(loss)
      grads, _ = tf.clip_by_global_norm([g for g, _ in grads_and_vars], 1.0)  # CLIP LINE
      step = opt.apply_gradients(zip(grads, [v for _, v in grads_and_vars]),
                                 tf.compat.v1.train.get_global_step())
    else:
      from cerebras_models import optimization
      step, _ = optimization.build_train_op(loss, {"optimizer_type": "sgd",
          "learning_rate": 0.1, "max_gradient_norm": 1.0}, 10)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=step)
  trial(f"clip/{HOW}", model_fn, 2)
  print("clip", HOW, "SAID", warned("clips its gradients"))
"""


_REPLICA_TRIALS["cond"] = """
def model_fn(features, labels, mode, params):
  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, dense(features))
  opt = tf.compat.v1.train.AdamOptimizer(1e-2)
  gs = tf.compat.v1.train.get_global_step()
  gvs = opt.compute_gradients(loss)
  accs = [tf.compat.v1.get_variable(v.op.name + "_acc", v.shape, trainable=False,
                                    initializer=tf.zeros_initializer()) for _, v in gvs]
  with tf.control_dependencies([a.assign_add(g) for a, (g, _) in zip(accs, gvs)]):
    step = tf.cond(tf.equal(gs % 2, 1), lambda: tf.group(opt.apply_gradients(  # COND LINE
        [(a.read_value(), v) for a, (_, v) in zip(accs, gvs)])), tf.no_op)
  with tf.control_dependencies([step]):
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=gs.assign_add(1))
trial("cond", model_fn, 2)
"""


_REPLICA_TRIALS["sum"] = """
for HOW, strategy in (("sum", "multi_replica"), ("v1_sum", "multi_replica"),
                      ("mean", "multi_replica"), ("sum", "pipelined")):
  def model_fn(features, labels, mode, params):
    logits = dense(features, zero=True)
    xent = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    loss = {"sum": lambda: tf.reduce_sum(xent),  # SUM LINE
            "v1_sum": lambda: tf.compat.v1.losses.sparse_softmax_cross_entropy(
                labels, logits, reduction=tf.compat.v1.losses.Reduction.SUM),
            "mean": lambda: tf.reduce_mean(xent)}[HOW]()
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=sgd(loss, 0.01))
  est = trial(f"sum/{HOW}_{strategy}", model_fn, 1, strategy=strategy)
  print("sum", f"{HOW}_{strategy}", est.get_variable_value("dense/kernel")[0, 0], "SAID",
        warned("sum over the batch"))
"""


_REPLICA_TRIALS["bn"] = """
for REPLICAS in (None, 2):
  def model_fn(features, labels, mode, params):
    h = tf.compat.v1.layers.batch_normalization(features, training=True, name="norm")
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, dense(h))
    with tf.control_dependencies(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)):
      return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=sgd(loss))
  est = trial(f"bn/{REPLICAS}", model_fn, 1, replicas=REPLICAS, batch=64)
  print("bn", REPLICAS, "R", est.compile(input_fn).plan.num_replicas, "SAID",
        warned("batch normalization (norm)"))
for BATCH, NUM_CSX, MICRO in ((16, 2, None), (32, 2, None), (32, 1, 8)):
  est = trial(f"bn_ws/{BATCH}_{NUM_CSX}_{MICRO}", model_fn, 1, strategy="weight_streaming",
              batch=BATCH, num_csx=NUM_CSX, micro_batch_size=MICRO)
  print("bn_ws", BATCH, NUM_CSX, MICRO, "SAID", warned("batch normalization (norm)"))
"""


@pytest.fixture(scope="module")
def replica_trials(tmp_path_factory):
  """(path, text, stdout) of one fresh process that ran every _REPLICA_TRIALS entry."""
  tmp = tmp_path_factory.mktemp("replica_trials")
  text = _REPLICA_PRELUDE + "".join(_REPLICA_TRIALS.values())
  path = tmp / "ported_model_fns.py"
  path.write_text(text)
  proc = warm_python.run([sys.executable, str(path), str(tmp)], cwd=ROOT, capture_output=True,
                         text=True, timeout=600, check=False,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
  return path, text, proc.stdout + "\n--- stderr ---\n" + proc.stderr[-3000:]


def _trial_lines(replica_trials, name):
  return [l.split(" ", 1)[1] for l in replica_trials[2].splitlines()
          if l.startswith(name + " ")]


def _line_of(replica_trials, mark):
  lines = replica_trials[1].splitlines()
  return lines.index(next(l for l in lines if mark in l)) + 1


def test_in_host_replicas_autograph_converts_the_users_model_fn_and_none_of_ours(replica_trials):
  """tf.estimator runs each replica's model_fn through autograph (tf.distribute's mirrored_run
  converts it); that transpiled the framework's wrapper and every function of ours it called,
  in each process: 2.5% of the test suite's CPU. Now the user's model_fn alone is converted
  under replicas, and nothing on one device, as tf.estimator does."""
  assert _trial_lines(replica_trials, "autograph") == [
      "multi_replica USER True OURS []", "pipelined USER False OURS []"], replica_trials[2]
  # A user's own MirroredStrategy with use_cs=False: a Python `if` on a tensor trains through
  # autograph under the strategy and fails on one device, with either estimator.
  assert _trial_lines(replica_trials, "tensor_if") == [
      "plain True TRAINED", "plain False FAILED OperatorNotAllowedInGraphError",
      "ours True TRAINED", "ours False FAILED OperatorNotAllowedInGraphError"], replica_trials[2]


def test_a_per_replica_counter_is_named_in_multi_replica(replica_trials):
  """A non-trainable `examples_seen` the train_op adds the batch to: 10 steps of 20 examples
  read 200 in pipelined but 100 in multi_replica (2 host replicas of 10, each counting into
  its own copy), without a word. Now a warning names it; with aggregation SUM it reads 200
  and nothing is said."""
  assert _trial_lines(replica_trials, "counter") == [
      "NONE SEEN 100.0 SAID True", "SUM SEEN 200.0 SAID False"], replica_trials[2]


def test_batch_norm_on_more_engine_replicas_than_the_host_trains_is_named(replica_trials):
  """A dense batch norm (tf.compat.v1.layers on [64, 8]) on multi_replica with R left to the
  compiler. It used to take R=20 at batch 20 (1 sample a replica: a dense feature's variance
  is 0) while the host trained 2 replicas of 10, without a word. The compiler now sees the
  norm (its moving mean) and stops R where a replica keeps 16 samples: at batch 64, R=4; the
  host's 2 replicas of 32 still normalize over more, and the warning names the norm, both
  splits and the num_replicas that makes them one; with num_replicas=2 nothing is said."""
  chosen, fixed = _trial_lines(replica_trials, "bn")
  assert chosen.startswith("None R 4 SAID [") and fixed == "2 R 2 SAID []", replica_trials[2]
  assert ("multi_replica plan's 4 engine replicas see 16 sample(s) each, this host trains 2 "
          "replica(s) of 32") in chosen, chosen
  assert "csconfig.num_replicas=2 makes the engine's replicas the host's" in chosen


def test_batch_norm_starved_or_split_otherwise_by_weight_streaming_is_named(replica_trials):
  """The same dense batch norm in weight streaming. At batch 16 on 2 systems each normalizes
  over 8 samples (as the host's 2 replicas do): the plan's note is said at train time, with
  the num_csx that keeps 16. At batch 32 nothing is said. A forced micro-batch of 8 on one
  system: the note, and that the host (which does not micro-batch) normalizes over all 32."""
  starved, kept, micro = _trial_lines(replica_trials, "bn_ws")
  assert starved.startswith("16 2 None SAID [") and \
      starved.count("batch normalization (norm)") == 1, replica_trials[2]
  assert ("takes its statistics over one micro-batch on one system: 8 sample(s), under 16 "
          "(Wu & He 2018): training is noisier than batch 16 says; num_csx=2 leaves each "
          "system 8: num_csx <= 1, or a global batch of 32") in starved
  assert kept == "32 2 None SAID []", replica_trials[2]
  assert micro.count("batch normalization (norm)") == 2, replica_trials[2]
  assert "micro_batch_size=8 forces it: micro_batch_size >= 16" in micro
  assert ("the weight-streaming plan's 1 system(s) x 4 micro-batch(es) see 8 sample(s) each, "
          "this host trains 1 replica(s) of 32, so these losses are not the engine's; the host "
          "does not micro-batch: csconfig.micro_batch_size=32") in micro


def test_batch_norm_on_workers_is_named_against_the_pipelined_engine(caplog):
  """A pipelined plan normalizes over the whole batch on the engine; on 2 workers each host
  replica normalizes its own half (Keras and tf.compat.v1 batch norms are per replica). The
  warning names both; on one worker nothing is said."""
  from cerebras_tf.compiler import compile as compile_lib  # pylint: disable=import-outside-toplevel
  from cerebras_tf.compiler import lints  # pylint: disable=import-outside-toplevel
  from cerebras_tf.compiler.plan import get_planner  # pylint: disable=import-outside-toplevel
  from cerebras_tf.core import ir, plans  # pylint: disable=import-outside-toplevel
  from cerebras_tf.engine import spec  # pylint: disable=import-outside-toplevel
  layer = ir.Layer("bn0", "elementwise", 2.0e5, 4.0e5, 80, 320, 640, 1280, 8192.0,
                   batch_norm=True)
  g = ir.LayerGraph("cnn", (layer,), 32)
  caplog.set_level(logging.WARNING, logger="tensorflow")
  for workers in (1, 2):
    opts = plans.PlanOptions(batch_size=32, num_workers=workers)
    plan = compile_lib.with_host(get_planner("pipelined").plan(g, spec.load_engine("cs2"), opts),
                                 opts)
    lints.say_batch_norm_statistics(g.batch_norm_layers, plan)
  said = [r.getMessage() for r in caplog.records if "batch normalization" in r.getMessage()]
  assert said == ["cerebras_tf: batch normalization (bn0) takes its statistics over one group of "
                  "samples: the pipelined plan normalizes over the whole batch, this host trains "
                  "2 replica(s) of 16, so these losses are not the engine's; training on one "
                  "worker reproduces the engine's"]


def test_a_scaffold_saver_is_not_taken_for_a_per_replica_counter(replica_trials):
  """A Saver made in the model_fn (after minimize) restores into every variable, and its
  restore writes named each of Adam's slots "written by the training step with aggregation
  NONE" in multi_replica (4 false warnings in the trial)."""
  assert _trial_lines(replica_trials, "saver") == ["STEP 8 SAID []"], replica_trials[2]


def test_clipping_each_replicas_share_is_named_in_multi_replica(replica_trials):
  """google-research/bert's optimizer clips by the global norm inside the model_fn: on 2 host
  replicas each clipped its own half of the gradient by the whole limit, up to 2x the
  one-device step, without a word. Now the line is named; the reference optimizer (which
  sums the replicas' gradients before it clips) called from a model_fn is not."""
  path, line = replica_trials[0], _line_of(replica_trials, "CLIP LINE")
  assert _trial_lines(replica_trials, "clip") == [
      "own SAID " + str([
          f"cerebras_tf: {path}:{line}: the model_fn clips its gradients by their global norm "
          f"in each of the 2 host replicas: each clips its own 1/2 share by the whole limit, "
          f"so a clipped update is up to 2x the one-device one; clip the replicas' sum (the "
          f"reference optimizer, cerebras_models.optimization.build_train_op, does), or "
          f"train pipelined"]),
      "reference SAID []"], replica_trials[2]


def test_an_update_applied_inside_a_cond_is_named_in_multi_replica(replica_trials):
  """A model_fn's own gradient accumulation (apply_gradients inside a tf.cond), ported from one
  device: under host replicas it failed with tf.distribute's paragraph about nested
  tf.functions ("`merge_call` called while defining a new graph"), pointing at autograph's
  generated files. Now one line names the user's line and the ways that train."""
  path, line = replica_trials[0], _line_of(replica_trials, "COND LINE")
  said = _trial_lines(replica_trials, "cond")
  assert len(said) == 1 and said[0].startswith(
      f"REFUSED ModelFnError {path}:{line}: the model_fn applies its update inside a tf.cond "
      f"or a loop (gradient accumulation?), which data-parallel host replicas cannot run"), \
      replica_trials[2]


def test_a_loss_summed_over_the_batch_is_named_in_multi_replica(replica_trials):
  """tf.reduce_sum as the loss: each of 2 host replicas summed its half of the batch and the
  optimizer, taking it for a mean, halved the replicas' gradients: one SGD step moved the
  kernel half as far as on one device, silently. Now it is named; the advice (a v1 loss with
  reduction=SUM) takes the one-device step, and a mean is not named."""
  path, line = replica_trials[0], _line_of(replica_trials, "SUM LINE")
  runs = {l.split()[0]: (float(l.split()[1]), l.split(" SAID ", 1)[1])
          for l in _trial_lines(replica_trials, "sum")}
  assert runs["sum_multi_replica"][1].startswith(
      f"['cerebras_tf: {path}:{line}: the loss is a sum over the batch (tf.reduce_sum): each "
      f"of the 2 host replicas sums its 1/2 share"), replica_trials[2]
  assert [runs[k][1] for k in ("v1_sum_multi_replica", "mean_multi_replica",
                               "sum_pipelined")] == ["[]"] * 3, replica_trials[2]
  # By hand: a zero kernel gives p(0) = 1/2 for inputs of ones and labels 0, so each sample's
  # gradient on kernel[0, 0] is -1/2. One device, sum over 20: -10, SGD 0.01 -> +0.1. Two
  # replicas summing 10 each, divided by 2: -5 -> +0.05. reduction=SUM: +0.1. A mean: +0.005.
  assert {k: v[0] for k, v in runs.items()} == pytest.approx({
      "sum_multi_replica": 0.05, "v1_sum_multi_replica": 0.1, "mean_multi_replica": 0.005,
      "sum_pipelined": 0.1}, rel=1e-5), replica_trials[2]


def test_a_users_own_train_distribute_gives_way_to_the_plan(tmp_path, caplog):
  """RunConfig(train_distribute=MirroredStrategy()) written for GPUs, then use_cs=True: the
  pipelined run kept the user's strategy, and checkpointing its input failed with
  "GeneratorDataset does not support checkpointing"."""
  cfg = tf.estimator.RunConfig(model_dir=str(tmp_path / "m"), save_checkpoints_steps=2,
                               train_distribute=tf.distribute.MirroredStrategy(["/cpu:0"]))
  est = CerebrasEstimator(model_fn, config=cfg, params=PARAMS)
  with caplog.at_level(logging.WARNING, logger="tensorflow"):
    est.train(train_input_fn, max_steps=3, use_cs=True)
  assert est.get_variable_value("global_step") == 3
  assert ("cerebras_tf: config.train_distribute (MirroredStrategy) is not used with "
          "use_cs=True") in caplog.text
