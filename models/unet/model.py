"""`model_fn` for the UNet: per-pixel sigmoid cross-entropy against the defect mask (the mean
over the batch's pixels, modelzoo's SUM_OVER_BATCH_SIZE of the flattened logits), and in
eval modelzoo's metrics over the pixels: mIOU, DSC, MPCA, Acc (a pixel is predicted a defect
when its probability exceeds 1/2).

Features: {"image": [B, C, H, W] or [B, H, W, C]} (input.py); labels [B, H * W] float mask.
Predict: {"probabilities": [B, H, W] float32, "mask": [B, H, W] int32}.
"""

import tensorflow as tf

from cerebras_models import graph_mode
from cerebras_models import optimization
from cerebras_models.unet import modeling
from cerebras_models.unet.config import UNetConfig

tf1 = tf.compat.v1


def pixel_loss(logits, labels):
  """Mean sigmoid cross-entropy.  logits [B, H, W, 1], labels [B, H*W] -> scalar float32."""
  flat = tf.reshape(logits, [tf.shape(logits)[0], -1])
  return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
      labels=tf.cast(labels, tf.float32), logits=flat))


def dice_coefficient(labels, predictions, num_classes: int = 2):
  """Streaming Dice, modelzoo's: over the classes present, the mean of 2 * TP / (2 * TP + FP
  + FN) from the confusion matrix of all pixels seen. labels, predictions [N] int ->
  (value, update_op)."""
  cm = tf.math.confusion_matrix(labels, predictions, num_classes, dtype=tf.float32)
  mean_cm, update = tf1.metrics.mean_tensor(cm)  # the mean matrix: Dice is scale-free
  denominator = tf.reduce_sum(mean_cm, 0) + tf.reduce_sum(mean_cm, 1)
  valid = tf.cast(denominator > 0, tf.float32)
  dice = 2 * tf.linalg.diag_part(mean_cm) / tf.where(denominator > 0, denominator,
                                                     tf.ones_like(denominator))
  return tf.reduce_sum(dice * valid) / tf.maximum(tf.reduce_sum(valid), 1.0), update


def eval_metrics(logits, labels, names):
  truth = tf.cast(tf.reshape(labels, [-1]), tf.int32)
  predicted = tf.cast(tf.reshape(logits, [-1]) > 0, tf.int32)
  make = {
      "mIOU": lambda: ("mean_iou", tf1.metrics.mean_iou(truth, predicted, 2)),
      "DSC": lambda: ("dice_coefficient", dice_coefficient(truth, predicted)),
      "MPCA": lambda: ("mean_per_class_accuracy",
                       tf1.metrics.mean_per_class_accuracy(truth, predicted, 2)),
      "Acc": lambda: ("accuracy", tf1.metrics.accuracy(truth, predicted)),
  }
  return dict(make[name]() for name in names)


@graph_mode.model_fn_as_written
def model_fn(features, labels, mode, params, config=None):
  """tf.estimator model_fn (see the module doc)."""
  del config
  model_params = params["model"]
  images = features["image"] if isinstance(features, dict) else features
  logits = modeling.unet(images, UNetConfig.from_params(model_params))
  if mode == tf.estimator.ModeKeys.PREDICT:
    probs = tf.sigmoid(logits[..., 0])
    preds = {"probabilities": probs, "mask": tf.cast(logits[..., 0] > 0, tf.int32)}
    return tf.estimator.EstimatorSpec(mode, predictions=preds, export_outputs={
        tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY:
        tf.estimator.export.PredictOutput(preds)})
  loss = pixel_loss(logits, labels)
  if mode == tf.estimator.ModeKeys.EVAL:
    return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops=eval_metrics(
        logits, labels, model_params["eval_metrics"]))
  steps = int((params.get("runconfig") or {}).get("max_steps") or 0)
  train_op, logs = optimization.build_train_op(loss, params["optimizer"], steps)
  tf1.summary.scalar("learning_rate", logs["learning_rate"])
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
