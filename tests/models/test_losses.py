"""models/losses.sparse_softmax_xent against TF's own ops: value, gradient, extremes, errors."""

import contextlib
import os

import numpy as np
import pytest
import tensorflow as tf

from cerebras_models import losses
from cerebras_tf.runtime import precision

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


def _dense_and_autodiff(x, table, bias, labels, weights, smoothing=0.0):
  """(ours, reference, our gradients, the reference's) of the output layer's loss: the
  reference is autodiff of `x @ table^T + bias` as a plain layer builds it (the table cast to
  x's dtype, float32 logits) through log_softmax, against the label-smoothed target
  (1 - s) onehot + s / V; gradients w.r.t. x, table (and bias)."""
  ours = losses.dense_sparse_softmax_xent(x, table, bias, labels, smoothing=smoothing)
  logits = tf.cast(tf.matmul(x, tf.cast(table, x.dtype), transpose_b=True), tf.float32)
  if bias is not None:
    logits = tf.nn.bias_add(logits, bias)
  log_p = tf.nn.log_softmax(logits)
  ref = (-(1.0 - smoothing) * tf.gather(log_p, labels, batch_dims=1)
         - smoothing * tf.reduce_mean(log_p, axis=-1))
  wrt = [x, table] + ([bias] if bias is not None else [])
  return (ours, ref, tf.gradients(tf.reduce_sum(ours * weights), wrt),
          tf.gradients(tf.reduce_sum(ref * weights), wrt))


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("untransposed", [True, False])
@pytest.mark.parametrize("with_bias", [True, False])
def test_dense_form_matches_autodiff_of_the_output_layer(with_bias, untransposed, smoothing,
                                                         monkeypatch):
  # Labels repeat (rows 0, 3, 5 share label 7): the two scatters must add, not overwrite.
  # Zero weights (padded prediction slots) must contribute nothing. Both forms of the table's
  # float32 gradient (the AVX-512 host's and the AVX2 hosts'), whichever this host runs; with
  # the Transformer's label smoothing 0.1 and without.
  monkeypatch.setattr(losses, "_table_gradient_untransposed", lambda: untransposed)
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
    ours, ref, g_ours, g_ref = _dense_and_autodiff(xt, tt, bt, labels, weights, smoothing)
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


def test_underflowing_label_rows_take_the_max_form_and_the_others_keep_their_value():
  """One row's label is 200 below its top logit (p[label] underflows: the batch's lse comes
  from the max reductions), the other's 80 below (p[label] = e^-80 is a normal float32). The
  same losses either way, and finite; a batch of the second row alone takes the label form."""
  x = np.ones((2, 1), np.float32)
  table = np.array([[200.0], [0.0], [0.0], [120.0]], np.float32)
  with tf.Graph().as_default():
    both = losses.dense_sparse_softmax_xent(tf.constant(x), tf.constant(table), None, [1, 3])
    alone = losses.dense_sparse_softmax_xent(tf.constant(x[:1]), tf.constant(table), None, [3])
    b, a = _run([both, alone])
  np.testing.assert_allclose(b, [200.0, 80.0], rtol=1e-6)
  np.testing.assert_allclose(a, [80.0], rtol=1e-6)


def test_the_engine_trace_has_no_cond(implementation):
  """The underflow guard is a cond on the host only: the engine's graph keeps its straight
  reductions (the compiler places what it traces). TF's fused op has none."""
  def conds(trace):
    with tf.Graph().as_default() as graph:
      with precision.tracing_for_engine() if trace else contextlib.nullcontext():
        losses.dense_sparse_softmax_xent(tf.zeros([4, 2]), tf.zeros([5, 2]), None, [0, 1, 2, 3])
    return [op.type for op in graph.get_operations() if op.type in ("If", "StatelessIf")]
  assert bool(conds(trace=False)) == (implementation == "softmax-based")
  assert not conds(trace=True)


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


