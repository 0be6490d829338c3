"""models/dropout.dropout: tf.nn.dropout's distribution, scale and gradient."""

import numpy as np
import pytest
import tensorflow as tf

from cerebras_models import dropout

tf1 = tf.compat.v1


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_keep_fraction_scale_and_gradient(rate):
  # 2^20 + 1 elements (odd: the last 32-bit draw is half used). The kept fraction of n
  # Bernoulli(1 - rate) draws has standard deviation sqrt(rate (1 - rate) / n) <= 4.9e-4;
  # 5 sigma is 2.5e-3. The 16-bit threshold moves the keep probability by < 8e-6.
  n = 2 ** 20 + 1
  x = np.linspace(1.0, 2.0, n).astype(np.float32)
  with tf.Graph().as_default():
    xt = tf.constant(x)
    y = dropout.dropout(xt, rate)
    g = tf.gradients(tf.reduce_sum(y * 3.0), xt)[0]
    with tf1.Session() as sess:
      y1, g1 = sess.run([y, g])
      y2 = sess.run(y)
  kept = y1 != 0
  assert abs(kept.mean() - (1 - rate)) < 2.5e-3
  np.testing.assert_allclose(y1[kept], x[kept] / (1 - rate), rtol=1e-6)
  np.testing.assert_allclose(g1, np.where(kept, 3.0 / (1 - rate), 0.0), rtol=1e-6)
  assert (y2 != 0).mean() != kept.mean() or not np.array_equal(y2 != 0, kept)  # fresh masks
  # Neighbouring elements come from the two halves of one draw: they must be independent.
  both = np.mean(kept[0:-1:2] & kept[1::2])
  assert abs(both - (1 - rate) ** 2) < 5e-3


def test_rate_outside_range_fails():
  with tf.Graph().as_default():
    with pytest.raises(ValueError, match=r"dropout rate must be in \[0, 1\)"):
      dropout.dropout(tf.zeros([3]), 1.0)


def test_a_graph_past_two_to_the_31_elements_builds():
  # TAPE BERT's attention probabilities, [1024, 12, 700, 700] = 6.0e9 elements: counted in
  # int32 the size wrapped and the reshape was refused while the graph was traced.
  with tf.Graph().as_default():
    x = tf1.placeholder(tf.bfloat16, [1024, 12, 700, 700])
    y = dropout.dropout(x, 0.1)
    assert y.shape.as_list() == [1024, 12, 700, 700]
