"""Kernel costs (compiler/lower.py:op_flops, op_bytes) against hand calculations.

Each test builds the op TF or Keras emits for a layer on tiny static shapes and checks its FLOPs
(a multiply-add is 2) or bytes with the arithmetic written in the comment. The kernel doc
(docs/kernels.md) must equal what scripts/kernel_doc.py renders from the kernel table.
"""

import os
import runpy

import pytest
import tensorflow as tf

from cerebras_tf.compiler import kernels, lower

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
L = tf.keras.layers


def _ops(build, *shapes, dtype=tf.float32):
  """(ops the output depends on, output) of build(placeholders...) in a fresh graph.

  Only the output's ancestors, as the compiler sees a model (not initializers or the
  moving-average updates of a batch norm, which run beside the forward pass).
  """
  g = tf.Graph()
  with g.as_default():
    xs = [tf.compat.v1.placeholder(dtype, s) for s in shapes]
    out = build(*xs)
  seen, stack = set(), [t.op for t in tf.nest.flatten(out)]
  while stack:
    op = stack.pop()
    if op not in seen:
      seen.add(op)
      stack.extend(t.op for t in op.inputs)
  return [op for op in g.get_operations() if op in seen], out


def _flops(ops, op_type):
  return sum(lower.op_flops(o) for o in ops if o.type == op_type)


def _only(ops, op_type):
  found = [o for o in ops if o.type == op_type]
  assert len(found) == 1, [o.type for o in ops]
  return found[0]


def test_dense_on_a_sequence_is_a_tensordot_matmul():
  # Keras's Dense on [2, 3, 4] (and tf.tensordot) reshapes to [6, 4] @ [4, 5]: 2 * 6 * 4 * 5
  # = 240 FLOPs; the reshapes and the shape arithmetic around it are free.
  ops, out = _ops(lambda x: L.Dense(5, use_bias=False)(x), [2, 3, 4])
  assert out.shape.as_list() == [2, 3, 5]
  assert sum(lower.op_flops(o) for o in ops) == _flops(ops, "MatMul") == 240


def test_conv2d_strided_same_padding():
  # in [2, 8, 8, 3], 4 filters 3x3, stride 2, same -> out [2, 4, 4, 4] = 128 elements;
  # each is a 3*3*3 = 27-term dot product: 2 * 128 * 27 = 6912.
  ops, out = _ops(lambda x: L.Conv2D(4, 3, strides=2, padding="same", use_bias=False)(x),
                  [2, 8, 8, 3])
  assert out.shape.as_list() == [2, 4, 4, 4]
  assert _flops(ops, "Conv2D") == 6912


def test_conv2d_dilated_counts_the_dilated_output():
  # in [1, 9, 9, 2], 4 filters 3x3, dilation 2 (a 5x5 footprint), valid -> out [1, 5, 5, 4]
  # = 100 elements of 3*3*2 = 18 terms: 2 * 100 * 18 = 3600 (dilation adds no FLOPs).
  ops, out = _ops(lambda x: L.Conv2D(4, 3, dilation_rate=2, use_bias=False)(x), [1, 9, 9, 2])
  assert out.shape.as_list() == [1, 5, 5, 4]
  assert _flops(ops, "Conv2D") == 3600
  assert all(kernels.kernel(o.type) for o in ops), [o.type for o in ops if not kernels.kernel(o.type)]


def test_conv1d_is_a_conv2d_on_a_row():
  # in [2, 10, 3], 4 filters of width 3, valid -> out [2, 8, 4] = 64; 2 * 64 * 9 = 1152.
  ops, _ = _ops(lambda x: L.Conv1D(4, 3, use_bias=False)(x), [2, 10, 3])
  assert _flops(ops, "Conv2D") == 1152


def test_conv3d():
  # in [1, 4, 4, 4, 2], 3 filters 2x2x2, valid -> out [1, 3, 3, 3, 3] = 81 elements of
  # 2*2*2*2 = 16 terms: 2 * 81 * 16 = 2592.
  ops, _ = _ops(lambda x: L.Conv3D(3, 2, use_bias=False)(x), [1, 4, 4, 4, 2])
  assert _flops(ops, "Conv3D") == 2592


