"""CerebrasEstimator training: plain-Estimator compatibility, use_cs=True compile + train, what
is said once, what is refused before training, and the API around it (add_metrics,
TPUEstimatorSpec, train_and_evaluate, the run lock).
"""

import json
import logging
import os
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from cerebras_tf import CerebrasEstimator, CSConfig, CSRunConfig
from cerebras_tf.errors import (CompileError, ConfigError, DataError, ModelFnError, TrainingError,
                                UnsupportedOpError)
from cerebras_models.mlp.model import input_fn, model_fn
from estimator_fixtures import PARAMS, ROOT, config_in, eval_input_fn, train_input_fn
from source_marks import line_of
import warm_python


def test_is_an_estimator_subclass():
  assert issubclass(CerebrasEstimator, tf.estimator.Estimator)


def test_use_cs_false_is_the_plain_estimator(tmp_path):
  """Same seed, same steps: identical eval loss to tf.estimator.Estimator, and no compile."""
  plain = tf.estimator.Estimator(model_fn, config=tf.estimator.RunConfig(
      model_dir=str(tmp_path / "plain"), tf_random_seed=7), params=PARAMS)
  plain.train(train_input_fn, max_steps=30)
  ours = CerebrasEstimator(model_fn, config=config_in(tmp_path), params=PARAMS)
  ours.train(train_input_fn, max_steps=30, use_cs=False)
  a = plain.evaluate(eval_input_fn, steps=4)
  b = ours.evaluate(eval_input_fn, steps=4, use_cs=False)
  assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
  assert not os.path.exists(ours.compile_dir)


def test_graph_pbtxt_holds_the_graph_tfs_saver_writes(tmp_path):
  """Our saver hook encodes graph.pbtxt with protobuf's C encoder: side by side with TF's hook
  on one graph, both files parse to the same GraphDef (the text may order map entries
  differently, which is why the bytes are not compared)."""
  from google.protobuf import text_format  # pylint: disable=import-outside-toplevel
  from cerebras_tf.runtime import hooks as hooks_lib  # pylint: disable=import-outside-toplevel
  with tf.Graph().as_default():
    step = tf.compat.v1.train.get_or_create_global_step()
    table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
        ["a\x00b", "\u00e9t\u00e9", "inf"], [1, 2, 3]), -1)  # escapes in string constants
    w = tf.compat.v1.get_variable("w", [3], initializer=tf.constant_initializer([1e-30, 3.5, 7]))
    found = tf.cast(table.lookup(tf.constant(["inf"]))[0], tf.float32)
    train_op = tf.group(step.assign_add(1), w.assign(w * found))
    saver_hooks = [tf.compat.v1.train.CheckpointSaverHook(str(tmp_path / "tf"), save_steps=10),
                   hooks_lib.CheckpointSaverHook(str(tmp_path / "ours"), save_steps=10)]
    with tf.compat.v1.train.MonitoredSession(hooks=saver_hooks) as sess:
      sess.run(train_op)
  parsed, files = [], []
  for who in ("tf", "ours"):
    graph_def = tf.compat.v1.GraphDef()
    text_format.Merge((tmp_path / who / "graph.pbtxt").read_text(), graph_def)
    parsed.append(graph_def)
    files.append(sorted(re.sub(r"events\.out\.tfevents\..*", "events", f.name)
                        for f in (tmp_path / who).iterdir()))
  assert parsed[0] == parsed[1] and len(parsed[0].node) > 20
  # the same files beside it: checkpoints of steps 0 and 1 with their .meta, the events
  assert files[0] == files[1] and "model.ckpt-1.meta" in files[0], files


def test_our_saver_takes_tfs_place_unless_one_is_there(tmp_path):
  """with_checkpoint_saver adds the saver tf.estimator's loop would (same steps, first of the
  chief hooks) and nothing when a hook already saves or the config saves nothing."""
  from cerebras_tf.runtime import hooks as hooks_lib  # pylint: disable=import-outside-toplevel
  with tf.Graph().as_default():
    loss = tf.constant(1.0)
    chief = tf.compat.v1.train.StepCounterHook(output_dir=str(tmp_path))
    spec = tf.estimator.EstimatorSpec("train", loss=loss, train_op=tf.no_op(),
                                      training_chief_hooks=[chief])
    config = config_in(tmp_path)
    added = hooks_lib.with_checkpoint_saver(spec, [], config, config.model_dir)
    saver = added.training_chief_hooks[0]
    assert isinstance(saver, hooks_lib.CheckpointSaverHook)
    assert list(added.training_chief_hooks[1:]) == [chief]
    assert saver._timer._every_steps == 20 and saver._save_graph_def  # pylint: disable=protected-access
    users = tf.compat.v1.train.CheckpointSaverHook(str(tmp_path), save_steps=5)
    assert hooks_lib.with_checkpoint_saver(spec, [users], config, config.model_dir) is spec
    quiet = config_in(tmp_path).replace(save_checkpoints_steps=None)
    assert hooks_lib.with_checkpoint_saver(spec, [], quiet, config.model_dir) is spec
    no_text = config_in(tmp_path).replace(checkpoint_save_graph_def=False)
    assert not hooks_lib.with_checkpoint_saver(  # pylint: disable=protected-access
        spec, [], no_text, config.model_dir).training_chief_hooks[0]._save_graph_def


def _stepping_model_fn(features, labels, mode, params):
  """The MLP's graph with a train_op that moves the global step by params["advance"]."""
  spec = model_fn(features, labels, mode, {k: v for k, v in params.items() if k != "advance"})
  if mode != tf.estimator.ModeKeys.TRAIN or params["advance"] == 1:
    return spec
  step = tf.compat.v1.train.get_global_step()
  with tf.control_dependencies([spec.train_op]):
    train_op = step.assign_add(params["advance"] - 1)
  return spec._replace(train_op=train_op)


