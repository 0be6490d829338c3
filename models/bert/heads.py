"""Task heads on top of the BERT backbone, with google-research/bert variable names.

  cls/predictions/transform/dense/{kernel,bias}        masked-LM transform (dense + GELU)
  cls/predictions/transform/LayerNorm/{gamma,beta}
  cls/predictions/output_bias [V]                      output matrix = tied word embeddings,
  cls/predictions/output_weights [V, H]                or this with share_embedding_weights: false
  cls/seq_relationship/output_{weights [2, H], bias [2]}  next-sentence prediction
  cls/classifier/output_{weights [C, H], bias [C]}     sequence classification (fine-tuning)

google-bert's run_classifier.py puts the classifier's `output_weights`/`output_bias` at the
top level; here they live under `cls/classifier` so they never collide with a pretraining
checkpoint's names and are simply left unmatched (freshly initialized) when warm-starting.

Logits, log-probs and losses are float32 whatever the compute dtype.
"""

from typing import NamedTuple, Optional

import tensorflow as tf

from cerebras_models import losses
from cerebras_models.bert import modeling

tf1 = tf.compat.v1


def gather_positions(sequence_output, positions):
  """Picks the hidden states at the given positions of each example.

  Args:
    sequence_output: [B, S, H].
    positions: [B, P] int32 indices into S.
  Returns:
    [B*P, H], example-major (example 0's P rows first).
  """
  batch, seq = tf.shape(sequence_output)[0], tf.shape(sequence_output)[1]
  width = sequence_output.shape[-1]
  offsets = tf.range(batch, dtype=positions.dtype)[:, tf.newaxis] * tf.cast(seq, positions.dtype)
  flat_positions = tf.reshape(positions + offsets, [-1])
  return tf.gather(tf.reshape(sequence_output, [-1, width]), flat_positions)


class MaskedLMScores(NamedTuple):
  """Each masked-LM slot's loss and predicted id (masked_lm_scores)."""
  losses: tf.Tensor       # [B*P] float32, 0 on the slots of weight 0
  predictions: tf.Tensor  # [B*P] int32, 0 on the slots of weight 0


class MaskedLMHead(NamedTuple):
  """The masked-LM head before its output layer: what the logits and the loss are made of."""
  x: tf.Tensor          # [B*P, H] compute dtype: transformed hidden states at the positions
  table: tf.Tensor      # [V, H] float32: the tied word embeddings, or the head's own matrix
  bias: tf.Variable     # [V] float32: cls/predictions/output_bias
  scope: str            # "cls/predictions/": the output layer's ops belong to this layer


def masked_lm_head(sequence_output, positions, word_embeddings, config) -> MaskedLMHead:
  """Masked-LM head (scope `cls/predictions`) up to the output layer.

  Args:
    sequence_output: [B, S, H] compute dtype.
    positions: [B, P] int32 (`masked_lm_positions`).
    word_embeddings: [V, H] float32 variable from the backbone (the output matrix when
      config.share_embedding_weights; else the head makes `output_weights` of that shape).
    config: modeling.BertConfig.
  """
  with tf1.variable_scope("cls/predictions") as scope:
    x = gather_positions(sequence_output, positions)
    with tf1.variable_scope("transform"):
      x = modeling.dense(x, config.hidden_size, "dense", config.initializer_range,
                         activation=modeling.activation(config))
      x = tf.cast(modeling.layer_norm(x, config.layer_norm_epsilon), modeling.compute_dtype(config))
    table = word_embeddings
    if not config.share_embedding_weights:
      table = tf1.get_variable("output_weights", [config.vocab_size, config.hidden_size],
                               initializer=modeling.initializer(config.initializer_range))
    bias = tf1.get_variable("output_bias", [config.vocab_size],
                            initializer=tf1.zeros_initializer())
    return MaskedLMHead(x, table, bias, scope.original_name_scope)


def masked_lm_logits(head: MaskedLMHead):
  """[B*P, V] float32 logits: x @ table^T + bias."""
  with tf1.name_scope(head.scope):
    logits = tf.matmul(head.x, tf.cast(head.table, head.x.dtype), transpose_b=True)
    return tf.nn.bias_add(tf.cast(logits, tf.float32), head.bias)