def test_depthwise_and_separable():
  # depthwise: in [1, 6, 6, 3], 3x3, multiplier 2, valid -> out [1, 4, 4, 6] = 96 elements of
  # 9 terms: 2 * 96 * 9 = 1728.
  ops, _ = _ops(lambda x: L.DepthwiseConv2D(3, depth_multiplier=2, use_bias=False)(x),
                [1, 6, 6, 3])
  assert _flops(ops, "DepthwiseConv2dNative") == 1728
  # separable, 5 filters: depthwise out [1, 4, 4, 3] = 48 * 9 terms -> 864; pointwise 1x1
  # out [1, 4, 4, 5] = 80 elements of 3 terms -> 480.
  ops, _ = _ops(lambda x: L.SeparableConv2D(5, 3, use_bias=False)(x), [1, 6, 6, 3])
  assert _flops(ops, "DepthwiseConv2dNative") == 864
  assert _flops(ops, "Conv2D") == 480


def test_conv2d_transpose_is_backprop_input_in_forward():
  # in [1, 3, 3, 4] -> 2 filters 3x3 stride 2 -> out [1, 7, 7, 2]. Each of the 36 input
  # elements scatters into 3*3*2 = 18 outputs: 2 * 36 * 18 = 1296.
  ops, out = _ops(lambda x: L.Conv2DTranspose(2, 3, strides=2, use_bias=False)(x), [1, 3, 3, 4])
  assert out.shape.as_list() == [1, 7, 7, 2]
  assert _flops(ops, "Conv2DBackpropInput") == 1296


def test_pooling_2d_3d_1d_and_global():
  # MaxPool 2x2 s2 on [1, 4, 4, 3]: out 2*2*3 = 12 elements, 4 compares each: 48.
  ops, _ = _ops(lambda x: L.MaxPool2D()(x), [1, 4, 4, 3])
  assert _flops(ops, "MaxPool") == 48
  # AvgPool 3x3 s1 same on [1, 4, 4, 1]: out 16 elements, 9 adds each: 144.
  ops, _ = _ops(lambda x: L.AveragePooling2D(3, strides=1, padding="same")(x), [1, 4, 4, 1])
  assert _flops(ops, "AvgPool") == 144
  # MaxPool3D 2x2x2 on [1, 4, 4, 4, 2]: out 2*2*2*2 = 16, 8 each: 128.
  ops, _ = _ops(lambda x: L.MaxPool3D()(x), [1, 4, 4, 4, 2])
  assert _flops(ops, "MaxPool3D") == 128
  # MaxPool1D 2 on [2, 6, 3] (a MaxPool on [2, 1, 6, 3]): out 2*3*3 = 18, 2 each: 36.
  ops, _ = _ops(lambda x: L.MaxPool1D()(x), [2, 6, 3])
  assert _flops(ops, "MaxPool") == 36
  # GlobalAveragePooling2D = Mean over [2, 4, 4, 3]: one add per input element: 96.
  ops, _ = _ops(lambda x: L.GlobalAveragePooling2D()(x), [2, 4, 4, 3])
  assert _flops(ops, "Mean") == 96
  ops, _ = _ops(lambda x: L.GlobalMaxPooling2D()(x), [2, 4, 4, 3])
  assert _flops(ops, "Max") == 96


def test_pooling_gradients():
  # MaxPoolGrad for 2x2 pooling of [1, 4, 4, 3]: dy has 12 elements, 4-element windows,
  # 2 FLOPs per element (find the max, route dy): 2 * 12 * 4 = 96. AvgPoolGrad: 1 * 12 * 4.
  def build(x):
    return tf.gradients(tf.reduce_sum(tf.nn.max_pool2d(x, 2, 2, "VALID")) +
                        tf.reduce_sum(tf.nn.avg_pool2d(x, 2, 2, "VALID")), x)
  ops, _ = _ops(build, [1, 4, 4, 3])
  assert _flops(ops, "MaxPoolGrad") == 96
  assert _flops(ops, "AvgPoolGrad") == 48


def test_batch_norm_training_inference_and_layer_norm():
  # Fused batch norm on [2, 4, 4, 3] = 96 elements: training 8 per element = 768;
  # inference folds to x * a + b: 2 per element = 192.
  ops, _ = _ops(lambda x: L.BatchNormalization()(x, training=True), [2, 4, 4, 3])
  assert _flops(ops, "FusedBatchNormV3") == 768
  ops, _ = _ops(lambda x: L.BatchNormalization()(x, training=False), [2, 4, 4, 3])
  assert _flops(ops, "FusedBatchNormV3") == 192
  # Keras's LayerNormalization on [2, 5, 6] emits a training-mode FusedBatchNormV3 over the
  # 60 elements: 8 * 60 = 480.
  ops, _ = _ops(lambda x: L.LayerNormalization()(x), [2, 5, 6])
  assert _flops(ops, "FusedBatchNormV3") == 480
  # Unfused batch norm: moments are Mean reductions (one add per input element) plus
  # elementwise ops, every one of them with a kernel.
  ops, _ = _ops(lambda x: L.BatchNormalization(fused=False)(x, training=True), [2, 3])
  assert "FusedBatchNormV3" not in {o.type for o in ops}
  assert all(kernels.kernel(o.type) for o in ops), sorted(
      {o.type for o in ops if not kernels.kernel(o.type)})
  assert _flops(ops, "Mean") == 2 * 6  # mean of x and of the squared deviations: 6 each