@pytest.mark.parametrize("advance", [1, 3])
def test_our_saver_saves_at_tfs_steps_without_reading_the_step_again_each_run(tmp_path, advance,
                                                                              monkeypatch):
  """TF's saver hook runs the session a second time after every step to read the global step
  (its _steps_per_run default); ours bounds a run's advance by the largest seen between two
  runs' reads. The checkpoints are the plain Estimator's, also when a run moves the step by 3
  (a train_op of the user's: 3, 6, ... 42 with saves every 11 steps: TF saves at 0, 12, 24,
  36, 42; a bound of 1 would check 9 + 1 < 11 and save at 15), and the second reads fall from
  one a run to a few."""
  from cerebras_tf.runtime import hooks as hooks_lib  # pylint: disable=import-outside-toplevel
  params = dict(PARAMS, advance=advance)
  reads = []
  after_run = tf.compat.v1.train.CheckpointSaverHook.after_run

  def counting(self, run_context, run_values):
    session_run = run_context.session.run
    def run(fetches, *args, **kwargs):
      if fetches is self._global_step_tensor:  # pylint: disable=protected-access
        reads.append(type(self))
      return session_run(fetches, *args, **kwargs)

    run_context.session.run = run
    try:
      after_run(self, run_context, run_values)
    finally:
      run_context.session.run = session_run

  monkeypatch.setattr(tf.compat.v1.train.CheckpointSaverHook, "after_run", counting)
  steps = []
  for name, make in (("plain", tf.estimator.Estimator), ("ours", CerebrasEstimator)):
    config = tf.estimator.RunConfig(model_dir=str(tmp_path / name), tf_random_seed=7,
                                    save_checkpoints_steps=11, keep_checkpoint_max=100)
    est = make(_stepping_model_fn, config=config, params=params)
    kwargs = {"use_cs": False} if make is CerebrasEstimator else {}
    est.train(train_input_fn, max_steps=40, **kwargs)
    state = tf.train.get_checkpoint_state(est.model_dir)
    steps.append([int(p.rsplit("-", 1)[1]) for p in state.all_model_checkpoint_paths])
  assert steps[0] == steps[1], steps
  assert steps[0] == ([0, 11, 22, 33, 40] if advance == 1 else [0, 12, 24, 36, 42])
  runs = 40 // advance + (advance != 1)
  tfs = reads.count(tf.compat.v1.train.CheckpointSaverHook)
  ours = reads.count(hooks_lib.CheckpointSaverHook)
  assert tfs == runs, reads  # TF's: one second read a run
  # ours: the first run's, then up to two around each save (a read after the run's own update
  # triggers a step early)
  assert 1 <= ours <= 1 + 2 * (len(steps[1]) - 1), reads


def test_a_logging_step_fetches_what_the_other_steps_fetch(tmp_path, monkeypatch):
  """Each new set of fetches is a new executor: TF prunes the graph, runs Grappler over it
  and pays a first run again (~0.4 s on BERT-tiny). The progress line's step is the read TF's
  own hooks fetch, so the training runs come in two sets only: TF's summary and logging
  steps (1, 11, 21: its LoggingTensorHook counts runs from 0), and the rest, our logging
  steps (10, 20, 30) among them. It was three when ours fetched the step variable."""
  from tensorflow.python.client import session as session_lib  # pylint: disable=import-outside-toplevel
  losses, fetch_sets = [], []

  def recording_model_fn(features, labels, mode, params):
    spec = model_fn(features, labels, mode, params)
    losses.append(spec.loss.name)
    return spec

  do_run = session_lib.BaseSession._do_run  # pylint: disable=protected-access

  def recording(self, handle, targets, fetches, *args, **kwargs):
    names = frozenset(f.name for f in fetches)
    if losses and losses[-1] in names:  # a training step: tf.estimator's NanTensorHook
      fetch_sets.append(names)
    return do_run(self, handle, targets, fetches, *args, **kwargs)

  monkeypatch.setattr(session_lib.BaseSession, "_do_run", recording)
  est = CerebrasEstimator(recording_model_fn, params=PARAMS,
                          config=config_in(tmp_path, save_summary_steps=10))
  est.train(train_input_fn, max_steps=30, use_cs=True)
  assert len(fetch_sets) == 30
  assert len(set(fetch_sets)) == 2, [sorted(f) for f in set(fetch_sets)]
  assert [i for i, f in enumerate(fetch_sets, 1) if f != fetch_sets[1]] == [1, 11, 21]


SEEDED_KERAS_LAYERS = """
import os, sys
import numpy as np
import tensorflow as tf
from cerebras_tf import CerebrasEstimator, CSConfig, CSRunConfig
from cerebras_models.mlp.model import input_fn
from cerebras_tf.runtime import strategies
strategies.reserve_logical_cpus(2)
PARAMS = {"batch_size": 16, "input_dim": 32, "num_classes": 4, "num_examples": 512}

def model_fn(features, labels, mode, params):
  h = tf.compat.v1.layers.dense(features["x"], 8, activation=tf.nn.relu, name="hidden")
  logits = tf.compat.v1.layers.dense(h, params["num_classes"], name="logits")
  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
  train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
      loss, global_step=tf.compat.v1.train.get_global_step())
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

def train(est, **kw):
  est.train(lambda params: input_fn(params, "train"), max_steps=1, **kw)
  kernel = tf.train.load_checkpoint(os.path.join(est.model_dir, "model.ckpt-0")).get_tensor(
      "hidden/kernel")
  return repr(kernel.ravel()[:4].tolist())

for run in ("tf1", "tf2"):
  print(run, train(tf.estimator.Estimator(model_fn, params=PARAMS, config=tf.estimator.RunConfig(
      model_dir=os.path.join(sys.argv[1], run), tf_random_seed=7))))
for run, use_cs in (("plain", False), ("pipelined", True), ("multi_replica", True)):
  print(run, train(CerebrasEstimator(model_fn, params=PARAMS, config=CSRunConfig(
      model_dir=os.path.join(sys.argv[1], run), tf_random_seed=7, cs_config=CSConfig(
          execution_strategy="multi_replica" if run == "multi_replica" else "pipelined"))),
      use_cs=use_cs))
"""


