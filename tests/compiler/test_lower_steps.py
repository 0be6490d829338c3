"""Each step of compiler/lower.py's `lower`, on one small graph whose counts are done by hand.

The model (batch 4): x [4, 8] -> block/h (dense 8 -> 16, ReLU) -> block/proj (dense 16 -> 16)
-> the residual sum h + proj in "block" (a scope that holds layers but is none) -> out (dense
16 -> 4) -> a sparse softmax cross-entropy loss; plain SGD.
"""

import pytest
import tensorflow as tf

from cerebras_tf.compiler import capture, lower

tf1 = tf.compat.v1
B = 4


def _model_fn(features, labels):
  with tf1.variable_scope("block"):
    h = tf1.layers.dense(features["x"], 16, tf.nn.relu, name="h")
    r = h + tf1.layers.dense(h, 16, name="proj")
  logits = tf1.layers.dense(r, 4, name="out")
  loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
  train_op = tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
  return tf.estimator.EstimatorSpec("train", loss=loss, train_op=train_op)


def _input_fn():
  return tf.data.Dataset.from_tensors(({"x": tf.zeros([B, 8])}, tf.zeros([B], tf.int32)))


@pytest.fixture(scope="module")
def steps():
  """The captured graph and what each step of `lower` makes of it, in its order."""
  cap = capture.capture(_input_fn, _model_fn, B)
  fwd = lower.forward_ops(cap)
  with cap.graph.as_default():
    trainable = tf1.trainable_variables()
  namer = lower.LayerNamer(cap.graph, fwd, trainable)
  routed = lower.routed_layers(fwd, namer.op_layer)
  tallies = lower.tally_forward(cap.graph, namer, routed, B, 2)
  forward_only = {n: t.fwd_flops for n, t in tallies.items()}
  inputs = lower.host_inputs(cap.graph, namer.fwd_set, set())
  lower.tally_inputs(inputs, namer, tallies)
  lower.count_params(trainable, namer, tallies)
  bwd = lower.backward_ops(cap.graph, namer.fwd_set)
  lower.tally_backward(bwd, namer, routed, tallies)
  return dict(cap=cap, fwd=fwd, namer=namer, routed=routed, tallies=tallies, inputs=inputs,
              bwd=bwd, forward_only=forward_only)


LOSS = "sparse_softmax_cross_entropy_loss"


def test_canonical_scope_undoes_the_uniquifier_only_where_it_split_a_variable_scope():
  known = {"t", "t/cross_attention", "t/cross_attention/query"}
  assert lower.canonical_scope("t/cross_attention_1/query", known) == "t/cross_attention/query"
  assert lower.canonical_scope("t/dense_1", known) == "t/dense_1"  # no "t/dense" either
  assert lower.canonical_scope("", known) == ""


def test_the_namer_names_scopes_forward_ops_and_gradient_ops(steps):
  namer, graph = steps["namer"], steps["cap"].graph
  assert namer.owners == {"block/h", "block/proj", "out"} and namer.ancestors == {"block"}
  assert namer.layer_of("block/h/Tensordot") == "block/h"
  assert namer.layer_of("block") == "block" and namer.layer_of("") == "(root)"
  # The residual sum sits in "block" but goes with the latest layer it reads, the projection.
  (add,) = [op for op in steps["fwd"] if op.name == "block/add"]
  assert namer.in_container(add, "block") and namer.op_layer(add) == "block/proj"
  # dW of h's matmul is h's backward work.
  grads = [op for op in steps["bwd"] if op.type == "MatMul" and "block/h/MatMul_grad" in op.name]
  assert grads and {namer.grad_layer(op) for op in grads} == {"block/h"}
  assert graph is namer.graph


def test_tally_forward_counts_every_forward_flop_once(steps):
  """h's matmul: 2 x 4 x 8 x 16 = 1,024 FLOPs (a contraction with weights: no token pairs);
  the loss's softmax reads the logits [4, 4] at 2 bytes: 32 bytes of work. The layers sit in
  the order of their heaviest op, and their FLOPs add up to all the forward ops'."""
  t = steps["tallies"]
  assert t["block/h"].contraction_flops == 1024 and t["block/h"].pair_flops == 0
  assert t["block/h"].heaviest_dims == (B, 16)
  assert t[LOSS].work_bytes == B * 4 * 2
  assert t["block/h"].position < t["block/proj"].position < t["out"].position < \
      t[LOSS].position
  ops = [op for op in steps["fwd"] if op.type not in lower._STORAGE]  # pylint: disable=protected-access
  assert sum(steps["forward_only"].values()) == pytest.approx(sum(map(lower.op_flops, ops)))
  assert steps["routed"] == {}