def test_batch_norm_gradient():
  # FusedBatchNormGradV3 on [2, 2, 2, 3] = 24 elements: 9 per element = 216.
  ops, _ = _ops(lambda x: tf.gradients(
      tf.reduce_sum(L.BatchNormalization()(x, training=True)), x), [2, 2, 2, 3])
  assert _flops(ops, "FusedBatchNormGradV3") == 216


def test_softmax_and_cross_entropy_variants():
  # Softmax on [2, 10]: max, subtract, exp, sum, divide = 5 per element: 100.
  ops, _ = _ops(tf.nn.softmax, [2, 10])
  assert _flops(ops, "Softmax") == 100
  ops, _ = _ops(tf.nn.log_softmax, [2, 10])
  assert _flops(ops, "LogSoftmax") == 100
  # Cross-entropy from logits [4, 10]: softmax 5 + log-likelihood and gradient 1 = 6 per
  # logit: 240, for the sparse and the dense label forms.
  def sparse(logits):
    return tf.nn.sparse_softmax_cross_entropy_with_logits(tf.zeros([4], tf.int32), logits)
  ops, _ = _ops(sparse, [4, 10])
  assert _flops(ops, "SparseSoftmaxCrossEntropyWithLogits") == 240
  ops, _ = _ops(lambda z: tf.nn.softmax_cross_entropy_with_logits(tf.zeros([4, 10]), z),
                [4, 10])
  assert _flops(ops, "SoftmaxCrossEntropyWithLogits") == 240


def test_upsampling_concat_residual_and_embedding():
  # Bilinear 2x: [1, 2, 2, 3] -> [1, 4, 4, 3] = 48 outputs, 4 multiply-adds each: 384.
  ops, _ = _ops(lambda x: L.UpSampling2D(interpolation="bilinear")(x), [1, 2, 2, 3])
  assert _flops(ops, "ResizeBilinear") == 384
  ops, _ = _ops(lambda x: L.UpSampling2D()(x), [1, 2, 2, 3])
  assert _flops(ops, "ResizeNearestNeighbor") == 0
  # Concatenate [2, 3] and [2, 5] (float32): no FLOPs; it reads 6 + 10 elements and the
  # int32 axis (1 element) and writes 16: (6 + 10 + 16) * 4 + 1 * 4 = 132 bytes.
  ops, _ = _ops(lambda a, b: L.Concatenate()([a, b]), [2, 3], [2, 5])
  concat = _only(ops, "ConcatV2")
  assert lower.op_flops(concat) == 0 and lower.op_bytes(concat) == 132
  # Residual add of two [2, 8]: 16 adds; reads 32 and writes 16 floats = 192 bytes.
  ops, _ = _ops(lambda a, b: L.Add()([a, b]), [2, 8], [2, 8])
  add = _only(ops, "AddV2")
  assert lower.op_flops(add) == 16 and lower.op_bytes(add) == 192
  # Embedding(50, 4) on ids [2, 3]: a gather, no FLOPs.
  ops, _ = _ops(lambda ids: L.Embedding(50, 4)(ids), [2, 3], dtype=tf.int32)
  gather = [o for o in ops if kernels.category(o.type) == kernels.GATHER and "embedding" in o.name]
  assert gather and all(lower.op_flops(o) == 0 for o in gather)


