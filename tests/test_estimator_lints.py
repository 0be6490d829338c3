"""CerebrasEstimator's single-device graph lints (compiler/lints.py): a train_op that never
advances the global step, batch-norm updates the train_op leaves out, attention scores in the
form TensorFlow runs slowly with oneDNN.
"""

import numpy as np
import pytest
import tensorflow as tf

from cerebras_tf import CerebrasEstimator, CSConfig
from cerebras_tf import estimator as estimator_lib
from cerebras_tf.errors import ModelFnError
from estimator_fixtures import PARAMS, config_in, train_input_fn


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
  est = CerebrasEstimator(model_fn, config=config_in(
      tmp_path, cs_config=CSConfig(execution_strategy="pipelined")), params=PARAMS)
  for use_cs in (True, False):
    with pytest.raises(ModelFnError, match=r"its train_op does not advance the global step, so "
                       r"steps/max_steps is never reached"):
      est.train(train_input_fn, max_steps=5, use_cs=use_cs)
  finite = lambda params: train_input_fn(params).take(3)  # noqa: E731
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
    est = CerebrasEstimator(model_fn, params={"batch_size": 16, "wired": wired}, config=config_in(
        tmp_path / str(wired), cs_config=CSConfig(execution_strategy="pipelined")))
    est.train(input_fn, max_steps=5, use_cs=True)
    moved = float(np.abs(est.get_variable_value("bn/moving_mean")).sum())
    said = "bn/moving_mean (and 1 more) is written by ops the train_op does not run" in caplog.text
    assert (moved > 0, said) == (wired, not wired), (moved, caplog.text[-2000:])


@pytest.mark.parametrize("scores", ["matmul", "einsum"])
def test_attention_scores_in_the_slow_fused_form_are_named_with_the_users_line(
    tmp_path, caplog, monkeypatch, scores):
  """A hand-written causal attention, tf.matmul(q, k, transpose_b=True) * scale + a [1, 1, L, L]
  bias: TF 2.15 with oneDNN fuses it into one op 200x slower (the Transformer's eval spent
  most of its time there). The warning names the line; an einsum is not fused, and not named.
  oneDNN is said to be on, so the lint runs on any host."""
  monkeypatch.setattr(estimator_lib.onednn, "active", lambda: True)

  def input_fn(params):
    x = np.random.RandomState(0).rand(32, 2, 8, 4).astype("float32")
    return tf.data.Dataset.from_tensor_slices(({"x": x}, np.zeros(32, np.int32))).repeat() \
        .batch(params["batch_size"], drop_remainder=True)

  def model_fn(features, labels, mode, params):
    w = tf.compat.v1.get_variable("w", [4, 4])
    q = tf.matmul(features["x"], w)  # [B, 2, 8, 4]
    causal = tf.linalg.band_part(tf.ones([8, 8]), -1, 0)[tf.newaxis, tf.newaxis] - 1.0
    if scores == "matmul":
      s = tf.matmul(q, q, transpose_b=True) * 0.5 + causal * 1e9  # the line named
    else:
      s = tf.einsum("bnqd,bnkd->bnqk", q, q) * 0.5 + causal * 1e9
    loss = tf.reduce_mean(tf.nn.softmax(s)[..., 0]) + 0 * tf.reduce_sum(tf.cast(labels, tf.float32))
    step = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
        loss, tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=step)

  est = CerebrasEstimator(model_fn, params={"batch_size": 8}, config=config_in(
      tmp_path, cs_config=CSConfig(execution_strategy="pipelined")))
  est.train(input_fn, max_steps=1, use_cs=False)
  line = next(i for i, text in enumerate(open(__file__, encoding="utf-8"), 1)
              if "# the line named" in text)
  said = [r.getMessage() for r in caplog.records if "attention scores as" in r.getMessage()]
  if scores == "einsum":
    assert said == []
  else:
    assert len(said) == 1 and f"test_estimator_lints.py:{line}: " in said[0], said
    assert "(1 such op(s))" in said[0] and "tf.einsum" in said[0]
