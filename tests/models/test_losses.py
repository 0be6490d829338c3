"""models/losses.sparse_softmax_xent against TF's own ops: value, gradient, extremes, errors."""

import os

import numpy as np
import pytest
import tensorflow as tf

from cerebras_models import losses

tf1 = tf.compat.v1


@pytest.fixture(autouse=True, params=["softmax-based", "tf-op"])
def implementation(request, monkeypatch):
  """Both forms: the softmax-based one (oneDNN on) and TF's fused op (oneDNN off)."""
  monkeypatch.setattr(losses, "onednn_active", lambda: request.param == "softmax-based")
  return request.param


def _run(fetches, feed=None):
  with tf1.Session() as sess:
    return sess.run(fetches, feed)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_value_and_gradient_match_log_softmax_form(smoothing):
  rng = np.random.RandomState(0)
  logits = (rng.randn(3, 5, 40) * 8).astype(np.float32)
  labels = rng.randint(0, 40, (3, 5))
  weights = rng.rand(3, 5).astype(np.float32)
  with tf.Graph().as_default():
    lt = tf.constant(logits)
    ours = losses.sparse_softmax_xent(lt, labels, smoothing)
    log_probs = tf.nn.log_softmax(lt)
    ref = ((smoothing - 1.0) * tf.gather(log_probs, labels, batch_dims=2)
           - smoothing * tf.reduce_mean(log_probs, axis=-1))
    if not smoothing:
      tf_op = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=lt)
    else:
      tf_op = ref
    g_ours = tf.gradients(tf.reduce_sum(ours * weights), lt)[0]
    g_ref = tf.gradients(tf.reduce_sum(ref * weights), lt)[0]
    o, r, t, go, gr = _run([ours, ref, tf_op, g_ours, g_ref])
  assert o.shape == (3, 5)
  np.testing.assert_allclose(o, r, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(o, t, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(go, gr, atol=1e-6)


def test_finite_where_the_label_probability_underflows():
  # The label's logit is 200 below the top one: p[label] = e^-200 underflows float32 to 0, so
  # -log(p[label]) would be inf; the loss is exactly 200 + log(1 + e^-200 + ...) ~ 200.
  logits = np.zeros((1, 4), np.float32)
  logits[0, 0] = 200.0
  with tf.Graph().as_default():
    ours = losses.sparse_softmax_xent(tf.constant(logits), [3])
    tf_op = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=[3], logits=logits)
    o, t = _run([ours, tf_op])
  assert np.isfinite(o).all()
  np.testing.assert_allclose(o, [200.0], rtol=1e-6)
  np.testing.assert_allclose(o, t, rtol=1e-6)


def test_out_of_range_label_fails():
  with tf.Graph().as_default():
    ours = losses.sparse_softmax_xent(tf.zeros([2, 5]), [1, 5])
    with pytest.raises(tf.errors.InvalidArgumentError):
      _run(ours)


def _dense_and_autodiff(x, table, bias, labels, weights):
  """(ours, reference, our gradients, the reference's) of the output layer's loss: the
  reference is autodiff of `x @ table^T + bias` as a plain layer builds it (the table cast to
  x's dtype, float32 logits) through log_softmax; gradients w.r.t. x, table (and bias)."""
  ours = losses.dense_sparse_softmax_xent(x, table, bias, labels)
  logits = tf.cast(tf.matmul(x, tf.cast(table, x.dtype), transpose_b=True), tf.float32)
  if bias is not None:
    logits = tf.nn.bias_add(logits, bias)
  ref = -tf.gather(tf.nn.log_softmax(logits), labels, batch_dims=1)
  wrt = [x, table] + ([bias] if bias is not None else [])
  return (ours, ref, tf.gradients(tf.reduce_sum(ours * weights), wrt),
          tf.gradients(tf.reduce_sum(ref * weights), wrt))


@pytest.mark.parametrize("with_bias", [True, False])
def test_dense_form_matches_autodiff_of_the_output_layer(with_bias):
  # Labels repeat (rows 0, 3, 5 share label 7): the two scatters must add, not overwrite.
  # Zero weights (padded prediction slots) must contribute nothing.
  rng = np.random.RandomState(1)
  n, k, v = 8, 6, 30
  x = rng.randn(n, k).astype(np.float32)
  table = (rng.randn(v, k) * 2).astype(np.float32)
  bias = rng.randn(v).astype(np.float32)
  labels = np.array([7, 1, 29, 7, 0, 7, 12, 3])
  weights = rng.rand(n).astype(np.float32)
  weights[4] = 0.0
  with tf.Graph().as_default():
    xt, tt = tf.constant(x), tf.constant(table)
    bt = tf.constant(bias) if with_bias else None
    ours, ref, g_ours, g_ref = _dense_and_autodiff(xt, tt, bt, labels, weights)
    o, r, go, gr = _run([ours, ref, g_ours, g_ref])
  np.testing.assert_allclose(o, r, rtol=1e-5, atol=1e-5)
  for name, a, b in zip(("x", "table", "bias"), go, gr):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=name)
  assert np.abs(gr[1][7]).max() > 0  # the repeated label's row really is in the check


