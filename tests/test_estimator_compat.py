"""CerebrasEstimator as a drop-in for tf.estimator.Estimator (issue 38): each test is one
behaviour that tensorflow/estimator's own tests showed differing
(benchmarks/bench_estimator_conformance.py runs those tests themselves)."""

import os
import sys

import numpy as np
import pytest
import tensorflow as tf

from cerebras_tf import CerebrasEstimator, CSConfig, CSRunConfig
from cerebras_tf import runner
from cerebras_tf.errors import ConfigError, ModelFnError, TrainingError
from conftest import ROOT
import warm_python

PIPELINED = CSConfig(execution_strategy="pipelined")


def _counting_model_fn(features, labels, mode):
  """No trainable variable: the train_op only advances the global step (tf.estimator's tests
  are full of these)."""
  del labels
  step = tf.compat.v1.train.get_global_step()
  return tf.estimator.EstimatorSpec(mode, loss=tf.constant(0.),
                                    train_op=tf.compat.v1.assign_add(step, 1),
                                    predictions={"x": features["x"]})


def _dense_model_fn(features, labels, mode):
  logits = tf.compat.v1.layers.dense(tf.reshape(features["x"], [-1, 1]), 2, name="d")
  if mode == tf.estimator.ModeKeys.PREDICT:
    return tf.estimator.EstimatorSpec(mode, predictions={"logits": logits})
  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
  train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
      loss, global_step=tf.compat.v1.train.get_global_step())
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def _xy_input():
  return tf.data.Dataset.from_tensors(({"x": tf.constant([1.0, 2.0])}, tf.constant([0, 1])))


# --- use_cs=False is tf.estimator.Estimator ------------------------------------------------

def test_constructor_refuses_as_tf_estimator():
  with pytest.raises(ValueError, match="an instance of `RunConfig`"):
    CerebrasEstimator(model_fn=None, config="NotARunConfig")
  with pytest.raises(ValueError, match="model_fn must be provided"):
    CerebrasEstimator(model_fn=None)
  # params given to a model_fn without a params argument: tf.estimator raises, it was accepted
  with pytest.raises(ValueError, match="does not include params"):
    CerebrasEstimator(model_fn=lambda features, labels: None, params={"a": 1})
  # ...except the batch alone, which the input_fn reads there (TPUEstimator's convention)
  CerebrasEstimator(model_fn=lambda features, labels: None, params={"batch_size": 8})


def test_no_false_params_warning(caplog):
  """Every model_fn without params got "includes params argument, but params are not passed"
  (tf.estimator's check saw the wrapper, which takes params)."""
  with caplog.at_level("WARNING", logger="tensorflow"):
    CerebrasEstimator(model_fn=lambda features, labels: None)
  assert "includes params argument" not in caplog.text


def test_no_false_params_warning_from_a_keras_model(caplog):
  # model_to_estimator's model_fn takes no params; ours takes them (from_keras_model(params=)).
  inputs = tf.keras.Input([2], name="x")
  model = tf.keras.Model(inputs, tf.keras.layers.Dense(1)(inputs))
  model.compile(optimizer="sgd", loss="mse")
  with caplog.at_level("WARNING", logger="tensorflow"):
    est = CerebrasEstimator.from_keras_model(model)
  assert "includes params argument" not in caplog.text
  assert est.params == {}  # as tf.estimator keeps params=None


def test_model_dir_and_run_config_subclass_kept_as_given():
  class MyConfig(tf.estimator.RunConfig):
    def mine(self):
      return "mine"

  est = CerebrasEstimator(lambda features, labels: None, model_dir="relative_dir",
                          config=MyConfig())
  assert est.model_dir == "relative_dir"
  assert est.eval_dir() == os.path.join("relative_dir", "eval")
  assert est.config.mine() == "mine"
  assert est.cs_config == CSConfig()  # a plain RunConfig: the default CSConfig


def test_run_config_refuses_as_run_config():
  with pytest.raises(ValueError, match="master"):
    CSRunConfig().replace(master="grpc://elsewhere:1")
  with pytest.raises(ValueError, match="tf_random_seed must be integer"):
    CSRunConfig(tf_random_seed=1.0)
  # the weight-streaming runtime's own session target (strategies.runtime_for)
  assert CSRunConfig().with_master("grpc://localhost:2").master == "grpc://localhost:2"


def test_labels_for_a_model_fn_without_labels_is_tf_estimators_value_error(tmp_path):
  def model_fn(features, mode):
    return _counting_model_fn(features, None, mode)
  est = CerebrasEstimator(model_fn, model_dir=str(tmp_path))
  with pytest.raises(ValueError, match="model_fn does not take labels, but input_fn returns"):
    est.train(_xy_input, steps=1)