def test_tf_random_seed_fixes_keras_layers_initial_weights_in_every_mode(tmp_path):
  """tf.compat.v1.layers (Keras underneath) seed their initializers from Python's `random`,
  not the graph seed: under tf.estimator.Estimator one tf_random_seed gave other initial
  weights on every run. Under CerebrasEstimator it fixes them, the same on one device and in
  each MirroredStrategy replica thread, so runs and modes start from one point."""
  script = tmp_path / "seeded.py"
  script.write_text(SEEDED_KERAS_LAYERS)
  proc = warm_python.run([sys.executable, str(script), str(tmp_path)], cwd=ROOT, timeout=600,
                         capture_output=True, text=True, env=dict(os.environ,
                                                                  TF_CPP_MIN_LOG_LEVEL="3"))
  assert proc.returncode == 0, proc.stderr[-3000:]
  kernels = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if line[:1] in "tpm")
  assert kernels["tf1"] != kernels["tf2"], kernels   # TensorFlow's own behaviour, fixed here
  assert kernels["plain"] == kernels["pipelined"] == kernels["multi_replica"], kernels


def test_use_cs_true_trains_evaluates_predicts_exports(tmp_path):
  est = CerebrasEstimator(model_fn, config=config_in(tmp_path), params=PARAMS)
  est.train(train_input_fn, max_steps=60, use_cs=True)
  for name in ("report.txt", "plan.json", "wafer.png", "timeline.json"):
    assert os.path.exists(os.path.join(est.compile_dir, name)), name
  with open(os.path.join(est.compile_dir, "plan.json")) as fh:
    plan = json.load(fh)
  # The default CSConfig is auto: the plan is the fastest that fits, and says so.
  assert plan["fits"] is True and plan["execution_strategy"] in ("pipelined", "multi_replica")
  assert any(n.startswith("auto: chose") for n in plan["notes"])
  assert plan["samples_per_sec"] > 0 and plan["batch_size"] == 16
  tags, images = set(), []
  for f in tf.io.gfile.glob(os.path.join(est.model_dir, "events.out.tfevents.*")):
    for event in tf.compat.v1.train.summary_iterator(f):
      for v in event.summary.value:
        tags.add((v.tag, v.WhichOneof("value")))
        if v.WhichOneof("value") == "image":
          images.append(v.image)
  assert ("cerebras/simulated_samples_per_sec", "simple_value") in tags
  assert ("cerebras/simulated_utilization", "simple_value") in tags
  assert ("cerebras/host_examples_per_sec", "simple_value") in tags
  assert ("cerebras/host_input_samples_per_sec", "simple_value") in tags
  assert ("cerebras/wafer_placement", "image") in tags
  # TensorBoard is told the picture's own size and colours (RGB: colorspace 3).
  with open(os.path.join(est.compile_dir, "wafer.png"), "rb") as fh:
    png = fh.read()
  decoded = tf.io.decode_png(png).shape
  assert [(i.height, i.width, i.colorspace) for i in images] == [tuple(decoded)], images
  with open(os.path.join(est.compile_dir, "report.txt")) as fh:
    assert re.search(r"^input: +this host's input_fn delivered [\d,]+ samples/s", fh.read(), re.M)
  metrics = est.evaluate(eval_input_fn, steps=8, use_cs=True)
  # 4 classes: chance loss is ln 4 = 1.386; a learned model is far below it.
  assert metrics["loss"] < 1.0 and metrics["accuracy"] > 0.6
  preds = list(est.predict(lambda params: eval_input_fn(params).map(lambda f, l: f).take(1),
                           use_cs=True))
  assert len(preds) == 16 and preds[0]["probabilities"].shape == (4,)
  def serving():
    x = tf.compat.v1.placeholder(tf.float32, [None, 32], name="x")
    return tf.estimator.export.ServingInputReceiver({"x": x}, {"x": x})
  export_dir = est.export_saved_model(str(tmp_path / "export"), serving)
  loaded = tf.saved_model.load(export_dir)
  out = loaded.signatures["serving_default"](x=tf.zeros([2, 32]))
  assert out["probabilities"].shape == (2, 4)


def test_no_config_at_all_trains_on_the_engine(tmp_path):
  """`CerebrasEstimator(model_fn, model_dir=...)`, the shortest call, failed at train with
  "'RunConfig' object has no attribute 'cs_config'": tf.estimator filled in a plain RunConfig.
  Now the default CSConfig (auto) plans it. Without a batch in params, a dataset batched
  without drop_remainder (no static batch dimension) compiles at its batch() argument, as
  tf.estimator trains it (it was refused: "cannot tell the batch size")."""
  est = CerebrasEstimator(model_fn, model_dir=str(tmp_path / "m"), params=PARAMS)
  assert isinstance(est.config, CSRunConfig) and est.config.model_dir == str(tmp_path / "m")
  est.train(train_input_fn, max_steps=3, use_cs=True)
  assert est.get_variable_value("global_step") == 3
  ragged = lambda: train_input_fn({**PARAMS, "batch_size": 16}).unbatch().batch(16)  # noqa: E731
  other = CerebrasEstimator(model_fn, model_dir=str(tmp_path / "n"))
  other.train(ragged, max_steps=1, use_cs=True)
  assert other.compile(ragged).plan.batch_size == 16


def test_auto_is_the_default():
  assert CSConfig().execution_strategy == "auto"
  assert CSRunConfig().cs_config.execution_strategy == "auto"


