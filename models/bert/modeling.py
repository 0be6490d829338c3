"""BERT encoder as small pure functions over tf.compat.v1 variable scopes.

Variable names and shapes follow the google-research/bert checkpoint layout exactly
(`bert/embeddings/word_embeddings`, `bert/encoder/layer_N/attention/self/query/kernel`, ...),
so released BERT checkpoints load by name through `tf.compat.v1.train.init_from_checkpoint`.

Shapes: B = batch, S = sequence length, H = hidden size, N = attention heads, D = H / N,
F = filter (intermediate) size, V = vocab size.

Precision: variables are always float32. With `dtype="bfloat16"` the matmuls (and the
activations between them) run in bfloat16; softmax, LayerNorm and the losses run in float32.
"""

import math
from typing import Any, Dict, List, Mapping

import tensorflow as tf

from cerebras_models import dropout as dropout_lib
from cerebras_models import embedding
from cerebras_models.bert.config import BertConfig  # the hyper-parameters, declared there
from cerebras_tf.runtime import bias_grad, precision

tf1 = tf.compat.v1

ATTENTION_MASK_ADDER = -10000.0


def compute_dtype(config: BertConfig) -> tf.DType:
  """The dtype the matmuls and activations run in (variables stay float32)."""
  return tf.as_dtype(config.dtype)


def activation(config: BertConfig):
  """The feed-forward activation model.encoder_nonlinearity names."""
  return ACTIVATIONS[config.encoder_nonlinearity]


# ---------------------------------------------------------------------------------------------
# Building blocks


_GELU_C = math.sqrt(2.0 / math.pi)
_GELU_A = 0.044715


@tf.custom_gradient
def gelu(x):
  """GELU, tanh approximation (what google-bert and its checkpoints were trained with).

  The forward pass is google-bert's expression (x^3 as grappler rewrites its pow, x^2 * x);
  the gradient is the derivative written out, cdf + x (1 - t^2) (c/2) (1 + 3 a x^2), in 6
  elementwise ops (TanhGrad gives x (1 - t^2) in one) where TensorFlow's chain rule took about
  a dozen: forward and backward at [4096, 512] alone 8.3 -> 4.7 ms on the AVX-512 host; in
  BERT-tiny's serialized fp32 step its two layers' GELUs 10.7 -> 9.8 ms (issue 42).

  Args:
    x: any shape, float dtype.
  Returns:
    the same shape and dtype.
  """
  x2, t = _gelu_tanh(x)
  cdf = 0.5 * (1.0 + t)

  def grad(dy):
    return dy * (cdf + tf.raw_ops.TanhGrad(y=t, dy=x) * _gelu_slope_factor(x2))

  return x * cdf, grad


def _gelu_tanh(x):
  """(x^2, tanh(c (x + a x^3))): the tanh form's inner part, x^3 as x^2 * x."""
  x2 = tf.square(x)
  return x2, tf.tanh(_GELU_C * (x + _GELU_A * (x2 * x)))


def _gelu_slope_factor(x2):
  """d/dx of c (x + a x^3), halved: the factor of x (1 - t^2) in GELU's derivative."""
  return 0.5 * _GELU_C + 1.5 * _GELU_C * _GELU_A * x2


# Both compute in float32 whatever x's dtype, casting inside the compiled function: XLA's CPU
# code for bfloat16 elementwise math is ~3x slower than float32's plus the two converts
# (forward and backward at [4096, 512] in bfloat16: 9.1-9.7 -> 2.8-3.7 ms, Intel host with
# AMX, issue 42), and float32 intermediates round once instead of at every op.
@tf.function(jit_compile=True, autograph=False)
def _gelu_forward_fused(x):
  x32 = tf.cast(x, tf.float32)
  _, t = _gelu_tanh(x32)
  return tf.cast(x32 * (0.5 * (1.0 + t)), x.dtype)


@tf.function(jit_compile=True, autograph=False)
def _gelu_backward_fused(dy, x):
  x32 = tf.cast(x, tf.float32)
  x2, t = _gelu_tanh(x32)
  return tf.cast(tf.cast(dy, tf.float32)
                 * (0.5 * (1.0 + t) + (1.0 - t * t) * x32 * _gelu_slope_factor(x2)), x.dtype)