def test_eval_and_predict_without_checkpoint_use_initializers(tmp_path):
  """tf.estimator evaluates and predicts the initialized model (with a warning); this was
  refused. The command line still refuses (runner.require_checkpoint)."""
  est = CerebrasEstimator(_counting_model_fn, model_dir=str(tmp_path / "m"))
  assert est.evaluate(_xy_input, steps=1)["global_step"] == 0
  assert next(est.predict(_xy_input))["x"] == 1.0
  with pytest.raises(ConfigError, match="eval: no checkpoint in model_dir"):
    runner.require_checkpoint("eval", {"model_dir": str(tmp_path / "m")}, None)
  runner.require_checkpoint("eval", {"model_dir": str(tmp_path / "m")}, "some/ckpt")


@pytest.mark.parametrize("raised", [KeyError, ValueError, TypeError, AttributeError])
def test_model_fn_errors_keep_their_kind(tmp_path, raised):
  """An error of the model_fn in eval arrived as ModelFnError only: `except KeyError` missed
  it. It is both now (the message still names the line)."""
  def model_fn(features, labels, mode):
    if mode == tf.estimator.ModeKeys.EVAL:
      raise raised("no such feature")
    return _counting_model_fn(features, labels, mode)
  est = CerebrasEstimator(model_fn, model_dir=str(tmp_path))
  est.train(_xy_input, steps=1)
  with pytest.raises(raised) as caught:
    est.evaluate(_xy_input, steps=1)
  assert isinstance(caught.value, ModelFnError)
  assert "model_fn failed in eval mode" in str(caught.value)


def test_not_an_estimator_spec_is_a_value_error(tmp_path):
  est = CerebrasEstimator(lambda features, labels: "spec", model_dir=str(tmp_path))
  with pytest.raises(ValueError, match="model_fn should return an EstimatorSpec"):
    est.train(_xy_input, steps=1)


def test_nan_loss_is_still_tf_estimators_error(tmp_path):
  def model_fn(features, labels, mode):
    del labels
    step = tf.compat.v1.train.get_global_step()
    return tf.estimator.EstimatorSpec(mode, loss=tf.constant(np.nan) + tf.reduce_sum(features["x"]),
                                      train_op=tf.compat.v1.assign_add(step, 1))
  est = CerebrasEstimator(model_fn, model_dir=str(tmp_path))
  with pytest.raises(tf.compat.v1.train.NanLossDuringTrainingError) as caught:
    est.train(_xy_input, steps=2)
  assert isinstance(caught.value, TrainingError) and "loss is NaN" in str(caught.value)


def test_train_op_without_global_step_warns_and_a_hook_stops_it(tmp_path, caplog):
  """It was refused up front even with a hook of the user's, which may stop it (tf.estimator
  trains until one does). Without one it is still refused: the run would never end."""
  def model_fn(features, labels, mode):
    del labels
    return tf.estimator.EstimatorSpec(mode, loss=tf.reduce_sum(features["x"]),
                                      train_op=tf.no_op())

  class StopAfter(tf.compat.v1.train.SessionRunHook):
    def __init__(self):
      self.runs = 0

    def after_run(self, run_context, run_values):
      self.runs += 1
      if self.runs == 3:
        run_context.request_stop()

  hook = StopAfter()
  est = CerebrasEstimator(model_fn, model_dir=str(tmp_path))
  with caplog.at_level("WARNING", logger="tensorflow"):
    est.train(lambda: _xy_input().repeat(), steps=5, hooks=[hook])
  assert hook.runs == 3
  assert "does not advance the global step" in caplog.text


def test_a_scaffold_saver_of_other_names_resumes(tmp_path):
  """A Saver mapping other checkpoint keys onto the variables: evaluate and resume were
  refused as "does not match this model"; tf.estimator reads it back."""
  def model_fn(features, labels, mode):
    spec = _dense_model_fn(features, labels, mode)
    names = {f"renamed/{v.op.name}": v for v in tf.compat.v1.global_variables()}
    return spec._replace(scaffold=tf.compat.v1.train.Scaffold(
        saver=tf.compat.v1.train.Saver(names)))
  est = CerebrasEstimator(model_fn, model_dir=str(tmp_path))
  est.train(_xy_input, steps=1)
  assert "renamed/global_step" in dict(tf.train.list_variables(est.latest_checkpoint()))
  est.train(_xy_input, steps=1)
  assert est.evaluate(_xy_input, steps=1)["global_step"] == 2


# --- use_cs=True never crashes on a model tf.estimator accepts -------------------------------

def _on_engine(tmp_path, model_fn, name="m"):
  return CerebrasEstimator(model_fn, model_dir=str(tmp_path / name),
                           config=CSRunConfig(cs_config=PIPELINED), use_cs=True)


def test_no_trainable_variables_is_a_trivial_plan(tmp_path):
  """ZeroDivisionError in the pipelined placer before."""
  est = _on_engine(tmp_path, _counting_model_fn)
  est.train(lambda: _xy_input().repeat(), steps=2)
  assert est.get_variable_value("global_step") == 2
  result = est.compile(lambda: _xy_input().repeat())
  assert result.plan.fits and result.plan.layers == () and result.plan.batch_size == 2
  assert os.path.exists(result.report_paths["report"])


