"""The TensorFlow example of the seed ("Deep Learning Programming at Scale"), as printed, with
a model_fn, input_fn, params and cs_config of a user's around it. Run as a script from any
directory (tests/test_estimator_compat.py with the checkout, tests/test_wheel.py with the
wheel); prints "SEED OK <global step>"."""

import tensorflow as tf

from cerebras.tf.cs_estimator import CerebrasEstimator
from cerebras.tf.run_config import CSRunConfig

params = {"cs_ip": "10.255.253.1:9000", "batch_size": 8, "learning_rate": 0.1}
cs_config = {"execution_strategy": "pipelined"}


def model_fn(features, labels, mode, params):
  logits = tf.compat.v1.layers.dense(features["x"], 3, name="head")
  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
  train_op = tf.compat.v1.train.GradientDescentOptimizer(params["learning_rate"]).minimize(
      loss, global_step=tf.compat.v1.train.get_or_create_global_step())
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def input_fn(params):
  x = tf.random.stateless_uniform([64, 4], seed=[1, 2])
  y = tf.cast(x[:, 0] * 3, tf.int32)
  ds = tf.data.Dataset.from_tensor_slices(({"x": x}, y))
  return ds.repeat().batch(params["batch_size"], drop_remainder=True)


est_config = CSRunConfig(cs_ip=params["cs_ip"], cs_config=cs_config)
est = CerebrasEstimator(model_fn=model_fn, model_dir='./out', config=est_config, params=params, use_cs=True)
est.train(input_fn, max_steps=5, use_cs=True)

print("SEED OK", est.get_variable_value("global_step"))