def test_our_lines_show_at_tensorflows_default_verbosity(tmp_path, caplog):
  """A user's own script leaves TensorFlow's logger at WARN: the compile summary, the engine
  time and the progress lines still show (they are why one calls train with use_cs=True);
  TensorFlow's own INFO stays hidden, and the logger is as it was afterwards.
  The eval total counts the rows the batches had: 40 examples at batch 16 are 3 batches and
  40 examples (it said 48, three full batches)."""
  logger = logging.getLogger("tensorflow")
  saved = logger.level
  logger.setLevel(logging.WARN)

  def forty_examples(params):
    x = np.random.default_rng(0).normal(size=(40, 32)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices(({"x": x}, np.arange(40) % 4)).batch(
        params["batch_size"])
  try:
    est = CerebrasEstimator(model_fn, config=config_in(tmp_path), params=PARAMS)
    est.train(train_input_fn, max_steps=12, use_cs=True)
    est.evaluate(eval_input_fn, steps=2, use_cs=True)
    est.evaluate(forty_examples, use_cs=True)
    assert logger.level == logging.WARN and not logger.filters
  finally:
    logger.setLevel(saved)
  infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
  assert any(m.startswith("cerebras_tf: compiled in") for m in infos), infos
  assert any(m.startswith("cerebras_tf: steps 0 -> 12 ") for m in infos), infos
  assert any(m.startswith("step 10/12  loss") for m in infos), infos
  assert any(m.startswith("eval done: 2 batch(es) (32 examples)") for m in infos), infos
  assert any(m.startswith("eval done: 3 batch(es) (40 examples)") for m in infos), infos
  assert not any("Saving checkpoints" in m or "Restoring parameters" in m for m in infos), infos


def test_constructor_use_cs_keyword_reaches_train(tmp_path):
  est = CerebrasEstimator(model_fn, config=config_in(tmp_path), params=PARAMS, use_cs=True)
  est.train(train_input_fn, max_steps=2)
  assert os.path.exists(os.path.join(est.compile_dir, "plan.json"))


def test_a_cs_ip_is_said_to_be_unused_once(tmp_path, caplog):
  """A config written for hardware names the system's address; it was validated and then
  silently ignored, so a user could believe a remote system trained the model."""
  est = CerebrasEstimator(model_fn, config=config_in(tmp_path, cs_ip="10.0.0.5",
                                                   stack_params={"ir_mode": "mlir"}),
                          params=PARAMS)
  with caplog.at_level(logging.WARNING, logger="tensorflow"):
    est.compile(train_input_fn)
    est.compile(train_input_fn)
  said = [r.getMessage() for r in caplog.records if "cs_ip" in r.getMessage()]
  assert said == ["cerebras_tf: cs_ip 10.0.0.5:9000; stack_params {'ir_mode': 'mlir'} kept but "
                  "not used: this build has no remote runtime or software stack to pass them "
                  "to; the embedded simulated engine compiles and TensorFlow trains on this "
                  "host"], said


def test_a_train_loop_prints_the_plan_once(tmp_path, caplog):
  """A notebook's `for ...: est.train(steps=50); est.evaluate()` printed the 5-line plan
  summary on every call; a cache hit with the same plan as the last compile is one line."""
  est = CerebrasEstimator(model_fn, config=config_in(tmp_path), params=PARAMS)
  with caplog.at_level(logging.INFO, logger="tensorflow"):
    for _ in range(3):
      est.train(train_input_fn, steps=2, use_cs=True)
  lines = [r.getMessage() for r in caplog.records if "cerebras_tf: comp" in r.getMessage()]
  assert len(lines) == 3 and " on cs2: fits, SRAM " in lines[0], lines
  assert all(re.fullmatch(r"cerebras_tf: compile cache hit in \d+\.\d\ds: the plan of this "
                          r"estimator's last compile \(\w+ on cs2, [\d,.]+ samples/s "
                          r"predicted\)", line) for line in lines[1:]), lines


def test_compile_cache_hit_is_fast(tmp_path):
  est = CerebrasEstimator(model_fn, config=config_in(tmp_path), params=PARAMS)
  first = est.compile(train_input_fn)
  assert not first.cached
  # A new estimator (as in a new process) hits the on-disk cache: it traces, no more.
  again = CerebrasEstimator(model_fn, config=config_in(tmp_path), params=PARAMS)
  t = time.perf_counter()
  second = again.compile(train_input_fn)
  assert second.cached and time.perf_counter() - t < 1.0
  assert second.performance.samples_per_sec == pytest.approx(first.performance.samples_per_sec)
  # Params that change the graph must miss.
  other = CerebrasEstimator(model_fn, config=config_in(tmp_path),
                            params=dict(PARAMS, hidden_sizes=[32]))
  assert not other.compile(train_input_fn).cached


def _bad_model_fn(kind):
  def fn(features, labels, mode, params):
    x = features["x"]
    if kind == "py_function":
      x = tf.py_function(lambda t: t * 2.0, [x], tf.float32)  # LINE-MARK py_function
      x.set_shape([None, 32])
    elif kind == "strings":  # on a layer's output: not input preprocessing the host can run
      x = tf.keras.layers.Dense(32)(x)
      x = x + tf.cast(tf.strings.length(tf.strings.as_string(x)), tf.float32)  # LINE-MARK strings
    elif kind == "dynamic":
      x = tf.reshape(tf.boolean_mask(x, x > 0), [-1, 1])  # LINE-MARK dynamic
    logits = tf.keras.layers.Dense(4)(x)
    loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(labels, logits, True))
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
        loss, tf.compat.v1.train.get_or_create_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
  return fn


@pytest.mark.parametrize("kind,op_type", [
    ("py_function", "EagerPyFunc"), ("strings", "AsString"), ("dynamic", "Where")])
def test_validate_only_names_unsupported_op_type_and_source_line(tmp_path, kind, op_type):
  est = CerebrasEstimator(_bad_model_fn(kind), config=config_in(tmp_path), params=PARAMS)
  with pytest.raises(UnsupportedOpError) as err:
    est.compile(train_input_fn, validate_only=True)
  msg = str(err.value)
  assert f"of type {op_type}" in msg
  line = line_of(__file__, f"LINE-MARK {kind}")
  assert f"test_estimator_train.py:{line}" in msg
  assert "\n" not in msg


