"""A 16-bit BiasAdd's bias gradient summed in float32 on the host.

TF 2.15's CPU BiasAddGrad adds a bfloat16 gradient up in bfloat16: over 4,096 rows of values
in [0.5, 1.5] its sums came to 12% of the true ones (tests/models/test_bf16.py), so a bf16
model's biases trained on a fraction of their gradient. TF's Sum adds a bfloat16 tensor up in
float32 and rounds once. Within `summed_in_float32()` the BiasAdd ops a graph gets take Sum for
their bias gradient; the forward op is the same BiasAdd (oneDNN still fuses it into the product
before it), and the engine's trace keeps TF's own gradient.
"""

import contextlib

import tensorflow as tf

from cerebras_tf.runtime import precision

GRADIENT = "BiasAddSummedInFloat32"


@tf.RegisterGradient(GRADIENT)
def _bias_add_grad(op, grad):
  rank = tf.rank(grad)
  if op.get_attr("data_format") == b"NCHW":  # the bias is axis 1 (a Keras channels_first conv)
    return grad, tf.reduce_sum(grad, tf.concat([[0], tf.range(2, rank)], 0))
  return grad, tf.reduce_sum(grad, tf.range(rank - 1))


def summed_in_float32(dtype):
  """A context in which a BiasAdd of `dtype` gets the float32-summed bias gradient: on the
  host for a 16-bit dtype; a null context otherwise."""
  if tf.as_dtype(dtype).size != 2 or precision.in_engine_trace():
    return contextlib.nullcontext()
  return tf.compat.v1.get_default_graph().gradient_override_map({"BiasAdd": GRADIENT})