@tf.custom_gradient
def gelu_fused(x):
  """gelu(x) with its forward and its backward each one XLA-compiled function: XLA fuses the
  ~15 elementwise passes over x into one loop each, and the backward recomputes tanh from x
  instead of reading stored intermediates. At [4096, 512] (BERT-tiny's feed-forward), forward
  and backward 1.9-2.1 ms against gelu's 6.5 on the Intel AVX-512 host (issue 42); values within
  2e-6 of gelu's. Each new graph compiles the two functions once per shape (about 50 ms), so
  the training graph uses it only where the shape is static (feed_forward_activation).

  Args:
    x: any fully defined shape, float dtype.
  Returns:
    the same shape and dtype.
  """
  return _gelu_forward_fused(x), lambda dy: _gelu_backward_fused(dy, x)


def feed_forward_activation(config, training: bool):
  """The activation `config.encoder_nonlinearity` names, for a feed-forward layer of BERT, GPT
  or the Transformer. In a host training graph GELU on a static shape is gelu_fused; the plain
  ops everywhere else: evaluation and prediction (an exported SavedModel needs no XLA), shapes
  not fully defined (each would compile again) and the engine's trace (the compiler checks
  every op against the engine's kernels; XLA's function call is none of them)."""
  plain = ACTIVATIONS[config.encoder_nonlinearity]
  if not training or config.encoder_nonlinearity != "gelu":
    return plain

  def host_training(x):
    if x.shape.is_fully_defined() and not precision.in_engine_trace():
      return gelu_fused(x)
    return plain(x)

  return host_training


def gelu_erf(x):
  """Exact GELU, x * Phi(x). Not used by BERT; kept to test that the two differ."""
  return 0.5 * x * (1.0 + tf.math.erf(x / math.sqrt(2.0)))


ACTIVATIONS = {"gelu": gelu, "relu": tf.nn.relu, "tanh": tf.tanh}

def initializer(initializer_range):
  """A truncated normal of stddev `initializer_range`, or the initializer a plain spec names
  (tf_files.initializer_spec's {name, args}: modelzoo's initializer keys)."""
  if not isinstance(initializer_range, Mapping):
    return tf1.truncated_normal_initializer(stddev=initializer_range)
  spec = dict(initializer_range)
  name = spec.pop("name")
  make = {"truncated_normal": tf1.truncated_normal_initializer,
          "normal": tf1.random_normal_initializer,
          "uniform": tf1.random_uniform_initializer,
          "constant": tf1.constant_initializer,
          "glorot_uniform": tf1.glorot_uniform_initializer,
          "glorot_normal": tf1.glorot_normal_initializer,
          "variance_scaling": tf1.variance_scaling_initializer}[name]
  return make(**spec)


def dropout(x, rate: float, training: bool):
  """Dropout that is the identity outside training or at rate 0 (models/dropout.py)."""
  if not training or not rate:
    return x
  return dropout_lib.dropout(x, rate)


def layer_norm(x, epsilon: float, name: str = "LayerNorm"):
  """LayerNorm over the last axis, computed in float32.

  Args:
    x: [..., H] any float dtype.
  Returns:
    [..., H] float32; callers cast back to the compute dtype.
  """
  x = tf.cast(x, tf.float32)
  width = x.shape[-1]
  with tf1.variable_scope(name):
    beta = tf1.get_variable("beta", [width], initializer=tf1.zeros_initializer())
    gamma = tf1.get_variable("gamma", [width], initializer=tf1.ones_initializer())
    return _normalized(x, tf.convert_to_tensor(gamma), tf.convert_to_tensor(beta),
                       tf.constant(epsilon, tf.float32))


