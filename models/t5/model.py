"""`model_fn` for T5 on the span-corruption objective (models/t5/input.py).

Features: encoder_input_ids, encoder_mask [B, S]; decoder_input_ids, decoder_mask [B, T].
Labels: decoder target ids [B, T].

TRAIN  cross-entropy of the decoder's predictions, the mean over real target tokens
       (decoder_mask); modelzoo's default scaling, precomputed_num_masked, is the same mean.
EVAL   loss, token accuracy, perplexity (exp of the mean cross-entropy over the eval run).
T5 in modelzoo trains and evaluates only; so does this one (predict is refused by the params
check).
"""

import tensorflow as tf

from cerebras_models import graph_mode
from cerebras_models import losses
from cerebras_models import optimization
from cerebras_models.t5 import input as input_lib
from cerebras_models.t5 import modeling
from cerebras_tf.runtime import precision

tf1 = tf.compat.v1
ModeKeys = tf.estimator.ModeKeys


def masked_xent(logits, labels, mask):
  """logits [B, T, V] float32, labels [B, T] int32, mask [B, T] (1 = real)
  -> (mean over real tokens, per-token loss [B, T])."""
  per_token = losses.sparse_softmax_xent(logits, labels)
  weights = tf.cast(mask, tf.float32)
  return tf.reduce_sum(per_token * weights) / tf.maximum(tf.reduce_sum(weights), 1.0), per_token


@graph_mode.model_fn_as_written
def model_fn(features, labels, mode, params):
  """tf.estimator model_fn; see the module docstring."""
  vocab_size, _ = input_lib.vocabulary(params["train_input"])
  config = modeling.T5Config.from_params(params["model"], vocab_size)
  training = mode == ModeKeys.TRAIN
  x, table = modeling.t5_output_layer(features["encoder_input_ids"], features["encoder_mask"],
                                      features["decoder_input_ids"], config, training)
  logits = modeling.t5_logits(x, table)
  mask = features["decoder_mask"]
  if training and not precision.in_engine_trace():
    # On the host, the loss from the output layer directly (no [B*T, V] gradient tensor), on
    # the real target tokens only: T5-tiny's serialized step 222 -> 195 ms. The logits feed
    # the token-accuracy summary, on summary steps. The engine's trace keeps the logits form,
    # so its figures do not depend on how the host computes.
    with tf1.name_scope("t5/"):
      loss = losses.output_layer_token_mean(x, table, labels, mask)
  else:
    loss, per_token = masked_xent(logits, labels, mask)
  predictions = tf.argmax(logits, axis=-1, output_type=tf.int32)
  weights = tf.cast(mask, tf.float32)

  if mode == ModeKeys.EVAL:
    mean_xent = tf1.metrics.mean(per_token, weights=weights)
    metrics = {"token_accuracy": tf1.metrics.accuracy(labels, predictions, weights=weights),
               "cross_entropy": mean_xent,
               "perplexity": (tf.exp(mean_xent[0]), mean_xent[1])}
    return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops=metrics)

  runconfig = params.get("runconfig") or {}
  train_op, logs = optimization.build_train_op(loss, params["optimizer"],
                                               int(runconfig.get("max_steps") or 0))
  tf1.summary.scalar("learning_rate", logs["learning_rate"])
  correct = tf.cast(tf.equal(predictions, labels), tf.float32) * weights
  tf1.summary.scalar("token_accuracy",
                     tf.reduce_sum(correct) / tf.maximum(tf.reduce_sum(weights), 1.0))
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
