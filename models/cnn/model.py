"""The digits CNN: a Keras Sequential model, put on the engine by cerebras_tf.keras_model.

Images are the 8x8 UCI digits (gray levels 0..16, scaled to [0, 1]) from
`acquire.ensure_datasets(["digits"])`: 1,437 training and 360 held-out test images.
"""

import numpy as np
import tensorflow as tf

from cerebras_tf import keras_model
from cerebras_tf.core import batching
from cerebras_tf.runtime import precision
from cerebras_models import fields
from cerebras_models.data import acquire

L = tf.keras.layers
IMAGE = (8, 8, 1)
INPUT_NAME = "image"


def image_shape(model_params: dict) -> tuple:
  """(H, W, C) of the images the model takes: the digits' 8x8x1 unless resized/repeated."""
  app = model_params.get("architecture", "digits_cnn") != "digits_cnn"
  h, w = model_params.get("image_size") or ((32, 32) if app else IMAGE[:2])
  return (int(h), int(w), int(model_params.get("num_channels") or (3 if app else 1)))


def _application(model_params: dict) -> tf.keras.Model:
  """A tf.keras.applications model, weights=None, logits out (no softmax)."""
  build = getattr(tf.keras.applications, model_params["architecture"])
  # The input named as the input_fn names it, one flat functional model (Keras clones it).
  return build(weights=None, input_tensor=L.Input(image_shape(model_params), name=INPUT_NAME),
               classes=model_params.get("num_classes", 10), classifier_activation=None)


