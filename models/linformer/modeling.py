"""Linformer's self-attention: BERT's, with the keys and values projected along the sequence.

Per layer (scope `encoder/layer_N/attention/self`): q, k, v = x W_q, x W_k, x W_v as BERT's
(`query`, `key`, `value`); then k' = E^T k and v' = F^T v, with E, F [S, k] (`E_projection`,
`F_projection`, each with a bias of k) shared by the heads, so each head's scores are
q k'^T [S, k], not [S, S]. `linformer-shared-kv`: F = E (one `E_projection`).

Padding: keys and values of padded positions are zeroed before the projection, so a padded
position adds nothing to k' and v' (modelzoo's TF Linformer passes no mask at all; on full
sequences, as its pretraining data are, the two agree).

Shapes: B batch, S sequence, H hidden, N heads, D = H / N, K = projected_dims. The
hyper-parameters are config.py's LinformerConfig (BERT's, and projected_dims, attention_style).
"""

import functools
import math

import tensorflow as tf

from cerebras_models.bert import modeling as bert
from cerebras_models.linformer.config import LinformerConfig

tf1 = tf.compat.v1


def project_sequence(x, projected_dims: int, name: str, initializer_range):
  """x [B, S, C] -> [B, K, C]: each of the C columns mapped from S positions to K by one
  dense layer (kernel [S, K], bias [K]) under scope `name`."""
  seq, width = x.shape[1], x.shape[2]
  cols = tf.reshape(tf.transpose(x, [0, 2, 1]), [-1, seq])             # [B*C, S]
  projected = bert.dense(cols, projected_dims, name, initializer_range)  # [B*C, K]
  return tf.transpose(tf.reshape(projected, [-1, width, projected_dims]), [0, 2, 1])


def linformer_attention(x, bias, batch, seq, config: LinformerConfig, training: bool, *,
                        padding_mask):
  """Multi-head attention over projected keys and values (the scope `self`); K is
  config.projected_dims, one projection for both when config.shared_kv.

  Args:
    x: [B*S, H] compute dtype.
    bias: [B, 1, 1, S] BERT's key-padding bias: unused (the projected keys are no positions).
    padding_mask: [B, S] int, 1 = real token; S must be static.
  Returns:
    [B*S, H] context vectors, heads concatenated (BERT's self_attention's output).
  """
  del bias
  width, n, projected_dims = config.hidden_size, config.num_heads, config.projected_dims
  d = width // n
  s_static = padding_mask.shape[1]
  if s_static is None:
    raise ValueError("the Linformer needs a static sequence length (its projections are "
                     "[max_sequence_length, projected_dims])")
  r = config.initializer_range
  with tf1.variable_scope("self"):
    q = bert.dense(x, width, "query", r)
    k = tf.reshape(bert.dense(x, width, "key", r), [batch, s_static, width])
    v = tf.reshape(bert.dense(x, width, "value", r), [batch, s_static, width])
    keep = tf.cast(padding_mask, x.dtype)[:, :, tf.newaxis]            # [B, S, 1]
    k, v = k * keep, v * keep
    if config.shared_kv:  # one projection E for both: project [k | v] at once
      kv = project_sequence(tf.concat([k, v], axis=-1), projected_dims, "E_projection", r)
      k, v = kv[:, :, :width], kv[:, :, width:]                        # [B, K, H] each
    else:
      k = project_sequence(k, projected_dims, "E_projection", r)
      v = project_sequence(v, projected_dims, "F_projection", r)
    q = tf.transpose(tf.reshape(q, [batch, seq, n, d]), [0, 2, 1, 3])   # [B, N, S, D]
    k = tf.transpose(tf.reshape(k, [batch, projected_dims, n, d]), [0, 2, 1, 3])  # [B,N,K,D]
    v = tf.transpose(tf.reshape(v, [batch, projected_dims, n, d]), [0, 2, 1, 3])
    scores = tf.matmul(q, k, transpose_b=True)                         # [B, N, S, K]
    probs = tf.nn.softmax(tf.cast(scores, tf.float32) * (1.0 / math.sqrt(float(d))))
    probs = bert.dropout(probs, config.attention_dropout_rate, training)
    context = tf.matmul(tf.cast(probs, x.dtype), v)                    # [B, N, S, D]
    return tf.reshape(tf.transpose(context, [0, 2, 1, 3]), [batch * seq, width])


def linformer_model(features, config: LinformerConfig, training: bool, with_pooler: bool):
  """BERT's backbone (scope `bert`) with Linformer attention; bert.bert_model's outputs."""
  attention = functools.partial(linformer_attention, padding_mask=features["padding_mask"])
  return bert.bert_model(features["token_ids"], features["segment_ids"],
                         features["padding_mask"], config, training, with_pooler=with_pooler,
                         attention=attention)


def num_parameters(config: LinformerConfig, seq: int) -> int:
  """BERT's backbone plus, per layer, E (and F): (S * K + K) each."""
  k = config.projected_dims
  per_layer = (1 if config.shared_kv else 2) * (seq * k + k)
  return bert.num_parameters(config) + config.num_hidden_layers * per_layer
