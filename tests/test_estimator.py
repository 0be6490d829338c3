"""CerebrasEstimator: plain-Estimator compatibility, use_cs=True compile + train, validation."""

import glob
import json
import logging
import os
import re
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from cerebras_tf import CerebrasEstimator, CSConfig, CSRunConfig
from cerebras_tf.errors import (CompileError, ConfigError, DataError, FitError, ModelFnError,
                                TrainingError, UnsupportedOpError)
from cerebras_tf.core import plans
from cerebras_tf.runtime import strategies
from cerebras_models.mlp.model import input_fn, model_fn
from source_marks import line_of

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PARAMS = {"batch_size": 16, "input_dim": 32, "num_classes": 4, "hidden_sizes": [64, 64],
          "learning_rate": 1e-2, "num_examples": 512}


def _config(tmp_path, **kw):
  return CSRunConfig(model_dir=str(tmp_path / "model"), tf_random_seed=7,
                     save_checkpoints_steps=20, log_step_count_steps=10, **kw)


def _train_input(params):
  return input_fn(params, tf.estimator.ModeKeys.TRAIN)


def _eval_input(params):
  return input_fn(params, tf.estimator.ModeKeys.EVAL)


def test_is_an_estimator_subclass():
  assert issubclass(CerebrasEstimator, tf.estimator.Estimator)


def test_use_cs_false_is_the_plain_estimator(tmp_path):
  """Same seed, same steps: identical eval loss to tf.estimator.Estimator, and no compile."""
  plain = tf.estimator.Estimator(model_fn, config=tf.estimator.RunConfig(
      model_dir=str(tmp_path / "plain"), tf_random_seed=7), params=PARAMS)
  plain.train(_train_input, max_steps=30)
  ours = CerebrasEstimator(model_fn, config=_config(tmp_path), params=PARAMS)
  ours.train(_train_input, max_steps=30, use_cs=False)
  a = plain.evaluate(_eval_input, steps=4)
  b = ours.evaluate(_eval_input, steps=4, use_cs=False)
  assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
  assert not os.path.exists(ours.compile_dir)


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
  proc = subprocess.run([sys.executable, str(script), str(tmp_path)], cwd=ROOT, timeout=600,
                        capture_output=True, text=True, env=dict(os.environ,
                                                                 TF_CPP_MIN_LOG_LEVEL="3"))
  assert proc.returncode == 0, proc.stderr[-3000:]
  kernels = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if line[:1] in "tpm")
  assert kernels["tf1"] != kernels["tf2"], kernels   # TensorFlow's own behaviour, fixed here
  assert kernels["plain"] == kernels["pipelined"] == kernels["multi_replica"], kernels