def test_lstm_while_loop_costs_its_body_times_the_time_steps():
  # LSTM(16) over T = 12 steps of 8 features, batch 4. Per step the cell's two matmuls are
  # x [4, 8] @ [8, 64] and h [4, 16] @ [16, 64]: 2 * 4 * 64 * (8 + 16) = 12288 FLOPs;
  # the loop's contraction FLOPs are 12 * 12288 = 147456.
  ops, _ = _ops(lambda x: L.LSTM(16)(x), [4, 12, 8])
  loop = _only(ops, "While")
  assert lower.trip_count(loop) == 12
  assert lower._loop_cost(loop, lower._contraction_flops) == 147456  # pylint: disable=protected-access
  # The same layer unrolled is plain ops with the same matmul FLOPs.
  ops_u, _ = _ops(lambda x: L.LSTM(16, unroll=True)(x), [4, 12, 8])
  assert _flops(ops_u, "MatMul") == 147456
  # All FLOPs (gates, biases, activations too) agree with the unrolled form within 1%.
  unrolled = sum(lower.op_flops(o) for o in ops_u)
  assert lower.op_flops(loop) == pytest.approx(unrolled, rel=0.01)


def test_while_loop_without_a_static_bound_is_refused():
  def build(x):
    n = tf.cast(tf.reduce_sum(x), tf.int32)
    return tf.while_loop(lambda i, y: i < n, lambda i, y: (i + 1, y * 2.0), (0, x))[1]
  ops, _ = _ops(build, [2])
  loop = [o for o in ops if o.type in ("While", "StatelessWhile")][0]
  assert lower.trip_count(loop) is None
  assert "static trip count" in lower._check_op(loop)  # pylint: disable=protected-access


@pytest.mark.parametrize("bound, step, trips", [(10, 1, 10), (10, 2, 5), (9, 2, 5)])
def test_while_loop_with_a_python_bound_and_step(bound, step, trips):
  # tf.while_loop(lambda i, h: i < 10, ...) with a Python int: the bound is a constant of the
  # condition, not a loop input, and was refused as "without a static trip count". Each trip
  # is h [4, 16] @ [16, 16] = 2 * 4 * 16 * 16 = 2048 matmul FLOPs; the step divides the span
  # (i = 0, 2, 4, 6, 8 is 5 trips for both 10 and 9).
  def build(x):
    w = tf.ones([16, 16])
    return tf.while_loop(lambda i, h: i < bound,
                         lambda i, h: (i + step, tf.matmul(h, w)), (0, x))[1]
  ops, _ = _ops(build, [4, 16])
  loop = [o for o in ops if o.type in ("While", "StatelessWhile")][0]
  assert lower.trip_count(loop) == trips
  assert lower._loop_cost(loop, lower._contraction_flops) == trips * 2048  # pylint: disable=protected-access
  assert lower._check_op(loop) is None  # pylint: disable=protected-access


@pytest.mark.parametrize("cond, start, body_step, trips", [
    (lambda i: i > 0, 10, lambda i: i - 1, 10),       # a countdown: 10, 9, ..., 1
    (lambda i: i >= 0, 9, lambda i: i - 2, 5),        # 9, 7, 5, 3, 1
    (lambda i: i > 1, 10, lambda i: i + (-3), 3),     # 10, 7, 4
    (lambda i: 10 > i, 0, lambda i: i + 1, 10),       # the bound on the left
    (lambda i: 0 < i, 4, lambda i: i - 1, 4),         # both
])
def test_while_loop_counting_down_or_written_the_other_way_round(cond, start, body_step, trips):
  # `while i > 0: i -= 1` (and `10 > i`) were refused as "without a static trip count": only
  # `i < n` counting up was read. Each trip is h [4, 16] @ [16, 16] = 2048 matmul FLOPs.
  def build(x):
    w = tf.ones([16, 16])
    return tf.while_loop(lambda i, h: cond(i),
                         lambda i, h: (body_step(i), tf.matmul(h, w)), (start, x))[1]
  ops, _ = _ops(build, [4, 16])
  loop = [o for o in ops if o.type in ("While", "StatelessWhile")][0]
  assert lower.trip_count(loop) == trips
  assert lower._loop_cost(loop, lower._contraction_flops) == trips * 2048  # pylint: disable=protected-access
  assert lower._check_op(loop) is None  # pylint: disable=protected-access