def test_nan_loss_stops_with_step_and_hint(tmp_path):
  def nan_model_fn(features, labels, mode, params):
    w = tf.compat.v1.get_variable("w", [32, 4])
    step = tf.compat.v1.train.get_or_create_global_step()
    blowup = tf.where(step >= 3, np.nan, 1.0)
    loss = tf.reduce_mean(tf.matmul(features["x"], w)) * blowup
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss, step)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
  est = CerebrasEstimator(nan_model_fn, config=config_in(tmp_path), params=PARAMS)
  with pytest.raises(TrainingError, match=r"loss is nan at step 4: .*learning_rate"):
    est.train(train_input_fn, max_steps=10, use_cs=True)


def test_data_smaller_than_one_batch_is_an_error_not_a_run_of_zero_steps(tmp_path):
  """Five examples at batch 16 (a user's own text, shorter than one batch of windows): the
  run "finished" at step 0 with exit 0 and a hint to .repeat() a dataset that repeats; an
  evaluation on them reported loss 0 and accuracy 0."""
  def five_examples(params):
    x = np.zeros((5, 32), np.float32)
    return tf.data.Dataset.from_tensor_slices(({"x": x}, np.zeros(5, np.int32))).batch(
        params["batch_size"], drop_remainder=True)
  # (The check is in the progress hook every strategy runs; multi_replica in this process
  # would need its 2 CPUs before TensorFlow started.)
  est = CerebrasEstimator(model_fn, config=config_in(tmp_path, cs_config=CSConfig(
      execution_strategy="pipelined")), params=PARAMS)
  with pytest.raises(DataError, match=r"the input_fn gave no batch at all: its data is empty "
                                      r"or smaller than one batch of 16 examples"):
    est.train(five_examples, max_steps=5, use_cs=True)
  # Evaluated on it, tf.estimator reported loss 0 and accuracy 0.
  est.train(train_input_fn, max_steps=2, use_cs=True)
  with pytest.raises(DataError, match=r"the eval input_fn gave no batch at all"):
    est.evaluate(five_examples, use_cs=True)


def test_the_progress_line_shows_a_tiny_utilization_not_zero():
  """The MLP's progress line said "util 0.0%" (8.3e-8 of the wafer): read as broken. It is
  written as the report writes it, two significant digits below 0.1%. Its step is counted
  from the session's start: the global step read in the same run may be taken after that
  run's increment (multi_replica printed "step 2" twice, never "step 1"); a jump of more than
  one (other workers' steps) is followed."""
  from cerebras_tf.runtime.hooks import CSProgressHook  # pylint: disable=import-outside-toplevel
  lines = []
  with tf.Graph().as_default():
    tf.compat.v1.train.get_or_create_global_step()
    hook = CSProgressHook(tf.constant(0.5), 16, 15842.0, 8.3e-8, None, 10, every_n_steps=1,
                          log_fn=lines.append)
    hook.begin()
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      hook.after_create_session(session, None)
      for _ in range(2):
        hook.before_run(None)
        # The global step read in the run may come after its increment: still step 1, 2.
        hook.after_run(None, tf.compat.v1.train.SessionRunValues(
            results={"loss": 0.5, "step": len(lines) + 1}, options=None, run_metadata=None))
      hook.before_run(None)  # another worker has taken 5 steps meanwhile: follow the count
      hook.after_run(None, tf.compat.v1.train.SessionRunValues(
          results={"loss": 0.5, "step": 7}, options=None, run_metadata=None))
  assert [l.split("  ")[0] for l in lines] == ["step 1/10", "step 2/10", "step 8/10"], lines
  assert "engine (simulated) 15,842 samples/s  util 0.0000083%  ETA" in lines[1], lines


def test_max_steps_already_reached_says_so(tmp_path, caplog):
  """tf.estimator returns at once when the model_dir is at max_steps already, saying so only
  at INFO (the log file under scripts/run.py): a rerun with a smaller --max_steps looked like
  a run that trained."""
  est = CerebrasEstimator(model_fn, config=config_in(tmp_path), params=PARAMS)
  est.train(train_input_fn, max_steps=3, use_cs=True)
  caplog.clear()
  est.train(train_input_fn, max_steps=2, use_cs=True)
  assert est.get_variable_value("global_step") == 3
  assert "is at step 3 already, max_steps is 2: nothing to train" in caplog.text


def test_checkpoints_off_trains_and_says_the_weights_are_not_kept(tmp_path, caplog):
  """save_checkpoints_steps=None and save_checkpoints_secs=None is tf.estimator's "no
  checkpoints". The pipelined run crashed building its input-position saver ("Either
  every_secs or every_steps should be provided"); every mode trained weights that nothing
  could read back, without a word."""
  cfg = config_in(tmp_path, cs_config=CSConfig(execution_strategy="pipelined")).replace(
      save_checkpoints_steps=None, save_checkpoints_secs=None)
  CerebrasEstimator(model_fn, config=cfg, params=PARAMS).train(train_input_fn, max_steps=3,
                                                                use_cs=True)
  assert "checkpoints are off" in caplog.text and "not saved" in caplog.text
  assert tf.train.latest_checkpoint(cfg.model_dir) is None


def test_add_metrics_keeps_the_engine(tmp_path, caplog):
  """tf.estimator.add_metrics(est, fn) returns a plain tf.estimator.Estimator: train_and_evaluate
  on it trained without the engine, silently (and without params). est.add_metrics(fn) keeps a
  CerebrasEstimator with the same params and config; the plain one's training is named."""
  def metric_fn(labels, features):
    return {"label_mean": tf.compat.v1.metrics.mean(tf.cast(labels, tf.float32)),
            "x_mean": tf.compat.v1.metrics.mean(features["x"])}
  est = CerebrasEstimator(model_fn, config=config_in(tmp_path, cs_config=CSConfig(
      execution_strategy="pipelined")), params=PARAMS, use_cs=True)
  ours = est.add_metrics(metric_fn)
  assert isinstance(ours, CerebrasEstimator) and ours.params == est.params
  tf.estimator.train_and_evaluate(ours, tf.estimator.TrainSpec(train_input_fn, max_steps=2),
                                  tf.estimator.EvalSpec(eval_input_fn, steps=1, throttle_secs=0))
  assert os.path.exists(os.path.join(ours.compile_dir, "plan.json"))  # trained on the engine
  metrics = ours.evaluate(eval_input_fn, steps=1)
  assert {"label_mean", "x_mean", "accuracy"} <= set(metrics)
  assert "another estimator is training" not in caplog.text
  plain = tf.estimator.add_metrics(est, metric_fn)
  plain.train(lambda: train_input_fn(PARAMS), max_steps=4)
  assert "another estimator is training this CerebrasEstimator's model_fn" in caplog.text