def _weighted_rows_and_all_rows(x, table, bias, labels, weights, engine=False):
  """(loss, gradients) of the weighted mean through on_weighted_rows and over every row."""
  per_row = lambda x, labels: losses.dense_sparse_softmax_xent(x, table, bias, labels)
  with precision.tracing_for_engine() if engine else contextlib.nullcontext():
    some = losses.on_weighted_rows(per_row, weights, x, labels)
  every = per_row(x, labels)
  variables = [x, table] + ([bias] if bias is not None else [])
  out = []
  for per_example in (some, every):
    loss = tf.reduce_sum(weights * per_example) / (tf.reduce_sum(weights) + 1e-5)
    # x's gradient through the gather is IndexedSlices; the layer below makes it dense
    gradients = [tf.convert_to_tensor(g) for g in tf.gradients(loss, variables)]
    out.append((loss, per_example, gradients))
  return out


@pytest.mark.parametrize("real", ["half", "none", "all", "one_bucket_plus_one"])
def test_weighted_rows_give_the_loss_and_gradients_of_every_row(real):
  """The rows of weight 0 (BERT's padded masked-LM slots) are left out: the same loss and the
  same gradients (their terms are 0 * loss), the per-row losses equal where the weight is not
  0 and 0 where it is. Row counts around losses.ROW_BUCKET's multiples, and a batch of
  padding alone (the loss is 0, every gradient 0)."""
  rng = np.random.RandomState(3)
  n, k, v = 70, 6, 40
  x = rng.randn(n, k).astype(np.float32)
  table, bias = rng.randn(v, k).astype(np.float32), rng.randn(v).astype(np.float32)
  labels = rng.randint(0, v, n)
  weights = {"half": (rng.rand(n) < 0.5) * rng.rand(n),
             "none": np.zeros(n),
             "all": rng.rand(n) + 0.1,
             "one_bucket_plus_one": np.r_[np.ones(losses.ROW_BUCKET + 1),
                                          np.zeros(n - losses.ROW_BUCKET - 1)]}[real]
  weights = weights.astype(np.float32)
  with tf.Graph().as_default():
    xt, tt, bt, wt = (tf.constant(a) for a in (x, table, bias, weights))
    lt = tf1.placeholder_with_default(labels, [None])  # the row count is dynamic in the head
    (lo, po, go), (lr, pr, gr) = _run(_weighted_rows_and_all_rows(xt, tt, bt, lt, wt))
  np.testing.assert_allclose(lo, lr, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(po, np.where(weights != 0, pr, 0.0), rtol=1e-5, atol=1e-6)
  for name, a, b in zip(("x", "table", "bias"), go, gr):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6,
                               err_msg=name)
  assert (np.abs(np.asarray(gr[1])).max() > 0) == (real != "none")


@pytest.mark.parametrize("real,total,computed", [
    # BERT-tiny's 640 slots: steps of 16 rows (640 / 16 = 40 shapes at most)
    (0, 640, 16), (1, 640, 16), (305, 640, 320), (321, 640, 336), (640, 640, 640),
    # few rows: steps of 16, never more than there are
    (33, 70, 48), (65, 70, 70),
    # 8,192 rows: steps of 16 * ceil(8192 / 640) = 208, so 40 shapes at most
    (8000, 8192, 8112), (4097, 8192, 4160), (8192, 8192, 8192)])
def test_rows_computed_round_up_to_a_bounded_number_of_shapes(real, total, computed):
  assert int(losses.rows_computed(real, total)) == computed


def test_weighted_rows_keep_the_static_shape_in_the_engine_trace():
  """The engine's figures are made of the graph's shapes: traced for the engine, the output
  layer runs on all N rows ([N, V] logits, as google-bert's head), not a dynamic selection."""
  with tf.Graph().as_default() as graph:
    x, table = tf.zeros([24, 4]), tf.zeros([10, 4])
    losses.on_weighted_rows(lambda x, labels: losses.dense_sparse_softmax_xent(
        x, table, None, labels, scope="on_host"), tf.zeros([24]), x, tf.zeros([24], tf.int32))
    with precision.tracing_for_engine():
      losses.on_weighted_rows(lambda x, labels: losses.dense_sparse_softmax_xent(
          x, table, None, labels, scope="for_engine"), tf.zeros([24]), x, tf.zeros([24], tf.int32))
  products = {op.name.split("/")[0]: op.outputs[0].shape.as_list()
              for op in graph.get_operations() if op.type == "MatMul"}
  assert products == {"weighted_rows": [None, 10], "for_engine": [24, 10]}, products


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