@tf.custom_gradient
def _normalized(x, gamma, beta, epsilon):
  """(x - mean) / sqrt(var + epsilon) * gamma + beta over the last axis, with its own gradient.

  Args:
    x: [..., H] float32.  gamma, beta: [H] float32.  epsilon: a float32 scalar tensor.
  Returns:
    [..., H] float32.
  """
  mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
  rstd = tf.math.rsqrt(variance + epsilon)
  xhat = (x - mean) * rstd

  def grad(dy):
    # The textbook gradient in a few [..., H]-sized ops, where TensorFlow's gradient of
    # moments + batch_normalization chains many (Tile, RsqrtGrad, Neg, ...): forward and
    # backward 1.87 -> 1.27 ms at [4096, 128], 9.67 -> 7.52 ms at [4096, 512] on the AVX-512
    # host; BERT-tiny's fp32 step 1.04x (issue 42).
    dxhat = dy * gamma
    dx = rstd * (dxhat - tf.reduce_mean(dxhat, axis=-1, keepdims=True)
                 - xhat * tf.reduce_mean(dxhat * xhat, axis=-1, keepdims=True))
    rows = [-1, x.shape[-1]]
    return (dx, tf.reduce_sum(tf.reshape(dy * xhat, rows), 0),
            tf.reduce_sum(tf.reshape(dy, rows), 0), tf.zeros_like(epsilon))

  return xhat * gamma + beta, grad


def dense(x, units: int, name: str, initializer_range: float, activation=None,
          use_bias: bool = True):
  """`x @ kernel + bias` (no bias with use_bias=False) with float32 variables cast to x's
  dtype.

  Args:
    x: [M, K] (2-D; callers flatten batch and sequence first).
  Returns:
    [M, units] in x.dtype.
  """
  with tf1.variable_scope(name):
    kernel = tf1.get_variable("kernel", [x.shape[-1], units],
                              initializer=initializer(initializer_range))
    y = tf.matmul(x, tf.cast(kernel, x.dtype))
    if use_bias:
      y = bias_add(y, tf1.get_variable("bias", [units], initializer=tf1.zeros_initializer()))
    return activation(y) if activation is not None else y


def bias_add(y, bias):
  """y + bias (a float32 variable) over y's last axis, in y's dtype.  [..., N], [N] -> [..., N].
  A bfloat16 y's bias gradient is summed in float32 on the host (runtime/bias_grad.py: TF's CPU
  BiasAddGrad sums bfloat16 in bfloat16); the forward op is TF's BiasAdd either way."""
  with bias_grad.summed_in_float32(y.dtype):
    return tf.nn.bias_add(y, tf.cast(bias, y.dtype))


# ---------------------------------------------------------------------------------------------
# Embeddings


def embeddings(token_ids, segment_ids, config: BertConfig, training: bool):
  """Word + token-type (unless config.use_segment_embedding is off) + position embeddings,
  then LayerNorm and dropout.

  Args:
    token_ids: [B, S] int32.
    segment_ids: [B, S] int32 in [0, type_vocab_size); unread without segment embeddings.
  Returns:
    (embedding_output [B, S, H] compute dtype, word_embeddings variable [V, H] float32).
  """
  seq_len = token_ids.shape[1]
  if seq_len is not None and seq_len > config.max_position_embeddings:
    raise ValueError("sequence length %d exceeds max_position_embeddings %d"
                     % (seq_len, config.max_position_embeddings))
  init = initializer(config.initializer_range)
  with tf1.variable_scope("embeddings"):
    word_table = tf1.get_variable("word_embeddings",
                                  [config.vocab_size, config.hidden_size], initializer=init)
    type_table = tf1.get_variable("token_type_embeddings",
                                  [config.type_vocab_size, config.hidden_size],
                                  initializer=init) if config.use_segment_embedding else None
    position_table = tf1.get_variable("position_embeddings",
                                      [config.max_position_embeddings, config.hidden_size],
                                      initializer=init)
    # Sum order word + type + position matches google-bert, which keeps fp32 results bitwise.
    x = embedding.lookup(word_table, token_ids)
    if type_table is not None:
      x += embedding.lookup(type_table, segment_ids)
    x += position_table[tf.newaxis, :tf.shape(token_ids)[1], :]
    x = layer_norm(x, config.layer_norm_epsilon)
    x = dropout(x, config.dropout_rate, training)
  return tf.cast(x, compute_dtype(config)), word_table