def test_dense_form_finite_where_the_label_probability_underflows():
  x = np.ones((1, 1), np.float32)
  table = np.array([[200.0], [0.0], [0.0]], np.float32)
  with tf.Graph().as_default():
    ours = losses.dense_sparse_softmax_xent(tf.constant(x), tf.constant(table), tf.zeros([3]), [2])
    o = _run(ours)
  np.testing.assert_allclose(o, [200.0 + np.log1p(2 * np.exp(-200.0))], rtol=1e-6)


@pytest.mark.parametrize("with_bias", [True, False])
def test_dense_form_in_bfloat16_matches_the_mixed_precision_output_layer(with_bias):
  """A bfloat16 x (mixed precision): the products in bfloat16, the loss and the table's and
  bias's gradients float32 and x's bfloat16, against autodiff of the same layer as the
  generic path builds it (cast table, bf16 matmul, float32 logits). Both round at bf16's
  8 bits (2^-8 = 0.4% relative per product), so they agree to about 1% of the largest
  gradient, not to float32's 1e-5."""
  rng = np.random.RandomState(2)
  n, k, v = 16, 8, 50
  x = rng.randn(n, k).astype(np.float32)
  table = rng.randn(v, k).astype(np.float32)
  bias = rng.randn(v).astype(np.float32)
  labels = np.array([7, 1, 49, 7, 0, 7, 12, 3] * 2)
  weights = rng.rand(n).astype(np.float32)
  with tf.Graph().as_default():
    xt, tt = tf.constant(x), tf.constant(table)
    bt = tf.constant(bias) if with_bias else None
    x16 = tf.cast(xt, tf.bfloat16)
    ours, ref, g_ours, g_ref = _dense_and_autodiff(x16, tt, bt, labels, weights)
    assert ours.dtype == tf.float32
    assert [g.dtype for g in g_ours] == [tf.bfloat16, tf.float32, tf.float32][:len(g_ours)]
    o, r, go, gr = _run([ours, ref, g_ours, g_ref])
  np.testing.assert_allclose(o, r, rtol=1e-5, atol=1e-5)  # the same float32 logits
  for name, a, b in zip(("x", "table", "bias"), go, gr):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    assert np.abs(a - b).max() <= 0.01 * np.abs(b).max(), name


_PROBE = """
import os, sys
if sys.argv[1] == "tensorflow_first":
  import tensorflow
import cerebras_tf
from cerebras_tf.runtime import onednn
print("ACTIVE", onednn.active(), cerebras_tf.ONEDNN_TOO_LATE)
"""


@pytest.mark.parametrize("case", ["tensorflow_first", "oneDNN_off"])
def test_onednn_is_read_from_the_kernels_that_run(case, implementation):
  """TensorFlow picks its kernels at import; IsMklEnabled() rereads the variable at each call.
  With TensorFlow imported first (env unset) the kernels are oneDNN's exactly where TF 2.15
  turns it on by default: a CPU with AVX-512 VNNI or bf16, AVX-VNNI or AMX. The old guard said
  "off" there (on the AVX-512 EPYC of 2026-11-29: the slower loss forms and a false hint)."""
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel
  from cerebras_tf.runtime import precision  # pylint: disable=import-outside-toplevel
  if implementation != "softmax-based":
    pytest.skip("one run per case")
  env = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
  if case == "oneDNN_off":
    env["TF_ENABLE_ONEDNN_OPTS"] = "0"
  out = subprocess.run([sys.executable, "-c", _PROBE, case], env=env, capture_output=True,
                       text=True, timeout=120, check=False)
  line = [l for l in out.stdout.splitlines() if l.startswith("ACTIVE")]
  assert line, out.stderr[-2000:]
  _, active, too_late = line[0].split()
  tf_default = bool(precision.cpu_flags() & {"avx512_vnni", "avx512_bf16", "avx_vnni",
                                              "amx_tile", "amx_int8", "amx_bf16"})
  if case == "tensorflow_first":
    assert too_late == "True" and active == str(tf_default), (active, tf_default)
  else:
    assert too_late == "False" and active == "False"
