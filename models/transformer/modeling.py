"""Encoder-decoder Transformer (Vaswani et al., 2017) as small pure functions.

Variable scopes:
  transformer/embeddings/{shared,source,target}_embeddings        [V, H]
  transformer/embeddings/position_embeddings                      [P, H]  (learned only)
  transformer/encoder/layer_N/self_attention/{query,key,value,output}/{kernel,bias}
  transformer/encoder/layer_N/{self_attention,ffn}/LayerNorm/{gamma,beta}
  transformer/encoder/layer_N/ffn/{intermediate,output}/{kernel,bias}
  transformer/decoder/layer_N/{self_attention,cross_attention,ffn}/...
  transformer/{encoder,decoder}/final_norm/{gamma,beta}            (pre-norm only)
  transformer/decoder/output_projection/kernel                     (untied output only)

Shapes: B batch, S source length, T target length, H hidden, N heads, D = H / N, F filter,
V vocabulary. Building blocks (dense, layer_norm, dropout, gelu, initializer) come from
models/bert/modeling.py. Compute is float32, or bfloat16 with `model.mixed_precision: true`
(float32 variables cast where used; softmax, LayerNorm, the attention bias, the residual sums
and the logits stay float32 on the host, as in BERT's and GPT's mixed precision).

Where lengths come from (variable tensor shape): the input pipeline pads every batch to the
static [B, S] / [B, T] the engine compiles for, and passes `source_padding_mask`,
`target_padding_mask` (1 = real token) and `source_lengths` / `target_lengths` from the
tokenizer's real lengths (models/transformer/input.py). Attention masks and the loss weights
are built from those masks only, so padded positions never change a real token's result and
an engine with VTS can skip them.
"""

import math
from typing import Dict

import tensorflow as tf

from cerebras_models import embedding
from cerebras_models.bert.modeling import (dense, dropout, feed_forward_activation,
                                               initializer, layer_norm)
from cerebras_models.transformer.config import TransformerConfig  # declared there
from cerebras_tf.runtime import precision

tf1 = tf.compat.v1

NEG_INF = -1e9


def compute_dtype(config: TransformerConfig) -> tf.DType:
  """The dtype the matmuls run in (variables stay float32)."""
  return tf.as_dtype(config.dtype)


def stream_dtype(config: TransformerConfig) -> tf.DType:
  """The dtype residuals are added in (precision.stream_dtype): float32 on the host, where a
  bfloat16 model adds each sublayer's output to a float32 residual (pre-norm: the stream
  itself; post-norm: the sum the LayerNorm takes); the compute dtype in the engine's trace."""
  return tf.as_dtype(precision.stream_dtype(config.dtype))


# ---------------------------------------------------------------------------------------------
# Embeddings


def sinusoids(length, width: int, start=0):
  """The paper's fixed position encodings, rows start..start+length-1.  -> [length, width]."""
  position = tf.cast(tf.range(length) + start, tf.float32)
  half = width // 2
  inv = tf.exp(tf.range(half, dtype=tf.float32) * -(math.log(10000.0) / max(half - 1, 1)))
  angles = position[:, tf.newaxis] * inv[tf.newaxis, :]
  return tf.concat([tf.sin(angles), tf.cos(angles)], axis=1)


def embedding_tables(config: TransformerConfig):
  """(source_table, target_table), [V, H] float32; the same variable when shared."""
  init = tf1.random_normal_initializer(stddev=config.hidden_size ** -0.5)
  shape = [config.vocab_size, config.hidden_size]
  with tf1.variable_scope("embeddings", reuse=tf1.AUTO_REUSE):
    if config.share_embedding_weights:
      table = tf1.get_variable("shared_embeddings", shape, initializer=init)
      return table, table
    return (tf1.get_variable("source_embeddings", shape, initializer=init),
            tf1.get_variable("target_embeddings", shape, initializer=init))


def position_table(config: TransformerConfig):
  with tf1.variable_scope("embeddings", reuse=tf1.AUTO_REUSE):
    return tf1.get_variable("position_embeddings",
                            [config.max_position_embeddings, config.hidden_size],
                            initializer=initializer(config.initializer_range))