def test_a_url_model_dir_is_refused_before_anything_is_written(tmp_path, monkeypatch):
  """model_dir="ram://m" (or gs://) trained, then reported step 0, and left a local directory
  named `ram:` with the compile reports in it."""
  monkeypatch.chdir(tmp_path)
  for kw, key in (({"model_dir": "ram://m"}, "model_dir"),
                  ({"model_dir": "m", "compile_dir": "gs://b/c"}, "compile_dir")):
    with pytest.raises(ConfigError, match=rf"^{key} \S+ is a filesystem URL; .* use a local "
                                          r"path"):
      CerebrasEstimator(model_fn, params=PARAMS, **kw)
  assert not os.path.exists(tmp_path / "ram:") and not os.path.exists(tmp_path / "gs:")


def test_an_input_fn_whose_argument_has_another_name_is_told_the_names(tmp_path):
  """`lambda p: ...`: tf.estimator passes params by name, so the call failed with Python's
  "missing 1 required positional argument: 'p'" from inside our wrapper."""
  est = CerebrasEstimator(model_fn, config=config_in(tmp_path), params=PARAMS)
  with pytest.raises(ConfigError, match=r"<lambda> \(.*test_estimator_train.py:\d+\) requires "
                                        r"argument\(s\) 'p', but tf.estimator passes arguments "
                                        r"by name, only config, input_context, mode, params: "
                                        r"rename 'p'"):
    est.train(lambda p: train_input_fn(p), max_steps=1, use_cs=True)  # pylint: disable=unnecessary-lambda
  assert not os.path.exists(os.path.join(est.model_dir, "checkpoint"))


def test_a_model_fn_without_params_trains_on_the_batch_params_carries(tmp_path):
  """params["batch_size"] is how the batch reaches the input_fn (the reserved key, as
  TPUEstimator's), so a model_fn(features, labels, mode) that needs no params is what users
  write; tf.estimator's check refused it ("does not include params argument, but params
  ({'batch_size': 32}) is passed to Estimator"): its batch could only be written into
  the input_fn."""
  def bare_model_fn(features, labels, mode):
    return model_fn(features, labels, mode, PARAMS)
  est = CerebrasEstimator(bare_model_fn, config=config_in(tmp_path), params={"batch_size": 8})
  est.train(lambda params: input_fn(dict(PARAMS, **params), "train"), max_steps=2, use_cs=True)
  assert est.get_variable_value("global_step") == 2
  assert est._last_compile.plan.batch_size == 8  # pylint: disable=protected-access
  # A misspelt argument is still refused as tf.estimator refuses it.
  with pytest.raises(ValueError, match=r"has following not expected args: \['param'\]"):
    CerebrasEstimator(lambda features, labels, mode, param: None, params={"batch_size": 8})


@pytest.mark.parametrize("value", [0, -4, 2.5, "8", True])
def test_a_batch_size_that_is_not_a_count_is_refused_when_the_estimator_is_made(value):
  """params={'batch_size': 0} was taken for no batch ("cannot tell the batch size ... name the
  global batch in params", which it did), -4 reached tf.data's "Dimension -4 must be >= 0",
  and 2.5 or True trained at batch 2 or 1."""
  with pytest.raises(ConfigError) as err:
    CerebrasEstimator(model_fn, params={"batch_size": value})
  assert str(err.value) == (f"params['batch_size'] must be an int > 0 (the global batch, split "
                            f"over the replicas), got {value!r}")
  with pytest.raises(ConfigError, match=r"^params\['eval_input'\]\['batch_size'\] must be"):
    CerebrasEstimator(model_fn, params={"train_input": {"batch_size": 8},
                                        "eval_input": {"batch_size": value}})
  assert CerebrasEstimator(model_fn, params={"batch_size": np.int64(8)}).params["batch_size"] == 8


def test_an_unbatched_dataset_is_named_as_such(tmp_path):
  """A hurried user forgets .batch(): x is [32] (input_dim) and the labels are scalars. That
  used to read "batches of 32 samples, but each replica must get 16"."""
  x = np.random.rand(64, PARAMS["input_dim"]).astype("float32")
  y = np.random.randint(0, PARAMS["num_classes"], 64).astype("int32")
  est = CerebrasEstimator(model_fn, config=config_in(tmp_path), params=PARAMS)
  unbatched = lambda params: tf.data.Dataset.from_tensor_slices(({"x": x}, y)).repeat()
  with pytest.raises(CompileError, match=r"the input_fn's elements are not batches "
                     r"\(features/x\[32\], labels\[\]\).*\.batch\(params\['batch_size'\]"):
    est.train(unbatched, max_steps=1, use_cs=True)
  # Labels batched by another number than the features: named with both shapes.
  odd = lambda params: tf.data.Dataset.zip((
      tf.data.Dataset.from_tensor_slices({"x": x}).batch(16, drop_remainder=True),
      tf.data.Dataset.from_tensor_slices(y).batch(8, drop_remainder=True)))
  with pytest.raises(CompileError, match=r"disagree on the batch dimension "
                     r"\(features/x\[16, 32\], labels\[8\]\)"):
    est.compile(odd)


