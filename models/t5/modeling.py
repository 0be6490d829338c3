"""T5's encoder-decoder as small pure functions (tf.compat.v1 variables).

What makes it T5 and not the Transformer of models/transformer:
  - no absolute positions: each stack adds a learned bias per (relative-distance bucket, head)
    to its self-attention scores; the table is made once per stack and every layer reuses it;
    the encoder's buckets are bidirectional, the decoder's look back only; cross-attention has
    none;
  - RMS layer norm: x / sqrt(mean(x^2) + eps) * scale, no mean subtracted, no bias;
  - pre-norm residual blocks, a final norm (and dropout) on each stack;
  - attention and feed-forward layers without biases; scores unscaled ("dot_product": the
    1/sqrt(d_kv) is folded into the query's initializer), inner width num_heads * d_kv;
  - the embedding table is not scaled going in; the decoder output is scaled by d_model^-1/2
    before the tied output projection onto the (decoder's) embedding table.

Variable scopes:
  t5/shared_embeddings                                   [V, M]   (or encoder_/decoder_embeddings)
  t5/encoder/relative_attention_bias                     [buckets, N]
  t5/encoder/layer_i/self_attention/{q,k,v,o}/kernel     [M, N*K] (o: [N*K, M])
  t5/encoder/layer_i/{self_attention,ffn}/rms_norm/scale [M]
  t5/encoder/layer_i/ffn/{wi,wo}/kernel                  [M, F], [F, M]   (+ bias: use_ffn_bias)
  t5/encoder/final_rms_norm/scale                        [M]
  t5/decoder/...                                         the same, + layer_i/cross_attention

Shapes: B batch, S source length, T target length, M d_model, N heads, K d_kv, F d_ff,
V vocabulary (words + sentinels). Compute is float32, or bfloat16 (mixed_precision): variables
stay float32 and are cast where used; norms, softmax and the position bias are float32.
"""

import math

import tensorflow as tf

from cerebras_models import embedding
from cerebras_models.dropout import dropout as _dropout
from cerebras_models.t5.config import T5Config  # the hyper-parameters, declared there
from cerebras_tf.runtime import precision

tf1 = tf.compat.v1

NEG_INF = -1e9
ACTIVATIONS = {"relu": tf.nn.relu, "gelu": lambda x: tf.nn.gelu(x, approximate=True)}


def _normal(stddev: float, config: T5Config):
  return tf1.random_normal_initializer(stddev=stddev * config.initializer_factor)


def dropout(x, config: T5Config, training: bool):
  if not training or not config.dropout_rate:
    return x
  return _dropout(x, config.dropout_rate)


def _matmul_last(x, kernel, transpose_b: bool = False):
  """x [..., I] times kernel [I, O] ([O, I] with transpose_b) -> [..., O], as one 2-D matmul:
  an einsum with "..." computes its kernel gradient through a broadcast [..., I, O] tensor
  (gigabytes at T5's shapes, tens of seconds a step)."""
  units = kernel.shape[0] if transpose_b else kernel.shape[1]
  y = tf.matmul(tf.reshape(x, [-1, x.shape[-1]]), kernel, transpose_b=transpose_b)
  y = tf.reshape(y, tf.concat([tf.shape(x)[:-1], [units]], axis=0))
  y.set_shape(x.shape[:-1].concatenate([units]))
  return y


def dense(x, units: int, name: str, stddev: float, config: T5Config, use_bias: bool = False):
  """x [..., I] @ kernel [I, units] (+ bias), float32 variables cast to x's dtype.
  -> [..., units]."""
  with tf1.variable_scope(name):
    kernel = tf1.get_variable("kernel", [x.shape[-1], units],
                              initializer=_normal(stddev, config))
    y = _matmul_last(x, tf.cast(kernel, x.dtype))
    if use_bias:
      bias = tf1.get_variable("bias", [units], initializer=tf1.zeros_initializer())
      y += tf.cast(bias, x.dtype)
  return y


def rms_norm(x, epsilon: float, name: str = "rms_norm"):
  """T5's layer norm: x / sqrt(mean(x^2) + eps) * scale; no centering, no bias.

  x: [..., M] any float dtype -> [..., M] in x's dtype (computed in float32)."""
  with tf1.variable_scope(name):
    scale = tf1.get_variable("scale", [x.shape[-1]], initializer=tf1.ones_initializer())
  x32 = tf.cast(x, tf.float32)
  y = x32 * tf.math.rsqrt(tf.reduce_mean(tf.square(x32), axis=-1, keepdims=True) + epsilon)
  return tf.cast(y * scale, x.dtype)


# ---------------------------------------------------------------------------------------------
# Relative position bias