# ---------------------------------------------------------------------------------------------
# Encoder


def attention_bias(padding_mask, dtype=tf.float32):
  """Additive attention bias from the key padding mask.

  Args:
    padding_mask: [B, S] int, 1 for real tokens, 0 for padding.
  Returns:
    [B, 1, 1, S]: 0 for real keys, -10000 for padded keys (broadcast over heads, queries).
  """
  mask = tf.cast(padding_mask, dtype)[:, tf.newaxis, tf.newaxis, :]
  return (1.0 - mask) * ATTENTION_MASK_ADDER


def _split_heads(x, batch, seq, num_heads, head_size):
  """[B*S, H] -> [B, N, S, D]."""
  x = tf.reshape(x, [batch, seq, num_heads, head_size])
  return tf.transpose(x, [0, 2, 1, 3])


def self_attention(x, bias, batch, seq, config: BertConfig, training: bool):
  """Multi-head scaled dot-product self-attention (scope `attention/self`).

  Args:
    x: [B*S, H] compute dtype.
    bias: [B, 1, 1, S] float32 additive mask from `attention_bias`.
  Returns:
    [B*S, H] context vectors, heads concatenated, before the output projection.
  """
  n, d = config.num_heads, config.hidden_size // config.num_heads
  r = config.initializer_range
  with tf1.variable_scope("self"):
    # 1 / sqrt(d) scales q, [B*S, H], rather than the scores, [B, N, S, S]: half the
    # elements at BERT-tiny's shape (forward and backward of a layer's attention 12.6 -> 11.9
    # ms, AVX2 host), and the same scores where d is a power of 4 (64: a scale of 1/8).
    q = dense(x, config.hidden_size, "query", r) * tf.constant(1.0 / math.sqrt(float(d)),
                                                               x.dtype)
    q = _split_heads(q, batch, seq, n, d)
    k = _split_heads(dense(x, config.hidden_size, "key", r), batch, seq, n, d)
    v = _split_heads(dense(x, config.hidden_size, "value", r), batch, seq, n, d)
    # An einsum, not matmul(q, k, transpose_b=True): TF 2.15's oneDNN remapper fuses
    # BatchMatMul * scale + bias into one op, slower than the three apart with BERT's
    # [B, 1, 1, S] bias (benchmarks/bench_eval_speed.py (b)); an einsum is left unfused.
    scores = tf.cast(tf.einsum("bnqd,bnkd->bnqk", q, k), tf.float32)  # [B, N, S, S]
    probs = tf.nn.softmax(scores + bias)
    probs = dropout(probs, config.attention_dropout_rate, training)
    context = tf.matmul(tf.cast(probs, x.dtype), v)  # [B, N, S, D]
    context = tf.transpose(context, [0, 2, 1, 3])
    return tf.reshape(context, [batch * seq, config.hidden_size])


def add_and_norm(x, residual, config: BertConfig, training: bool):
  """dropout(x) + residual, LayerNorm in float32, cast back.  [M, H] -> [M, H]."""
  # Dropout after the cast: a bfloat16 x would be cast to float32 and back inside it
  # (models/dropout.py drops 16-bit tensors out in float32, for the exact scale).
  x = dropout(tf.cast(x, tf.float32), config.dropout_rate, training)
  y = layer_norm(x + tf.cast(residual, tf.float32), config.layer_norm_epsilon)
  return tf.cast(y, compute_dtype(config))


def transformer_layer(x, bias, batch, seq, config: BertConfig, training: bool,
                      attention=None):
  """One post-LN transformer block (scopes `attention/...`, `intermediate`, `output`).

  Args:
    x: [B*S, H] compute dtype.
    bias: [B, 1, 1, S] float32.
    attention: another self-attention of self_attention's signature and shapes (Linformer's
      projected one); None: self_attention.
  Returns:
    [B*S, H] compute dtype.
  """
  r = config.initializer_range
  with tf1.variable_scope("attention"):
    context = (attention or self_attention)(x, bias, batch, seq, config, training)
    with tf1.variable_scope("output"):
      attn = add_and_norm(dense(context, config.hidden_size, "dense", r), x, config, training)
  with tf1.variable_scope("intermediate"):
    inner = dense(attn, config.filter_size, "dense", r,
                  activation=feed_forward_activation(config, training))
  with tf1.variable_scope("output"):
    return add_and_norm(dense(inner, config.hidden_size, "dense", r), attn, config, training)