def test_each_input_is_counted_once_at_its_first_reader(steps):
  """x: 4 x 8 float32 = 128 bytes at h; the labels: 4 int32 = 16 bytes at the loss."""
  readers = {t.op.name: steps["namer"].op_layer(op) for t, op in steps["inputs"].items()}
  assert sorted(readers.values()) == ["block/h", LOSS]
  t = steps["tallies"]
  assert t["block/h"].io_bytes == 128 and t[LOSS].io_bytes == 16 and t["out"].io_bytes == 0


def test_params_go_to_the_scope_that_holds_them(steps):
  t = steps["tallies"]
  assert (t["block/h"].params, t["block/proj"].params, t["out"].params) == (
      8 * 16 + 16, 16 * 16 + 16, 16 * 4 + 4)
  assert t[LOSS].params == 0


def test_backward_flops_land_with_their_layers(steps):
  """out's dW = h^T dy: 2 x 4 x 16 x 4 = 512 and dx = dy W^T: 512 more; h's dW: 2 x 4 x 8 x
  16 = 1,024 (no gradient flows into the input). Every backward FLOP is somewhere."""
  t = steps["tallies"]
  assert t["out"].bwd_flops >= 1024 and t["block/h"].bwd_flops >= 1024
  assert all(lower._GRAD_PREFIX.match(op.name) for op in steps["bwd"])  # pylint: disable=protected-access
  assert sum(x.bwd_flops for x in t.values()) == pytest.approx(
      sum(map(lower.op_flops, steps["bwd"])))


def test_pipeline_order_and_handed_activations(steps):
  """The layers with forward ops by position, then "(root)": a gradient op named
  for no forward op ("gradients/zeros_like", the loss's unused second output's gradient:
  16 FLOPs) with backward FLOPs and nothing else. h hands its
  ReLU [4, 16] at 2 bytes (128) to proj and to the sum (once); proj hands the sum [4, 16]
  (128) to out; out hands the logits [4, 4] (32) to the loss."""
  ordered = lower.pipeline_order(steps["tallies"])
  assert [t.name for t in ordered] == ["block/h", "block/proj", "out", LOSS, "(root)"]
  root = ordered[-1]
  assert root.bwd_flops > 0 and not root.fwd_flops and not root.params
  namer = steps["namer"]
  handed = lower.handed_activations(steps["fwd"], namer.fwd_set, namer.op_layer, 2)
  assert dict(handed) == {"block/h": 128, "block/proj": 128, "out": 32}
  kept = lower.kept_for_backward(steps["bwd"], namer.fwd_set)
  assert any(t.op.name == "block/h/Relu" for t in kept)


def test_lower_puts_the_steps_together(steps):
  """Per sample: the tallies divided by 4 (folding moves FLOPs between layers, loses none);
  the weights are the three dense layers'; SGD has no slots; the host sends 128 + 16 bytes
  for 4 x 8 + 4 values."""
  g = lower.lower(steps["cap"], "m", act_dtype_bytes=2)
  total_fwd = sum(t.fwd_flops for t in steps["tallies"].values())
  assert sum(l.fwd_flops for l in g.layers) * B == pytest.approx(total_fwd)
  assert g.num_params == 144 + 272 + 68 and g.optimizer == "gradientdescent"
  assert all(l.optimizer_bytes == 0 for l in g.layers)
  assert g.input_value_bytes == (128 + 16) / (4 * 8 + 4)
  assert len({l.name for l in g.layers}) == len(g.layers)


def test_routed_layers_find_a_dispatch_and_its_share():
  """3 routed rows summed into 8 expert slots: the ops on [8, ...] count 3 / 8."""
  with tf.Graph().as_default():
    rows = tf.zeros([3, 4])
    slots = tf.math.unsorted_segment_sum(rows, tf.constant([0, 2, 5]), 8)
    out = tf.matmul(slots, tf.zeros([4, 4]))
    other = tf.matmul(rows, tf.zeros([4, 4]))
    routed = lower.routed_layers([slots.op, out.op], lambda op: "moe")
    assert routed == {"moe": (8, 3 / 8)}
    assert lower.routed_share(out.op, "moe", routed) == 3 / 8
    assert lower.routed_share(other.op, "moe", routed) == 1.0
    assert lower.routed_share(out.op, "dense", routed) == 1.0


def test_batch_norm_layers_are_the_owners_of_a_moving_mean():
  with tf.Graph().as_default() as g:
    x = tf.zeros([2, 4, 4, 3])
    with tf1.variable_scope("stem"):
      tf1.layers.batch_normalization(tf1.layers.conv2d(x, 3, 1, name="conv"), name="bn")
    assert lower.batch_norm_layers(g, lambda scope: scope) == {"stem/bn"}
    assert lower.batch_norm_layers(g, lambda scope: scope.split("/")[0]) == {"stem"}