def embed(ids, table, config: TransformerConfig, training: bool, start=0):
  """Token embeddings * sqrt(H) + positions start.., then dropout.

  Args:
    ids: [B, L] int32.  start: position of ids[:, 0] (decoding steps).
  Returns:
    [B, L, H] in stream_dtype.
  """
  length = tf.shape(ids)[1]
  dtype = stream_dtype(config)
  x = tf.cast(embedding.lookup(table, ids), dtype) * (config.hidden_size ** 0.5)
  if config.position_embedding_type == "fixed":
    pos = sinusoids(length, config.hidden_size, start)
  else:
    pos = tf.gather(position_table(config), tf.range(length) + start)
  x += tf.cast(pos, dtype)[tf.newaxis]
  return dropout(x, config.dropout_rate, training)


# ---------------------------------------------------------------------------------------------
# Attention


def padding_bias(padding_mask):
  """[B, S] int (1 = real) -> [B, 1, 1, S] additive bias (0 real, -1e9 padded keys)."""
  mask = tf.cast(padding_mask, tf.float32)[:, tf.newaxis, tf.newaxis, :]
  return (1.0 - mask) * NEG_INF


def causal_bias(length):
  """[1, 1, L, L]: query i may attend keys 0..i."""
  allowed = tf.linalg.band_part(tf.ones([length, length]), -1, 0)
  return ((1.0 - allowed) * NEG_INF)[tf.newaxis, tf.newaxis]


def _dense3d(x, units: int, name: str, config: TransformerConfig, activation=None,
             use_bias: bool = True):
  """bert's 2-D `dense` on [B, L, K] -> [B, L, units]."""
  batch, length = tf.shape(x)[0], tf.shape(x)[1]
  y = dense(tf.reshape(x, [-1, x.shape[-1]]), units, name, config.initializer_range, activation,
            use_bias=use_bias)
  out = tf.reshape(y, [batch, length, units])
  out.set_shape(x.shape[:-1].concatenate([units]))
  return out


def project_heads(x, name: str, config: TransformerConfig):
  """[B, L, H] -> dense -> [B, N, L, D]."""
  batch, length = tf.shape(x)[0], tf.shape(x)[1]
  y = _dense3d(x, config.hidden_size, name, config,
               use_bias=config.use_projection_bias_in_attention)
  y = tf.reshape(y, [batch, length, config.num_heads, config.head_size])
  return tf.transpose(y, [0, 2, 1, 3])


def key_values(memory, config: TransformerConfig):
  """Keys and values of `memory` [B, L, H] -> ([B, N, L, D], [B, N, L, D])."""
  return project_heads(memory, "key", config), project_heads(memory, "value", config)


def attention(query_input, bias, config: TransformerConfig, training: bool, kv=None):
  """Scaled dot-product multi-head attention and its output projection.

  Args:
    query_input: [B, Lq, H].
    bias: additive, broadcastable to [B, N, Lq, Lk].
    kv: (keys, values) [B, N, Lk, D]; None means self-attention over query_input.
  Returns:
    [B, Lq, H].
  """
  q = project_heads(query_input, "query", config)
  k, v = kv if kv is not None else key_values(query_input, config)
  # An einsum, not matmul: TF 2.15's oneDNN remapper fuses BatchMatMul * scale + a [1, 1, L, L]
  # addend (the causal bias) into one op that runs ~250x slower (benchmarks/bench_eval_speed.py).
  if config.scaled_attention:  # on q, [B, N, Lq, D], not on the scores (as in BERT's)
    q *= config.head_size ** -0.5
  scores = tf.einsum("bnqd,bnkd->bnqk", q, k)  # [B, N, Lq, Lk]
  probs = tf.nn.softmax(tf.cast(scores, tf.float32) + bias)  # float32: the -1e9 bias
  probs = dropout(tf.cast(probs, v.dtype), config.attention_dropout_rate, training)
  context = tf.transpose(tf.matmul(probs, v), [0, 2, 1, 3])  # [B, Lq, N, D]
  batch, length = tf.shape(query_input)[0], tf.shape(query_input)[1]
  context = tf.reshape(context, [batch, length, config.hidden_size])
  context.set_shape(query_input.shape)
  return _dense3d(context, config.hidden_size, "output", config,
                  use_bias=config.use_ffn_bias_in_attention)


def feed_forward(x, config: TransformerConfig, training: bool):
  """[B, L, H] -> relu(x W1 + b1) W2 + b2 -> [B, L, H]."""
  h = _dense3d(x, config.filter_size, "intermediate", config,
               activation=feed_forward_activation(config, training))
  h = dropout(h, config.dropout_rate, training)
  return _dense3d(h, config.hidden_size, "output", config)


