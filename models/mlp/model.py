"""MLP classifier on a deterministic synthetic task: a model_fn as a tf.estimator user writes it.

The task: features x ~ N(0, 1)^d, label = argmax(x @ W_true) for a fixed random W_true, so a
network can learn it and the loss must fall.
"""

import numpy as np
import tensorflow as tf

from cerebras_tf.core import batching
from cerebras_tf.runtime import precision
from cerebras_models import fields, optimization


def _flat(params):
  """Accepts flat params (plain Estimator users) or the nested YAML layout."""
  model = params.get("model", params)
  data = params.get("train_input", params)
  return model, data


def synthetic_data(num_examples: int, input_dim: int, num_classes: int, seed: int):
  """(x [N, input_dim] float32, y [N] int32) for the synthetic task, fixed by `seed`."""
  rng = np.random.RandomState(seed)
  w_true = np.random.RandomState(1234).randn(input_dim, num_classes).astype(np.float32)
  x = rng.randn(num_examples, input_dim).astype(np.float32)
  y = np.argmax(x @ w_true, axis=1).astype(np.int32)
  return x, y


def input_fn(params, mode=tf.estimator.ModeKeys.TRAIN):
  """tf.data pipeline: {"x": [B, d]}, labels [B]."""
  model, _ = _flat(params)
  section = params.get("eval_input" if mode == tf.estimator.ModeKeys.EVAL else "train_input", params)
  batch_size = params.get(batching.RESERVED_PARAMS_KEY) or section.get("batch_size", 32)
  n = section.get("num_examples", 4096)
  seed = 1 if mode == tf.estimator.ModeKeys.TRAIN else 2
  x, y = synthetic_data(n, model.get("input_dim", 32), model.get("num_classes", 4), seed)
  ds = tf.data.Dataset.from_tensor_slices(({"x": x}, y))
  if mode == tf.estimator.ModeKeys.TRAIN:
    ds = ds.shuffle(n, seed=seed).repeat()
  ds = ds.batch(batch_size, drop_remainder=mode == tf.estimator.ModeKeys.TRAIN)
  return ds.prefetch(fields.prefetch_batches(section, 2))


def model_fn(features, labels, mode, params):
  """Dense -> ReLU stack -> logits; softmax cross-entropy; the params' optimizer (Adam unset).

  `mixed_precision`: the Dense layers under Keras's mixed_bfloat16 policy (float32 variables,
  bfloat16 matmuls; float32 on a CPU without bf16 math), the logits cast to float32 for the
  softmax and the loss."""
  model, _ = _flat(params)
  policy = precision.keras_policy(model.get("mixed_precision"))
  hidden = model.get("hidden_sizes", [64, 64])
  seed = model.get("seed", 0)
  init = lambda i: tf.keras.initializers.GlorotUniform(seed=seed + i)  # noqa: E731 reproducible
  x = features["x"]
  activation = {"linear": None}.get(model.get("activation_fn", "relu"),
                                    model.get("activation_fn", "relu"))
  rate = float(model.get("dropout") or 0.0)
  training = mode == tf.estimator.ModeKeys.TRAIN
  for i, h in enumerate(hidden):
    x = tf.keras.layers.Dense(h, activation=activation, kernel_initializer=init(i),
                              name=f"dense_{i}", dtype=policy)(x)
    if rate:  # FC-MNIST's dropout after each hidden layer
      x = tf.keras.layers.Dropout(rate, seed=seed + i)(x, training=training)
  logits = tf.keras.layers.Dense(model.get("num_classes", 4), kernel_initializer=init(len(hidden)),
                                 name="logits", dtype=policy)(x)
  logits = tf.cast(logits, tf.float32)
  probs = tf.nn.softmax(logits)
  predictions = {"class": tf.argmax(logits, axis=-1), "probabilities": probs}
  if mode == tf.estimator.ModeKeys.PREDICT:
    return tf.estimator.EstimatorSpec(
        mode, predictions=predictions,
        export_outputs={"serving_default": tf.estimator.export.PredictOutput(predictions)})
  loss = tf.reduce_mean(
      tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
  # Every `optimizer` key of a params file (schedules, clipping, accumulation, ...), as the
  # other reference models; a flat Python params dict gives Adam at its `learning_rate`.
  opt = {"optimizer_type": "adam", "learning_rate": 1e-2, **params.get("optimizer", params)}
  total_steps = int((params.get("runconfig") or {}).get("max_steps") or 0)
  train_op, _ = optimization.build_train_op(loss, opt, total_steps)
  accuracy = tf.compat.v1.metrics.accuracy(labels, predictions["class"])
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op,
                                    eval_metric_ops={"accuracy": accuracy})
