"""Feature columns as Estimator users wrote them: the lookups run on the host.

A wide & deep model_fn on raw string features (tf.compat.v1.feature_column: a vocabulary
list, a hash bucket, a bucketized number, a crossed column, embeddings, input_layer and
linear_model) and the canned DNNLinearCombinedClassifier train with use_cs=True with the
per-step losses of plain tf.estimator. The compiler finds the part of the graph that depends
only on the features and holds no variable (string lookups, hashing, bucketizing, crossing),
reports it as host preprocessing and leaves it out of the engine's layers; the embeddings and
dense layers are the engine's. The SavedModel takes the raw strings.
"""

import os

import numpy as np
import pytest
import tensorflow as tf

from cerebras_tf import CerebrasEstimator, CSConfig, CSRunConfig
from cerebras_tf.compiler import capture, lower
from event_losses import summary_losses

tf1 = tf.compat.v1
fc = tf1.feature_column
COLORS = ["red", "green", "blue", "black"]
CITIES = ["paris", "tokyo", "lima", "oslo", "rome"]
BATCH, STEPS = 8, 5


def _columns():
  color = fc.categorical_column_with_vocabulary_list("color", COLORS)
  city = fc.categorical_column_with_hash_bucket("city", 16)
  age = fc.numeric_column("age")
  wide = [color, fc.bucketized_column(age, [20.0, 30.0, 40.0, 50.0]),
          fc.crossed_column([color, "city"], 32)]
  deep = [fc.embedding_column(color, 4), fc.embedding_column(city, 4), age,
          fc.indicator_column(color)]
  return wide, deep


def wide_and_deep(features, labels, mode, params):
  del params
  wide, deep = _columns()
  h = fc.input_layer(features, deep)
  h = tf1.layers.dense(h, 8, tf.nn.relu, kernel_initializer=tf1.glorot_uniform_initializer(1))
  deep_logit = tf1.layers.dense(h, 1, kernel_initializer=tf1.glorot_uniform_initializer(2))
  logits = tf.squeeze(deep_logit + fc.linear_model(features, wide), -1)
  probs = tf.sigmoid(logits)
  if mode == tf.estimator.ModeKeys.PREDICT:
    return tf.estimator.EstimatorSpec(mode, predictions={"prob": probs})
  loss = tf1.losses.sigmoid_cross_entropy(labels, logits)
  if mode == tf.estimator.ModeKeys.EVAL:
    accuracy = tf1.metrics.accuracy(labels, tf.cast(probs > 0.5, tf.float32))
    return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops={"accuracy": accuracy})
  train_op = tf1.train.GradientDescentOptimizer(0.1).minimize(loss, tf1.train.get_global_step())
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def _data(n=64):
  rng = np.random.RandomState(0)
  color, city = rng.choice(COLORS, n), rng.choice(CITIES, n)
  age = rng.uniform(15, 60, n).astype(np.float32)
  return {"color": color, "city": city, "age": age}, ((color == "red") | (age > 40)).astype(
      np.float32)


def _input_fn(params=None, repeat=True):
  del params
  ds = tf.data.Dataset.from_tensor_slices(_data())
  return (ds.repeat() if repeat else ds.take(2 * BATCH)).batch(BATCH, drop_remainder=True)


def _config(model_dir):
  return CSRunConfig(model_dir=model_dir, tf_random_seed=0, save_summary_steps=1,
                     cs_config=CSConfig(execution_strategy="pipelined"))