def test_use_cs_true_trains_evaluates_predicts_exports(tmp_path):
  est = CerebrasEstimator(model_fn, config=_config(tmp_path), params=PARAMS)
  est.train(_train_input, max_steps=60, use_cs=True)
  for name in ("report.txt", "plan.json", "wafer.png", "timeline.json"):
    assert os.path.exists(os.path.join(est.compile_dir, name)), name
  with open(os.path.join(est.compile_dir, "plan.json")) as fh:
    plan = json.load(fh)
  # The default CSConfig is auto: the plan is the fastest that fits, and says so.
  assert plan["fits"] is True and plan["execution_strategy"] in ("pipelined", "multi_replica")
  assert any(n.startswith("auto: chose") for n in plan["notes"])
  assert plan["samples_per_sec"] > 0 and plan["batch_size"] == 16
  tags = set()
  for f in tf.io.gfile.glob(os.path.join(est.model_dir, "events.out.tfevents.*")):
    for event in tf.compat.v1.train.summary_iterator(f):
      for v in event.summary.value:
        tags.add((v.tag, v.WhichOneof("value")))
  assert ("cerebras/simulated_samples_per_sec", "simple_value") in tags
  assert ("cerebras/simulated_utilization", "simple_value") in tags
  assert ("cerebras/host_examples_per_sec", "simple_value") in tags
  assert ("cerebras/host_input_samples_per_sec", "simple_value") in tags
  assert ("cerebras/wafer_placement", "image") in tags
  with open(os.path.join(est.compile_dir, "report.txt")) as fh:
    assert re.search(r"^input: +this host's input_fn delivered [\d,]+ samples/s", fh.read(), re.M)
  metrics = est.evaluate(_eval_input, steps=8, use_cs=True)
  # 4 classes: chance loss is ln 4 = 1.386; a learned model is far below it.
  assert metrics["loss"] < 1.0 and metrics["accuracy"] > 0.6
  preds = list(est.predict(lambda params: _eval_input(params).map(lambda f, l: f).take(1),
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
  est.train(_train_input, max_steps=3, use_cs=True)
  assert est.get_variable_value("global_step") == 3
  ragged = lambda: _train_input({**PARAMS, "batch_size": 16}).unbatch().batch(16)  # noqa: E731
  other = CerebrasEstimator(model_fn, model_dir=str(tmp_path / "n"))
  other.train(ragged, max_steps=1, use_cs=True)
  assert other.compile(ragged).plan.batch_size == 16


def test_auto_is_the_default():
  assert CSConfig().execution_strategy == "auto"
  assert CSRunConfig().cs_config.execution_strategy == "auto"


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
  est = CerebrasEstimator(model_fn, config=_config(tmp_path), params=params)
  est.train(_train_input, max_steps=2, use_cs=True)
  plan = est.compile(_train_input).plan
  assert plan.execution_strategy == "multi_replica" and plan.num_replicas > 2
  assert plan.reason.startswith(f"multi_replica (R={plan.num_replicas}) ")
  assert plan.batching.host_replicas == 1 and plan.batching.per_host_replica == 256
  assert asked[0] == 2 and est._current_step() == 2
  logged = caplog.text
  assert f"R={plan.num_replicas} replicas on the engine (chosen by auto); the host trains them " \
         f"as 1 replica(s) of 256 samples" in logged
  assert "TensorFlow already started with 1 CPU device(s); if auto picks a data-parallel " \
         "mode the host trains on the devices it has" in logged
  assert "for 2 host replicas, run in a fresh process" in logged
  caplog.clear()
  explicit = CerebrasEstimator(model_fn, config=_config(
      tmp_path / "mr", cs_config=CSConfig(execution_strategy="multi_replica")), params=params)
  explicit.train(_train_input, max_steps=2, use_cs=True)
  assert explicit.compile(_train_input).plan.batching.host_replicas == 1
  assert "the multi_replica plan is data-parallel: the host trains on the devices it has" \
      in caplog.text
  forced = CerebrasEstimator(model_fn, config=_config(tmp_path / "mr2", cs_config=CSConfig(
      execution_strategy="multi_replica", num_replicas=2)), params=params)
  with pytest.raises(ConfigError, match="needs 2 CPU devices"):
    forced.train(_train_input, max_steps=2, use_cs=True)


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
    est = CerebrasEstimator(model_fn, config=_config(tmp_path), params=PARAMS)
    est.train(_train_input, max_steps=12, use_cs=True)
    est.evaluate(_eval_input, steps=2, use_cs=True)
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
  est = CerebrasEstimator(model_fn, config=_config(tmp_path), params=PARAMS, use_cs=True)
  est.train(_train_input, max_steps=2)
  assert os.path.exists(os.path.join(est.compile_dir, "plan.json"))


def test_a_cs_ip_is_said_to_be_unused_once(tmp_path, caplog):
  """A config written for hardware names the system's address; it was validated and then
  silently ignored, so a user could believe a remote system trained the model."""
  est = CerebrasEstimator(model_fn, config=_config(tmp_path, cs_ip="10.0.0.5",
                                                   stack_params={"ir_mode": "mlir"}),
                          params=PARAMS)
  with caplog.at_level(logging.WARNING, logger="tensorflow"):
    est.compile(_train_input)
    est.compile(_train_input)
  said = [r.getMessage() for r in caplog.records if "cs_ip" in r.getMessage()]
  assert said == ["cerebras_tf: cs_ip 10.0.0.5:9000; stack_params {'ir_mode': 'mlir'} kept but "
                  "not used: this build has no remote runtime or software stack to pass them "
                  "to; the embedded simulated engine compiles and TensorFlow trains on this "
                  "host"], said


def test_a_train_loop_prints_the_plan_once(tmp_path, caplog):
  """A notebook's `for ...: est.train(steps=50); est.evaluate()` printed the 5-line plan
  summary on every call; a cache hit with the same plan as the last compile is one line."""
  est = CerebrasEstimator(model_fn, config=_config(tmp_path), params=PARAMS)
  with caplog.at_level(logging.INFO, logger="tensorflow"):
    for _ in range(3):
      est.train(_train_input, steps=2, use_cs=True)
  lines = [r.getMessage() for r in caplog.records if "cerebras_tf: comp" in r.getMessage()]
  assert len(lines) == 3 and " on cs2: fits, SRAM " in lines[0], lines
  assert all(re.fullmatch(r"cerebras_tf: compile cache hit in \d+\.\d\ds: the plan of this "
                          r"estimator's last compile \(\w+ on cs2, [\d,.]+ samples/s "
                          r"predicted\)", line) for line in lines[1:]), lines


def test_compile_cache_hit_is_fast(tmp_path):
  est = CerebrasEstimator(model_fn, config=_config(tmp_path), params=PARAMS)
  first = est.compile(_train_input)
  assert not first.cached
  # A new estimator (as in a new process) hits the on-disk cache: it traces, no more.
  again = CerebrasEstimator(model_fn, config=_config(tmp_path), params=PARAMS)
  t = time.perf_counter()
  second = again.compile(_train_input)
  assert second.cached and time.perf_counter() - t < 1.0
  assert second.performance.samples_per_sec == pytest.approx(first.performance.samples_per_sec)
  # Params that change the graph must miss.
  other = CerebrasEstimator(model_fn, config=_config(tmp_path), params=dict(PARAMS, hidden_sizes=[32]))
  assert not other.compile(_train_input).cached


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
  est = CerebrasEstimator(_bad_model_fn(kind), config=_config(tmp_path), params=PARAMS)
  with pytest.raises(UnsupportedOpError) as err:
    est.compile(_train_input, validate_only=True)
  msg = str(err.value)
  assert f"of type {op_type}" in msg
  line = line_of(__file__, f"LINE-MARK {kind}")
  assert f"test_estimator.py:{line}" in msg
  assert "\n" not in msg


def test_nan_loss_stops_with_step_and_hint(tmp_path):
  def nan_model_fn(features, labels, mode, params):
    w = tf.compat.v1.get_variable("w", [32, 4])
    step = tf.compat.v1.train.get_or_create_global_step()
    blowup = tf.where(step >= 3, np.nan, 1.0)
    loss = tf.reduce_mean(tf.matmul(features["x"], w)) * blowup
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss, step)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
  est = CerebrasEstimator(nan_model_fn, config=_config(tmp_path), params=PARAMS)
  with pytest.raises(TrainingError, match=r"loss is nan at step 4: .*learning_rate"):
    est.train(_train_input, max_steps=10, use_cs=True)


def test_an_input_fn_that_returns_tensors_trains_and_resumes(tmp_path, caplog):
  """Estimator input_fns may return (features, labels) tensors instead of a Dataset. The
  pipelined run checkpoints the input position, and TF's hook for it failed on such an
  input_fn with "No variables to save" (no iterator); it now stands down and says so."""
  def tensors(params):
    x = tf.random.uniform([params["batch_size"], PARAMS["input_dim"]], seed=1)
    return {"x": x}, tf.cast(x[:, 0] * PARAMS["num_classes"], tf.int32)
  caplog.set_level(logging.INFO, logger="tensorflow")
  cfg = _config(tmp_path, cs_config=CSConfig(execution_strategy="pipelined"))
  est = CerebrasEstimator(model_fn, config=cfg, params=PARAMS)
  est.train(tensors, max_steps=3, use_cs=True)
  assert est.get_variable_value("global_step") == 3
  assert "its position is not checkpointed" in caplog.text
  est = CerebrasEstimator(model_fn, config=cfg, params=PARAMS)
  est.train(tensors, max_steps=5, use_cs=True)  # resumes at 3
  assert est.get_variable_value("global_step") == 5
  assert not os.path.exists(os.path.join(cfg.model_dir, "checkpoint_input"))


def _records_input_fn(params):
  """The MLP's (x, label) from the TFRecord file params['data'], shuffled and repeated."""
  spec = {"x": tf.io.FixedLenFeature([32], tf.float32), "y": tf.io.FixedLenFeature([], tf.int64)}
  ds = tf.data.TFRecordDataset(params["data"]).shuffle(64, seed=1).repeat()
  ds = ds.map(lambda r: tf.io.parse_single_example(r, spec))
  return ds.map(lambda e: ({"x": e["x"]}, tf.cast(e["y"], tf.int32))).batch(
      params["batch_size"], drop_remainder=True)


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
  est = CerebrasEstimator(model_fn, config=_config(tmp_path, cs_config=CSConfig(
      execution_strategy="pipelined")), params=PARAMS)
  with pytest.raises(DataError, match=r"the input_fn gave no batch at all: its data is empty "
                                      r"or smaller than one batch of 16 examples"):
    est.train(five_examples, max_steps=5, use_cs=True)
  # Evaluated on it, tf.estimator reported loss 0 and accuracy 0.
  est.train(_train_input, max_steps=2, use_cs=True)
  with pytest.raises(DataError, match=r"the eval input_fn gave no batch at all"):
    est.evaluate(five_examples, use_cs=True)


def test_other_data_under_the_same_shapes_starts_the_input_afresh(tmp_path, caplog):
  """Training on a.tfrecord, then on b.tfrecord on the same model_dir (the same shapes): the
  saved position of a's pipeline (its shuffle buffer, its file offset) was restored into b's,
  silently. The input's files are now part of what the position is saved for; the same file
  again keeps it."""
  rng = np.random.default_rng(0)
  for name in ("a", "b"):
    with tf.io.TFRecordWriter(str(tmp_path / f"{name}.tfrecord")) as w:
      for _ in range(200):
        w.write(tf.train.Example(features=tf.train.Features(feature={
            "x": tf.train.Feature(float_list=tf.train.FloatList(value=rng.normal(size=32))),
            "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[rng.integers(4)]))}))
                .SerializeToString())
  caplog.set_level(logging.WARNING, logger="tensorflow")

  def train(name, steps):
    caplog.clear()
    est = CerebrasEstimator(model_fn, config=_config(tmp_path),
                            params={**PARAMS, "data": str(tmp_path / f"{name}.tfrecord")})
    est.train(_records_input_fn, steps=steps, use_cs=True)
    return [r.getMessage() for r in caplog.records if "since its position" in r.getMessage()]

  assert train("a", 20) == []
  said = train("b", 20)
  changed = re.match(
      r"cerebras_tf: the input reads other data files since its position was saved \(1 "
      r"file\(s\) (\w{12}) -> 1 file\(s\) (\w{12})\); the input starts from its beginning",
      said[0]) if len(said) == 1 else None
  assert changed and changed.group(1) != changed.group(2), said
  assert train("b", 20) == []  # the same data: its position resumes
  with open(tmp_path / "model" / "checkpoint_input.signature", encoding="utf-8") as fh:
    assert fh.read().endswith(f"; data: 1 file(s) {changed.group(2)}")


def test_time_based_checkpoints_save_the_input_position_at_the_same_steps(tmp_path):
  """With save_checkpoints_secs, TF's input-position hook ran its own timer: the model was
  saved at 0, 1371, 2932, the input at 0, 1426, 2999, and a run killed before its last save
  resumed from step 0, the only step with both. The position is now written by the model's
  saver, at each of its steps."""
  from cerebras_tf.runtime import ckpt_files  # pylint: disable=import-outside-toplevel
  cfg = CSRunConfig(model_dir=str(tmp_path / "model"), save_checkpoints_secs=1,
                    save_checkpoints_steps=None, keep_checkpoint_max=0, log_step_count_steps=1000,
                    cs_config=CSConfig(execution_strategy="pipelined"))
  est = CerebrasEstimator(model_fn, config=cfg, params={**PARAMS, "hidden_sizes": [256, 256]})

  class Slow(tf.compat.v1.train.SessionRunHook):
    def after_run(self, run_context, run_values):
      time.sleep(0.01)  # 400 steps: 4 s or more, at least three timed saves in one call
  est.train(_train_input, max_steps=400, hooks=[Slow()], use_cs=True)
  model = [ckpt_files.step_of(p) for p in ckpt_files.list_checkpoints(cfg.model_dir)]
  inputs = [ckpt_files.step_of(p) for p in ckpt_files.list_checkpoints(
      cfg.model_dir, ckpt_files.INPUT_PREFIX)]
  assert model == inputs and len(model) >= 3, (model, inputs)
  # A kill before the last save: the run resumes from the save before it, not from step 0.
  assert ckpt_files.paired_step(model[:-1], inputs[:-1]) == model[-2] > 0


def test_evaluation_shows_progress_then_its_total():
  """A long evaluation was silent until its metrics (tf.estimator's "Evaluation [n/N]" is INFO,
  hidden by default, and absent without `steps`). Hand-checked with a fake clock: batches of
  32, one every 2 s, a line at most every 10 s."""
  from cerebras_tf.runtime.hooks import BatchProgressHook  # pylint: disable=import-outside-toplevel
  now, lines = [0.0], []
  hook = BatchProgressHook(32, total_batches=20, every_s=10.0, log_fn=lines.append,
                          clock=lambda: now[0])
  hook.begin()
  for _ in range(20):
    now[0] += 2.0
    hook.after_run(None, None)
  hook.end(None)
  # First line at batch 6 (10 s after batch 1): 5 batches x 32 / 10 s = 16 examples/s;
  # 14 batches left at 0.5 batch/s = 28 s. Then batches 11 and 16, then the total.
  assert lines[0] == "eval batch 6/20 (192 examples)  16.0 examples/s  ETA 0:00:28"
  assert len(lines) == 4 and lines[-1] == "eval done: 20 batch(es) (640 examples) in 40.0 s"
  unknown = []
  hook = BatchProgressHook(None, None, what="predict", every_s=0.0, log_fn=unknown.append,
                           clock=lambda: now[0])
  hook.begin()
  for _ in range(3):
    now[0] += 4.0
    hook.after_run(None, None)
  assert unknown == ["predict batch 2  0.25 batches/s", "predict batch 3  0.25 batches/s"]


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
  est = CerebrasEstimator(model_fn, config=_config(tmp_path), params=PARAMS)
  est.train(_train_input, max_steps=3, use_cs=True)
  caplog.clear()
  est.train(_train_input, max_steps=2, use_cs=True)
  assert est.get_variable_value("global_step") == 3
  assert "is at step 3 already, max_steps is 2: nothing to train" in caplog.text


def test_a_dataset_that_runs_out_says_so_and_the_next_call_takes_another_pass(tmp_path,
                                                                              caplog):
  """A dataset without .repeat(): 96 examples are 6 batches of 16. tf.estimator stops at the
  end of the input, silently. The pipelined run also saved the input's position there, so
  every later train call restored an exhausted iterator and trained nothing (global step
  stayed 6). Now the stop is one warning with the step, and the next call takes another
  pass, as the plain Estimator's would: 6 more steps."""
  def finite(params):
    x = np.random.RandomState(0).randn(96, PARAMS["input_dim"]).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    return tf.data.Dataset.from_tensor_slices(({"x": x}, y)).batch(params["batch_size"])
  cfg = _config(tmp_path, cs_config=CSConfig(execution_strategy="pipelined"))
  est = CerebrasEstimator(model_fn, config=cfg, params=PARAMS)
  est.train(finite, max_steps=30, use_cs=True)
  assert est.get_variable_value("global_step") == 6
  assert "the input_fn's data ran out at step 6 of 30: training stopped there" in caplog.text
  caplog.clear()
  est.train(finite, max_steps=30, use_cs=True)
  assert est.get_variable_value("global_step") == 12
  assert "ran out at step 12 of 30" in caplog.text
  caplog.clear()
  est.train(finite, max_steps=12, use_cs=True)  # at max_steps already: nothing to say
  assert "ran out" not in caplog.text


def test_evaluating_on_a_repeating_dataset_without_steps_is_refused_not_endless(tmp_path,
                                                                               caplog):
  """The training input_fn reused for eval: `.repeat()` and steps=None read batch after batch
  (8.8 M examples in 90 s in the trial, never ending), in every mode and with use_cs=False
  too. Now refused with the input_fn named; steps=N, or a dataset that ends, evaluates.
  predict on one is a generator without end (list() of it never returns): a warning, since
  taking a few is fine."""
  cfg = _config(tmp_path, cs_config=CSConfig(execution_strategy="pipelined"))
  est = CerebrasEstimator(model_fn, config=cfg, params=PARAMS)
  est.train(_train_input, max_steps=5, use_cs=True)
  for use_cs in (True, False):
    with pytest.raises(ConfigError, match=r"the dataset of _train_input \(tests/test_estimator.py:\d+\) "
                       r"repeats forever \(.repeat\(\)\) and steps is None"):
      est.evaluate(_train_input, use_cs=use_cs)
  assert est.evaluate(_train_input, steps=3, use_cs=True)["global_step"] == 5
  assert est.evaluate(_eval_input, use_cs=True)["global_step"] == 5
  with caplog.at_level(logging.WARNING):
    predictions = est.predict(lambda params: _train_input(params).map(lambda f, y: f),
                              use_cs=True)
    assert len([p for _, p in zip(range(600), predictions)]) == 600  # past its 512 rows
    predictions.close()  # leaves its graph (a suspended generator keeps it the default)
  assert "predict: the dataset of <lambda> (tests/test_estimator.py:" in caplog.text
  assert "repeats forever (.repeat()), so the predictions never end" in caplog.text
  filtered = lambda params: _train_input(params).filter(lambda f, y: True)  # noqa: E731
  assert tf.data.experimental.cardinality(filtered(PARAMS)) == tf.data.UNKNOWN_CARDINALITY
  # Unknown is not endless: a filter over a finite dataset ends. Steps bound this one.
  assert est.evaluate(filtered, steps=2, use_cs=True)["global_step"] == 5


def test_a_train_op_that_never_advances_the_global_step_is_refused_not_endless(tmp_path):
  """minimize(loss) without global_step: tf.estimator trains forever, since max_steps is never
  reached (the trial printed "step 1/20" for a minute, in every mode). Refused before the
  session starts; with no step limit (the input's end stops it) it trains as tf.estimator
  would (and, as there, its step-0 checkpoint is not saved again)."""
  def model_fn(features, labels, mode, params):
    logits = tf.compat.v1.layers.dense(features["x"], params["num_classes"])
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    step = tf.compat.v1.train.AdamOptimizer(1e-2).minimize(loss)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=step)
  est = CerebrasEstimator(model_fn, config=_config(
      tmp_path, cs_config=CSConfig(execution_strategy="pipelined")), params=PARAMS)
  for use_cs in (True, False):
    with pytest.raises(ModelFnError, match=r"its train_op does not advance the global step, so "
                       r"steps/max_steps is never reached"):
      est.train(_train_input, max_steps=5, use_cs=use_cs)
  finite = lambda params: _train_input(params).take(3)  # noqa: E731
  est.train(finite, use_cs=False)  # returns at the input's end
  assert est.get_variable_value("global_step") == 0


@pytest.mark.parametrize("layer", ["v1", "keras"])
def test_batch_norm_updates_left_out_of_the_train_op_are_named(tmp_path, caplog, layer):
  """The classic TF1 slip: batch normalization's update ops not in the train_op. Its moving
  statistics stay at their initial values (moving_mean 0.0 after 30 steps on inputs near 3.5,
  in every mode), and eval and predict read them; tf.estimator says nothing. Now a warning
  names them; wired in (UPDATE_OPS, or the Keras layer's .updates), they move and nothing is
  said."""
  def input_fn(params):
    x = np.random.RandomState(0).rand(64, 4, 4, 1).astype("float32") + 3.0
    return tf.data.Dataset.from_tensor_slices(({"img": x}, np.zeros(64, np.int32))).repeat() \
        .batch(params["batch_size"], drop_remainder=True)

  def model_fn(features, labels, mode, params):
    h = tf.compat.v1.layers.conv2d(features["img"], 4, 3, padding="same")
    if layer == "v1":
      h = tf.compat.v1.layers.batch_normalization(h, training=True, name="bn")
      updates = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
    else:
      bn = tf.keras.layers.BatchNormalization(name="bn")
      h = bn(h, training=True)
      updates = bn.updates
    logits = tf.compat.v1.layers.dense(tf.compat.v1.layers.flatten(h), 2)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    with tf.control_dependencies(updates if params["wired"] else []):
      step = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
          loss, tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=step)

  for wired in (False, True):
    caplog.clear()
    est = CerebrasEstimator(model_fn, params={"batch_size": 16, "wired": wired}, config=_config(
        tmp_path / str(wired), cs_config=CSConfig(execution_strategy="pipelined")))
    est.train(input_fn, max_steps=5, use_cs=True)
    moved = float(np.abs(est.get_variable_value("bn/moving_mean")).sum())
    said = "bn/moving_mean (and 1 more) is written by ops the train_op does not run" in caplog.text
    assert (moved > 0, said) == (wired, not wired), (moved, caplog.text[-2000:])


def test_a_generator_dataset_trains_on_and_never_rolls_the_model_back(tmp_path, caplog):
  """Dataset.from_generator cannot save its position past step 0: the pipelined run crashed at
  its first checkpoint (UnimplementedError from SerializeIterator) with the model saved and
  the input not, and the next call paired them at step 0: "resuming both from step 0", every
  step lost. Now the run trains on and says its input restarts on resume; no rollback."""
  def gen_input(params):
    def gen():
      r = np.random.RandomState(0)
      while True:
        x = r.randn(PARAMS["input_dim"]).astype("float32")
        yield {"x": x}, np.int32(x[0] > 0)
    spec = ({"x": tf.TensorSpec([PARAMS["input_dim"]], tf.float32)},
            tf.TensorSpec([], tf.int32))
    return tf.data.Dataset.from_generator(gen, output_signature=spec).batch(params["batch_size"])
  cfg = _config(tmp_path, cs_config=CSConfig(execution_strategy="pipelined"))
  est = CerebrasEstimator(model_fn, config=cfg.replace(save_checkpoints_steps=10), params=PARAMS)
  est.train(gen_input, max_steps=20, use_cs=True)
  assert est.get_variable_value("global_step") == 20
  assert "cannot save its position (GeneratorDataset does not support checkpointing.)" \
      in caplog.text
  caplog.clear()
  est.train(gen_input, max_steps=30, use_cs=True)
  assert est.get_variable_value("global_step") == 30
  assert "resuming both from step" not in caplog.text


def test_checkpoints_off_trains_and_says_the_weights_are_not_kept(tmp_path, caplog):
  """save_checkpoints_steps=None and save_checkpoints_secs=None is tf.estimator's "no
  checkpoints". The pipelined run crashed building its input-position saver ("Either
  every_secs or every_steps should be provided"); every mode trained weights that nothing
  could read back, without a word."""
  cfg = _config(tmp_path, cs_config=CSConfig(execution_strategy="pipelined")).replace(
      save_checkpoints_steps=None, save_checkpoints_secs=None)
  CerebrasEstimator(model_fn, config=cfg, params=PARAMS).train(_train_input, max_steps=3,
                                                                use_cs=True)
  assert "checkpoints are off" in caplog.text and "not saved" in caplog.text
  assert tf.train.latest_checkpoint(cfg.model_dir) is None


def test_a_model_this_machine_cannot_hold_is_refused_before_training(tmp_path, monkeypatch):
  """A 4-G-parameter embedding fit the engine in weight streaming, then its weight server
  segfaulted allocating 65 GB of float32 weights and Adam state on a 23 GB host, four times,
  minutes later; a 2048x2048 CNN at batch 16 ended in an allocator dump and a segfault. By
  hand for this MLP: 32x64+64 + 64x64+64 + 64x4+4 = 6,532 parameters, each with its weight,
  gradient and two Adam slots in float32: 6,532 x 16 B = 104,512 B; the gradient reads the
  input (16x32), both ReLU outputs (16x64) and the loss's backprop (16x4), in float32:
  (512 + 1,024 + 1,024 + 64) x 4 B = 10,496 B; 115,008 B in all."""
  from cerebras_tf.runtime import host_memory  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(host_memory, "available_bytes", lambda: 50_000)
  est = CerebrasEstimator(model_fn, config=_config(tmp_path), params=PARAMS)
  with pytest.raises(FitError, match=r"needs about 115.01 KB of memory \(TensorFlow runs the "
                                     r"numerics here: 104.51 KB for 6,532 float32 parameters "
                                     r"with their gradients and adam state; 10.50 KB at least "
                                     r"for the activations the gradient reads, 16 samples a "
                                     r"step\), and 50.00 KB is available; .* to train here, "
                                     r"make the model smaller$"):
    est.train(_train_input, max_steps=1, use_cs=True)
  monkeypatch.setattr(host_memory, "available_bytes", lambda: 110_000)  # the state alone fits
  with pytest.raises(FitError, match=r"needs about 115.01 KB .* to train here, lower "
                                     r"train_input.batch_size \(params\['batch_size'\]\), or "
                                     r"the input size$"):
    est.train(_train_input, max_steps=1, use_cs=True)
  assert tf.train.latest_checkpoint(est.model_dir) is None


def test_the_host_memory_check_leaves_remote_weight_servers_alone(monkeypatch):
  """With a TF_CONFIG cluster's own weight servers (ps tasks on other hosts) the weights and
  optimizer state live there: a 1 TB model is not refused for this host's memory. Without
  them (the local weight servers run here) it is."""
  from types import SimpleNamespace  # pylint: disable=import-outside-toplevel
  from cerebras_tf import estimator as estimator_lib  # pylint: disable=import-outside-toplevel
  from cerebras_tf.runtime import host_memory  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(host_memory, "available_bytes", lambda: 10**9)
  result = SimpleNamespace(
      graph=SimpleNamespace(state_bytes=10**12, num_params=6 * 10**10, optimizer="adam",
                            host_activation_bytes=1000.0),
      plan=SimpleNamespace(execution_strategy="weight_streaming",
                           mode=plans.mode_of(plans.WEIGHT_STREAMING),
                           batching=SimpleNamespace(host_replicas_per_worker=1, per_worker=8)))
  monkeypatch.setenv("TF_CONFIG", json.dumps({
      "cluster": {"chief": ["h0:1"], "ps": ["h1:1", "h2:1"]},
      "task": {"type": "chief", "index": 0}}))
  estimator_lib._raise_unless_host_holds(result)  # pylint: disable=protected-access
  monkeypatch.delenv("TF_CONFIG")
  with pytest.raises(FitError, match=r"needs about 1000.00 GB of memory"):
    estimator_lib._raise_unless_host_holds(result)  # pylint: disable=protected-access


def test_available_memory_reads_meminfo_and_a_cgroup_limit(tmp_path):
  from cerebras_tf.runtime import host_memory  # pylint: disable=import-outside-toplevel
  meminfo = tmp_path / "meminfo"
  meminfo.write_text("MemTotal:       24000000 kB\nMemAvailable:    2000000 kB\n")
  cgroup = tmp_path / "cg"
  cgroup.mkdir()
  assert host_memory.available_bytes(str(meminfo), str(cgroup)) == 2_048_000_000
  (cgroup / "memory.max").write_text("1000000000\n")
  (cgroup / "memory.current").write_text("400000000\n")
  assert host_memory.available_bytes(str(meminfo), str(cgroup)) == 600_000_000
  (cgroup / "memory.max").write_text("max\n")  # no limit
  assert host_memory.available_bytes(str(meminfo), str(cgroup)) == 2_048_000_000
  assert host_memory.available_bytes(str(tmp_path / "none"), str(cgroup)) is None


def test_available_memory_reads_the_cgroup_and_rlimits_the_process_runs_under(tmp_path):
  """Issue 40: under `ulimit -v` 4.1 GiB a 4.3 GB model passed the check (it read the
  machine's memory) and died in a 167-line ResourceExhaustedError. A v1 memory cgroup nested
  two levels deep (the parent's limit binds), and RLIMIT_AS less the VmSize already mapped."""
  import resource  # pylint: disable=import-outside-toplevel
  from cerebras_tf.runtime import host_memory  # pylint: disable=import-outside-toplevel
  meminfo = tmp_path / "meminfo"
  meminfo.write_text("MemAvailable:   20000000 kB\n")  # 20.48 GB
  proc_cgroup = tmp_path / "cgroup"
  proc_cgroup.write_text("4:memory:/job/step\n0::/\n")
  v1 = tmp_path / "fs" / "memory"
  (v1 / "job" / "step").mkdir(parents=True)
  (v1 / "job" / "step" / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # none
  (v1 / "job" / "step" / "memory.usage_in_bytes").write_text("100\n")
  (v1 / "job" / "memory.limit_in_bytes").write_text("5000000000\n")
  (v1 / "job" / "memory.usage_in_bytes").write_text("1000000000\n")
  status = tmp_path / "status"
  status.write_text("VmSize:\t 1000000 kB\nVmData:\t  500000 kB\n")

  def unlimited(which):
    del which
    return resource.RLIM_INFINITY, resource.RLIM_INFINITY

  def ulimit_v(which):  # ulimit -v 4300000 (KiB)
    return ((4_300_000 * 1024, 4_300_000 * 1024) if which == resource.RLIMIT_AS
            else unlimited(which))
  read = lambda rlimits: host_memory.available_bytes(
      str(meminfo), str(tmp_path / "fs"), str(proc_cgroup), str(status), rlimits)
  assert read(unlimited) == 4_000_000_000              # the parent cgroup: 5 GB - 1 GB used
  assert read(ulimit_v) == (4_300_000 - 1_000_000) * 1024  # 3.38 GB: the limit less VmSize


def test_a_real_ulimit_v_is_read(tmp_path):
  """The same in a process really started under `ulimit -v` 4 GiB (a subshell)."""
  code = ("from cerebras_tf.runtime import host_memory; "
          "print(host_memory.available_bytes())")
  out = subprocess.run(["bash", "-c", f"ulimit -v {4 * 1024 * 1024}; exec {sys.executable} "
                        f"-c '{code}'"], capture_output=True, text=True, check=True,
                       env=dict(os.environ, PYTHONPATH=ROOT), cwd=str(tmp_path)).stdout
  assert 0 < int(out) < 4 * 1024 ** 3


def test_evaluate_and_predict_take_the_newest_when_training_deletes_theirs(tmp_path, caplog,
                                                                          monkeypatch):
  """`--mode eval` in a second terminal while training saves every few seconds (keep 2): the
  checkpoint picked was deleted before it was restored, and eval failed with "file not found
  ... run prepare_data.py" or a ValueError traceback. The deletion is staged here: the first
  pick is a checkpoint whose files are removed before it is read."""
  cfg = _config(tmp_path, cs_config=CSConfig(execution_strategy="pipelined")).replace(
      save_checkpoints_steps=2, keep_checkpoint_max=0)
  est = CerebrasEstimator(model_fn, config=cfg, params=PARAMS)
  est.train(_train_input, max_steps=4, use_cs=True)
  real = est._checkpoint_for  # pylint: disable=protected-access
  picks = []

  def stale_first(what, checkpoint_path):
    picks.append(what)
    if len(picks) == 1:
      old = os.path.join(cfg.model_dir, "model.ckpt-2")
      for f in glob.glob(old + ".*"):
        os.remove(f)  # the training run's keep_checkpoint_max, mid-read
      return old
    return real(what, checkpoint_path)
  monkeypatch.setattr(est, "_checkpoint_for", stale_first)
  assert est.evaluate(_eval_input, steps=1, use_cs=True)["global_step"] == 4
  assert "model.ckpt-2 was deleted while being read" in caplog.text and len(picks) == 2
  picks.clear()
  (tmp_path / "model" / "model.ckpt-2.index").write_text("")  # picked again, then "deleted"
  assert len(list(est.predict(_eval_input, use_cs=True))) > 0
  assert est.last_predict_checkpoint.endswith("model.ckpt-4") and len(picks) == 2
  # A checkpoint the caller names is not swapped for another.
  with pytest.raises((tf.errors.NotFoundError, ValueError)):
    est.evaluate(_eval_input, steps=1,
                 checkpoint_path=os.path.join(cfg.model_dir, "model.ckpt-2"))


def test_numpy_input_fn_trains_and_multi_replica_asks_for_a_dataset(tmp_path):
  """tf.compat.v1.estimator.inputs.numpy_input_fn (queues, tensors) trains pipelined; in
  multi_replica tf.distribute raised "input_fn must return a tf.data.Dataset or a callable"."""
  x = np.random.RandomState(0).randn(64, PARAMS["input_dim"]).astype("float32")
  y = (x[:, 0] > 0).astype("int32")
  numpy_fn = tf.compat.v1.estimator.inputs.numpy_input_fn(
      x={"x": x}, y=y, batch_size=PARAMS["batch_size"], num_epochs=None, shuffle=False)
  est = CerebrasEstimator(model_fn, config=_config(tmp_path, cs_config=CSConfig(
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
  proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "mr")], cwd=ROOT,
                        capture_output=True, text=True, timeout=300, check=False)
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
  proc = subprocess.run([sys.executable, str(path), str(tmp)], cwd=ROOT, capture_output=True,
                        text=True, timeout=600, check=False)
  return path, text, proc.stdout + "\n--- stderr ---\n" + proc.stderr[-3000:]


def _trial_lines(replica_trials, name):
  return [l.split(" ", 1)[1] for l in replica_trials[2].splitlines()
          if l.startswith(name + " ")]


def _line_of(replica_trials, mark):
  lines = replica_trials[1].splitlines()
  return lines.index(next(l for l in lines if mark in l)) + 1


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
  from cerebras_tf import estimator as estimator_lib  # pylint: disable=import-outside-toplevel
  from cerebras_tf.compiler import compile as compile_lib  # pylint: disable=import-outside-toplevel
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
    estimator_lib._say_batch_norm_statistics(g.batch_norm_layers, plan)  # pylint: disable=protected-access
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


def _saver_model_fn(saver_first):
  def model_fn(features, labels, mode, params):
    logits = tf.compat.v1.layers.dense(features["x"], params["num_classes"])
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    saver = tf.compat.v1.train.Saver(max_to_keep=1) if saver_first else None
    step = tf.compat.v1.train.AdamOptimizer(1e-2).minimize(
        loss, tf.compat.v1.train.get_global_step())
    scaffold = tf.compat.v1.train.Scaffold(saver=saver or tf.compat.v1.train.Saver(max_to_keep=1))
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=step, scaffold=scaffold)
  return model_fn


def test_a_scaffold_saver_made_before_minimize_is_refused_before_training(tmp_path):
  """A Saver saves the variables that exist when it is made: one made before minimize() wrote
  checkpoints without Adam's state (5 of the 15 variables in the trial), and the next train
  call was refused as "the optimizer or its settings changed" after the first had trained.
  Now refused before anything trains, with the names; made after minimize, it trains and
  resumes (max_to_keep=1 leaves one checkpoint)."""
  cfg = _config(tmp_path, cs_config=CSConfig(execution_strategy="pipelined"))
  est = CerebrasEstimator(_saver_model_fn(saver_first=True), config=cfg, params=PARAMS)
  # By hand: it saves dense/kernel, dense/bias and global_step; Adam adds two slots for each
  # of the 2 weights and beta1_power, beta2_power: 9 in all, 6 left out.
  with pytest.raises(ConfigError, match=r"the Saver in its scaffold saves 3 of the 9 variables "
                     r"\(not 'beta1_power' and 5 more\), so a checkpoint it writes cannot resume"):
    est.train(_train_input, max_steps=5, use_cs=True)
  assert tf.train.latest_checkpoint(cfg.model_dir) is None
  est = CerebrasEstimator(_saver_model_fn(saver_first=False), config=cfg, params=PARAMS)
  est.train(_train_input, max_steps=20, use_cs=True)
  est.train(_train_input, max_steps=30, use_cs=True)
  assert tf.train.get_checkpoint_state(cfg.model_dir).all_model_checkpoint_paths == [
      os.path.join(cfg.model_dir, "model.ckpt-30")]


def test_add_metrics_keeps_the_engine(tmp_path, caplog):
  """tf.estimator.add_metrics(est, fn) returns a plain tf.estimator.Estimator: train_and_evaluate
  on it trained without the engine, silently (and without params). est.add_metrics(fn) keeps a
  CerebrasEstimator with the same params and config; the plain one's training is named."""
  def metric_fn(labels, features):
    return {"label_mean": tf.compat.v1.metrics.mean(tf.cast(labels, tf.float32)),
            "x_mean": tf.compat.v1.metrics.mean(features["x"])}
  est = CerebrasEstimator(model_fn, config=_config(tmp_path, cs_config=CSConfig(
      execution_strategy="pipelined")), params=PARAMS, use_cs=True)
  ours = est.add_metrics(metric_fn)
  assert isinstance(ours, CerebrasEstimator) and ours.params == est.params
  tf.estimator.train_and_evaluate(ours, tf.estimator.TrainSpec(_train_input, max_steps=2),
                                  tf.estimator.EvalSpec(_eval_input, steps=1, throttle_secs=0))
  assert os.path.exists(os.path.join(ours.compile_dir, "plan.json"))  # trained on the engine
  metrics = ours.evaluate(_eval_input, steps=1)
  assert {"label_mean", "x_mean", "accuracy"} <= set(metrics)
  assert "another estimator is training" not in caplog.text
  plain = tf.estimator.add_metrics(est, metric_fn)
  plain.train(lambda: _train_input(PARAMS), max_steps=4)
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


@pytest.mark.parametrize("strategy", ["pipelined", "weight_streaming"])
def test_a_relative_model_dir_resumes(tmp_path, monkeypatch, strategy):
  """`model_dir="model"`, the way a notebook writes it. TF's checkpoint state joins its
  relative entries to the model_dir already; joining them again read `model/model/...`, so
  every second run on a relative model_dir stopped with "checkpoint is corrupt". In weight
  streaming the weight servers (run from another directory) failed the first save."""
  monkeypatch.chdir(tmp_path)
  cfg = CSRunConfig(model_dir="model", save_checkpoints_steps=2,
                    cs_config=CSConfig(execution_strategy=strategy))
  CerebrasEstimator(model_fn, config=cfg, params=PARAMS).train(_train_input, max_steps=2,
                                                               use_cs=True)
  est = CerebrasEstimator(model_fn, config=cfg, params=PARAMS)
  est.train(_train_input, max_steps=4, use_cs=True)
  assert est.get_variable_value("global_step") == 4
  assert sorted(os.listdir("model")).count("model.ckpt-4.index") == 1
  assert not glob.glob("model/*.corrupt")
  monkeypatch.setenv("HOME", str(tmp_path / "home"))  # `~` is the home, not a directory "~"
  est = CerebrasEstimator(model_fn, config=cfg.replace(model_dir="~/m"), params=PARAMS)
  assert est.model_dir == str(tmp_path / "home" / "m")


@pytest.mark.parametrize("how", ["init_checkpoint", "warm_start_from", "WarmStartSettings",
                                 "keras", "model_fn_init_from_checkpoint"])
def test_relative_warm_start_paths_reach_the_weight_servers(tmp_path, monkeypatch, how):
  """In weight streaming the weight servers run the restore ops, and ran in another
  directory: a relative init_checkpoint, warm_start_from, from_keras_model's own warm start
  under a relative model_dir, or a model_fn's own google-bert-style
  init_from_checkpoint("src", ...) failed the first step with "Failed to find any matching
  files for src/model.ckpt-2" from /job:ps. They now run in the client's directory (and do
  not import from it: a module there named like ours is not picked up)."""
  monkeypatch.chdir(tmp_path)
  (tmp_path / "cerebras_tf.py").write_text("raise SystemExit('the user directory shadowed us')\n")
  ws = CSRunConfig(model_dir="dst", cs_config=CSConfig(execution_strategy="weight_streaming"))
  if how == "keras":
    model = tf.keras.Sequential([tf.keras.layers.Dense(PARAMS["num_classes"],
                                                       input_shape=(PARAMS["input_dim"],))])
    model.compile(tf.keras.optimizers.legacy.SGD(0.1),
                  tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    est = CerebrasEstimator.from_keras_model(model, config=ws, params=PARAMS)
    est.train(lambda params: _train_input(params).map(lambda f, l: (f["x"], l)), max_steps=1,
              use_cs=True)
    assert est.get_variable_value("global_step") == 1
    return
  CerebrasEstimator(model_fn, config=CSRunConfig(model_dir="src"), params=PARAMS).train(
      _train_input, max_steps=2, use_cs=True)
  def own_init_model_fn(features, labels, mode, params):
    spec = model_fn(features, labels, mode, params)
    tf.compat.v1.train.init_from_checkpoint("src", {"dense_0/": "dense_0/"})
    return spec
  kwargs = {"init_checkpoint": {"init_checkpoint": "src"},
            "warm_start_from": {"warm_start_from": "src"},
            "WarmStartSettings": {"warm_start_from": tf.estimator.WarmStartSettings("src")},
            "model_fn_init_from_checkpoint": {}}[how]
  est = CerebrasEstimator(own_init_model_fn if how == "model_fn_init_from_checkpoint"
                          else model_fn, config=ws, params=PARAMS, **kwargs)
  est.train(_train_input, max_steps=1, use_cs=True)
  assert est.get_variable_value("global_step") == 1


def test_an_input_fn_whose_argument_has_another_name_is_told_the_names(tmp_path):
  """`lambda p: ...`: tf.estimator passes params by name, so the call failed with Python's
  "missing 1 required positional argument: 'p'" from inside our wrapper."""
  est = CerebrasEstimator(model_fn, config=_config(tmp_path), params=PARAMS)
  with pytest.raises(ConfigError, match=r"<lambda> \(.*test_estimator.py:\d+\) requires "
                                        r"argument\(s\) 'p', but tf.estimator passes arguments "
                                        r"by name, only config, input_context, mode, params: "
                                        r"rename 'p'"):
    est.train(lambda p: _train_input(p), max_steps=1, use_cs=True)  # pylint: disable=unnecessary-lambda
  assert not os.path.exists(os.path.join(est.model_dir, "checkpoint"))


def test_a_model_fn_without_params_trains_on_the_batch_params_carries(tmp_path):
  """params["batch_size"] is how the batch reaches the input_fn (the reserved key, as
  TPUEstimator's), so a model_fn(features, labels, mode) that needs no params is what users
  write; tf.estimator's check refused it ("does not include params argument, but params
  ({'batch_size': 32}) is passed to Estimator"): its batch could only be written into
  the input_fn."""
  def bare_model_fn(features, labels, mode):
    return model_fn(features, labels, mode, PARAMS)
  est = CerebrasEstimator(bare_model_fn, config=_config(tmp_path), params={"batch_size": 8})
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
  est = CerebrasEstimator(model_fn, config=_config(tmp_path), params=PARAMS)
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


def test_eval_and_predict_input_fns_get_their_batch_in_params(tmp_path):
  """params['batch_size'] holds the batch in every mode with use_cs=True: the per-replica
  training batch, eval_input's for evaluate and predict (a registered user model whose
  input_fn batched with it trained, then failed at eval with KeyError: 'batch_size')."""
  params = {**PARAMS, "eval_input": {"batch_size": 8}}
  seen = {}

  def input_fn_(params, mode):
    seen.setdefault(mode, params["batch_size"])
    return input_fn({k: v for k, v in params.items() if k != "eval_input"}, mode)
  est = CerebrasEstimator(model_fn, config=_config(tmp_path), params=params)
  est.train(lambda params: input_fn_(params, "train"), max_steps=2, use_cs=True)
  est.evaluate(lambda params: input_fn_(params, "eval"), steps=1, use_cs=True)
  next(iter(est.predict(lambda params: input_fn_(params, "infer"), use_cs=True)))
  assert seen == {"train": 16, "eval": 8, "infer": 8}


def test_a_model_fn_that_fails_in_predict_names_its_line(tmp_path):
  def needs_labels(features, labels, mode, params):
    logits = tf.compat.v1.layers.dense(features["x"], PARAMS["num_classes"])
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)  # LINE: loss
    step = tf.compat.v1.train.get_or_create_global_step()
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=tf.compat.v1.train
                                      .GradientDescentOptimizer(0.1).minimize(loss, step))
  _predict_fails_after_training(
      tmp_path, needs_labels, _train_input, PARAMS,
      rf"^tests/test_estimator.py:{line_of(__file__, 'LINE: loss')}: model_fn failed in "
      r"predict mode: ValueError: .*; in predict mode labels is None: build the loss only "
      r"for train and eval$")


def _predict_fails_after_training(tmp_path, model_fn_, train_input, params, pattern):
  """Trains one step, then predicts on the same input without labels: a ModelFnError."""
  est = CerebrasEstimator(model_fn_, config=_config(tmp_path), params=params)
  est.train(train_input, max_steps=1, use_cs=True)
  with pytest.raises(ModelFnError, match=pattern):
    next(iter(est.predict(lambda params: train_input(params).map(lambda f, l: f),
                          use_cs=True)))


def _bare_features_model_fn(features, labels, mode, params):
  """Features are one tensor, not a dict; in predict mode labels.shape fails if asked to."""
  logits = tf.compat.v1.layers.dense(features, PARAMS["num_classes"])
  if mode == tf.estimator.ModeKeys.PREDICT and params.get("touch_labels"):
    logits += tf.zeros([labels.shape[0], 1])  # LINE: labels
  if mode == tf.estimator.ModeKeys.PREDICT:
    return tf.estimator.EstimatorSpec(mode, predictions={"logits": logits})
  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
  step = tf.compat.v1.train.get_or_create_global_step()
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=tf.compat.v1.train
                                    .GradientDescentOptimizer(0.1).minimize(loss, step))


