"""`model.pooling`: what the pooler reads, [CLS] (google-bert) or the mean of the real tokens."""

import numpy as np
import pytest
import tensorflow as tf

from cerebras_models.bert import modeling

tf1 = tf.compat.v1


def _pooled(pooling, sequence_output, padding_mask):
  """The pooler's output with its dense layer set to the identity and a zero bias, so the
  result is tanh(what the pooler read)."""
  config = modeling.BertConfig(hidden_size=sequence_output.shape[-1], num_heads=1,
                               pooling=pooling)
  with tf.Graph().as_default():
    out = modeling.pooler(tf.constant(sequence_output), config, tf.constant(padding_mask))
    kernel = [v for v in tf1.global_variables() if v.op.name == "pooler/dense/kernel"][0]
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      sess.run(kernel.assign(np.eye(sequence_output.shape[-1], dtype=np.float32)))
      return sess.run(out)


def test_mean_pooling_averages_the_real_tokens_only_and_cls_reads_the_first():
  # Example 0: 3 real tokens (0.1, 0.2, 0.3 in every unit), then padding holding 9.0, which
  # must not count: mean 0.2. Example 1: 4 real tokens 0.4: mean 0.4.
  seq = np.full((2, 4, 3), 9.0, np.float32)
  seq[0, :3] = np.array([0.1, 0.2, 0.3], np.float32)[:, None]
  seq[1] = 0.4
  mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], np.int32)
  np.testing.assert_allclose(_pooled("mean", seq, mask),
                             np.tanh([[0.2] * 3, [0.4] * 3]), atol=1e-6)
  np.testing.assert_allclose(_pooled("cls", seq, mask), np.tanh([[0.1] * 3, [0.4] * 3]),
                             atol=1e-6)


def test_an_unknown_pooling_is_refused_by_name():
  with pytest.raises(ValueError, match="model.pooling must be one of cls, mean"):
    modeling.BertConfig(pooling="max")
