"""Losses shared by the reference models.

`sparse_softmax_xent` is `tf.nn.sparse_softmax_cross_entropy_with_logits` (same value, same
gradient) at a fraction of its CPU cost; `dense_sparse_softmax_xent` is the same loss of an
output layer `x @ table^T + bias`, whose gradient never forms d(logits) (BERT's masked-LM
head, GPT's tied head); `on_weighted_rows` computes BERT's on the slots that carry a label.
TF's fused CPU kernel is plain Eigen: for BERT-tiny's masked-LM head ([640, 30522] logits) it
took 85 ms where a oneDNN softmax takes 23 ms (benchmarks/bench_bert_vs_google.py, per-op
table). Here the forward pass is one softmax and two gathers of N elements (two max reductions
as well where a label's probability underflows), and the backward pass one multiply and a
scatter of N elements.
That is faster only with oneDNN's softmax: without it (on an AVX2 CPU with TensorFlow imported
before cerebras_tf, or TF_ENABLE_ONEDNN_OPTS=0) TF's own op is used, which was faster there
(benchmarks/bench_host_speed.py).
"""

import contextlib
import functools
from typing import Optional

import numpy as np
import tensorflow as tf

from cerebras_tf.runtime import onednn, precision


def onednn_active() -> bool:
  """Whether TF runs oneDNN kernels in this process (decided when TensorFlow was imported)."""
  return onednn.active()


def sparse_softmax_xent(logits, labels, smoothing: float = 0.0):
  """Per-position cross-entropy against the label, optionally label-smoothed.

  The target puts 1 - smoothing on the label and smoothing / V on every token:
  loss = -(1 - s) log p[label] - s mean_v log p_v = lse - (1 - s) l[label] - s mean_v l_v.
  With s = 0 it is tf.nn.sparse_softmax_cross_entropy_with_logits.

  log-sum-exp comes from the softmax itself (`_log_sum_exp`): lse = l[j] - log(p[j]) at the
  label, or at argmax(l), whose probability is at least 1/V, where a label's underflows (the
  loss stays finite where -log(p[label]) would not).

  Args:
    logits: [..., V] float32.
    labels: [...] int, in [0, V) (out-of-range labels fail in the gather, as in TF's op).
    smoothing: s in [0, 1).
  Returns:
    [...] float32 losses. Gradient w.r.t. logits: (softmax(l) - (1 - s) onehot - s / V) * dy.
  """
  with tf.name_scope("sparse_softmax_xent"):
    if not onednn_active():
      return _tf_xent(logits, labels, float(smoothing))
    return _xent(logits, labels, float(smoothing))


def _tf_xent(logits, labels, s):
  """The same loss from TF's fused op (and one mean over V when smoothing)."""
  labels = tf.convert_to_tensor(labels)
  loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.cast(labels, tf.int32),
                                                         logits=logits)
  if s:
    # -s mean_v log p_v = s (lse - mean_v l_v), and lse = loss + l[label].
    at_label = tf.gather(logits, tf.cast(labels, tf.int32), batch_dims=len(labels.shape))
    loss = loss - s * (tf.reduce_mean(logits, axis=-1) - at_label)
  return loss


def _xent(logits, labels, s):
  shape = tf.shape(labels)
  flat_logits = tf.reshape(logits, [-1, tf.shape(logits)[-1]])
  flat_labels = tf.cast(tf.reshape(labels, [-1]), tf.int32)

  @tf.custom_gradient
  def xent(l):
    p = tf.nn.softmax(l)
    at_label = tf.gather(l, flat_labels, batch_dims=1)
    loss = _log_sum_exp(l, p, at_label, flat_labels) - (1.0 - s) * at_label
    if s:
      loss -= s * tf.reduce_mean(l, axis=-1)

    def grad(dy):
      rows = tf.range(tf.shape(flat_labels)[0])
      at_label = tf.stack([rows, flat_labels], axis=1)
      q = p - s / tf.cast(tf.shape(l)[-1], l.dtype) if s else p
      return tf.tensor_scatter_nd_sub(q * dy[:, tf.newaxis], at_label, (1.0 - s) * dy)

    return loss, grad

  return tf.reshape(xent(flat_logits), shape)


def _log_sum_exp(logits, p, at_label, labels):
  """log(sum(exp(logits))) of each row, from its softmax p = exp(logits - lse).

  lse = l[j] - log(p[j]) for any j. At the label it is a gather of N values. Where some
  p[label] is below the smallest normal float32 (a logit gap past ~87: a diverging model) its
  log is inexact or inf, and j = argmax is used instead: max(l) - log(max(p)), where the
  largest p is at least 1/V, two reductions over [N, V] (1.3 and 1.1 ms of BERT-tiny's fp32
  step; TF's CPU ArgMax is scalar and slower still). On the host those run only then (a
  cond); in the engine's trace always, so its graph has no cond.

  Args:
    logits, p: [N, V] float32.  at_label: [N], logits at the labels.  labels: [N] int32.
  Returns:
    [N] float32.
  """
  def from_max():
    return tf.reduce_max(logits, axis=-1) - tf.math.log(tf.reduce_max(p, axis=-1))

  if precision.in_engine_trace():
    return from_max()
  p_label = tf.gather(p, labels, batch_dims=1)
  normal = tf.reduce_all(p_label >= np.finfo(np.float32).tiny)
  return tf.cond(normal, lambda: at_label - tf.math.log(p_label), from_max)


