"""Lowering a Keras model: layers are the Keras layers, backward FLOPs land where they belong."""

import tensorflow as tf

from cerebras_tf import keras_model
from cerebras_tf.compiler import capture, lower

L = tf.keras.layers
B = 4


def _lowered(model):
  fn = keras_model.model_fn_from_keras(model)

  def input_fn():
    x = tf.zeros([B] + model.inputs[0].shape.as_list()[1:], model.inputs[0].dtype)
    return tf.data.Dataset.from_tensors(({model.input_names[0]: x}, tf.zeros([B], tf.int32)))
  cap = capture.capture(input_fn, lambda f, l: fn(f, l, tf.estimator.ModeKeys.TRAIN), B)
  return lower.lower(cap, "m")


def test_residual_gradient_sums_stay_with_their_layers():
  """h feeds both a Dense and the residual Add, so tf.gradients sums its two gradients in an
  op named "gradients/AddN" for no forward op. It belongs to the layers before the head, not
  to the last layer: the head's backward work is its own, per sample:
    dW = h^T dy: 2 x 16 x 4 = 128, dx = dy W^T: 2 x 4 x 16 = 128, dbias: 4 -> 260."""
  x = L.Input((8,), name="x")
  h = L.Dense(16, name="h")(x)
  a = L.Dense(16, name="a")(h)
  r = L.Add(name="res")([a, h])
  out = L.Dense(4, name="head")(r)
  model = tf.keras.Model(x, out)
  model.compile(tf.keras.optimizers.legacy.SGD(0.1),
                tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  g = _lowered(model)
  names = [l.name for l in g.layers]
  print({l.name: l.bwd_flops for l in g.layers})
  assert names == ["h", "a", "res", "head", "loss"], names
  head = g.layer("head")
  assert head.bwd_flops == 260, head.bwd_flops
  # Every backward FLOP is somewhere: the matmul gradients of h (2 x 8 x 16 for dW only:
  # no gradient flows into the input) and a (2 x 2 x 16 x 16) are in the total.
  assert g.layer("h").bwd_flops >= 2 * 8 * 16 and g.layer("a").bwd_flops >= 2 * 2 * 16 * 16


def test_a_keras_encoder_block_is_its_keras_layers():
  """Embedding -> MultiHeadAttention -> LayerNormalization -> Dense on [B, S, D], as a user
  writes a text model in Keras. Keras runs a Dense kernel on 3-D input in "dense/Tensordot",
  an EinsumDense one in "mha/query/einsum", and the first projection reads the embedding
  lookup: none of these is another layer (they were: "mha/query/einsum" with the FLOPs and
  "mha/query" with the weights, each paying its own per-token latency). LayerNormalization
  runs FusedBatchNormV3 on [1, B x S, D, 1]: a per-position norm, not an image with B x S
  channels. Per sample, by hand: each projection 2 x S x D x D = 2 x 8 x 16 x 16 = 4,096
  FLOPs plus S x D = 128 for the bias; the query's also carries Keras's scaling of it by
  1 / sqrt(key_dim), another S x D = 128 (an op in the "mha" scope, which holds the
  projections but is none of them, goes with the layer whose output it reads)."""
  s, d, heads = 8, 16, 2
  ids = L.Input((s,), dtype="int32", name="token_ids")
  x = L.Embedding(50, d, name="embedding")(ids)
  a = L.MultiHeadAttention(heads, d // heads, name="mha")(x, x)
  x = L.LayerNormalization(name="ln")(x + a)
  x = L.Dense(2 * d, name="ffn")(x)
  out = L.Dense(3, name="head")(L.GlobalAveragePooling1D(name="pool")(x))
  model = tf.keras.Model(ids, out)
  model.compile(tf.keras.optimizers.legacy.SGD(0.1),
                tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  g = _lowered(model)
  names = [l.name for l in g.layers]
  assert not [n for n in names if n.endswith(("/einsum", "/Tensordot"))], names
  for proj in ("mha/query", "mha/key", "mha/value"):
    layer = g.layer(proj)
    assert layer.num_params == d * d + d
    scale = s * d if proj == "mha/query" else 0
    assert layer.fwd_flops == 2 * s * d * d + s * d + scale, (proj, layer.fwd_flops)
  assert g.layer("ffn").fwd_flops >= 2 * s * d * 2 * d
  assert g.layer("ln").spatial == ()


def test_an_input_read_by_two_ops_crosses_the_host_links_once():
  """x [8, 1000] float32 read by a Dense layer and by a reduce_mean: by hand 1000 values x 4 B
  = 4,000 B per sample from the host. Each reading op counted it, 8,000 B (an image
  standardized in the model_fn, (x - mean(x)) / std(x), by 4 ops: counted 4 times)."""
  def model_fn(features, labels):
    del labels
    x = features["x"]
    loss = tf.reduce_mean(tf.keras.layers.Dense(4)(x) + tf.reduce_mean(x))
    step = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    return tf.estimator.EstimatorSpec("train", loss=loss, train_op=step)

  def input_fn():
    return tf.data.Dataset.from_tensors(({"x": tf.zeros([8, 1000])}, tf.zeros([8], tf.int32)))
  graph = lower.lower(capture.capture(input_fn, model_fn, 8), "two_readers")
  assert sum(layer.io_bytes for layer in graph.layers) == 4000.0
  assert graph.input_value_bytes == 4.0  # float32: what report.io_lines says to narrow


def test_batch_norms_of_any_rank_are_marked_and_layer_norms_are_not():
  """The compiler caps a chosen multi_replica R so each replica's batch norm keeps 16 samples,
  and the report names the norms: so it must see them. A dense BatchNormalization on [B, 16]
  runs moments and no FusedBatchNorm (no image op), a conv's on [B, 8, 8, 4] runs
  FusedBatchNormV3; both own a moving mean. LayerNormalization runs FusedBatchNormV3 too (on
  [1, B x ..., D, 1]), with statistics per sample: not one."""
  x = L.Input((8, 8, 1), name="img")
  c = L.Conv2D(4, 3, padding="same", name="conv")(x)
  c = L.BatchNormalization(name="conv_bn")(c)
  f = L.Flatten(name="flat")(c)
  h = L.Dense(16, name="fc")(f)
  h = L.BatchNormalization(name="fc_bn")(h)
  h = L.LayerNormalization(name="fc_ln")(h)
  out = L.Dense(3, name="head")(h)
  model = tf.keras.Model(x, out)
  model.compile(tf.keras.optimizers.legacy.SGD(0.1),
                tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  g = _lowered(model)
  assert set(g.batch_norm_layers) == {"conv_bn", "fc_bn"}, [l.name for l in g.layers]
  assert g.layer("fc_bn").batch_norm and not g.layer("fc_bn").spatial  # seen only by its mean
  assert not g.layer("fc_ln").batch_norm
