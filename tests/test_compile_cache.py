"""The compile cache never returns a plan for another graph or input (issue 12).

Each case was a silent wrong answer with the old key (the model_fn's source + params): the
input_fn and a Keras model built elsewhere were invisible to it. A new estimator on the same
compile_dir reads the on-disk cache, exactly as a second process does.
"""

import importlib.util
import os

import tensorflow as tf

from cerebras_tf import CerebrasEstimator, CSConfig, CSRunConfig
from cerebras_tf.compiler import compile as compile_lib

PARAMS = {"batch_size": 8}
# The input_fn lives in another file, as in a user's project (written per test, imported).
INPUT_MODULE = '''
import tensorflow as tf
SIDE = 28
def input_fn(params):
  n = params["batch_size"]
  x = tf.zeros([4 * n, SIDE, SIDE, 1])
  y = tf.zeros([4 * n], tf.int32)
  return tf.data.Dataset.from_tensor_slices(({"image": x}, y)).batch(n, drop_remainder=True)
'''
WIDTH = {"value": 32}  # the Keras model's width, changed between compiles like a user would


def _input_module(tmp_path):
  path = tmp_path / "user_inputs.py"
  path.write_text(INPUT_MODULE)
  spec = importlib.util.spec_from_file_location("user_inputs", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def image_model_fn(features, labels, mode, params):
  del params
  x = tf.reshape(features["image"], [tf.shape(features["image"])[0], -1])
  logits = tf.compat.v1.layers.dense(x, 10, name="out")
  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
  train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
      loss, tf.compat.v1.train.get_global_step())
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def keras_model_fn(features, labels, mode, params):
  del params
  model = tf.keras.Sequential([tf.keras.layers.Dense(WIDTH["value"], activation="relu"),
                               tf.keras.layers.Dense(10)])
  logits = model(tf.reshape(features["image"], [-1, 28 * 28]))
  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
  train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
      loss, tf.compat.v1.train.get_global_step())
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def _estimator(model_fn, tmp_path):
  config = CSRunConfig(model_dir=str(tmp_path / "model"), tf_random_seed=1,
                       cs_config=CSConfig(execution_strategy="pipelined"))
  return CerebrasEstimator(model_fn, config=config, params=PARAMS,
                           compile_dir=str(tmp_path / "compile"))


def test_input_fn_in_another_file_changing_its_shape_misses(tmp_path):
  inputs = _input_module(tmp_path)
  small = _estimator(image_model_fn, tmp_path).compile(inputs.input_fn)
  inputs.SIDE = 56
  big = _estimator(image_model_fn, tmp_path).compile(inputs.input_fn)
  assert not big.cached
  # 28*28*10 + 10 weights, then 56*56*10 + 10.
  assert (small.graph.num_params, big.graph.num_params) == (7850, 31370)
  inputs.SIDE = 28  # back: a hit, and it is the 28x28 plan
  again = _estimator(image_model_fn, tmp_path).compile(inputs.input_fn)
  assert again.cached and again.graph.num_params == 7850


def test_keras_model_width_changed_misses_and_report_follows(tmp_path):
  inputs = _input_module(tmp_path)
  WIDTH["value"] = 32
  narrow = _estimator(keras_model_fn, tmp_path).compile(inputs.input_fn)
  WIDTH["value"] = 1024
  wide = _estimator(keras_model_fn, tmp_path).compile(inputs.input_fn)
  assert not wide.cached
  # 784*32 + 32 + 32*10 + 10 = 25,450; 784*1024 + 1024 + 1024*10 + 10 = 814,090.
  assert (narrow.graph.num_params, wide.graph.num_params) == (25450, 814090)
  WIDTH["value"] = 32
  hit = _estimator(keras_model_fn, tmp_path).compile(inputs.input_fn)
  assert hit.cached and hit.graph.num_params == 25450
  # The reports at the compile_dir's top describe the plan just returned, not the last built.
  with open(os.path.join(tmp_path, "compile", "plan.json")) as fh:
    assert '"num_params": 25450' in fh.read()
  with open(hit.report_paths["report"]) as fh:
    text = fh.read()
  assert "25,450" in text or "25450" in text, text[:400]


def test_a_hit_is_cheaper_than_a_compile(tmp_path, monkeypatch):
  """A hit skips lowering's plan, the simulation and the reports (it still traces). Counted,
  not timed: since the wafer picture is cheap (issue 42), a small model's full compile takes
  about as long as its trace, and the two times crossed in the suite."""
  planned = []
  real = compile_lib.plan_and_report
  monkeypatch.setattr(compile_lib, "plan_and_report",
                      lambda *a, **k: planned.append(1) or real(*a, **k))
  inputs = _input_module(tmp_path)
  first = _estimator(image_model_fn, tmp_path).compile(inputs.input_fn)
  assert planned == [1]
  second = _estimator(image_model_fn, tmp_path).compile(inputs.input_fn)
  assert not first.cached and second.cached
  assert planned == [1]  # the hit planned nothing
  assert os.path.exists(second.report_paths["wafer"])  # and the reports are back in place
