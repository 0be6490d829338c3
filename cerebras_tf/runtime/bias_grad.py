"""A bfloat16 BiasAdd's bias gradient summed in float32 on the host.

TF 2.15's CPU BiasAddGrad adds a bfloat16 gradient up in bfloat16: over 4,096 rows of values
in [0.5, 1.5] its sums came to 12% of the true ones (tests/models/test_bf16.py), so a bf16
model's biases trained on a fraction of their gradient. TF's Sum adds a bfloat16 tensor up in
float32 and rounds once. (Its float16 kernel sums in float32, its float16 Sum does not: 0.05%
against 0.36% off in the test.) Within `on_the_host()` a BiasAdd's bias gradient is that Sum
for a bfloat16 BiasAdd and TF's own BiasAddGrad otherwise; the forward op is the same BiasAdd
(oneDNN still fuses it into the product before it), and the engine's trace keeps TF's own
gradient. It covers every BiasAdd of a model_fn's graph in an engine training call
(`use_cs=True`: model_fn_wrapper.py), and the reference models' own bfloat16 ones in any call
(`summed_in_float32`); `use_cs=False` leaves a user's graph exactly as tf.estimator builds it.
"""

import contextlib

import tensorflow as tf

from cerebras_tf.runtime import precision

GRADIENT = "BiasAddSummedInFloat32"


@tf.RegisterGradient(GRADIENT)
def _bias_add_grad(op, grad):
  data_format = op.get_attr("data_format")
  if grad.dtype != tf.bfloat16:  # TF's own gradient, op for op
    return grad, tf.raw_ops.BiasAddGrad(out_backprop=grad, data_format=data_format)
  rank = tf.rank(grad)
  if data_format == b"NCHW":  # the bias is axis 1 (a Keras channels_first conv)
    return grad, tf.reduce_sum(grad, tf.concat([[0], tf.range(2, rank)], 0))
  return grad, tf.reduce_sum(grad, tf.range(rank - 1))


def on_the_host():
  """A context in which every BiasAdd the default graph gets takes the gradient above: on
  the host; a null context in the engine's trace."""
  if precision.in_engine_trace():
    return contextlib.nullcontext()
  return tf.compat.v1.get_default_graph().gradient_override_map({"BiasAdd": GRADIENT})


def summed_in_float32(dtype):
  """on_the_host() for a layer of ours adding a bias to a `dtype` tensor: bfloat16 only, so a
  float32 graph keeps TF's ops and their attributes as they were."""
  return on_the_host() if tf.as_dtype(dtype) == tf.bfloat16 else contextlib.nullcontext()
