"""Decoder-only GPT backbone: GPT-2/GPT-3 (learned positions, sequential attention then FFN),
GPT-J (rotary positions, attention and FFN in parallel off one LayerNorm), and LLaMA's
variations, as modelzoo's keys name them: RMSNorm (`norm_type`), a SwiGLU FFN
(`nonlinearity`), grouped-query attention (`num_kv_groups` K/V heads), no biases
(`use_ffn_bias`, `use_projection_bias_in_attention`, `use_ffn_bias_in_attention`,
`use_bias_in_output`) and the rotary base (`rope_theta`).

Small pure functions in the google-research/bert style; building blocks come from
`cerebras_models.bert.modeling` so the two families share one dense / LayerNorm / dropout.
Variable scopes: `gpt/embeddings/{word,position}_embeddings`, `gpt/decoder/layer_N/
{ln_1, attention/{query,key,value,output}, ln_2, mlp/{fc_in,fc_gate (SwiGLU),fc_out}}`,
`gpt/ln_f`, `gpt/lm_head`.
"""

import dataclasses
import math
from typing import Any, Mapping, NamedTuple, Optional

import numpy as np
import tensorflow as tf

from cerebras_models import embedding, losses
from cerebras_models.bert.modeling import (ACTIVATIONS, bias_add, dense, dropout,
                                               feed_forward_activation, initializer,
                                               layer_norm)
from cerebras_models.gpt.config import GPTConfig  # the hyper-parameters, declared there
from cerebras_tf.runtime import precision

tf1 = tf.compat.v1


def compute_dtype(config: GPTConfig) -> tf.DType:
  """The dtype the matmuls run in (variables stay float32)."""
  return tf.as_dtype(config.dtype)


def stream_dtype(config: GPTConfig) -> tf.DType:
  """The residual stream's dtype (precision.stream_dtype): float32 on the host."""
  return tf.as_dtype(precision.stream_dtype(config.dtype))


def causal_bias(padding_mask, seq: int):
  """[B, 1, S, S] additive bias: -1e4 above the diagonal and on padded keys, else 0.

  Args:
    padding_mask: [B, S] int, 1 for real tokens.
  """
  # Built in the graph from two [S] ranges: a numpy [S, S] constant is 64 GiB on the host at
  # 131,072 tokens (Llama-3.1 at 128k) before anything runs.
  positions = tf.range(seq)
  causal = tf.cast(positions[tf.newaxis, :] > positions[:, tf.newaxis], tf.float32) * -10000.0
  pad = (1.0 - tf.cast(padding_mask, tf.float32))[:, tf.newaxis, tf.newaxis, :] * -10000.0
  return causal[tf.newaxis, tf.newaxis] + pad


def rotary_frequencies(rotary_dim: int, theta: float = 10000.0, factor: float = 1.0,
                       kind: str = "linear", extra: Optional[Mapping[str, float]] = None):
  """[rotary_dim / 2] angular frequencies, base `theta` (LLaMA-3's 500,000). With a scaling
  `factor` for a longer context: "linear" divides every frequency by it; "llama3" (Llama 3.1)
  divides the low frequencies (wavelength above original / low_freq_factor), keeps the high
  ones (below original / high_freq_factor) and blends in between."""
  inv_freq = 1.0 / (theta ** (np.arange(0, rotary_dim, 2) / rotary_dim))
  if factor == 1.0:
    return inv_freq
  if kind == "linear":
    return inv_freq / factor
  low, high = extra["low_freq_factor"], extra["high_freq_factor"]
  original = extra["original_max_position_embeddings"]
  wavelen = 2 * math.pi / inv_freq
  smooth = np.clip((original / wavelen - low) / (high - low), 0.0, 1.0)
  return (1 - smooth) * inv_freq / factor + smooth * inv_freq