def masked_lm_loss(head: MaskedLMHead, label_ids, label_weights, logits, training: bool,
                   loss_weight: Optional[float] = None, per_example=None):
  """google-bert's weighted masked-LM loss.

  Args:
    head: from masked_lm_head.
    label_ids: [B, P] int (`masked_lm_ids`).
    label_weights: [B, P] float, 0 for padded prediction slots.
    logits: [B*P, V] float32, from masked_lm_logits(head).
    training: the head then takes its loss from the output layer directly
      (losses.dense_sparse_softmax_xent), whose gradient skips the [B*P, V] d(logits), on the
      slots of nonzero weight only (losses.on_weighted_rows: the padded slots' losses are
      0 instead of multiplied by 0); the logits are left unused (not for a 16-bit model
      traced for the engine: losses.host_output_layer).
    loss_weight: None for google-bert's mean over the real slots; a number for modelzoo's
      `mlm_loss_weight`: sum(w * l) / B * loss_weight.
    per_example: [B*P] float32 losses computed already (evaluation's masked_lm_scores); then
      only their weighted mean is made here.
  Returns:
    (loss scalar, per_example_loss [B*P]). loss = sum(w * l) / (sum(w) + 1e-5).
  """
  ids = tf.reshape(label_ids, [-1])
  weights = tf.cast(tf.reshape(label_weights, [-1]), tf.float32)
  if per_example is None and training and losses.host_output_layer(head.x):
    with tf1.name_scope(head.scope):
      per_example = losses.on_weighted_rows(
          lambda x, labels: losses.dense_sparse_softmax_xent(x, head.table, head.bias, labels),
          weights, head.x, ids)
  elif per_example is None:
    per_example = losses.sparse_softmax_xent(logits, ids)
  if loss_weight is None:
    loss = tf.reduce_sum(weights * per_example) / (tf.reduce_sum(weights) + 1e-5)
  else:
    batch = tf.cast(tf.shape(label_ids)[0], tf.float32)
    loss = tf.reduce_sum(weights * per_example) / batch * loss_weight
  return loss, per_example


def masked_lm_scores(head: MaskedLMHead, label_ids, label_weights):
  """What evaluation reads of the masked-LM head: each slot's loss and predicted id, computed
  on the slots of nonzero weight only (losses.on_weighted_rows); 0 on the others, which every
  metric weighs by 0. The output layer over all B*P slots is most of BERT-tiny's eval step,
  and half the slots are padding on the demo's data.

  Args:
    head: from masked_lm_head.
    label_ids: [B, P] int (`masked_lm_ids`).  label_weights: [B, P] float.
  Returns:
    MaskedLMScores.
  """

  def per_row(x, ids):
    logits = masked_lm_logits(head._replace(x=x))
    return losses.sparse_softmax_xent(logits, ids), tf.argmax(logits, -1, output_type=tf.int32)

  with tf1.name_scope(head.scope):
    return MaskedLMScores(*losses.on_weighted_rows(
        per_row, tf.reshape(label_weights, [-1]), head.x, tf.reshape(label_ids, [-1])))


def next_sentence_logits(pooled_output, config):
  """Next-sentence head (scope `cls/seq_relationship`).  [B, H] -> [B, 2] float32."""
  return _linear_classifier(pooled_output, 2, "cls/seq_relationship", config)


def classifier_logits(pooled_output, num_classes, config, training, rate=None):
  """Sequence-classification head (scope `cls/classifier`), dropout on the pooled output.

  Args:
    pooled_output: [B, H] compute dtype.
  Returns:
    [B, num_classes] float32.
  """
  x = modeling.dropout(pooled_output, config.dropout_rate if rate is None else rate, training)
  return _linear_classifier(x, num_classes, "cls/classifier", config)


def _linear_classifier(x, num_classes, scope, config):
  """`x @ output_weights^T + output_bias` with google-bert's [C, H] weight layout."""
  with tf1.variable_scope(scope):
    weights = tf1.get_variable("output_weights", [num_classes, config.hidden_size],
                               initializer=modeling.initializer(config.initializer_range))
    bias = tf1.get_variable("output_bias", [num_classes], initializer=tf1.zeros_initializer())
    logits = tf.matmul(x, tf.cast(weights, x.dtype), transpose_b=True)
    return tf.nn.bias_add(tf.cast(logits, tf.float32), bias)


def classification_loss(logits, labels):
  """Mean softmax cross-entropy.  logits [B, C] float32, labels [B] int -> (loss, [B])."""
  log_probs = tf.nn.log_softmax(logits, axis=-1)
  per_example = -tf.gather(log_probs, tf.cast(tf.reshape(labels, [-1]), tf.int32), batch_dims=1)
  return tf.reduce_mean(per_example), per_example
