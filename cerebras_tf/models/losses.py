"""Losses shared by the reference models.

`sparse_softmax_xent` is `tf.nn.sparse_softmax_cross_entropy_with_logits` (same value, same
gradient) at a fraction of its CPU cost. TF's fused CPU kernel is plain Eigen: for BERT-tiny's
masked-LM head ([640, 30522] logits) it took 85 ms where a oneDNN softmax takes 23 ms
(benchmarks/bench_bert_vs_google.py, per-op table). Here the forward pass is one softmax plus
an argmax and three gathers, and the backward pass one multiply and a scatter of N elements.
"""

import tensorflow as tf


def sparse_softmax_xent(logits, labels):
  """Per-position cross-entropy -log softmax(logits)[label].

  log-sum-exp comes from the softmax itself: lse = l[j] - log(p[j]) for any j, and at
  j = argmax(l) the probability is at least 1/V, so it never underflows (the loss stays finite
  where -log(p[label]) would not).

  Args:
    logits: [..., V] float32.
    labels: [...] int, in [0, V) (out-of-range labels fail in the gather, as in TF's op).
  Returns:
    [...] float32 losses. Gradient w.r.t. logits: (softmax(logits) - onehot(labels)) * dy.
  """
  shape = tf.shape(labels)
  flat_logits = tf.reshape(logits, [-1, tf.shape(logits)[-1]])
  flat_labels = tf.cast(tf.reshape(labels, [-1]), tf.int32)

  @tf.custom_gradient
  def xent(l):
    p = tf.nn.softmax(l)
    top = tf.argmax(l, axis=-1, output_type=tf.int32)
    lse = tf.gather(l, top, batch_dims=1) - tf.math.log(tf.gather(p, top, batch_dims=1))
    loss = lse - tf.gather(l, flat_labels, batch_dims=1)

    def grad(dy):
      rows = tf.range(tf.shape(flat_labels)[0])
      at_label = tf.stack([rows, flat_labels], axis=1)
      return tf.tensor_scatter_nd_sub(p * dy[:, tf.newaxis], at_label, dy)

    return loss, grad

  return tf.reshape(xent(flat_logits), shape)
