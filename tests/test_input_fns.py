"""An input_fn called by the framework builds TF's checks as plain Assert ops
(runtime/input_fns.unguarded_asserts): fewer graph functions, the same failures."""

import pytest
import tensorflow as tf
from tensorflow.python.ops import control_flow_assert

from cerebras_tf.runtime import input_fns


def _ragged_input_fn(params):
  """A map that checks int64 row splits, as tf-text's tokenizers do: TF guards each such
  check with a cond (an If op and two branch functions inside the map's function)."""
  splits = params["splits"]

  def to_ragged(values):
    r = tf.RaggedTensor.from_row_splits(values, tf.constant(splits, tf.int64))
    return r.to_tensor()

  return tf.data.Dataset.from_tensors(tf.range(4, dtype=tf.int64)).map(to_ragged)


def _build_and_read(call, splits):
  """(graph functions in the library, If ops in them, the first element or the error)."""
  g = tf.Graph()
  with g.as_default():
    ds = call(_ragged_input_fn, params={"splits": splits})
    element = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
    with tf.compat.v1.Session() as sess:
      try:
        out = sess.run(element)
      except tf.errors.InvalidArgumentError as e:
        out = e
  library = g.as_graph_def().library.function
  ifs = sum(n.op in ("If", "StatelessIf") for f in library for n in f.node_def)
  return len(library), ifs, out


def test_checks_are_plain_asserts_and_the_values_the_same():
  n_tf, ifs_tf, out_tf = _build_and_read(input_fns.call_with_supported_args, [0, 1, 4])
  n_ours, ifs_ours, out_ours = _build_and_read(input_fns.call_input_fn, [0, 1, 4])
  # TF's: a cond's two branch functions per guarded check, besides the same others (the
  # map's function, the one-shot iterator's).
  assert ifs_tf == 3 and ifs_ours == 0 and n_tf - n_ours == 2 * ifs_tf
  assert (out_ours == out_tf).all() and out_ours.tolist() == [[0, 0, 0], [1, 2, 3]]
  assert control_flow_assert.Assert is input_fns._TF_ASSERT  # put back after the call


def test_a_failing_check_fails_with_tfs_message():
  _, _, err_tf = _build_and_read(input_fns.call_with_supported_args, [0, 3, 2, 4])
  _, _, err_ours = _build_and_read(input_fns.call_input_fn, [0, 3, 2, 4])
  assert isinstance(err_tf, tf.errors.InvalidArgumentError)
  assert isinstance(err_ours, tf.errors.InvalidArgumentError)
  # The same check's message (the splits must not decrease), from the op alone; the node it
  # names is the check's (TF's names the branch's op, `Assert`).
  failed = lambda e: next(l for l in e.message.splitlines() if "assertion failed" in l)  # noqa: E731
  assert failed(err_ours) == failed(err_tf)
  assert "valid RaggedTensor:monotonic" in failed(err_ours)
  assert "assert_non_negative/assert_less_equal/Assert/Assert" in err_ours.message


def test_nested_calls_restore_tfs_assert_only_at_the_outermost_exit():
  with input_fns.unguarded_asserts():
    with input_fns.unguarded_asserts():
      assert control_flow_assert.Assert is not input_fns._TF_ASSERT
    assert control_flow_assert.Assert is not input_fns._TF_ASSERT
  assert control_flow_assert.Assert is input_fns._TF_ASSERT
  with pytest.raises(RuntimeError):
    with input_fns.unguarded_asserts():
      raise RuntimeError("an input_fn that fails")
  assert control_flow_assert.Assert is input_fns._TF_ASSERT


def test_a_users_own_check_on_float_data_still_stops_the_input():
  """A user's tf.debugging check on float features (guarded by TF, plain here) fails with the
  user's message at the bad element, and passes the good ones through unchanged."""
  def input_fn(params):
    def check(age):
      with tf.control_dependencies([tf.debugging.assert_non_negative(
          age, message="age must be >= 0")]):
        return tf.identity(age)
    return tf.data.Dataset.from_tensor_slices(params["ages"]).map(check)

  with tf.Graph().as_default():
    ds = input_fns.call_input_fn(input_fn, params={"ages": [20.0, 35.0, -1.0]})
    element = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
    with tf.compat.v1.Session() as sess:
      assert [sess.run(element), sess.run(element)] == [20.0, 35.0]
      with pytest.raises(tf.errors.InvalidArgumentError, match="age must be >= 0"):
        sess.run(element)
