"""`model_fn` for BERT pretraining (MLM + NSP) and sequence classification.

`params["model"]["task"]` picks the task: `pretraining` (default) or `classification`.

Features (from `models/bert/input.py`):
  token_ids, segment_ids, padding_mask       [B, S] int32
  masked_lm_positions, masked_lm_ids         [B, P] int32      (pretraining)
  masked_lm_weights                          [B, P] float32    (pretraining)
  next_sentence_label                        [B] int32         (pretraining)
  label                                      [B] int32         (classification; or `labels`)

Warm start: `model.init_checkpoint` (or `runconfig.init_checkpoint`) names a checkpoint whose
variables are restored by name into this graph with `tf.compat.v1.train.init_from_checkpoint`
(google-bert checkpoints load directly), unless the model_dir already has a checkpoint, which
the Estimator restores instead. Variables absent from the checkpoint, or of another
shape, keep their initializers (e.g. a fresh classifier head); the counts are logged.
"""

from typing import Any, Mapping, Optional

import tensorflow as tf

from cerebras_models.bert import heads
from cerebras_models.bert import input as input_lib
from cerebras_models.bert import modeling
from cerebras_models import optimization
from cerebras_tf.runtime import checkpoints

tf1 = tf.compat.v1

PRETRAINING = "pretraining"
CLASSIFICATION = "classification"


def _task(model_params: Mapping[str, Any]) -> str:
  task = model_params.get("task") or PRETRAINING
  if task not in (PRETRAINING, CLASSIFICATION):
    raise ValueError("model.task must be %s or %s, got %r" % (PRETRAINING, CLASSIFICATION, task))
  return task


def _pretraining(features, outputs, config, training, nsp: bool,
                 mlm_loss_weight: Optional[float] = None):
  """MLM heads, and the NSP head unless `nsp` is off (model.disable_nsp); returns
  (total_loss, tensors dict, heads.MaskedLMScores outside training or None).
  `mlm_loss_weight`: heads.masked_lm_loss's."""
  head = heads.masked_lm_head(outputs["sequence_output"], features["masked_lm_positions"],
                              outputs["word_embeddings"], config)
  mlm_logits = heads.masked_lm_logits(head)  # the fp32 training loss does not read it
  mlm_log_probs = tf.nn.log_softmax(mlm_logits, axis=-1)  # [B*P, V]
  positions = features["masked_lm_positions"]
  batch, preds = tf.shape(positions)[0], positions.shape[1]
  t = {
      "masked_lm_log_probs": tf.reshape(mlm_log_probs, [batch, preds, config.vocab_size]),
      "masked_lm_predictions": tf.reshape(tf.argmax(mlm_logits, -1, output_type=tf.int32),
                                          [batch, preds]),
  }
  if nsp:
    nsp_log_probs = tf.nn.log_softmax(
        heads.next_sentence_logits(outputs["pooled_output"], config), axis=-1)  # [B, 2]
    t.update(next_sentence_log_probs=nsp_log_probs,
             next_sentence_probabilities=tf.exp(nsp_log_probs),
             next_sentence_predictions=tf.argmax(nsp_log_probs, -1, output_type=tf.int32))
  if "masked_lm_ids" not in features:  # PREDICT without labels
    return None, t, None
  ids, weights = features["masked_lm_ids"], features["masked_lm_weights"]
  # Evaluation scores the labelled slots alone; masked_lm_predictions stays every slot's.
  scores = None if training else heads.masked_lm_scores(head, ids, weights)
  mlm_loss, mlm_example = heads.masked_lm_loss(
      head, ids, weights, mlm_logits, training, mlm_loss_weight,
      per_example=None if scores is None else scores.losses)
  t.update(masked_lm_loss=mlm_loss, masked_lm_example_loss=mlm_example)
  if not nsp:
    return mlm_loss, t, scores
  nsp_labels = tf.reshape(features["next_sentence_label"], [-1])
  nsp_example = -tf.gather(nsp_log_probs, tf.cast(nsp_labels, tf.int32), batch_dims=1)
  nsp_loss = tf.reduce_mean(nsp_example)
  t.update(next_sentence_loss=nsp_loss, next_sentence_example_loss=nsp_example)
  return mlm_loss + nsp_loss, t, scores


def _pretraining_metrics(features, t, scores: heads.MaskedLMScores):
  weights = tf.reshape(features["masked_lm_weights"], [-1])
  ids = tf.reshape(features["masked_lm_ids"], [-1])
  metrics = {
      "masked_lm_accuracy": tf1.metrics.accuracy(ids, scores.predictions, weights=weights),
      "masked_lm_loss": tf1.metrics.mean(t["masked_lm_example_loss"], weights=weights),
  }
  if "next_sentence_predictions" in t:
    metrics.update(
        next_sentence_accuracy=tf1.metrics.accuracy(
            tf.reshape(features["next_sentence_label"], [-1]), t["next_sentence_predictions"]),
        next_sentence_loss=tf1.metrics.mean(t["next_sentence_example_loss"]))
  return metrics


def _classification(features, labels, outputs, config, num_classes, training, rate=None):
  logits = heads.classifier_logits(outputs["pooled_output"], num_classes, config, training,
                                   rate)
  t = {"logits": logits, "probabilities": tf.nn.softmax(logits, axis=-1),
       "predictions": tf.argmax(logits, -1, output_type=tf.int32)}
  if labels is None:
    labels = features.get("label")
  if labels is None:
    return None, t, None
  loss, per_example = heads.classification_loss(logits, labels)
  t["example_loss"] = per_example
  return loss, t, tf.cast(tf.reshape(labels, [-1]), tf.int32)


