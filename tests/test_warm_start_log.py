"""A warm start is logged once: the compiler traces model_fn(TRAIN) in its own graph before
training builds it again, and both apply the same warm start (issue 44: "logged twice")."""

from unittest import mock

import numpy as np
import tensorflow as tf

from cerebras_tf.runtime import checkpoints

tf1 = tf.compat.v1


def _warm_start_lines(calls):
  return [c for c in calls if "warm start from" in str(c.args[0])]


def test_the_same_warm_start_in_two_graphs_is_logged_once_and_restores_both(tmp_path):
  with tf.Graph().as_default():
    w = tf1.get_variable("w", initializer=np.arange(3, dtype=np.float32))
    with tf1.Session() as sess:
      sess.run(w.initializer)
      tf1.train.Saver().save(sess, str(tmp_path / "src" / "model.ckpt"))
  checkpoint = str(tmp_path / "src")
  with mock.patch.object(tf1.logging, "info") as info:
    for _ in range(2):  # the compiler's trace, then the training graph
      with tf.Graph().as_default():
        w = tf1.get_variable("w", [3])
        tf1.get_variable("head", [2])  # not in the checkpoint: keeps its initializer
        checkpoints.init_matching(checkpoint)
        with tf1.Session() as sess:
          sess.run(tf1.global_variables_initializer())
          np.testing.assert_array_equal(sess.run(w), [0.0, 1.0, 2.0])
  lines = _warm_start_lines(info.call_args_list)
  assert len(lines) == 1, lines
  assert lines[0].args[2:4] == (1, 1)  # 1 restored, 1 of 2 trainable