def rotary(x, rotary_dim: int, theta: float = 10000.0, inv_freq=None):
  """Rotary position embedding on the first `rotary_dim` features of each head (GPT-J style;
  `inv_freq` from rotary_frequencies, else unscaled with base `theta`).

  Args:
    x: [B, S, N, D].
  Returns:
    [B, S, N, D] with rotated leading features.
  """
  seq = x.shape[1]
  if inv_freq is None:
    inv_freq = rotary_frequencies(rotary_dim, theta)
  angles = np.einsum("s,f->sf", np.arange(seq), inv_freq)            # [S, R/2]
  sin = np.repeat(np.sin(angles), 2, axis=-1)[None, :, None, :].astype(np.float32)
  cos = np.repeat(np.cos(angles), 2, axis=-1)[None, :, None, :].astype(np.float32)
  if sin.nbytes >= 1 << 20:  # long contexts: one table per graph, not per call
    sin, cos = _shared_constant(sin, "rotary_sin"), _shared_constant(cos, "rotary_cos")
  rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
  even, odd = rot[..., 0::2], rot[..., 1::2]
  rotated = tf.reshape(tf.stack([-odd, even], axis=-1), tf.shape(rot))  # pairs (x1,x2)->(-x2,x1)
  rot = rot * tf.cast(cos, x.dtype) + rotated * tf.cast(sin, x.dtype)
  return tf.concat([rot, rest], axis=-1)


def _shared_constant(value: np.ndarray, name: str):
  """One graph constant per distinct `value` in the default graph: Mixtral's 32,768-position
  rotary tables are 16 MB each, and one per layer would pass TF's 2 GB graph limit."""
  graph = tf1.get_default_graph()
  ref = graph.get_collection_ref("gpt_shared_constants")
  if not ref:
    ref.append({})
  cache = ref[0]
  key = (name, value.shape, value.tobytes()[:64], float(value.sum()))
  if key not in cache:
    with graph.as_default(), tf1.name_scope(None):
      cache[key] = tf.constant(value, name=name)
  return cache[key]