def _bare_features_input(params):
  return _train_input(params).map(lambda f, l: (f["x"], l))


def test_a_serving_receiver_that_wraps_a_bare_tensor_is_told_the_one_that_does_not(tmp_path):
  """A model_fn that takes one feature tensor, exported with ServingInputReceiver(x, ...):
  TF hands the model_fn {"feature": x}, and the error was the model_fn's dense layer failing
  to read a dict's shape, with a hint that labels are None in predict mode (unrelated)."""
  est = CerebrasEstimator(_bare_features_model_fn, config=_config(tmp_path), params=PARAMS)
  est.train(_bare_features_input, max_steps=1, use_cs=True)

  def wrapping():
    x = tf.compat.v1.placeholder(tf.float32, [None, PARAMS["input_dim"]])
    return tf.estimator.export.ServingInputReceiver(x, {"x": x})
  with pytest.raises(ModelFnError) as raised:
    est.export_saved_model(str(tmp_path / "export"), wrapping)
  message = str(raised.value)
  assert "features arrived as {'feature': tensor}" in message, message
  assert "TensorServingInputReceiver" in message and "labels is None" not in message

  def bare():
    x = tf.compat.v1.placeholder(tf.float32, [None, PARAMS["input_dim"]])
    return tf.estimator.export.TensorServingInputReceiver(x, {"x": x})
  assert os.path.isdir(est.export_saved_model(str(tmp_path / "export"), bare))