def compile_classifier(model: tf.keras.Model, optimizer_params: dict) -> tf.keras.Model:
  """The params' optimizer, sparse softmax cross-entropy on logits, Keras's accuracy."""
  model.compile(optimizer=_optimizer(optimizer_params),
                loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"])
  return model


def under_policy(build, model_params: dict):
  """build() under the Keras dtype policy `model.mixed_precision` asks for: mixed_bfloat16
  (float32 variables, bfloat16 compute; float32 on a CPU without bf16 math,
  runtime/precision.py) while the layers are made, the global policy restored after. The
  layers keep their policy in their config, so the Estimator's clone computes alike."""
  if precision.keras_policy(model_params.get("mixed_precision")) != "mixed_bfloat16":
    return build()
  previous = tf.keras.mixed_precision.global_policy()
  tf.keras.mixed_precision.set_global_policy("mixed_bfloat16")
  try:
    return build()
  finally:
    tf.keras.mixed_precision.set_global_policy(previous)


def float32_logits(model: tf.keras.Model) -> tf.keras.Model:
  """`model` with its logits cast to float32 (a weightless float32 layer) when they are not:
  the softmax and the loss stay float32 under a bfloat16 policy."""
  if model.output.dtype == tf.float32:
    return model
  out = L.Activation("linear", dtype="float32", name="logits_fp32")(model.output)
  return tf.keras.Model(model.inputs, out, name=model.name)


def build_keras_model(model_params: dict, optimizer_params: dict) -> tf.keras.Model:
  """Conv-BN-ReLU-MaxPool blocks, Flatten, Dense-ReLU, Dense logits (or the
  tf.keras.applications model `architecture` names); compiled with the params' optimizer
  and sparse softmax cross-entropy (Keras's accuracy metric). `mixed_precision`: under
  Keras's mixed_bfloat16 policy, the logits float32 (under_policy)."""
  model = under_policy(lambda: _build(model_params), model_params)
  return compile_classifier(float32_logits(model), optimizer_params)


def _build(model_params: dict) -> tf.keras.Model:
  """The uncompiled model of build_keras_model, under the global dtype policy."""
  if model_params.get("architecture", "digits_cnn") != "digits_cnn":
    tf.keras.utils.set_random_seed(model_params.get("seed", 0))  # its initializers are unseeded
    return _application(model_params)
  seed = model_params.get("seed", 0)
  init = lambda i: tf.keras.initializers.GlorotUniform(seed=seed + i)  # noqa: E731 reproducible
  layers = [L.Input(IMAGE, name=INPUT_NAME)]
  for i, f in enumerate(model_params.get("filters", [16, 32])):
    layers += [L.Conv2D(f, 3, padding="same", use_bias=False, kernel_initializer=init(i),
                        name=f"conv{i}"),
               # 45 batches an epoch: moving statistics that settle within an epoch or two.
               L.BatchNormalization(momentum=0.9, name=f"bn{i}"), L.ReLU(name=f"relu{i}"),
               L.MaxPool2D(name=f"pool{i}")]
  n = len(model_params.get("filters", [16, 32]))
  layers += [L.Flatten(name="flatten"),
             L.Dense(model_params.get("dense_units", 64), activation="relu",
                     kernel_initializer=init(n), name="dense"),
             L.Dense(model_params.get("num_classes", 10), kernel_initializer=init(n + 1),
                     name="logits")]
  return tf.keras.Sequential(layers, name="digits_cnn")


def _optimizer(opt: dict):
  lr = opt.get("learning_rate", 1e-3)
  if isinstance(lr, list):  # a YAML schedule: this small model uses its first rate
    lr = lr[0].get("learning_rate", lr[0].get("initial_learning_rate", 1e-3))
  kind = opt.get("optimizer_type", "adam")
  if kind == "sgd":
    return tf.keras.optimizers.legacy.SGD(lr)
  if kind == "momentum":
    return tf.keras.optimizers.legacy.SGD(lr, momentum=opt.get("momentum", 0.9))
  return tf.keras.optimizers.legacy.Adam(lr, beta_1=opt.get("beta1", 0.9),
                                         beta_2=opt.get("beta2", 0.999),
                                         epsilon=opt.get("epsilon", 1e-7))


def model_fn(features, labels, mode, params):
  """The Keras model's model_fn (cerebras_tf.keras_model), built from the params.

  The Keras model is built in a throw-away graph; keras_model clones it into the Estimator's
  graph (from its config, with the seeded initializers), as for a user's own Keras model.
  """
  with tf.Graph().as_default():
    model = build_keras_model(params.get("model", params), params.get("optimizer", params))
  return keras_model.model_fn_from_keras(model)(features, labels, mode)


def as_image(x, shape):
  """A digit [8, 8, 1] as an image of `shape` (H, W, C): bilinear resize, gray repeated."""
  x = tf.image.resize(x, shape[:2])
  return tf.tile(x, [1, 1, shape[2]]) if shape[2] != 1 else x


def load_split(split: str, data_dir=None):
  """(x float32 [N, 8, 8, 1] in [0, 1], y int32 [N]) of the digits `train` or `test` split."""
  paths = acquire.ensure_datasets(["digits"], data_dir=data_dir)["digits"]
  with np.load(paths[split]) as d:
    x, y = d["x"], d["y"]
  return (x.astype(np.float32) / 16.0)[..., None], y.astype(np.int32)


def majority_class_accuracy(train_y, test_y) -> float:
  """The trivial baseline: always answer the commonest training label; its test accuracy."""
  return float(np.mean(test_y == np.bincount(train_y).argmax()))


def input_fn(params, mode=tf.estimator.ModeKeys.TRAIN):
  """tf.data of ({"image": [B, H, W, C]}, label [B]): train (shuffled, repeated) or test;
  the 8x8 gray digits, resized to model.image_size and repeated to model.num_channels."""
  train = mode == tf.estimator.ModeKeys.TRAIN
  section = params.get("train_input" if train else "eval_input", params)
  batch_size = params.get(batching.RESERVED_PARAMS_KEY) or section.get("batch_size", 32)
  x, y = load_split("train" if train else "test", section.get("data_dir"))
  ds = tf.data.Dataset.from_tensor_slices(({INPUT_NAME: x}, y))
  shape = image_shape(params.get("model") or {})
  if shape != IMAGE:
    ds = ds.map(lambda f, label: ({INPUT_NAME: as_image(f[INPUT_NAME], shape)}, label))
  if train:
    if section.get("shuffle", True):
      ds = ds.shuffle(len(y), seed=section.get("shuffle_seed"))
    ds = ds.repeat()
  return ds.batch(batch_size, drop_remainder=train).prefetch(fields.prefetch_batches(section, 2))


def serving_input_receiver_fn(params):
  """A ServingInputReceiver for the exported SavedModel: `image` float32 [None, H, W, C] in
  [0, 1], at the model's image shape (the input_fn resizes the digits to it)."""
  shape = image_shape(params.get("model") or {})
  image = tf.compat.v1.placeholder(tf.float32, [None, *shape], name=INPUT_NAME)
  return tf.estimator.export.ServingInputReceiver({INPUT_NAME: image}, {INPUT_NAME: image})