@pytest.mark.parametrize("returned", [
    lambda: ({"x": tf.constant([1.0, 2.0])}, None),        # (features, None)
    lambda: [{"x": tf.constant([1.0, 2.0])}, tf.constant([0, 1])],  # a list
    lambda: ({"x": 4.0, "y": 5}, 1),                         # unbatched Python scalars
    lambda: ((tf.constant(1.0), {"x": tf.constant([1.0, 2.0])}), tf.constant([0])),  # nested
])
def test_input_shapes_tf_estimator_takes(tmp_path, returned):
  """'NoneType' / 'int' object has no attribute 'shape' before; unbatched input was refused:
  it compiles as one sample a step."""
  def model_fn(features, labels, mode):
    del labels
    x = tf.nest.flatten(features)[-1]
    step = tf.compat.v1.train.get_global_step()
    return tf.estimator.EstimatorSpec(mode, loss=tf.reduce_sum(tf.cast(x, tf.float32)),
                                      train_op=tf.compat.v1.assign_add(step, 1))
  est = _on_engine(tmp_path, model_fn)
  est.train(returned, steps=1)
  assert est.get_variable_value("global_step") == 1


def test_train_op_updating_only_non_trainables(tmp_path):
  """A model with a weight whose train_op takes no gradient (it only counts): was refused as
  "updates none of the model's trainable variables"."""
  def model_fn(features, labels, mode):
    del labels
    w = tf.compat.v1.get_variable("w", [1], initializer=tf.compat.v1.ones_initializer())
    step = tf.compat.v1.train.get_global_step()
    return tf.estimator.EstimatorSpec(mode, loss=tf.reduce_sum(features["x"] * w),
                                      train_op=tf.compat.v1.assign_add(step, 1))
  est = _on_engine(tmp_path, model_fn)
  est.train(_xy_input, steps=1)
  assert est.get_variable_value("w") == pytest.approx([1.0])


def test_batch_without_drop_remainder_trains_the_partial_batch(tmp_path):
  """10 examples in batches of 4 without drop_remainder: the engine compiles batch 4 (the
  batch() argument; no params['batch_size']), the host trains 4 + 4 + 2 as tf.estimator does:
  3 steps for one epoch."""
  def input_fn():
    x = tf.range(10, dtype=tf.float32)
    return tf.data.Dataset.from_tensor_slices(({"x": x}, tf.cast(x, tf.int32) % 2)).batch(4)
  est = _on_engine(tmp_path, _dense_model_fn)
  est.train(input_fn)
  assert est.get_variable_value("global_step") == 3
  assert est.compile(input_fn).plan.batch_size == 4


# --- the seed's example ----------------------------------------------------------------------

def test_cerebras_tf_is_a_namespace_portion():
  """`cerebras.tf.*` must not own `cerebras`: a real Cerebras install keeps its modules."""
  assert not os.path.exists(os.path.join(ROOT, "cerebras", "__init__.py"))
  assert not os.path.exists(os.path.join(ROOT, "cerebras", "tf", "__init__.py"))
  from cerebras.tf.cs_estimator import CerebrasEstimator as Seed  # pylint: disable=import-outside-toplevel
  from cerebras.tf.run_config import CSRunConfig as SeedConfig  # pylint: disable=import-outside-toplevel
  assert Seed is CerebrasEstimator and SeedConfig is CSRunConfig


@pytest.mark.slow
def test_seed_example_runs_as_printed_from_another_directory(tmp_path):
  env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
  env.update(PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
  proc = warm_python.run([sys.executable, os.path.join(ROOT, "tests", "seed_example.py")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "SEED OK 5" in proc.stdout
  assert os.path.exists(tmp_path / "out" / "model.ckpt-5.index")


def test_params_stay_as_given_when_they_name_no_batch(tmp_path):
  """The per-replica batch went into params['batch_size'] of every input_fn and model_fn call
  even when the batch came from the data: tf.estimator's tests comparing params failed."""
  seen = []

  def input_fn(params):
    seen.append(dict(params))
    return _xy_input()

  def model_fn(features, labels, mode, params):
    seen.append(dict(params))
    return _dense_model_fn(features, labels, mode)
  est = CerebrasEstimator(model_fn, model_dir=str(tmp_path), params={"units": 2},
                          config=CSRunConfig(cs_config=PIPELINED), use_cs=True)
  est.train(input_fn, steps=1)
  assert seen and all(p == {"units": 2} for p in seen), seen


def test_train_on_an_evaluator_is_tf_estimators_value_error(tmp_path):
  class EvaluatorConfig(CSRunConfig):
    @property
    def task_type(self):
      return "evaluator"
  est = CerebrasEstimator(_counting_model_fn, model_dir=str(tmp_path), config=EvaluatorConfig(),
                          use_cs=True)
  with pytest.raises(ValueError, match="train_and_evaluate"):
    est.train(_xy_input, steps=1)


def test_a_v1_dataset_batch_is_found(tmp_path):
  def input_fn():
    x = tf.range(10, dtype=tf.float32)
    return tf.compat.v1.data.Dataset.from_tensor_slices(
        ({"x": x}, tf.cast(x, tf.int32) % 2)).batch(4)
  assert _on_engine(tmp_path, _dense_model_fn).compile(input_fn).plan.batch_size == 4