def _largest_class_share(values, num_classes):
  """(running max over classes of the share of `values` equal to that class, update op).

  Of the labels: the accuracy of the best constant answer on the split evaluated (Rotten
  Tomatoes' dev split is 57.25% positive, not 50%). Of the predictions: 1.0 when the model
  answers one class for every example, the collapse a warm start can cause."""
  shares = [tf1.metrics.mean(tf.cast(tf.equal(values, c), tf.float32)) for c in range(num_classes)]
  return (tf.reduce_max(tf.stack([share for share, _ in shares])),
          tf.group(*[update for _, update in shares]))


def _classification_metrics(labels, t, num_classes):
  metrics = {  # "loss" is built in; the names sort the baseline beside the accuracy
      "accuracy": tf1.metrics.accuracy(labels, t["predictions"]),
      "accuracy_majority_baseline": _largest_class_share(labels, num_classes),
      "largest_predicted_class_share": _largest_class_share(t["predictions"], num_classes),
  }
  if num_classes == 2:  # F1 of the positive class; undefined as one number for more classes
    p, p_op = tf1.metrics.precision(labels, t["predictions"])
    r, r_op = tf1.metrics.recall(labels, t["predictions"])
    f1 = tf.math.divide_no_nan(2.0 * p * r, p + r)
    metrics.update(precision=(p, p_op), recall=(r, r_op), f1=(f1, tf.group(p_op, r_op)))
  return metrics


# Keys PREDICT yields by default; `model.predict_all_outputs: true` adds the hidden states.
_PREDICT_KEYS = {
    PRETRAINING: ("masked_lm_predictions", "next_sentence_probabilities",
                  "next_sentence_predictions"),
    CLASSIFICATION: ("probabilities", "predictions"),
}


def _has_checkpoint(run_config) -> bool:
  """Whether the Estimator will restore the model_dir's own checkpoint, which overrides a warm
  start (as tf.estimator's warm_start_from: later rounds of train_and_eval, eval, predict)."""
  model_dir = getattr(run_config, "model_dir", None)
  return bool(model_dir and tf.train.latest_checkpoint(model_dir))


def model_fn(features, labels, mode, params, config=None):
  """tf.estimator model_fn for BERT; see the module docstring for features and params.
  `config`: the Estimator's RunConfig (its model_dir decides whether a warm start applies)."""
  run_config = config
  model_params = params["model"]
  task = _task(model_params)
  config = modeling.BertConfig.from_params(model_params)
  training = mode == tf.estimator.ModeKeys.TRAIN

  nsp = task == PRETRAINING and not model_params.get("disable_nsp")
  outputs = modeling.bert_model(features["token_ids"], features["segment_ids"],
                                features["padding_mask"], config, training,
                                with_pooler=task == CLASSIFICATION or nsp)
  if task == PRETRAINING:
    loss, t, scores = _pretraining(features, outputs, config, training, nsp,
                                   model_params.get("mlm_loss_weight"))
    cls_labels = None
  else:
    num_classes = int(model_params.get("num_classes") or 2)
    loss, t, cls_labels = _classification(features, labels, outputs, config, num_classes,
                                          training, rate=model_params.get("cls_dropout_rate"))

  runconfig = params.get("runconfig") or {}
  init_checkpoint = model_params.get("init_checkpoint") or runconfig.get("init_checkpoint")
  if init_checkpoint and not _has_checkpoint(run_config):
    checkpoints.init_matching(init_checkpoint)

  # Everything computed, in float32; TRAIN/EVAL specs carry it too (the Estimator ignores
  # predictions there) so tests and debugging can fetch hidden states from one graph.
  everything = dict(t)
  everything.update({k: tf.cast(outputs[k], tf.float32)
                     for k in ("embedding_output", "sequence_output", "pooled_output")
                     if k in outputs})
  everything["all_encoder_layers"] = tf.cast(tf.stack(outputs["all_encoder_layers"], axis=1),
                                             tf.float32)  # [B, L, S, H]

  if mode == tf.estimator.ModeKeys.PREDICT:
    keys = [k for k in _PREDICT_KEYS[task] if k in everything]
    if model_params.get("predict_all_outputs"):
      keys = [k for k, v in everything.items() if v.shape.rank and v.shape.rank > 0]
    preds = {k: everything[k] for k in keys}
    if task == CLASSIFICATION:
      _, names = input_lib.classification_text(params)
      if names:  # trained on word labels (RTE's entailment): serve them too
        preds["classes"] = tf.gather(tf.constant(list(names)), t["predictions"])
    # export_saved_model's signature: the same tensors (probabilities for a classifier).
    export = {tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY:
              tf.estimator.export.PredictOutput(preds)}
    return tf.estimator.EstimatorSpec(mode, predictions=preds, export_outputs=export)

  if mode == tf.estimator.ModeKeys.EVAL:
    metrics = (_pretraining_metrics(features, t, scores) if task == PRETRAINING
               else _classification_metrics(cls_labels, t, num_classes))
    return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops=metrics,
                                      predictions=everything)

  total_steps = int(runconfig.get("max_steps") or 0)
  train_op, logs = optimization.build_train_op(loss, params["optimizer"], total_steps)
  tf1.summary.scalar("learning_rate", logs["learning_rate"])
  if task == PRETRAINING:
    tf1.summary.scalar("masked_lm_loss", t["masked_lm_loss"])
    if nsp:
      tf1.summary.scalar("next_sentence_loss", t["next_sentence_loss"])
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op, predictions=everything)
