"""`model_fn` for the decoder-only GPT: next-token language modelling.

Features: token_ids [B, S] int32, padding_mask [B, S] int32. Labels: [B, S] int32, the next
token at each position (padding positions carry weight 0 through padding_mask).
"""

import tensorflow as tf

from cerebras_models import graph_mode
from cerebras_models import losses
from cerebras_models import optimization
from cerebras_models.gpt import modeling

tf1 = tf.compat.v1


def lm_loss(xent, weights, per: str = "num_tokens", loss_weight: float = 1.0):
  """The real positions' cross-entropy summed, over the real tokens (`num_tokens`: the
  weighted mean) or over the batch size times 1/loss_weight (`batch_size`, modelzoo's rule).
  xent/weights [B,S] -> scalar."""
  weights = tf.cast(weights, tf.float32)
  total = tf.reduce_sum(xent * weights)
  if per == "batch_size":
    return total * loss_weight / tf.cast(tf.shape(xent)[0], tf.float32)
  return total / (tf.reduce_sum(weights) + 1e-6)


@graph_mode.model_fn_as_written
def model_fn(features, labels, mode, params):
  config = modeling.GPTConfig.from_params(params["model"])
  training = mode == tf.estimator.ModeKeys.TRAIN
  hidden = modeling.gpt_hidden(features["token_ids"], features["padding_mask"], config, training)
  weights = features["padding_mask"]
  per = params["model"].get("loss_scaling") or "num_tokens"
  weight = float(params["model"].get("loss_weight") or 1.0)
  if training:  # no logits tensor: the head's loss and gradient come from the hidden states
    loss = lm_loss(modeling.lm_xent(hidden, labels, config), weights, per, weight)
    loss = _with_moe_loss(loss)
    total_steps = int((params.get("runconfig") or {}).get("max_steps") or 0)
    train_op, logs = optimization.build_train_op(loss, params["optimizer"], total_steps)
    tf1.summary.scalar("learning_rate", logs["learning_rate"])
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
  logits = modeling.lm_logits(hidden, config)
  predictions = {"next_token": tf.argmax(logits, axis=-1, output_type=tf.int32)}
  if mode == tf.estimator.ModeKeys.PREDICT:
    # After each row's last real token (right padding), not after its last padded slot.
    last = tf.maximum(tf.reduce_sum(tf.cast(features["padding_mask"], tf.int32), 1) - 1, 0)
    predictions["log_probs"] = tf.nn.log_softmax(tf.gather(logits, last, batch_dims=1))
    export = {tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY:
              tf.estimator.export.PredictOutput(predictions)}
    return tf.estimator.EstimatorSpec(mode, predictions=predictions, export_outputs=export)
  xent = losses.sparse_softmax_xent(logits, labels)
  loss = _with_moe_loss(lm_loss(xent, weights, per, weight))
  if mode == tf.estimator.ModeKeys.EVAL:
    metrics = {
        "accuracy": tf1.metrics.accuracy(labels, predictions["next_token"], weights=weights),
        "perplexity": _perplexity(lm_loss(xent, weights)),  # per token, whatever the scaling
    }
  return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops=metrics)


def _with_moe_loss(loss):
  """The LM loss plus the MoE layers' weighted load-balancing losses (none: unchanged)."""
  extra = tf1.get_collection(modeling.MOE_LOSSES)
  return loss + tf.add_n(extra) if extra else loss


def _perplexity(loss):
  mean_loss, update = tf1.metrics.mean(loss)
  return tf.exp(mean_loss), update