def sublayer(x, fn, config: TransformerConfig, training: bool):
  """Residual block: post-norm LN(x + drop(fn(x))) or pre-norm x + drop(fn(LN(x))), fn's
  output dropped out and added in stream_dtype.  x [B, L, H] -> [B, L, H]: pre-norm
  stream_dtype -> stream_dtype; post-norm any float dtype -> the compute dtype."""
  eps, dtype, stream = config.layer_norm_epsilon, compute_dtype(config), stream_dtype(config)
  if config.pre_norm:
    y = fn(tf.cast(layer_norm(x, eps), dtype))
    return x + dropout(tf.cast(y, stream), config.dropout_rate, training)
  y = dropout(tf.cast(fn(tf.cast(x, dtype)), stream), config.dropout_rate, training)
  return tf.cast(layer_norm(tf.cast(x, stream) + y, eps), dtype)


def final_norm(x, config: TransformerConfig):
  """Pre-norm stacks end with a LayerNorm; post-norm outputs are normalized already.
  -> the compute dtype."""
  if not config.pre_norm:
    return tf.cast(x, compute_dtype(config))
  return tf.cast(layer_norm(x, config.layer_norm_epsilon, "final_norm"), compute_dtype(config))


# ---------------------------------------------------------------------------------------------
# Encoder and decoder


def encoder(source_ids, source_padding_mask, config: TransformerConfig, training: bool):
  """Source ids [B, S] -> encoder output [B, S, H] (scope `encoder`)."""
  source_table, _ = embedding_tables(config)
  bias = padding_bias(source_padding_mask)
  x = embed(source_ids, source_table, config, training)
  with tf1.variable_scope("encoder"):
    for i in range(config.num_encoder_layers):
      with tf1.variable_scope("layer_%d" % i):
        with tf1.variable_scope("self_attention"):
          x = sublayer(x, lambda h: attention(h, bias, config, training), config, training)
        with tf1.variable_scope("ffn"):
          x = sublayer(x, lambda h: feed_forward(h, config, training), config, training)
    return final_norm(x, config)


def decoder_layer(x, self_bias, cross_bias, cross_kv, config, training, self_kv_fn=None):
  """One decoder block.  x [B, L, H] -> [B, L, H].

  self_kv_fn(keys_values_of_x) -> (keys, values) lets decoding extend a cache; None means
  plain self-attention over x.
  """
  def self_attn(h):
    kv = None if self_kv_fn is None else self_kv_fn(key_values(h, config))
    return attention(h, self_bias, config, training, kv=kv)

  with tf1.variable_scope("self_attention"):
    x = sublayer(x, self_attn, config, training)
  with tf1.variable_scope("cross_attention"):
    x = sublayer(x, lambda h: attention(h, cross_bias, config, training, kv=cross_kv),
                 config, training)
  with tf1.variable_scope("ffn"):
    return sublayer(x, lambda h: feed_forward(h, config, training), config, training)


def cross_key_values(encoder_output, config: TransformerConfig):
  """Per decoder layer, keys/values of the encoder output (computed once for decoding)."""
  out = []
  with tf1.variable_scope("decoder", reuse=tf1.AUTO_REUSE):
    for i in range(config.num_decoder_layers):
      with tf1.variable_scope("layer_%d/cross_attention" % i):
        out.append(key_values(encoder_output, config))
  return out


def output_logits(x, config: TransformerConfig):
  """Decoder states [B, L, H] -> float32 logits [B, L, V] (tied to the target embeddings or
  not)."""
  _, target_table = embedding_tables(config)
  batch, length = tf.shape(x)[0], tf.shape(x)[1]
  flat = tf.reshape(x, [-1, config.hidden_size])
  if config.tie_output_projection:
    logits = tf.matmul(flat, tf.cast(target_table, flat.dtype), transpose_b=True)
  else:
    with tf1.variable_scope("decoder/output_projection", reuse=tf1.AUTO_REUSE):
      kernel = tf1.get_variable("kernel", [config.hidden_size, config.vocab_size],
                                initializer=initializer(config.initializer_range))
    logits = tf.matmul(flat, tf.cast(kernel, flat.dtype))
  logits = tf.reshape(tf.cast(logits, tf.float32), [batch, length, config.vocab_size])
  logits.set_shape(x.shape[:-1].concatenate([config.vocab_size]))
  return logits