def test_a_tpu_estimator_model_fn_trains_and_evaluates(tmp_path):
  """A model_fn written for TPUEstimator (google-research/bert's style) returns a
  TPUEstimatorSpec with scaffold_fn and eval_metrics=(metric_fn, tensors). The compile said
  "model_fn failed while being traced ...: model_fn should return an EstimatorSpec; check the
  batch size and the input shapes". It now runs as TPUEstimator runs it off-TPU; anything
  else a model_fn returns is named."""
  scaffolds = []

  def tpu_model_fn(features, labels, mode, params):
    logits = tf.compat.v1.layers.dense(features["x"], PARAMS["num_classes"])
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)

    def scaffold_fn():
      scaffolds.append(mode)
      return tf.compat.v1.train.Scaffold()
    if mode == tf.estimator.ModeKeys.TRAIN:
      step = tf.compat.v1.train.get_global_step()
      train_op = tf.compat.v1.train.AdamOptimizer(1e-2).minimize(loss, step)
      return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op,
                                                         scaffold_fn=scaffold_fn)
    metric_fn = lambda labels, logits: {"acc": tf.compat.v1.metrics.accuracy(
        labels, tf.argmax(logits, -1))}
    return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(
        mode, loss=loss, eval_metrics=(metric_fn, [labels, logits]))
  est = CerebrasEstimator(tpu_model_fn, config=config_in(tmp_path), params=PARAMS)
  est.train(train_input_fn, max_steps=2, use_cs=True)
  result = est.evaluate(eval_input_fn, steps=1, use_cs=True)
  assert result["global_step"] == 2 and 0 <= result["acc"] <= 1
  assert tf.estimator.ModeKeys.TRAIN in scaffolds

  def tuple_model_fn(features, labels, mode, params):
    loss = tf.reduce_mean(tf.compat.v1.layers.dense(features["x"], 1))
    return loss, tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
  est = CerebrasEstimator(tuple_model_fn, config=config_in(tmp_path / "b"), params=PARAMS)
  with pytest.raises(ModelFnError, match=(
      r"^model_fn \(tests/test_estimator_train.py:\d+\) returned tuple, not a "
      r"tf.estimator.EstimatorSpec: return tf.estimator.EstimatorSpec\(mode, loss=")):
    est.train(train_input_fn, max_steps=1, use_cs=True)


def test_train_and_evaluate_goes_on_the_engine_when_the_estimator_says_so(tmp_path, caplog):
  """tf.estimator.train_and_evaluate calls train() without use_cs: with a CSConfig chosen by
  hand, a user got the plain Estimator and no word about it. Now one warning says how to get
  the engine, and CerebrasEstimator(use_cs=True) gets it."""
  cs_config = CSConfig(execution_strategy="weight_streaming")
  train = tf.estimator.TrainSpec(train_input_fn, max_steps=2)
  evaluate = tf.estimator.EvalSpec(eval_input_fn, steps=1, throttle_secs=0)
  plain = CerebrasEstimator(model_fn, config=config_in(tmp_path / "a", cs_config=cs_config),
                            params=PARAMS)
  tf.estimator.train_and_evaluate(plain, train, evaluate)
  assert caplog.text.count("train without use_cs runs as a plain tf.estimator.Estimator, so "
                           "the CSConfig given (weight_streaming on cs2) is not used") == 1
  assert not os.path.exists(os.path.join(plain.model_dir, "cs_compile"))
  caplog.clear()
  on_engine = CerebrasEstimator(model_fn, config=config_in(tmp_path / "b", cs_config=cs_config),
                                params=PARAMS, use_cs=True)
  metrics, _ = tf.estimator.train_and_evaluate(on_engine, train, evaluate)
  assert metrics["global_step"] == 2 and "train without use_cs" not in caplog.text
  with open(os.path.join(on_engine.model_dir, "cs_compile", "plan.json")) as fh:
    assert json.load(fh)["execution_strategy"] == "weight_streaming"


