"""Models people bring, as Keras builds them: the foreign-model suite.

`tf.keras.applications` ResNet50, MobileNetV2, EfficientNetB0 and ConvNeXtTiny (weights=None:
no download),
a small U-Net (the segmentation model the vendor's TF model zoo shipped) and a small LSTM
language model. Each builder returns a compiled Keras model; `input_fn_for` feeds it zeros of
the right shapes (the compiler reads shapes only). Used by benchmarks/bench_foreign_models.py (the
README table) and tests/keras/test_foreign_models.py.
"""

from typing import Callable, Dict, Tuple

import numpy as np
import tensorflow as tf

L = tf.keras.layers


def _compile(model, loss="sparse_categorical_crossentropy"):
  model.compile(optimizer=tf.keras.optimizers.legacy.Adam(1e-3),
                loss=tf.keras.losses.get(loss) if isinstance(loss, str) else loss,
                metrics=["accuracy"])
  return model


def resnet50(size: int = 96, classes: int = 10):
  return _compile(tf.keras.applications.ResNet50(
      weights=None, input_shape=(size, size, 3), classes=classes))


def mobilenet_v2(size: int = 96, classes: int = 10):
  return _compile(tf.keras.applications.MobileNetV2(
      weights=None, input_shape=(size, size, 3), classes=classes))


def efficientnet_b0(size: int = 96, classes: int = 10):
  return _compile(tf.keras.applications.EfficientNetB0(
      weights=None, input_shape=(size, size, 3), classes=classes))


def convnext_tiny(size: int = 96, classes: int = 10):
  """ConvNeXt-T: 7x7 depthwise convolutions, LayerNormalization over channels, GELU MLPs."""
  return _compile(tf.keras.applications.ConvNeXtTiny(
      weights=None, input_shape=(size, size, 3), classes=classes))


def unet(size: int = 64, classes: int = 2, base: int = 16, depth: int = 3):
  """A U-Net: conv-BN-ReLU pairs, max-pool down, Conv2DTranspose up, skip concatenations,
  a per-pixel softmax over `classes`."""
  def block(x, filters):
    for _ in range(2):
      x = L.Conv2D(filters, 3, padding="same", use_bias=False)(x)
      x = L.BatchNormalization()(x)
      x = L.ReLU()(x)
    return x

  inputs = L.Input((size, size, 1), name="image")
  x, skips = inputs, []
  for d in range(depth):
    x = block(x, base * 2 ** d)
    skips.append(x)
    x = L.MaxPool2D()(x)
  x = block(x, base * 2 ** depth)
  for d in reversed(range(depth)):
    x = L.Conv2DTranspose(base * 2 ** d, 2, strides=2, padding="same")(x)
    x = L.Concatenate()([x, skips[d]])
    x = block(x, base * 2 ** d)
  outputs = L.Conv2D(classes, 1, name="mask_logits")(x)
  return _compile(tf.keras.Model(inputs, outputs, name="unet"),
                  tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))


def lstm_lm(vocab: int = 1000, seq_len: int = 32, embed: int = 64, units: int = 128):
  """A next-token LSTM language model: Embedding -> LSTM (Keras's While-loop form) -> Dense."""
  inputs = L.Input((seq_len,), dtype="int32", name="tokens")
  x = L.Embedding(vocab, embed)(inputs)
  x = L.LSTM(units, return_sequences=True)(x)
  outputs = L.Dense(vocab, name="next_token_logits")(x)
  return _compile(tf.keras.Model(inputs, outputs, name="lstm_lm"),
                  tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))


# name -> (builder, what it is)
SUITE: Dict[str, Tuple[Callable, str]] = {
    "ResNet50": (resnet50, "tf.keras.applications, 96x96x3, 10 classes"),
    "MobileNetV2": (mobilenet_v2, "tf.keras.applications, 96x96x3, 10 classes"),
    "EfficientNetB0": (efficientnet_b0, "tf.keras.applications, 96x96x3, 10 classes"),
    "ConvNeXtTiny": (convnext_tiny, "tf.keras.applications, 96x96x3, 10 classes"),
    "U-Net": (unet, "64x64x1, depth 3, base 16 filters, 2 classes per pixel"),
    "LSTM LM": (lstm_lm, "vocab 1000, 32 tokens, embed 64, LSTM 128"),
}


def input_fn_for(model, batch_size: int):
  """An input_fn of zeros shaped like the model's input and labels (the compiler reads
  shapes; the numbers do not matter for compiling)."""
  spec = model.inputs[0]
  name = model.input_names[0]
  x_shape = [batch_size] + spec.shape.as_list()[1:]
  out_shape = model.outputs[0].shape.as_list()[1:]
  y_shape = [batch_size] + out_shape[:-1]  # sparse labels: the logits' shape without classes

  def input_fn(params=None):
    del params
    x = tf.zeros(x_shape, spec.dtype)
    y = tf.zeros(y_shape, tf.int32)
    return tf.data.Dataset.from_tensors(({name: x}, y)).repeat()
  return input_fn


def random_batch(model, batch_size: int, seed: int = 0):
  """(x, y) numpy arrays for one batch (labels in range), for a training smoke test."""
  rng = np.random.RandomState(seed)
  spec = model.inputs[0]
  shape = [batch_size] + spec.shape.as_list()[1:]
  classes = model.outputs[0].shape[-1]
  if spec.dtype.is_integer:
    x = rng.randint(0, classes, size=shape).astype(spec.dtype.as_numpy_dtype)
  else:
    x = rng.randn(*shape).astype(np.float32)
  y = rng.randint(0, classes, size=[batch_size] + model.outputs[0].shape.as_list()[1:-1])
  return x, y.astype(np.int32)