def test_a_tf_function_call_costs_its_body_forward_and_backward():
  # TF2 code decorates helpers with @tf.function; called from a model_fn (a graph) each call
  # is one StatefulPartitionedCall op, which validation refused as an op with no kernel.
  # x [4, 64] -> gelu(x @ [64, 256]) @ [256, 64]: 2 * 4 * 64 * 256 * 2 = 262144 matmul FLOPs;
  # with the GELU and its gradient, forward and backward equal the same helper undecorated.
  def block(x, w1, w2):
    return tf.matmul(tf.nn.gelu(tf.matmul(x, w1)), w2)

  def costs(fn):
    g = tf.Graph()
    with g.as_default():
      x = tf.compat.v1.placeholder(tf.float32, [4, 64])
      w1 = tf.compat.v1.get_variable("w1", [64, 256])
      w2 = tf.compat.v1.get_variable("w2", [256, 64])
      y = fn(x, w1, w2)
      grads = tf.gradients(tf.reduce_sum(y), [w1, w2])
    fwd, stack = set(), [y.op]  # what y depends on: not the variables' initializers
    while stack:
      op = stack.pop()
      if op not in fwd:
        fwd.add(op)
        stack.extend(t.op for t in op.inputs)
    bwd = [o for o in g.get_operations() if o.name.startswith("gradients")]
    assert all(lower._check_op(o) is None for o in fwd)  # pylint: disable=protected-access
    return (sum(lower.op_flops(o) for o in fwd), sum(lower.op_flops(o) for o in bwd),
            [o.type for o in fwd], grads)

  fwd, bwd, types, _ = costs(tf.function(block))
  assert "StatefulPartitionedCall" in types or "PartitionedCall" in types
  inline_fwd, inline_bwd, inline_types, _ = costs(block)
  assert "MatMul" in inline_types
  assert fwd == pytest.approx(inline_fwd, rel=1e-6) and fwd > 262144
  # The gradient of a call is a call of the function's gradient: the two matmuls' gradients
  # (2 x 262144) and the GELU's; TF's spelling of them differs by a few elementwise ops.
  assert bwd == pytest.approx(inline_bwd, rel=0.05) and bwd > 2 * 262144


def test_a_tf_function_whose_body_has_no_kernel_is_named():
  ops, _ = _ops(lambda x: tf.function(lambda y: tf.strings.as_string(y))(x), [2])
  call = [o for o in ops if o.type in ("PartitionedCall", "StatefulPartitionedCall")][0]
  assert lower._check_op(call) == (  # pylint: disable=protected-access
      "is a call of a tf.function whose body uses op(s) with no engine kernel: AsString")


def test_the_elementwise_math_of_users_losses_has_kernels():
  # Robust losses and masks users write (tf.math.is_nan, xlogy in a KL term, cumprod, atan2,
  # expm1) were refused as ops with no kernel; each is one pass over its output: 4 x 8 = 32.
  fns = {"IsNan": tf.math.is_nan, "IsInf": tf.math.is_inf, "Expm1": tf.math.expm1,
         "Sinh": tf.math.sinh, "Cosh": tf.math.cosh, "Atan": tf.math.atan, "Tan": tf.math.tan,
         "Xlogy": lambda x: tf.math.xlogy(x, x), "Xdivy": lambda x: tf.math.xdivy(x, x),
         "Atan2": lambda x: tf.math.atan2(x, x), "Cumprod": lambda x: tf.math.cumprod(x, 1)}
  for op_type, fn in fns.items():
    ops, _ = _ops(fn, [4, 8])
    op = _only(ops, op_type)
    assert lower._check_op(op) is None, op_type  # pylint: disable=protected-access
    assert lower.op_flops(op) == 32, op_type


def test_gradient_names_under_a_scope_map_to_their_forward_op():
  # Keras's optimizers build tf.gradients under "training/<Optimizer>/gradients/gradients/".
  assert lower._forward_name(  # pylint: disable=protected-access
      "training/SGD/gradients/gradients/dense/MatMul_grad/MatMul") == "dense/MatMul"
  assert lower._GRAD_PREFIX.match("gradients_1/x/MatMul_grad/MatMul")  # pylint: disable=protected-access
  assert not lower._GRAD_PREFIX.match("dense/MatMul")  # pylint: disable=protected-access


def test_every_kernel_has_a_known_form_and_category():
  for op_type, k in kernels.KERNELS.items():
    assert k.category in kernels.CATEGORIES, op_type
    assert k.form in kernels.FORMS, op_type
    assert k.flops_formula() and k.memory_formula(), op_type


def test_kernel_doc_is_generated_from_the_table():
  doc = runpy.run_path(os.path.join(ROOT, "scripts", "kernel_doc.py"), run_name="kernel_doc")
  with open(os.path.join(ROOT, "docs", "kernels.md"), encoding="utf-8") as fh:
    committed = fh.read()
  assert committed == doc["render"](), "docs/kernels.md is stale: run scripts/kernel_doc.py"
  for op_type in ("MaxPool", "FusedBatchNormV3", "Conv2DBackpropInput", "StatelessWhile"):
    assert f"`{op_type}`" in committed