def relative_position_bucket(relative_position, bidirectional: bool, num_buckets: int,
                             max_distance: int):
  """T5's bucket of each key-minus-query distance.

  Half the buckets (all, if one-directional) hold the exact distances 0 .. half-1; the rest
  cover half .. max_distance logarithmically; farther distances share the last bucket. With
  `bidirectional`, keys after the query (distance > 0) get the upper half of the buckets; else
  keys after the query (masked anyway) fall in bucket 0 with distance 0.

  relative_position: [Lq, Lk] int32 (key position - query position) -> [Lq, Lk] int32 in
  [0, num_buckets).
  """
  bucket = tf.zeros_like(relative_position)
  if bidirectional:
    num_buckets //= 2
    bucket += tf.cast(relative_position > 0, tf.int32) * num_buckets
    distance = tf.abs(relative_position)
  else:
    distance = tf.maximum(-relative_position, 0)
  exact = num_buckets // 2
  # log-spaced for distance >= exact; the maximum keeps log() off 0 (those take the exact branch)
  log_ratio = tf.math.log(tf.cast(tf.maximum(distance, exact), tf.float32) / exact) / math.log(
      max_distance / exact)
  far = exact + tf.cast(log_ratio * (num_buckets - exact), tf.int32)
  far = tf.minimum(far, num_buckets - 1)
  return bucket + tf.where(distance < exact, distance, far)


def position_bias(query_length: int, key_length: int, bidirectional: bool, config: T5Config):
  """The stack's bias table [buckets, N] looked up for every (query, key) pair.

  -> [1, N, Lq, Lk] float32, added to the attention scores of every layer of the stack."""
  table = tf1.get_variable("relative_attention_bias",
                           [config.num_relative_attention_buckets, config.num_heads],
                           initializer=tf1.glorot_uniform_initializer())
  relative = tf.range(key_length)[tf.newaxis, :] - tf.range(query_length)[:, tf.newaxis]
  buckets = relative_position_bucket(relative, bidirectional,
                                     config.num_relative_attention_buckets,
                                     config.relative_attention_max_distance)
  values = embedding.lookup(table, buckets)               # [Lq, Lk, N]
  return tf.transpose(values, [2, 0, 1])[tf.newaxis]       # [1, N, Lq, Lk]


def padding_bias(mask):
  """[B, S] int (1 = real token) -> [B, 1, 1, S] additive bias (0 real, -1e9 padding)."""
  return (1.0 - tf.cast(mask, tf.float32))[:, tf.newaxis, tf.newaxis, :] * NEG_INF


def causal_bias(length: int):
  """[1, 1, T, T]: query i sees keys 0..i."""
  allowed = tf.linalg.band_part(tf.ones([length, length]), -1, 0)
  return ((1.0 - allowed) * NEG_INF)[tf.newaxis, tf.newaxis]


# ---------------------------------------------------------------------------------------------
# Blocks


def _heads(x, config: T5Config):
  """[B, L, N*K] -> [B, N, L, K]."""
  shape = tf.shape(x)
  x = tf.reshape(x, [shape[0], shape[1], config.num_heads, config.d_kv])
  return tf.transpose(x, [0, 2, 1, 3])


def attention(x, memory, bias, config: T5Config, training: bool):
  """Multi-head attention of x over memory (itself, for self-attention), no biases.

  x: [B, Lq, M]; memory: [B, Lk, M]; bias: float32, broadcastable to [B, N, Lq, Lk]
  (masks + position bias) -> [B, Lq, M]."""
  m, inner = config.d_model, config.inner
  q = _heads(dense(x, inner, "q", (m * config.d_kv) ** -0.5, config), config)
  k = _heads(dense(memory, inner, "k", m ** -0.5, config), config)
  v = _heads(dense(memory, inner, "v", m ** -0.5, config), config)
  if config.scaled_attention:
    q *= tf.cast(config.d_kv ** -0.5, q.dtype)
  scores = tf.cast(tf.matmul(q, k, transpose_b=True), tf.float32) + bias   # [B, N, Lq, Lk]
  probs = dropout(tf.cast(tf.nn.softmax(scores), v.dtype), config, training)
  context = tf.transpose(tf.matmul(probs, v), [0, 2, 1, 3])               # [B, Lq, N, K]
  context = tf.reshape(context, [tf.shape(x)[0], tf.shape(x)[1], inner])
  context.set_shape(x.shape[:-1].concatenate([inner]))
  return dense(context, m, "o", inner ** -0.5, config)


def feed_forward(x, activation: str, config: T5Config):
  """[B, L, M] -> relu/gelu(x wi) wo -> [B, L, M]."""
  h = ACTIVATIONS[activation](dense(x, config.d_ff, "wi", config.d_model ** -0.5, config,
                                    config.use_ffn_bias))
  return dense(h, config.d_model, "wo", config.d_ff ** -0.5, config, config.use_ffn_bias)


def stream_dtype(config: T5Config) -> tf.DType:
  """The residual stream's dtype (precision.stream_dtype): float32 on the host."""
  return tf.as_dtype(precision.stream_dtype(config.dtype))


