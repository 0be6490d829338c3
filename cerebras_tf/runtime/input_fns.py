"""The user's input_fn as tf.estimator calls it, and the input it returns: arguments passed by
name (the Estimator's convention, with the names a wrong one could take), and a dataset
without end where evaluate or predict would read it to its end.
"""

import contextlib
import inspect

import tensorflow as tf
from tensorflow.python.framework import ops
from tensorflow.python.ops import control_flow_assert
from tensorflow.python.ops import gen_logging_ops
from tensorflow_estimator.python.estimator import util as estimator_util

from cerebras_tf.errors import ConfigError, defined_at, keeping_kind
from cerebras_tf.runtime import strategies


def call_with_supported_args(fn, *, through=None, **kwargs):
  """Calls `fn` with the subset of kwargs its signature names (the Estimator's convention);
  `through`: a wrapper of `fn` to call instead (autograph's conversion of it).

  Raises:
    ConfigError (a TypeError too): `fn` requires an argument by another name (`lambda p:
      ...`): tf.estimator's TypeError said only "missing 1 required positional argument".
  """
  args = estimator_util.fn_args(fn)
  _check_required_args(fn, kwargs)
  return (through or fn)(**{k: v for k, v in kwargs.items() if k in args})


def call_input_fn(fn, **kwargs):
  """`call_with_supported_args` for an input_fn: its checks built as plain Assert ops
  (`unguarded_asserts`)."""
  with unguarded_asserts():
    return call_with_supported_args(fn, **kwargs)


_TF_ASSERT = control_flow_assert.Assert
_unguarded_depth = 0


def _plain_assert(condition, data, summarize=None, name=None):
  """tf.debugging.Assert's own unguarded branch, for any data; eagerly, TF's own."""
  if tf.executing_eagerly():
    return _TF_ASSERT(condition, data, summarize, name)
  with ops.name_scope(name, "Assert", [condition, data]):
    return gen_logging_ops._assert(  # pylint: disable=protected-access
        condition, ops.convert_n_to_tensor(data), summarize, name="Assert")


@contextlib.contextmanager
def unguarded_asserts():
  """Asserts that TF builds meanwhile (ragged tensors' and check_ops' checks) are plain Assert
  ops, not an Assert inside a cond.

  TF guards an Assert with a cond unless all its data is int32 or string, so that a GPU need
  not copy the data to the host when the check passes. Inside a tf.function, as every
  Dataset.map function is, each cond is an If op with two branch functions. tf-text's ragged
  checks gave BERT's input pipeline 104 of its 118 graph functions: traced again on every
  input_fn call (1.45 s a call, 1.0 s without them) and in every session's graph optimization.
  On the CPU the op alone checks the same condition and fails with the same message. Another
  thread tracing meanwhile gets plain asserts too, or TF's: either is correct.
  """
  global _unguarded_depth  # pylint: disable=global-statement
  _unguarded_depth += 1
  control_flow_assert.Assert = _plain_assert
  try:
    yield
  finally:
    _unguarded_depth -= 1
    if not _unguarded_depth:
      control_flow_assert.Assert = _TF_ASSERT


def _check_required_args(fn, passed) -> None:
  try:
    parameters = inspect.signature(fn).parameters.values()
  except (TypeError, ValueError):  # a builtin or C callable: let the call speak
    return
  missing = [p.name for p in parameters if p.default is p.empty and p.name not in passed
             and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
  if not missing:
    return
  name = getattr(fn, "__name__", type(fn).__name__)
  raise keeping_kind(ConfigError, TypeError(), (  # a TypeError where tf.estimator's call failed
      f"{name}{defined_at(fn)} requires argument(s) {', '.join(repr(m) for m in missing)}, but "
      f"tf.estimator passes arguments by name, only {', '.join(sorted(passed))}: rename "
      f"{missing[0]!r} to one of those (the input_fn's is usually 'params'), or give it a "
      "default"))


def refusing_endless(input_fn):
  """An eval input_fn that refuses a dataset without end: evaluate(steps=None) reads until the
  input ends, and a training input_fn reused for eval (`.repeat()`) ran forever."""
  def wrapped(params, mode, config):
    out = call_input_fn(input_fn, params=params, mode=mode, config=config)
    if endless(out):
      raise ConfigError(
          f"evaluate: the dataset of {_name_at(input_fn)} repeats forever (.repeat()) "
          f"and steps is None, so the evaluation would never end; pass steps=N "
          f"(--eval_steps), or build the eval dataset without .repeat()")
    return out
  return wrapped


def saying_endless(input_fn):
  """A predict input_fn that warns of a dataset without end: the predictions generator never
  ends either (`list(est.predict(...))` runs until memory does); taking a few with
  itertools.islice is fine, so it is not refused."""
  def wrapped(params, mode, config):
    out = call_input_fn(input_fn, params=params, mode=mode, config=config)
    if endless(out):
      tf.compat.v1.logging.warning(
          "cerebras_tf: predict: the dataset of %s repeats forever (.repeat()), so the "
          "predictions never end: take what you need (itertools.islice), or build the predict "
          "dataset without .repeat()", _name_at(input_fn))
    return out
  return wrapped


def _name_at(fn) -> str:
  return f"{getattr(fn, '__name__', type(fn).__name__)}{defined_at(fn)}"


def endless(dataset) -> bool:
  """Whether a dataset's cardinality is known to be infinite. In graph mode it is a tensor:
  run alone (it builds the dataset, reads nothing). Unknown (a filter, a generator) is not."""
  if not isinstance(dataset, tf.data.Dataset):
    return False
  cardinality = dataset.cardinality()
  if tf.executing_eagerly():
    return int(cardinality) == tf.data.INFINITE_CARDINALITY
  try:
    with tf.compat.v1.Session(graph=cardinality.graph,
                              config=strategies.quick_session_config()) as session:
      return int(session.run(cardinality)) == tf.data.INFINITE_CARDINALITY
  except tf.errors.OpError:  # it needs a feed or an initialized resource: not known
    return False