def test_a_model_fn_that_reads_labels_in_predict_is_named_not_a_traceback(tmp_path):
  """`labels.shape` in predict mode raised AttributeError, which was not caught: a traceback
  through tf.estimator instead of the model_fn's line."""
  _predict_fails_after_training(
      tmp_path, _bare_features_model_fn, _bare_features_input,
      {**PARAMS, "touch_labels": True},
      rf"^tests/test_estimator.py:{line_of(__file__, 'LINE: labels')}: model_fn failed "
      r"in predict mode: AttributeError: 'NoneType' object has no attribute 'shape'; in "
      r"predict mode labels is None")


def _scalar_prediction_model_fn(features, labels, mode, params):
  logits = tf.compat.v1.layers.dense(features, PARAMS["num_classes"])
  if mode == tf.estimator.ModeKeys.PREDICT:
    return tf.estimator.EstimatorSpec(mode, predictions={
        "logits": logits, "temperature": tf.constant(1.5)})
  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
  step = tf.compat.v1.train.get_or_create_global_step()
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=tf.compat.v1.train
                                    .GradientDescentOptimizer(0.1).minimize(loss, step))


def test_a_scalar_prediction_is_named_when_predict_yields_single_examples(tmp_path):
  """predict() splits each prediction along its batch dimension: a scalar one failed inside
  tf.estimator with "IndexError: tuple index out of range". Now the key is named; batched
  results (yield_single_examples=False) and predict_keys without it still work."""
  est = CerebrasEstimator(_scalar_prediction_model_fn, config=_config(tmp_path), params=PARAMS)
  est.train(_bare_features_input, max_steps=1, use_cs=True)
  features = lambda params: _bare_features_input(params).map(lambda f, l: f).take(2)
  with pytest.raises(ModelFnError, match=r"^model_fn \(tests/test_estimator.py:\d+\): "
                     r"predictions\['temperature'\] is a scalar, but predict yields one "
                     r"result per example"):
    next(iter(est.predict(features, use_cs=True)))
  batches = list(est.predict(features, use_cs=True, yield_single_examples=False))
  assert len(batches) == 2 and batches[0]["temperature"] == 1.5
  assert batches[0]["logits"].shape == (PARAMS["batch_size"], PARAMS["num_classes"])
  rows = list(est.predict(features, use_cs=True, predict_keys=["logits"]))
  assert len(rows) == 2 * PARAMS["batch_size"] and list(rows[0]) == ["logits"]


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
  est = CerebrasEstimator(tpu_model_fn, config=_config(tmp_path), params=PARAMS)
  est.train(_train_input, max_steps=2, use_cs=True)
  result = est.evaluate(_eval_input, steps=1, use_cs=True)
  assert result["global_step"] == 2 and 0 <= result["acc"] <= 1
  assert tf.estimator.ModeKeys.TRAIN in scaffolds

  def tuple_model_fn(features, labels, mode, params):
    loss = tf.reduce_mean(tf.compat.v1.layers.dense(features["x"], 1))
    return loss, tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
  est = CerebrasEstimator(tuple_model_fn, config=_config(tmp_path / "b"), params=PARAMS)
  with pytest.raises(ModelFnError, match=(
      r"^model_fn \(tests/test_estimator.py:\d+\) returned tuple, not a "
      r"tf.estimator.EstimatorSpec: return tf.estimator.EstimatorSpec\(mode, loss=")):
    est.train(_train_input, max_steps=1, use_cs=True)