def _residual(x, name: str, sublayer, config: T5Config, training: bool):
  """x + dropout(sublayer(rms_norm(x))): T5's pre-norm block; x in stream_dtype, the
  sublayer in the compute dtype."""
  with tf1.variable_scope(name):
    h = tf.cast(rms_norm(x, config.layer_norm_epsilon), tf.as_dtype(config.dtype))
    # dropped out after the cast to the stream's dtype: no cast there and back inside it
    return x + dropout(tf.cast(sublayer(h), x.dtype), config, training)


def embedding_tables(config: T5Config):
  """(encoder table, decoder table) [V, M] float32; one variable when shared."""
  shape, init = [config.vocab_size, config.d_model], _normal(1.0, config)
  if config.share_embedding_weights:
    table = tf1.get_variable("shared_embeddings", shape, initializer=init)
    return table, table
  return (tf1.get_variable("encoder_embeddings", shape, initializer=init),
          tf1.get_variable("decoder_embeddings", shape, initializer=init))


def encoder(ids, mask, table, config: T5Config, training: bool):
  """ids, mask: [B, S] int32 (mask 1 = real) -> [B, S, M] in the compute dtype."""
  dtype = tf.as_dtype(config.dtype)
  x = dropout(tf.cast(embedding.lookup(table, ids), stream_dtype(config)), config, training)
  length = ids.shape[1] if ids.shape[1] is not None else tf.shape(ids)[1]
  with tf1.variable_scope("encoder"):
    bias = padding_bias(mask)
    if config.use_relative_attention_bias:
      bias += position_bias(length, length, True, config)
    for i in range(config.num_encoder_layers):
      with tf1.variable_scope(f"layer_{i}"):
        x = _residual(x, "self_attention",
                      lambda h: attention(h, h, bias, config, training), config, training)
        x = _residual(x, "ffn", lambda h: feed_forward(h, config.encoder_nonlinearity, config),
                      config, training)
    return dropout(tf.cast(rms_norm(x, config.layer_norm_epsilon, "final_rms_norm"), dtype),
                   config, training)


def decoder(ids, encoder_output, encoder_mask, table, config: T5Config, training: bool):
  """Teacher-forced decoder. ids: [B, T] int32 ([start] y[:-1]); encoder_output [B, S, M];
  encoder_mask [B, S] -> [B, T, M] in the compute dtype."""
  dtype = tf.as_dtype(config.dtype)
  x = dropout(tf.cast(embedding.lookup(table, ids), stream_dtype(config)), config, training)
  length = ids.shape[1] if ids.shape[1] is not None else tf.shape(ids)[1]
  with tf1.variable_scope("decoder"):
    self_bias = causal_bias(length)
    if config.use_relative_attention_bias:
      self_bias += position_bias(length, length, False, config)
    cross_bias = padding_bias(encoder_mask)
    for i in range(config.num_decoder_layers):
      with tf1.variable_scope(f"layer_{i}"):
        x = _residual(x, "self_attention",
                      lambda h: attention(h, h, self_bias, config, training), config, training)
        x = _residual(x, "cross_attention",
                      lambda h: attention(h, encoder_output, cross_bias, config, training),
                      config, training)
        x = _residual(x, "ffn", lambda h: feed_forward(h, config.decoder_nonlinearity, config),
                      config, training)
    return dropout(tf.cast(rms_norm(x, config.layer_norm_epsilon, "final_rms_norm"), dtype),
                   config, training)


def t5_output_layer(encoder_ids, encoder_mask, decoder_ids, config: T5Config, training: bool):
  """The whole model up to its output layer.

  encoder_ids, encoder_mask: [B, S] int32; decoder_ids: [B, T] int32
  -> (the decoder output * d_model^-1/2 [B, T, M] compute dtype, the decoder table [V, M]
  float32): logits = the first times the second^T."""
  with tf1.variable_scope("t5", reuse=tf1.AUTO_REUSE):
    enc_table, dec_table = embedding_tables(config)
    enc = encoder(encoder_ids, encoder_mask, enc_table, config, training)
    dec = decoder(decoder_ids, enc, encoder_mask, dec_table, config, training)
    return dec * tf.cast(config.d_model ** -0.5, dec.dtype), dec_table


def t5_logits(x, table):
  """[B, T, V] float32 logits of t5_output_layer's (x, table)."""
  with tf1.name_scope("t5/"):
    return tf.cast(_matmul_last(x, tf.cast(table, x.dtype), transpose_b=True), tf.float32)


def t5(encoder_ids, encoder_mask, decoder_ids, config: T5Config, training: bool):
  """The whole model: logits [B, T, V] float32 (the decoder output * d_model^-1/2 times the
  decoder table^T)."""
  return t5_logits(*t5_output_layer(encoder_ids, encoder_mask, decoder_ids, config, training))