def encoder(x, padding_mask, config: BertConfig, training: bool,
            attention=None) -> List[tf.Tensor]:
  """Stack of `num_hidden_layers` transformer layers (scope `encoder/layer_N`).

  Args:
    x: [B, S, H] embedding output.
    padding_mask: [B, S] int.
    attention: transformer_layer's (None: self_attention).
  Returns:
    list of num_hidden_layers tensors [B, S, H], one per layer output.
  """
  batch, seq = tf.shape(x)[0], tf.shape(x)[1]
  static = x.shape.as_list()
  bias = attention_bias(padding_mask)
  h = tf.reshape(x, [-1, config.hidden_size])  # 2-D between layers avoids reshapes per matmul
  outputs = []
  with tf1.variable_scope("encoder"):
    for i in range(config.num_hidden_layers):
      with tf1.variable_scope("layer_%d" % i):
        h = transformer_layer(h, bias, batch, seq, config, training, attention)
        out = tf.reshape(h, [batch, seq, config.hidden_size])
        out.set_shape(static)
        outputs.append(out)
  return outputs


def pooler(sequence_output, config: BertConfig, padding_mask=None):
  """Dense (scope `pooler/dense`, tanh unless the config says) on the first ([CLS]) token, or
  with `pooling: mean` on the mean over the real tokens (padding_mask [B, S], 1 = real).
  [B, S, H] -> [B, H]."""
  with tf1.variable_scope("pooler"):
    if config.pooling == "mean":
      mask = tf.cast(padding_mask, sequence_output.dtype)[:, :, tf.newaxis]
      summary = tf.reduce_sum(sequence_output * mask, 1) / tf.maximum(tf.reduce_sum(mask, 1), 1)
    else:
      summary = sequence_output[:, 0, :]
    return dense(summary, config.hidden_size, "dense", config.initializer_range,
                 activation=ACTIVATIONS[config.pooler_nonlinearity])


def bert_model(token_ids, segment_ids, padding_mask, config: BertConfig,
               training: bool, with_pooler: bool = True, attention=None) -> Dict[str, Any]:
  """The BERT backbone under scope `bert`.

  Args:
    token_ids: [B, S] int32.
    segment_ids: [B, S] int32.
    padding_mask: [B, S] int32, 1 = real token.
    config: BertConfig.
    training: True only in TRAIN mode (turns dropout on).
    with_pooler: build `bert/pooler` (what the next-sentence and classifier heads read).
    attention: transformer_layer's (None: self_attention; Linformer passes its own).
  Returns:
    dict with
      embedding_output [B, S, H], all_encoder_layers (list of [B, S, H]),
      sequence_output [B, S, H], pooled_output [B, H] (with_pooler; all in compute dtype) and
      word_embeddings, the float32 [V, H] table (tied to the MLM output layer).
  """
  with tf1.variable_scope("bert"):
    emb, word_table = embeddings(token_ids, segment_ids, config, training)
    layers = encoder(emb, padding_mask, config, training, attention)
    out = {"embedding_output": emb, "all_encoder_layers": layers,
           "sequence_output": layers[-1], "word_embeddings": word_table}
    if with_pooler:
      out["pooled_output"] = pooler(layers[-1], config, padding_mask)
  return out


def num_parameters(config: BertConfig) -> int:
  """Backbone parameter count (no heads), for reports and tests."""
  h, f, l = config.hidden_size, config.filter_size, config.num_hidden_layers
  types = config.type_vocab_size if config.use_segment_embedding else 0
  emb = (config.vocab_size + config.max_position_embeddings + types) * h + 2 * h
  layer = 4 * (h * h + h) + 2 * h + (h * f + f) + (f * h + h) + 2 * h
  return int(emb + l * layer + h * h + h)

