"""modeling.layer_norm computes its own gradient (three passes instead of TensorFlow's ten for
moments + batch_normalization): its values and all three gradients must be TensorFlow's."""

import numpy as np
import pytest
import tensorflow as tf

from cerebras_models.bert import modeling

tf1 = tf.compat.v1


@pytest.mark.parametrize("shape", [[48, 32], [3, 16, 32]])
def test_layer_norm_and_its_gradients_are_tensorflows(shape):
  with tf.Graph().as_default():
    x = tf.random.normal(shape, seed=2) * 3 + 1
    dy = tf.random.normal(shape, seed=3)  # a loss sum(y * dy): every gradient is non-trivial
    y = modeling.layer_norm(x, 1e-12)
    with tf1.variable_scope("", reuse=True):
      gamma, beta = tf1.get_variable("LayerNorm/gamma"), tf1.get_variable("LayerNorm/beta")
    mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
    ref = tf.nn.batch_normalization(x, mean, variance, offset=beta, scale=gamma,
                                    variance_epsilon=1e-12)
    ours = tf.gradients(tf.reduce_sum(y * dy), [x, gamma, beta])
    theirs = tf.gradients(tf.reduce_sum(ref * dy), [x, gamma, beta])
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      sess.run([gamma.assign(tf.random.normal([32], seed=4)),
                beta.assign(tf.random.normal([32], seed=5))])
      got, want, got_grads, want_grads = sess.run([y, ref, ours, theirs])
  np.testing.assert_allclose(got, want, atol=2e-6)
  for name, g, w in zip(("x", "gamma", "beta"), got_grads, want_grads):
    assert np.abs(w).max() > 0.1, name
    np.testing.assert_allclose(g, w, atol=1e-5, rtol=1e-5, err_msg=name)