def test_the_host_runs_the_lookups_and_the_engine_the_layers():
  """Found from the graph alone: every op that depends only on the features and reads no
  variable, around the string/sparse ops, is the host's; no such op is in a layer, and the
  variables (embeddings, dense, linear weights) are all in layers."""
  captured = capture.capture(_input_fn, lambda f, l: wide_and_deep(f, l, "train", {}), BATCH)
  fwd = lower.forward_ops(captured)
  host = lower.host_preprocessing(fwd)
  host_types = {op.type for op in host}
  assert {"LookupTableFindV2", "StringToHashBucketFast", "Bucketize", "SparseCross"} <= \
      host_types, host_types
  lower.validate(captured, fwd)  # refused before: 136 ops of 19 types
  graph = lower.lower(captured, name="wide_deep", fwd=fwd)
  names = [l.name for l in graph.layers]
  assert "dense" in names and "input_layer/city_embedding" in names, names
  assert graph.num_params == sum(int(np.prod(v.shape)) for v in
                                 captured.graph.get_collection("trainable_variables"))
  prep = graph.host_preprocessing
  assert prep.features == ("features_age", "features_city", "features_color")
  # Per sample: age float32 4 B + two strings at 8 B each (the pointer, not the characters).
  assert prep.read_bytes == 20
  assert prep.op_types[:4] and set(prep.op_types[:6]) & {"LookupTableFindV2", "Bucketize",
                                                          "SparseCross", "StringToHashBucketFast"}


def test_wide_and_deep_trains_evaluates_and_exports_raw_strings(tmp_path):
  plain = tf.estimator.Estimator(wide_and_deep, model_dir=str(tmp_path / "plain"),
                                 config=tf.estimator.RunConfig(tf_random_seed=0,
                                                               save_summary_steps=1))
  plain.train(_input_fn, max_steps=STEPS)
  est = CerebrasEstimator(wide_and_deep, config=_config(str(tmp_path / "cs")))
  est.train(_input_fn, max_steps=STEPS, use_cs=True)
  want, got = summary_losses(plain.model_dir), summary_losses(est.model_dir)
  assert len(got) == STEPS
  np.testing.assert_allclose(got, want, rtol=1e-6)
  report = open(os.path.join(est.model_dir, "cs_compile", "report.txt"), encoding="utf-8").read()
  assert "host prep:" in report and "features_city" in report
  metrics = est.evaluate(lambda params: _input_fn(params, repeat=False), use_cs=True)
  assert metrics["accuracy"] == pytest.approx(plain.evaluate(
      lambda: _input_fn(repeat=False))["accuracy"])
  def receiver():  # the raw features, as the input_fn gives them
    raw = {"color": tf1.placeholder(tf.string, [None], "color"),
           "city": tf1.placeholder(tf.string, [None], "city"),
           "age": tf1.placeholder(tf.float32, [None], "age")}
    return tf.estimator.export.ServingInputReceiver(raw, raw)
  path = est.export_saved_model(str(tmp_path / "export"), receiver).decode()
  served = tf.saved_model.load(path).signatures["serving_default"]
  x, _ = _data(4)
  out = served(color=tf.constant(x["color"]), city=tf.constant(x["city"]),
               age=tf.constant(x["age"]))
  predicted = [p["prob"] for p in est.predict(
      lambda params: tf.data.Dataset.from_tensor_slices(_data(4)[0]).batch(4))]
  np.testing.assert_allclose(out["prob"].numpy(), predicted, rtol=1e-5)


def test_a_canned_wide_and_deep_estimator_goes_the_same_path(tmp_path):
  """tf.estimator.DNNLinearCombinedClassifier's model_fn (feature columns v2, its own
  optimizers) in a CerebrasEstimator: the canned estimator's own losses."""
  fc2 = tf.feature_column
  color = fc2.categorical_column_with_vocabulary_list("color", COLORS)
  city = fc2.categorical_column_with_hash_bucket("city", 16)
  age = fc2.numeric_column("age")
  canned = tf.estimator.DNNLinearCombinedClassifier(
      model_dir=str(tmp_path / "canned"),
      linear_feature_columns=[color, fc2.bucketized_column(age, [30.0, 40.0])],
      dnn_feature_columns=[fc2.embedding_column(city, 4), age], dnn_hidden_units=[8],
      config=tf.estimator.RunConfig(tf_random_seed=0, save_summary_steps=1))
  canned.train(_input_fn, max_steps=STEPS)
  est = CerebrasEstimator(canned.model_fn, config=_config(str(tmp_path / "cs")))
  est.train(_input_fn, max_steps=STEPS, use_cs=True)
  np.testing.assert_allclose(summary_losses(est.model_dir), summary_losses(canned.model_dir), rtol=1e-6)
  assert est.evaluate(lambda params: _input_fn(params, repeat=False), use_cs=True)["auc"] >= 0
