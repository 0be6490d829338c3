"""The reference families' model_fns are built as written, also where MirroredStrategy would run
them through AutoGraph (models/graph_mode.py)."""

import inspect

import pytest
import tensorflow as tf

from cerebras_models import graph_mode
from cerebras_tf import registry

tf1 = tf.compat.v1

WRAPPED = ("bert", "transformer", "gpt", "t5", "linformer", "unet")


def _python_if_on_a_tensor(features, labels, mode, params):
  # Unconverted, graph mode refuses a tensor as a Python bool; AutoGraph would make a tf.cond.
  if tf.reduce_sum(features) > 0:
    return "positive"
  return "not positive"


def test_autograph_leaves_the_body_alone():
  with tf.Graph().as_default():
    x = tf1.placeholder(tf.float32, [2])
    converted = tf.autograph.to_graph(_python_if_on_a_tensor)
    assert isinstance(converted(x, None, "train", {}), tf.Tensor)  # the check can fail
    as_written = tf.autograph.to_graph(graph_mode.model_fn_as_written(_python_if_on_a_tensor))
    with pytest.raises(TypeError, match="bool"):
      as_written(x, None, "train", {})


@pytest.mark.parametrize("name", WRAPPED)
def test_a_family_model_fn_keeps_its_arguments_and_is_wrapped(name):
  model_fn, _ = registry.get_model(name).resolve()
  original = model_fn.__wrapped__
  # tf.estimator passes `config` only to a model_fn that names it: both see the same names.
  assert inspect.getfullargspec(model_fn).args == inspect.getfullargspec(original).args
  assert inspect.getfullargspec(model_fn).args[:4] == ["features", "labels", "mode", "params"]
  assert model_fn.__name__ == original.__name__ and model_fn.__module__ == original.__module__
