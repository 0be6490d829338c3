"""A user model with an op the engine has no kernel for (tf.py_function), registered as
`pyfunc_model` through CEREBRAS_TF_MODEL_MODULES=bad_inputs_model (tests/test_bad_inputs.py)."""

from cerebras_tf.registry import ModelSpec, register


def _train_spec(mode, logits, labels):
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels,
                                                                       logits=logits))
  step = tf.compat.v1.train.get_or_create_global_step()
  train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=step)
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def model_fn(features, labels, mode, params):
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  doubled = tf.py_function(lambda t: t * 2.0, [features], tf.float32)
  doubled.set_shape(features.shape)
  logits = tf.compat.v1.layers.dense(doubled, 2)
  return _train_spec(mode, logits, labels)


def input_fn(params, mode):
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  ds = tf.data.Dataset.from_tensors((tf.ones([4], tf.float32), tf.constant(1, tf.int32)))
  return ds.repeat().batch(params["train_input"]["batch_size"], drop_remainder=True)


register(ModelSpec(name="pyfunc_model", model_fn=model_fn, input_fn=input_fn))


def reshape_model_fn(features, labels, mode, params):
  """A model whose reshape cannot take its input (4 values into rows of 3)."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  del params
  rows = tf.reshape(features, [-1, 3])
  logits = tf.compat.v1.layers.dense(rows, 2)
  return _train_spec(mode, logits, labels)


def dense_model_fn(features, labels, mode, params):
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  del params
  logits = tf.compat.v1.layers.dense(features, 2)
  return _train_spec(mode, logits, labels)


# `input_fn` above batches with its own key (train_input.batch_size, the GLOBAL batch) instead
# of params["batch_size"] (the per-replica batch the framework passes): under 2 host replicas
# every replica would get the global batch, doubling it.
register(ModelSpec(name="reshape_model", model_fn=reshape_model_fn, input_fn=input_fn))
register(ModelSpec(name="own_batch_model", model_fn=dense_model_fn, input_fn=input_fn))