def decoder(target_input_ids, encoder_output, source_padding_mask, config: TransformerConfig,
            training: bool):
  """Teacher-forced decoder: [B, T] ids ([START] y) -> final states [B, T, H] (scope
  `decoder`); output_logits makes the logits of them."""
  _, target_table = embedding_tables(config)
  x = embed(target_input_ids, target_table, config, training)
  self_bias = causal_bias(tf.shape(target_input_ids)[1])
  cross_bias = padding_bias(source_padding_mask)
  with tf1.variable_scope("decoder", reuse=tf1.AUTO_REUSE):
    for i in range(config.num_decoder_layers):
      with tf1.variable_scope("layer_%d" % i):
        with tf1.variable_scope("cross_attention"):
          cross_kv = key_values(encoder_output, config)
        x = decoder_layer(x, self_bias, cross_bias, cross_kv, config, training)
    return final_norm(x, config)


def init_cache(batch, max_length: int, config: TransformerConfig) -> Dict[str, tf.Tensor]:
  """Zeroed self-attention keys/values, fixed size: {layer_i/k, layer_i/v: [B, N, Tmax, D]}."""
  shape = [batch, config.num_heads, max_length, config.head_size]
  cache = {}
  for i in range(config.num_decoder_layers):
    cache["layer_%d/k" % i] = tf.zeros(shape, compute_dtype(config))
    cache["layer_%d/v" % i] = tf.zeros(shape, compute_dtype(config))
  return cache


def decode_step(ids, step, cache, cross_kv, cross_bias, config: TransformerConfig,
                max_length: int):
  """One cached decoder step (no dropout).

  Args:
    ids: [B, 1] int32, the token at position `step`.
    step: int32 scalar.
    cache: from `init_cache` (or a previous step); keys/values of positions < step.
    cross_kv: `cross_key_values(encoder_output)`; cross_bias [B, 1, 1, S].
  Returns:
    (logits [B, V] for position step + 1, the cache with position `step` written).
  """
  _, target_table = embedding_tables(config)
  x = embed(ids, target_table, config, False, start=step)
  # Keys 0..step are visible; later cache slots are still zero.
  positions = tf.range(max_length)
  self_bias = tf.where(positions <= step, 0.0, NEG_INF)[tf.newaxis, tf.newaxis, tf.newaxis, :]
  # The cache's column `step` by one select over it (four elementwise passes did the same).
  write = tf.equal(positions, step)[tf.newaxis, tf.newaxis, :, tf.newaxis]
  new_cache = dict(cache)
  with tf1.variable_scope("decoder", reuse=tf1.AUTO_REUSE):
    for i in range(config.num_decoder_layers):
      name = "layer_%d" % i

      def extend(kv, name=name):
        k = tf.where(write, kv[0], cache[name + "/k"])  # [B,N,1,D] broadcast over Tmax
        v = tf.where(write, kv[1], cache[name + "/v"])
        new_cache[name + "/k"], new_cache[name + "/v"] = k, v
        return k, v

      with tf1.variable_scope(name):
        x = decoder_layer(x, self_bias, cross_bias, cross_kv[i], config, False, extend)
    x = final_norm(x, config)
  return output_logits(x, config)[:, 0, :], new_cache


def transformer(source_ids, source_padding_mask, target_input_ids, config: TransformerConfig,
                training: bool) -> Dict[str, tf.Tensor]:
  """Full teacher-forced forward pass under scope `transformer`.

  Returns:
    {"encoder_output": [B, S, H], "decoder_output": [B, T, H], "logits": [B, T, V]}.
  """
  with tf1.variable_scope("transformer", reuse=tf1.AUTO_REUSE):
    enc = encoder(source_ids, source_padding_mask, config, training)
    dec = decoder(target_input_ids, enc, source_padding_mask, config, training)
    logits = output_logits(dec, config)
  return {"encoder_output": enc, "decoder_output": dec, "logits": logits}


def num_parameters(config: TransformerConfig) -> int:
  """Trainable parameter count, for reports and tests."""
  h, f, v = config.hidden_size, config.filter_size, config.vocab_size
  attn = 4 * (h * h + h) + 2 * h
  ffn = h * f + f + f * h + h + 2 * h
  emb = v * h * (1 if config.share_embedding_weights else 2)
  if config.position_embedding_type == "learned":
    emb += config.max_position_embeddings * h
  out = 0 if config.tie_output_projection else h * v
  final = 4 * h if config.pre_norm else 0
  return int(emb + config.num_encoder_layers * (attn + ffn)
             + config.num_decoder_layers * (2 * attn + ffn) + out + final)
