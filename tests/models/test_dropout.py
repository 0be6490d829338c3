"""models/dropout.dropout: tf.nn.dropout's distribution, scale and gradient."""

import numpy as np
import pytest
import tensorflow as tf

from cerebras_models import dropout
from cerebras_tf.runtime import precision

tf1 = tf.compat.v1


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_keep_fraction_scale_and_gradient(rate):
  # 2^20 + 1 elements (odd: the last 32-bit draw is half used). The kept fraction of n
  # Bernoulli(1 - rate) draws has standard deviation sqrt(rate (1 - rate) / n) <= 4.9e-4;
  # 5 sigma is 2.5e-3. The 16-bit threshold moves the keep probability by < 8e-6.
  n = 2 ** 20 + 1
  x = np.linspace(1.0, 2.0, n).astype(np.float32)
  with tf.Graph().as_default():
    xt = tf.constant(x)
    y = dropout.dropout(xt, rate)
    g = tf.gradients(tf.reduce_sum(y * 3.0), xt)[0]
    with tf1.Session() as sess:
      y1, g1 = sess.run([y, g])
      y2 = sess.run(y)
  kept = y1 != 0
  assert abs(kept.mean() - (1 - rate)) < 2.5e-3
  np.testing.assert_allclose(y1[kept], x[kept] / (1 - rate), rtol=1e-6)
  np.testing.assert_allclose(g1, np.where(kept, 3.0 / (1 - rate), 0.0), rtol=1e-6)
  assert (y2 != 0).mean() != kept.mean() or not np.array_equal(y2 != 0, kept)  # fresh masks
  # Neighbouring elements come from the two halves of one draw: they must be independent.
  both = np.mean(kept[0:-1:2] & kept[1::2])
  assert abs(both - (1 - rate) ** 2) < 5e-3


def test_rate_outside_range_fails():
  with tf.Graph().as_default():
    with pytest.raises(ValueError, match=r"dropout rate must be in \[0, 1\)"):
      dropout.dropout(tf.zeros([3]), 1.0)


def test_more_than_int32_elements_keeps_static_shape():
  # Attention probabilities of BERT-Large at 10,256 tokens, batch 30: 30 x 16 x 10,256^2 =
  # 50.5e9 elements, past int32's 2^31. tf.size in int32 wrapped and left the dropout's shapes
  # unknown (the compiler refused them as "dynamic output shape"); at 2^32 it wrapped to 0.
  # Graph only: nothing this size is run.
  with tf.Graph().as_default():
    for shape in ([30, 16, 10256, 10256], [1024, 16, 512, 512], [3, 5, 7]):
      x = tf1.placeholder(tf.float32, shape)
      y = dropout.dropout(x, 0.1)
      assert y.shape.as_list() == shape
      ops = [op for op in tf1.get_default_graph().get_operations() if "dropout" in op.name]
      assert all(o.shape.is_fully_defined() for op in ops for o in op.outputs), shape


def test_dynamic_shape_and_odd_last_dimension():
  with tf.Graph().as_default():
    x = tf1.placeholder(tf.float32, [None, 3])
    y = dropout.dropout(x, 0.5)
    with tf1.Session() as sess:
      out = sess.run(y, {x: np.ones([1000, 3], np.float32)})
  assert out.shape == (1000, 3)
  assert set(np.unique(out)) <= {0.0, 2.0} and abs((out != 0).mean() - 0.5) < 0.05


def _masks(graph_seed, ops=2, runs=2):
  """The keep masks of `ops` dropout ops over `runs` session runs of one new graph."""
  with tf.Graph().as_default():
    if graph_seed is not None:
      tf1.set_random_seed(graph_seed)
    ys = [dropout.dropout(tf.ones([64, 33]), 0.5) for _ in range(ops)]
    with tf1.Session() as sess:
      return [[m != 0 for m in sess.run(ys)] for _ in range(runs)]


def test_the_graph_seed_decides_the_masks_and_each_op_and_run_draws_its_own():
  """The stateless draw is keyed by the op's stateful generator: a seeded graph repeats its
  masks in a new process-like graph, an unseeded one does not, and two ops or two runs of
  one op never share a mask (64 x 33 elements at rate 0.5: a repeat by chance is 2^-2112)."""
  first, again, unseeded = _masks(7), _masks(7), _masks(None)
  assert all(np.array_equal(a, b) for ra, rb in zip(first, again) for a, b in zip(ra, rb))
  assert not np.array_equal(first[0][0], unseeded[0][0])
  assert not np.array_equal(first[0][0], first[0][1])  # two ops
  assert not np.array_equal(first[0][0], first[1][0])  # two runs


@pytest.mark.parametrize("dtype, rounded", [(tf.bfloat16, 1.109375), (tf.float16, 1.111328125)])
def test_a_16_bit_tensor_is_dropped_out_at_the_float32_scale_on_the_host_only(dtype, rounded):
  # 1 / 0.9 in 16 bits is `rounded`: kept values 0.16% (bfloat16) or 0.018% (float16) off
  # their float32 mean. Here each kept value is x * float32(1 / 0.9) rounded once to 16 bits,
  # round-to-nearest-even on 2^20 random mantissas: the mean ratio is 1 / 0.9 within ~1e-6,
  # where the 16-bit scale is 1.8e-4 (float16) to 1.6e-3 (bfloat16) off.
  assert abs(rounded * 0.9 - 1) > 1.5e-4
  x = np.random.default_rng(0).uniform(1.0, 2.0, 2 ** 20).astype(np.float32)
  with tf.Graph().as_default():
    x16 = tf.cast(tf.constant(x), dtype)
    y = dropout.dropout(x16, 0.1)
    assert y.dtype == dtype
    g = tf.gradients(tf.reduce_sum(tf.cast(y, tf.float32)), x16)[0]
    with tf1.Session() as sess:
      y1, x1, g1 = sess.run([tf.cast(y, tf.float32), tf.cast(x16, tf.float32),
                             tf.cast(g, tf.float32)])
    with precision.tracing_for_engine():  # the engine computes the op in 16 bits
      traced = dropout.dropout(tf1.placeholder(dtype, [4, 6]), 0.1)
    muls = [op for op in traced.graph.get_operations()
            if op.type == "Mul" and op.name.startswith(traced.op.name.rsplit("/", 1)[0])]
  kept = y1 != 0
  assert abs(kept.mean() - 0.9) < 2.5e-3
  assert abs(y1[kept].sum() / x1[kept].sum() * 0.9 - 1) < 5e-5
  np.testing.assert_array_equal(g1 != 0, kept)
  assert traced.dtype == dtype and [op.outputs[0].dtype for op in muls] == [dtype]
