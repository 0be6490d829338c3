"""Dropout with tf.nn.dropout's distribution from half its random numbers and fewer passes.

tf.nn.dropout draws one float32 uniform per element (TF's CPU RandomUniform: ~6 ns a number on
this 2-core machine, 4.7M numbers a BERT-tiny step at dropout 0.1), then scales, zeroes with a
select, and selects again in the gradient. Here each 32-bit Philox draw gives two 16-bit
uniforms, the kept scale is one select of two scalars, and the gradient is one multiply by
that mask. An element is kept with probability round(keep * 65536) / 65536 (within 8e-6 of
1 - rate) and scaled by 1 / (1 - rate), as in tf.nn.dropout.

A 16-bit x (a bfloat16 or float16 model) is dropped out in float32 on the host and cast back,
as PyTorch's dropout computes a bfloat16 tensor in float: in 16 bits the scale 1 / (1 - 0.1)
rounds to 1.109375 (bfloat16), every kept activation 0.16% short of its mean (tf.nn.dropout
has that bias too), and the float32 way was also the faster where measured (forward and
backward at [4096, 512]: 3.9 -> 2.9 ms, AVX-512 EPYC with avx512_bf16, issue 42). The engine's
trace keeps the 16-bit op: the engine computes in 16 bits.
"""

import tensorflow as tf

from cerebras_tf.runtime import precision

_LEVELS = 65536  # a 16-bit uniform


def dropout(x, rate: float):
  """x with each element zeroed with probability `rate`, the rest scaled by 1 / (1 - rate).

  Args:
    x: any shape, float dtype.  rate: in [0, 1).
  Returns:
    the same shape and dtype.
  """
  if not 0.0 <= rate < 1.0:
    raise ValueError(f"dropout rate must be in [0, 1), got {rate}")
  with tf.name_scope("dropout"):
    x = tf.convert_to_tensor(x)
    halves = _uniform_halves(x)  # uniform on [-32768, 32767], x's shape
    threshold = int(round(rate * _LEVELS)) - _LEVELS // 2
    keep = halves >= threshold
    dtype = x.dtype
    if dtype.size == 2 and not precision.in_engine_trace():  # bfloat16, float16 on the host
      dtype = tf.float32
    mask = tf.where(keep, tf.constant(1.0 / (1.0 - rate), dtype), tf.constant(0.0, dtype))
    return tf.cast(tf.cast(x, dtype) * tf.stop_gradient(mask), x.dtype)


def _uniform_halves(x):
  """An int16 uniform of x's shape, two from each 32-bit draw, drawn over x's own dimensions:
  never the element count, which passes int32 (2^31) for a long sequence's attention
  probabilities (BERT-Large at 10,256 tokens, batch 30) and made the shapes unknown or wrap
  to 0. The last dimension is drawn as pairs (one more half when it is odd, dropped)."""
  static = x.shape.as_list() if x.shape.is_fully_defined() else None
  if static is not None and not static:
    return _uniform_halves(tf.reshape(x, [1]))[0]  # a scalar
  if static is not None:  # python ints: the compiler sees static shapes
    lead, last = static[:-1], static[-1]
    pairs = (last + 1) // 2
    words = _full_range_words(lead + [pairs])
    halves = tf.reshape(tf.bitcast(words, tf.int16), lead + [2 * pairs])
    return halves[..., :last] if last % 2 else halves
  shape = tf.shape(x)
  lead, last = shape[:-1], shape[-1]
  pairs = (last + 1) // 2
  words = _full_range_words(tf.concat([lead, [pairs]], 0))
  halves = tf.reshape(tf.bitcast(words, tf.int16), tf.concat([lead, [2 * pairs]], 0))
  return halves[..., :last]


def _full_range_words(shape):
  """Uniform int32 words of `shape`, every bit pattern equally likely.

  A stateless full-range draw keyed by two words of the op's stateful generator (so the graph
  seed still decides the stream, and an unseeded graph differs run to run): TF's
  RandomUniformInt reduces each word modulo its range, 1.73 against 1.45 ms for BERT-tiny's
  524,288 attention-dropout words on the AVX-512 host.
  """
  key = tf.random.uniform([2], tf.int32.min, tf.int32.max, tf.int32)
  return tf.random.stateless_uniform(shape, key, minval=None, maxval=None, dtype=tf.int32)
