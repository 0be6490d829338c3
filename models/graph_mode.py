"""A reference model's model_fn, built as written in every execution mode.

tf.estimator builds the model_fn plainly on one device, but MirroredStrategy (multi_replica)
runs it through AutoGraph, which rewrites every Python function the model_fn calls, in each
replica thread: `scripts/run.py` of a 6-layer BERT-tiny multi_replica run took 50.6 s with it
and 43.1 s without (benchmarks/bench_graph_build.py, AVX2, 2 cores; issue 42). The families wrapped here are plain TF1 graph code (no Python
control flow on tensors: they build unconverted in pipelined mode), so they lose nothing.
Families built from Keras layers are not wrapped: a Keras layer's `call` may rely on
AutoGraph, and with it disabled around them they would build differently per mode.
"""

import functools
import inspect

import tensorflow as tf


def model_fn_as_written(fn):
  """`fn` as a model_fn with its own argument names, whose body AutoGraph leaves alone.

  The returned function takes exactly `fn`'s arguments (tf.estimator passes `config` and
  `params` by name only to a model_fn that declares them) and calls `fn` marked with
  tf.autograph.experimental.do_not_convert; AutoGraph converts only that one-line call.
  """
  unconverted = tf.autograph.experimental.do_not_convert(fn)
  if "config" in inspect.signature(fn).parameters:
    def model_fn(features, labels, mode, params, config=None):
      return unconverted(features, labels, mode, params, config=config)
  else:
    def model_fn(features, labels, mode, params):
      return unconverted(features, labels, mode, params)
  return functools.wraps(fn)(model_fn)  # fn's name, doc and (through __wrapped__) source line