@functools.lru_cache(maxsize=None)
def _table_gradient_untransposed() -> bool:
  """Whether float32 d_table is p^T (dy x), as einsum("nv,nk->vk"), rather than
  ((dy x)^T @ p)^T. On an AVX-512 host the untransposed product wins: on the EPYC with
  avx512_bf16, p^T @ (dy x) as a MatMul took 12.4 ms where the second form and its transpose
  took 14.0 (BERT-tiny's 320 rows); on the Intel Xeon without it (2026-12-01) the MatMul's
  transposed operand took 13.1-14.1 ms alone and the einsum, oneDNN's batch-matmul primitive,
  10.2-10.3 (13.8 -> 9.7 ms in the serialized step). On the AVX2 hosts the second form was
  faster (bench_host_speed.py's lever table)."""
  return "avx512f" in precision.cpu_flags()


# The rows computed are a multiple of ROW_BUCKET (AVX-512's 16 floats), coarser for a head of
# more than MAX_SHAPES buckets: oneDNN builds a kernel for each shape it meets, so a batch's
# count of real rows selects one of at most MAX_SHAPES shapes. BERT-tiny's 640 slots: steps of
# 16 rows leave 8 padding rows a batch on average, where steps of 40 left 20.
ROW_BUCKET = 16
MAX_SHAPES = 40