def test_a_second_training_run_on_the_model_dir_is_refused(tmp_path):
  """Two notebooks (or a notebook and scripts/run.py) training one model_dir interleave their
  checkpoints. The lock was only in the CLI; the Python API now takes it too, in either
  use_cs, and a run holding it (here: this thread's own train_and_eval-style outer lock) may
  train inside it."""
  from cerebras_tf.runtime import dir_lock  # pylint: disable=import-outside-toplevel
  cfg = config_in(tmp_path)
  os.makedirs(cfg.model_dir)
  holder = subprocess.Popen(  # pylint: disable=consider-using-with
      [sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a+'); "
       "fcntl.flock(f, fcntl.LOCK_EX); f.write('pid 4242'); f.flush(); print('held', flush=True); "
       "time.sleep(60)", os.path.join(cfg.model_dir, dir_lock.LOCK_FILE)],
      stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == "held"
    est = CerebrasEstimator(model_fn, config=cfg, params=PARAMS)
    for use_cs in (True, False):
      with pytest.raises(ConfigError, match=r"model_dir .*model is in use by another training "
                                            r"run \(pid 4242\); wait for it to finish"):
        est.train(train_input_fn, max_steps=2, use_cs=use_cs)
    assert not os.path.exists(os.path.join(cfg.model_dir, "checkpoint"))
  finally:
    holder.kill()
    holder.wait()
  est = CerebrasEstimator(model_fn, config=cfg, params=PARAMS)
  with dir_lock.model_dir_lock(cfg.model_dir):
    est.train(train_input_fn, max_steps=2, use_cs=True)
    errors = []
    other = threading.Thread(target=lambda: errors.append(
        _raises(lambda: est.train(train_input_fn, max_steps=4, use_cs=False))))
    other.start()
    other.join()
    assert "in use by another training run (thread" in errors[0]
  est.train(train_input_fn, max_steps=4, use_cs=True)
  assert est.get_variable_value("global_step") == 4


def _raises(fn):
  try:
    fn()
  except ConfigError as e:
    return str(e)
  return "no error"


NOTEBOOK = '''
import sys
import tensorflow as tf
from cerebras_tf import CerebrasEstimator, CSConfig, CSRunConfig
from cerebras_models.mlp import model as mlp
params = {"batch_size": 16, "input_dim": 32, "num_classes": 4, "hidden_sizes": [16],
          "learning_rate": 1e-2, "num_examples": 256}
train = lambda params: mlp.input_fn(params, tf.estimator.ModeKeys.TRAIN)

def model_fn(features, labels, mode, params):
  # A model that reshapes by the batch: params['batch_size'] must be what the features have.
  x = tf.reshape(features["x"], [params["batch_size"], params["input_dim"]])
  return mlp.model_fn({"x": x}, labels, mode, params)

for step, (strategy, systems) in enumerate([("pipelined", 1), ("weight_streaming", 1),
                                            ("multi_replica", 1), ("weight_streaming", 2)]):
  est = CerebrasEstimator(model_fn, params=params, config=CSRunConfig(
      model_dir=sys.argv[1], cs_config=CSConfig(execution_strategy=strategy, num_csx=systems)))
  est.train(train, max_steps=2 * (step + 1), use_cs=True)
  print("trained", strategy, systems, est.get_variable_value("global_step"), flush=True)
print("evaluated", est.evaluate(lambda params: mlp.input_fn(params, "eval"), steps=1,
                                use_cs=True)["global_step"])
'''


@pytest.mark.slow
def test_one_process_trains_in_every_mode_in_turn(tmp_path):
  """A notebook: pipelined, then weight streaming, then multi_replica (2 host replicas), then
  weight streaming on 2 systems, in one process. TensorFlow fixes a process's devices when its
  runtime starts, so the first (one-device) run used to leave one CPU device and the third
  and fourth runs failed with "TensorFlow already started with 1"; the weight-streaming client
  then refused 2 systems as "a cluster of another shape". The model_fn reshapes by
  params['batch_size']: it got the global batch beside per-replica features and failed."""
  script = tmp_path / "notebook.py"
  script.write_text(NOTEBOOK)
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  env.pop("TF_CONFIG", None)
  proc = warm_python.run([sys.executable, str(script), str(tmp_path / "m")], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.split("\n")[:4] == [
      "trained pipelined 1 2", "trained weight_streaming 1 4", "trained multi_replica 1 6",
      "trained weight_streaming 2 8"], proc.stdout
  assert "evaluated 8" in proc.stdout


def test_a_model_dir_that_cannot_be_a_directory_is_one_line(tmp_path):
  (tmp_path / "afile").write_text("a regular file\n")
  est = CerebrasEstimator(model_fn, config=CSRunConfig(model_dir=str(tmp_path / "afile" / "m")),
                          params=PARAMS)
  with pytest.raises(ConfigError, match=r"model_dir .*afile/m cannot be created \(Not a "
                                        r"directory\); choose a writable model_dir"):
    est.train(train_input_fn, max_steps=1, use_cs=True)


class _SessionConfigs(tf.compat.v1.train.SessionRunHook):
  """The ConfigProto each session a call creates was made with."""

  def __init__(self):
    self.seen = []

  def after_create_session(self, session, coord):
    del coord
    self.seen.append(session._config)  # pylint: disable=protected-access


@pytest.mark.parametrize("use_cs", [True, False])
def test_sessions_skip_tfs_tfg_round_trip_and_keep_the_users_settings(tmp_path, use_cs):
  """Each session's first run spent 0.7 s of a short BERT-tiny run in TensorFlow's MLIR round
  trip (runtime/strategies.quick_session_config); the user's thread count stays, and so does
  est.config as they gave it."""
  user = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1)
  est = CerebrasEstimator(model_fn, config=config_in(tmp_path, session_config=user),
                          params=PARAMS)
  train, evaluate = _SessionConfigs(), _SessionConfigs()
  est.train(train_input_fn, max_steps=2, hooks=[train], use_cs=use_cs)
  est.evaluate(eval_input_fn, steps=1, hooks=[evaluate], use_cs=use_cs)
  for seen in (train.seen, evaluate.seen):
    assert len(seen) == 1
    assert seen[0].graph_options.rewrite_options.disable_tfg_optimizer
    assert seen[0].intra_op_parallelism_threads == 1
  assert not est.config.session_config.graph_options.rewrite_options.disable_tfg_optimizer
  assert not user.graph_options.rewrite_options.disable_tfg_optimizer


def test_the_compiles_looks_at_the_input_skip_tfs_tfg_round_trip_too(tmp_path, monkeypatch):
  """The compile opens sessions of its own on the input (the files it reads, how fast the
  host delivers it): they ran TFG over the pipeline and each tf.data function, about 200 ms
  of a short BERT-tiny run (capture.probe_session), and so does the one that asks whether an
  evaluation's dataset ends (input_fns.endless). Every session a use_cs=True train and
  evaluate start skips it; the oneDNN probe, once a process, runs before."""
  from cerebras_tf.runtime import onednn  # pylint: disable=import-outside-toplevel
  onednn.active()  # its probe runs once a process; not the compile's
  rows = tmp_path / "rows.txt"  # a file, so that the compile looks for the files it reads
  rows.write_text("".join(f"{i % 7} {i % 4}\n" for i in range(64)))

  def files_input_fn(params):
    def parse(line):
      values = tf.strings.to_number(tf.strings.split(line), tf.float32)
      x, y = values[0], values[1]
      return {"x": tf.fill([PARAMS["input_dim"]], x)}, tf.cast(y, tf.int32)
    return tf.data.TextLineDataset(str(rows)).map(parse).repeat().batch(
        params["batch_size"], drop_remainder=True)

  made = []
  real_init = tf.compat.v1.Session.__init__

  def recording_init(self, target="", graph=None, config=None):
    made.append(config)
    real_init(self, target, graph, config)

  monkeypatch.setattr(tf.compat.v1.Session, "__init__", recording_init)
  est = CerebrasEstimator(model_fn, config=config_in(tmp_path), params=PARAMS)
  est.train(files_input_fn, max_steps=2, use_cs=True)
  # the compile's two looks at the input (the file names it reads, the input's rate), then
  # training's
  assert len(made) == 3, made
  # steps=None: a session asks whether the dataset ends, then evaluation's own
  est.evaluate(lambda params: files_input_fn(params).take(1), use_cs=True)
  assert len(made) == 5, made
  assert all(c is not None and c.graph_options.rewrite_options.disable_tfg_optimizer
             for c in made), made