def test_train_and_evaluate_goes_on_the_engine_when_the_estimator_says_so(tmp_path, caplog):
  """tf.estimator.train_and_evaluate calls train() without use_cs: with a CSConfig chosen by
  hand, a user got the plain Estimator and no word about it. Now one warning says how to get
  the engine, and CerebrasEstimator(use_cs=True) gets it."""
  cs_config = CSConfig(execution_strategy="weight_streaming")
  train = tf.estimator.TrainSpec(_train_input, max_steps=2)
  evaluate = tf.estimator.EvalSpec(_eval_input, steps=1, throttle_secs=0)
  plain = CerebrasEstimator(model_fn, config=_config(tmp_path / "a", cs_config=cs_config),
                            params=PARAMS)
  tf.estimator.train_and_evaluate(plain, train, evaluate)
  assert caplog.text.count("train without use_cs runs as a plain tf.estimator.Estimator, so "
                           "the CSConfig given (weight_streaming on cs2) is not used") == 1
  assert not os.path.exists(os.path.join(plain.model_dir, "cs_compile"))
  caplog.clear()
  on_engine = CerebrasEstimator(model_fn, config=_config(tmp_path / "b", cs_config=cs_config),
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
  cfg = _config(tmp_path)
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
        est.train(_train_input, max_steps=2, use_cs=use_cs)
    assert not os.path.exists(os.path.join(cfg.model_dir, "checkpoint"))
  finally:
    holder.kill()
    holder.wait()
  est = CerebrasEstimator(model_fn, config=cfg, params=PARAMS)
  with dir_lock.model_dir_lock(cfg.model_dir):
    est.train(_train_input, max_steps=2, use_cs=True)
    errors = []
    other = threading.Thread(target=lambda: errors.append(
        _raises(lambda: est.train(_train_input, max_steps=4, use_cs=False))))
    other.start()
    other.join()
    assert "in use by another training run (thread" in errors[0]
  est.train(_train_input, max_steps=4, use_cs=True)
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
  proc = subprocess.run([sys.executable, str(script), str(tmp_path / "m")], cwd=tmp_path, env=env,
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
    est.train(_train_input, max_steps=1, use_cs=True)


def test_a_users_own_train_distribute_gives_way_to_the_plan(tmp_path, caplog):
  """RunConfig(train_distribute=MirroredStrategy()) written for GPUs, then use_cs=True: the
  pipelined run kept the user's strategy, and checkpointing its input failed with
  "GeneratorDataset does not support checkpointing"."""
  cfg = tf.estimator.RunConfig(model_dir=str(tmp_path / "m"), save_checkpoints_steps=2,
                               train_distribute=tf.distribute.MirroredStrategy(["/cpu:0"]))
  est = CerebrasEstimator(model_fn, config=cfg, params=PARAMS)
  with caplog.at_level(logging.WARNING, logger="tensorflow"):
    est.train(_train_input, max_steps=3, use_cs=True)
  assert est.get_variable_value("global_step") == 3
  assert ("cerebras_tf: config.train_distribute (MirroredStrategy) is not used with "
          "use_cs=True") in caplog.text