def rows_computed(real, total):
  """How many of `total` rows on_weighted_rows computes for `real` nonzero weights (ints or
  int tensors): `real` rounded up to the step, at least one step, at most `total`."""
  span = ROW_BUCKET * MAX_SHAPES
  step = ROW_BUCKET * tf.maximum((total + span - 1) // span, 1)
  return tf.minimum(tf.maximum((real + step - 1) // step, 1) * step, total)


def on_weighted_rows(per_row, weights, *rows):
  """per_row(*rows) computed on the rows whose weight is not 0; 0 for the others.

  BERT's masked-LM slots are half padding on the demo's data (47.7% real at seq 128, 20
  slots): google-bert computes the output layer over every slot and multiplies the padding's
  losses by 0. The same loss and gradients come from the real rows alone (BERT-tiny's bf16
  step 1.3x). Not within the engine's trace, whose graph keeps the static shape its figures
  are made of.

  Args:
    per_row: [M, ...] tensors -> [M] tensor, or a tuple of them, row by row (no mixing of
      rows).
    weights: [N].  rows: [N, ...] tensors.
  Returns:
    [N], or a tuple of [N] tensors as per_row returns.
  """
  if precision.in_engine_trace():
    return per_row(*rows)
  with tf.name_scope("weighted_rows"):
    total = tf.shape(weights)[0]
    keep = tf.cast(tf.where(tf.not_equal(weights, 0))[:, 0], tf.int32)
    n = tf.shape(keep)[0]
    picked = tf.pad(keep, [[0, rows_computed(n, total) - n]])  # filler: row 0, dropped below
    values = per_row(*[tf.gather(r, picked) for r in rows])
    scatter = lambda v: tf.scatter_nd(keep[:, tf.newaxis], v[:n], [total])  # noqa: E731
    return tuple(map(scatter, values)) if isinstance(values, tuple) else scatter(values)


def output_layer_token_mean(x, table, labels, weights, smoothing: float = 0.0):
  """The mean over real tokens of a tied output layer's cross-entropy, from the layer directly:
  dense_sparse_softmax_xent on the rows of nonzero weight (on_weighted_rows), for training a
  sequence model's head on the host (T5's, the Transformer's).

  Args:
    x: [..., K] the final states.  table: [V, K].  labels: [...] int.  weights: [...] (1 =
      a real token).  smoothing: label smoothing s.
  Returns:
    sum(w * loss) / max(sum(w), 1), float32.
  """
  w = tf.cast(tf.reshape(weights, [-1]), tf.float32)
  per_token = on_weighted_rows(
      lambda rows, ids: dense_sparse_softmax_xent(rows, table, None, ids, smoothing=smoothing),
      w, tf.reshape(x, [-1, x.shape[-1]]), tf.reshape(labels, [-1]))
  return tf.reduce_sum(per_token * w) / tf.maximum(tf.reduce_sum(w), 1.0)


def host_output_layer(x) -> bool:
  """Whether a training head on `x` takes dense_sparse_softmax_xent: yes, except for a 16-bit
  model traced for the engine, which keeps the plain logits form (as it did before the
  bfloat16 form existed here, so an engine figure does not depend on how the host computes)."""
  return x.dtype == tf.float32 or not precision.in_engine_trace()


def dense_sparse_softmax_xent(x, table, bias, labels, scope: Optional[str] = "sparse_softmax_xent",
                              smoothing: float = 0.0):
  """sparse_softmax_xent(x @ table^T + bias, labels, smoothing), without a [N, V] gradient
  tensor.

  With G = d(loss)/d(logits) = dy * (softmax - onehot), the output layer's gradients are
  G @ table, G^T @ x and sum_n G: the onehot part is a gather and two scatters of N rows, and
  dy folds into x, so only the softmax p itself is [N, V]:
    dx = dy * (p @ table - table[labels]);   d_table = p^T (dy x) - scatter(labels, dy x);
    d_bias = p^T dy - scatter(labels, dy).
  Label smoothing s makes G = dy * (p - (1 - s) onehot - s / V): the scatters take (1 - s)
  and each gradient loses s / V of a sum over the other axis (sum_v table_v for dx,
  sum_n dy x for every row of d_table, sum_n dy for d_bias).
  d_table is computed as p^T @ (dy x) in bfloat16 and on an AVX-512 host (BERT-tiny's head
  with avx512_bf16: 18.1 ms against 20.4 plus a transpose; in float32 an einsum, see
  _table_gradient_untransposed), as ((dy x)^T @ p)^T in float32 elsewhere (faster on the AVX2
  hosts: benchmarks/bench_host_speed.py, lever table). Without
  oneDNN the plain logits and TF's op are used, as in sparse_softmax_xent.

  Mixed precision: with a bfloat16 x the three products run in bfloat16 (the table cast to
  it, p cast once for the two backward ones); the logits, softmax, loss and the table's and
  bias's gradients are float32, x's gradient bfloat16.

  Args:
    x: [N, K] float32 or bfloat16.  table: [V, K] float32 (e.g. a tied embedding).  bias: [V]
    float32, or None for a layer without one.  labels: [N] int in [0, V).
    scope: the ops' name scope, None for the caller's (the compiler names a layer that owns no
      variables by its ops' scope: GPT's tied `gpt/lm_head`).
    smoothing: s in [0, 1), as sparse_softmax_xent's.
  Returns:
    [N] float32 losses.
  """
  s = float(smoothing)
  with tf.name_scope(scope) if scope else contextlib.nullcontext():
    labels = tf.cast(labels, tf.int32)
    x, table = tf.convert_to_tensor(x), tf.convert_to_tensor(table)
    compute = x.dtype
    if not onednn_active():
      logits = tf.cast(tf.matmul(x, tf.cast(table, compute), transpose_b=True), tf.float32)
      return _tf_xent(logits if bias is None else tf.nn.bias_add(logits, bias), labels, s)

    def forward(x, table, bias):
      table_c = table if compute == tf.float32 else tf.cast(table, compute)
      logits = tf.cast(tf.matmul(x, table_c, transpose_b=True), tf.float32)
      if bias is not None:
        logits = tf.nn.bias_add(logits, bias)
      p = tf.nn.softmax(logits)
      at_label = tf.gather(logits, labels, batch_dims=1)
      loss = _log_sum_exp(logits, p, at_label, labels) - (1.0 - s) * at_label
      if s:
        loss -= s * tf.reduce_mean(logits, axis=-1)

      def grad(dy):
        label_index = labels[:, tf.newaxis]
        dyx = dy[:, tf.newaxis] * tf.cast(x, tf.float32)
        at_labels = tf.gather(table, labels)
        if s:  # p - (1 - s) onehot - s / V: the rows at the labels, and every row's mean
          at_labels = (1.0 - s) * at_labels + s * tf.reduce_mean(table, axis=0)
        if compute == tf.float32:
          dx = dy[:, tf.newaxis] * (tf.matmul(p, table) - at_labels)
          d_table = (tf.einsum("nv,nk->vk", p, dyx) if _table_gradient_untransposed()
                     else tf.transpose(tf.matmul(dyx, p, transpose_a=True)))
        else:
          p_c = tf.cast(p, compute)
          dx = dy[:, tf.newaxis] * (tf.cast(tf.matmul(p_c, table_c), tf.float32) - at_labels)
          d_table = tf.cast(tf.matmul(p_c, tf.cast(dyx, compute), transpose_a=True), tf.float32)
        if s:
          d_table -= (s / tf.cast(tf.shape(table)[0], tf.float32)) * tf.reduce_sum(dyx, 0)
        d_table = tf.tensor_scatter_nd_sub(d_table, label_index, (1.0 - s) * dyx if s else dyx)
        dx = tf.cast(dx, compute)
        if bias is None:
          return dx, d_table
        d_bias = tf.linalg.matvec(p, dy, transpose_a=True)
        if s:
          d_bias -= (s / tf.cast(tf.shape(p)[1], tf.float32)) * tf.reduce_sum(dy)
        d_bias = tf.tensor_scatter_nd_sub(d_bias, label_index, (1.0 - s) * dy if s else dy)
        return dx, d_table, d_bias

      return loss, grad

    if bias is None:
      return tf.custom_gradient(lambda x, table: forward(x, table, None))(x, table)
    return tf.custom_gradient(forward)(x, table, tf.convert_to_tensor(bias))
