"""`model_fn` for Linformer pretraining: masked LM (modelzoo's files: `disable_nsp: true`), plus
BERT's next-sentence head when disable_nsp is false. The heads and losses are models/bert's.

Features: see input.py. Params: `model` (BERT's keys, projected_dims, attention_style),
`optimizer` (models/optimization.py), `runconfig.max_steps` (its schedules).
"""

import tensorflow as tf

from cerebras_models import graph_mode
from cerebras_models import optimization
from cerebras_models.bert import heads
from cerebras_models.linformer import modeling
from cerebras_models.linformer.config import LinformerConfig
from cerebras_tf.runtime import checkpoints

tf1 = tf.compat.v1


def _losses(features, outputs, config, training, nsp, mlm_loss_weight):
  """(loss or None without labels, tensors): masked LM (+ NSP)."""
  head = heads.masked_lm_head(outputs["sequence_output"], features["masked_lm_positions"],
                              outputs["word_embeddings"], config)
  logits = heads.masked_lm_logits(head)                                 # [B*P, V]
  positions = features["masked_lm_positions"]
  t = {"masked_lm_predictions": tf.reshape(tf.argmax(logits, -1, output_type=tf.int32),
                                           [tf.shape(positions)[0], positions.shape[1]])}
  if nsp:
    nsp_log_probs = tf.nn.log_softmax(heads.next_sentence_logits(outputs["pooled_output"],
                                                                 config))  # [B, 2]
    t["next_sentence_predictions"] = tf.argmax(nsp_log_probs, -1, output_type=tf.int32)
  if "masked_lm_ids" not in features:
    return None, t
  loss, per_example = heads.masked_lm_loss(head, features["masked_lm_ids"],
                                           features["masked_lm_weights"], logits, training,
                                           mlm_loss_weight)
  t.update(masked_lm_loss=loss, masked_lm_example_loss=per_example)
  if nsp:
    labels = tf.cast(tf.reshape(features["next_sentence_label"], [-1]), tf.int32)
    t["next_sentence_loss"] = -tf.reduce_mean(tf.gather(nsp_log_probs, labels, batch_dims=1))
    loss += t["next_sentence_loss"]
  return loss, t


@graph_mode.model_fn_as_written
def model_fn(features, labels, mode, params, config=None):
  """tf.estimator model_fn (labels unused: the masked-LM targets are features)."""
  del labels
  model_params = params["model"]
  linformer_config = LinformerConfig.from_params(model_params)
  training = mode == tf.estimator.ModeKeys.TRAIN
  nsp = not model_params.get("disable_nsp")
  outputs = modeling.linformer_model(features, linformer_config, training, with_pooler=nsp)
  loss, t = _losses(features, outputs, linformer_config, training, nsp,
                    model_params.get("mlm_loss_weight"))
  init = model_params.get("init_checkpoint")
  model_dir = getattr(config, "model_dir", None)
  if init and not (model_dir and tf.train.latest_checkpoint(model_dir)):
    checkpoints.init_matching(init)

  if mode == tf.estimator.ModeKeys.PREDICT:
    preds = {k: v for k, v in t.items() if k.endswith("_predictions")}
    return tf.estimator.EstimatorSpec(mode, predictions=preds, export_outputs={
        tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY:
        tf.estimator.export.PredictOutput(preds)})
  if mode == tf.estimator.ModeKeys.EVAL:
    weights = tf.reshape(features["masked_lm_weights"], [-1])
    metrics = {
        "masked_lm_accuracy": tf1.metrics.accuracy(
            tf.reshape(features["masked_lm_ids"], [-1]),
            tf.reshape(t["masked_lm_predictions"], [-1]), weights=weights),
        "masked_lm_loss": tf1.metrics.mean(t["masked_lm_example_loss"], weights=weights)}
    return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops=metrics)
  steps = int((params.get("runconfig") or {}).get("max_steps") or 0)
  train_op, logs = optimization.build_train_op(loss, params["optimizer"], steps)
  tf1.summary.scalar("learning_rate", logs["learning_rate"])
  tf1.summary.scalar("masked_lm_loss", t["masked_lm_loss"])
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