def attention(x, bias, batch, seq: int, config: GPTConfig, training: bool):
  """Causal multi-head self-attention (scope `attention`); with num_kv_groups < num_heads,
  grouped-query: each K/V head serves num_heads / num_kv_groups query heads.
  [B*S, H] -> [B*S, H]."""
  n, d, r = config.num_heads, config.hidden_size // config.num_heads, config.init("layers")
  kv = config.kv_heads
  with tf1.variable_scope("attention"):
    def heads(name, count):
      y = dense(x, count * d, name, r, use_bias=config.use_projection_bias_in_attention)
      return tf.reshape(y, [batch, seq, count, d])
    q, k, v = heads("query", n), heads("key", kv), heads("value", kv)
    if config.position_embedding_type == "rotary":
      freq = rotary_frequencies(config.rotary_dim, config.rope_theta, config.pos_scaling_factor,
                                config.pos_scaling_type, config.pos_scaling_extra_args)
      q, k = rotary(q, config.rotary_dim, inv_freq=freq), rotary(k, config.rotary_dim,
                                                                 inv_freq=freq)
    if kv != n:  # [B, S, kv, D] -> [B, S, n, D], each K/V head repeated for its group
      k, v = tf.repeat(k, n // kv, axis=2), tf.repeat(v, n // kv, axis=2)
    # the scale on q, [B, S, n, D], not on the scores, [B, n, S, S] (as in BERT's attention)
    q = q * tf.constant(1.0 / math.sqrt(d), q.dtype)
    scores = tf.cast(tf.einsum("bqnd,bknd->bnqk", q, k), tf.float32) + bias
    probs = dropout(tf.nn.softmax(scores), config.attention_dropout_rate, training)
    context = tf.einsum("bnqk,bknd->bqnd", tf.cast(probs, x.dtype), v)
    context = tf.reshape(context, [batch * seq, config.hidden_size])
    return dense(context, config.hidden_size, "output", config.output_range,
                 use_bias=config.use_ffn_bias_in_attention)


def mlp(x, config: GPTConfig, training: bool):
  """fc_in -> activation -> fc_out (scope `mlp`); SwiGLU: silu(fc_gate(x)) * fc_in(x) ->
  fc_out, dropped out.  [M, H] compute dtype -> [M, H] stream_dtype."""
  r, bias = config.init("layers"), config.use_ffn_bias
  with tf1.variable_scope("mlp"):
    if config.encoder_nonlinearity == "swiglu":
      gate = dense(x, config.filter_size, "fc_gate", r, activation=tf.nn.silu, use_bias=bias)
      h = gate * dense(x, config.filter_size, "fc_in", r, use_bias=bias)
    else:
      h = dense(x, config.filter_size, "fc_in", r,
                activation=feed_forward_activation(config, training), use_bias=bias)
    y = dense(h, config.hidden_size, "fc_out", config.output_range, use_bias=bias)
    return dropout(tf.cast(y, stream_dtype(config)), config.dropout_rate, training)


def expert_capacity(tokens: int, config: GPTConfig) -> int:
  """Slots per expert: ceil(capacity_factor x tokens x top_k / num_experts), at most the
  tokens (an expert takes each token once); dropless (no capacity_factor): every token."""
  if config.capacity_factor is None:
    return tokens
  return max(1, min(tokens, math.ceil(config.capacity_factor * tokens * config.top_k /
                                      config.num_experts)))


def _expert_weights(name, shape, r, dtype):
  return tf.cast(tf1.get_variable(name, shape, initializer=initializer(r)), dtype)


def moe_mlp(x, config: GPTConfig, training: bool):
  """A mixture of expert FFNs (scope `moe`): a learned router picks top_k of num_experts per
  token; tokens go to fixed expert slots (capacity) by a one-hot cumsum and a segment sum,
  the experts run as one batched matmul over [num_experts, capacity, H], and each token's
  outputs come back by a gather, weighted by its (renormalized) router probabilities.
  A token past an expert's capacity skips it (the residual carries it).

  Returns:
    ([M, H] in stream_dtype, the load-balancing loss: num_experts x sum_e f_e x P_e, f_e the
    share of routed slots given to expert e and P_e its mean router probability).
  """
  e, k, r = config.num_experts, config.top_k, config.initializer_range
  m, hidden = x.shape[0], config.hidden_size
  m = m if m is not None else tf.shape(x)[0]
  with tf1.variable_scope("moe"):
    router_in = tf.cast(x, tf.float32) if config.router_fp32 else x
    logits = dense(router_in, e, "router", r, use_bias=False)
    probs = tf.nn.softmax(tf.cast(logits, tf.float32))                   # [M, E]
    gate, chosen = tf.math.top_k(probs, k)                               # [M, k]
    if config.expert_weighting_normalization and k > 1:
      gate /= tf.reduce_sum(gate, -1, keepdims=True)
    # Choice-major: every token's first choice takes a slot before any second choice.
    expert_of = tf.reshape(tf.transpose(chosen), [-1])                   # [k*M]
    onehot = tf.one_hot(expert_of, e, dtype=tf.float32)                  # [k*M, E]
    position = tf.reduce_sum(tf.cumsum(onehot, axis=0, exclusive=True) * onehot, -1)
    capacity = expert_capacity(m, config) if isinstance(m, int) else m
    if not isinstance(m, int) and config.capacity_factor is not None:
      capacity = tf.cast(tf.math.ceil(config.capacity_factor * tf.cast(m * k, tf.float32) / e),
                         tf.int32)
    kept = position < tf.cast(capacity, tf.float32)
    slot = tf.where(kept, expert_of * capacity + tf.cast(position, tf.int32), -1)
    lb_loss = e * tf.reduce_sum(tf.reduce_mean(onehot, 0) * tf.reduce_mean(probs, 0))
    with tf1.variable_scope("experts"):
      routed = tf.tile(x, [k, 1])                                        # [k*M, H]
      slots = tf.math.unsorted_segment_sum(routed, slot, e * capacity)   # dropped: id -1
      h = tf.reshape(slots, [e, capacity, hidden])
      f, dt = config.filter_size, x.dtype
      bias = config.use_ffn_bias

      def project(h, name, units):
        y = tf.matmul(h, _expert_weights(name + "_kernel", [e, h.shape[-1], units], r, dt))
        if bias:
          y += tf.cast(tf1.get_variable(name + "_bias", [e, 1, units],
                                        initializer=tf1.zeros_initializer()), dt)
        return y
      if config.encoder_nonlinearity == "swiglu":
        h = tf.nn.silu(project(h, "fc_gate", f)) * project(h, "fc_in", f)
      else:
        h = ACTIVATIONS[config.encoder_nonlinearity](project(h, "fc_in", f))
      out = tf.reshape(project(h, "fc_out", hidden), [e * capacity, hidden])
      back = tf.gather(out, tf.maximum(slot, 0))                         # [k*M, H]
      weight = tf.reshape(tf.transpose(gate), [-1]) * tf.cast(kept, tf.float32)
      y = tf.reduce_sum(tf.reshape(back * tf.cast(weight[:, None], dt), [k, m, hidden]), 0)
    y = tf.cast(y, stream_dtype(config))
    if config.num_shared_experts:
      with tf1.variable_scope("shared"):
        shared = dataclasses.replace(config, filter_size=config.filter_size *
                                     config.num_shared_experts, dropout_rate=0.0)
        y += mlp(x, shared, training)
    return dropout(y, config.dropout_rate, training), lb_loss


def rms_norm(x, epsilon: float, name: str):
  """RMSNorm over the last axis in float32 (LLaMA): x / rms(x) * gamma, no mean, no beta.

  Args:
    x: [..., H] any float dtype.
  Returns:
    [..., H] float32.
  """
  x = tf.cast(x, tf.float32)
  with tf1.variable_scope(name):
    gamma = tf1.get_variable("gamma", [x.shape[-1]], initializer=tf1.ones_initializer())
    return x * tf.math.rsqrt(tf.reduce_mean(tf.square(x), -1, keepdims=True) + epsilon) * gamma


def _ln(x, name, config):
  norm = rms_norm if config.norm_type == "rmsnorm" else layer_norm
  return tf.cast(norm(x, config.layer_norm_epsilon, name), compute_dtype(config))


# The load-balancing losses of the MoE layers built in this graph, already weighted by
# load_balancing_loss_coef and averaged over the layers; model_fn adds their sum to the loss.
MOE_LOSSES = "gpt_moe_load_balancing_losses"


def _ffn(x, config: GPTConfig, training: bool):
  if not config.num_experts:
    return mlp(x, config, training)
  y, lb_loss = moe_mlp(x, config, training)
  if config.load_balancing_loss_coef:
    tf1.add_to_collection(MOE_LOSSES, lb_loss * (config.load_balancing_loss_coef /
                                                 config.num_hidden_layers))
  return y


def decoder_layer(x, bias, batch, seq: int, config: GPTConfig, training: bool):
  """One pre-LN block.  [B*S, H] stream_dtype -> [B*S, H] stream_dtype."""
  # Each sublayer's output is dropped out after its cast to the stream's dtype (here, and in
  # mlp and moe_mlp): in float32 on the host, with no cast there and back inside the dropout.
  def attended(h):
    return dropout(tf.cast(attention(h, bias, batch, seq, config, training), x.dtype),
                   config.dropout_rate, training)

  if config.parallel_attention:
    h = _ln(x, "ln_1", config)
    h_mlp = _ln(x, "ln_2", config) if config.use_untied_layer_norm else h
    return x + attended(h) + _ffn(h_mlp, config, training)
  x = x + attended(_ln(x, "ln_1", config))
  return x + _ffn(_ln(x, "ln_2", config), config, training)


class Hidden(NamedTuple):
  """The decoder's output before the LM head."""
  h: tf.Tensor                  # [B*S, H] compute dtype, after ln_f
  word_embeddings: tf.Variable  # [V, H] float32
  batch: Any                    # int, or a scalar tensor when B is unknown
  seq: int


def gpt_model(token_ids, padding_mask, config: GPTConfig, training: bool):
  """Token ids -> next-token logits.

  Args:
    token_ids: [B, S] int32 (S static).
    padding_mask: [B, S] int32, 1 for real tokens.
  Returns:
    logits [B, S, V] float32.
  """
  return lm_logits(gpt_hidden(token_ids, padding_mask, config, training), config)


def gpt_hidden(token_ids, padding_mask, config: GPTConfig, training: bool) -> Hidden:
  """Token ids [B, S] -> the final hidden states (scope `gpt`); see gpt_model. S must be
  static; B may be unknown (an eval's or predict's last, partial batch)."""
  batch, seq = token_ids.shape.as_list()
  if batch is None:
    batch = tf.shape(token_ids)[0]
  if seq > config.max_position_embeddings:
    raise ValueError(f"sequence length {seq} exceeds max_position_embeddings "
                     f"{config.max_position_embeddings}")
  init = initializer(config.init("embedding"))
  with tf1.variable_scope("gpt"):
    with tf1.variable_scope("embeddings"):
      word = tf1.get_variable("word_embeddings", [config.vocab_size, config.hidden_size],
                              initializer=init)
      x = embedding.lookup(word, token_ids)
      if config.learned_positions:
        pos = tf1.get_variable("position_embeddings",
                               [config.max_position_embeddings, config.hidden_size],
                               initializer=init)
        x += pos[tf.newaxis, :seq]
      rate = config.dropout_rate if config.embedding_dropout_rate is None \
          else config.embedding_dropout_rate
      x = dropout(tf.cast(x, stream_dtype(config)), rate, training)
    bias = causal_bias(padding_mask, seq)
    h = tf.reshape(x, [batch * seq, config.hidden_size])
    with tf1.variable_scope("decoder"):
      for i in range(config.num_hidden_layers):
        with tf1.variable_scope(f"layer_{i}"):
          h = decoder_layer(h, bias, batch, seq, config, training)
    h = _ln(h, "ln_f", config)
  return Hidden(h, word, batch, seq)


# The tied head's name scope: its own layer in the compiler's report (its weights stay with the
# embeddings); the fp32 logits, or the loss made from them, are made in it, so counted once.
LM_HEAD_SCOPE = "gpt/lm_head/"


def lm_logits(hidden: Hidden, config: GPTConfig):
  """[B, S, V] float32 next-token logits (tied to the word embeddings, or `gpt/lm_head`)."""
  shape = [hidden.batch, hidden.seq, config.vocab_size]
  if config.share_embedding_weights:
    bias = _tied_head_bias(config)
    with tf1.name_scope(LM_HEAD_SCOPE):  # the cast too: one tensor leaves the layer
      logits = tf.matmul(hidden.h, tf.cast(hidden.word_embeddings, hidden.h.dtype),
                         transpose_b=True)
      if bias is not None:
        logits = bias_add(logits, bias)
      return tf.reshape(tf.cast(logits, tf.float32), shape)
  # gpt/lm_head/{kernel,bias}, the ops in gpt/ as before the split
  with tf1.variable_scope("gpt", auxiliary_name_scope=False), tf1.name_scope("gpt/"):
    logits = dense(hidden.h, config.vocab_size, "lm_head", config.init("layers"),
                   use_bias=config.head_bias)
    return tf.reshape(tf.cast(logits, tf.float32), shape)


def _tied_head_bias(config: GPTConfig):
  """`gpt/lm_head/bias` [V] of a tied head that has one (modelzoo's GPT-J), else None."""
  if not config.head_bias:
    return None
  with tf1.variable_scope("gpt", reuse=tf1.AUTO_REUSE, auxiliary_name_scope=False), \
      tf1.variable_scope("lm_head", reuse=tf1.AUTO_REUSE):
    return tf1.get_variable("bias", [config.vocab_size], initializer=tf1.zeros_initializer())


def lm_xent(hidden: Hidden, labels, config: GPTConfig):
  """Per-position next-token cross-entropy [B, S] from the hidden states.

  A tied head takes losses.dense_sparse_softmax_xent (losses.host_output_layer): its gradient
  never forms the [B*S, V] d(logits). Otherwise the logits are made and
  losses.sparse_softmax_xent applied.
  """
  if config.share_embedding_weights and losses.host_output_layer(hidden.h):
    with tf1.name_scope(LM_HEAD_SCOPE):
      xent = losses.dense_sparse_softmax_xent(hidden.h, hidden.word_embeddings,
                                              _tied_head_bias(config),
                                              tf.reshape(labels, [-1]), scope=None)
    return tf.reshape(xent, [hidden.batch, hidden.seq])
  return losses.sparse_softmax_xent(lm_logits(hidden, config), labels)


def num_parameters(config: GPTConfig) -> int:
  """Trainable parameters, by formula (a check on the graph's count)."""
  h, f, v, layers = (config.hidden_size, config.filter_size, config.vocab_size,
                     config.num_hidden_layers)
  kv_width = config.kv_heads * (h // config.num_heads)
  qkv = (h * h + 2 * h * kv_width) + (h + 2 * kv_width) * config.use_projection_bias_in_attention
  out = h * h + h * config.use_ffn_bias_in_attention
  ffn_in = (2 if config.encoder_nonlinearity == "swiglu" else 1) * (h * f + f * config.use_ffn_bias)
  ffn_out = f * h + h * config.use_ffn_bias
  one_norm = config.parallel_attention and not config.use_untied_layer_norm
  norms = (1 if one_norm else 2) * (1 if config.norm_type == "rmsnorm" else 2)
  per_layer = qkv + out + ffn_in + ffn_out + norms * h
  emb = v * h + (config.max_position_embeddings * h if config.learned_positions else 0)
  head = (0 if config.share_embedding_weights else h * v) + v * config.head_bias
  ln_f = h * (1 if config.norm_type == "rmsnorm" else 2)
  return emb + layers * per_layer + ln_f + head
