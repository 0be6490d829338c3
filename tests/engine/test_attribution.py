"""Per-layer attribution where scope names collide (the lowering's layer grouping).

The reference Transformer opens `variable_scope("cross_attention")` twice per decoder layer
(once for the keys/values of the encoder output, once for the attention), so TF puts the
second block's ops under the name scope "cross_attention_1" while its variables stay in
"cross_attention". Before the fix the cross-attention's FLOPs landed in "decoder/layer_i" and
"cross_attention/query" kept the weights with 0 FLOPs.
"""

import inspect

import pytest

tf = pytest.importorskip("tensorflow")

from cerebras_tf.compiler import capture, lower  # noqa: E402
from cerebras_models.transformer import modeling  # noqa: E402


def _trace():
  cfg = modeling.TransformerConfig(vocab_size=50, hidden_size=16, num_encoder_layers=2,
                                   num_decoder_layers=2, num_heads=2, filter_size=32,
                                   dropout_rate=0.0, attention_dropout_rate=0.0)
  graph = tf.Graph()
  with graph.as_default():
    src = tf.compat.v1.placeholder(tf.int32, [4, 12], "source")
    tgt = tf.compat.v1.placeholder(tf.int32, [4, 10], "target")
    mask = tf.ones_like(src)
    out = modeling.transformer(src, mask, tgt, cfg, training=True)
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tgt, logits=out["logits"]))
    train_op = tf.compat.v1.train.AdamOptimizer(1e-3).minimize(loss)
  cap = capture.CapturedGraph(graph=graph, loss=loss, train_op=train_op,
                              inputs={"source": src, "target": tgt}, batch_size=4,
                              optimizers=("AdamOptimizer",))
  return lower.lower(cap, name="transformer", seq_len=12, token_lengths=(12, 10))


def test_cross_attention_gets_its_own_flops():
  g = _trace()
  names = [l.name for l in g.layers]
  for i in range(2):
    q = g.layer(f"transformer/decoder/layer_{i}/cross_attention/query")
    assert q.num_params > 0 and q.fwd_flops > 0, q
    # 2 x (4 x 10) target positions x 16 x 16 per sample: the query projection of 10 targets.
    assert q.fwd_flops == pytest.approx(2 * 10 * 16 * 16 + 10 * 16, rel=0.05)
  # No layer but the embedding lookup (a gather: no FLOPs) carries weights without doing any
  # work, and no decoder block's bare scope collects another sub-layer's FLOPs.
  assert [l.name for l in g.layers if l.num_params and not l.fwd_flops] == [
      "transformer/embeddings"]
  for i in range(2):
    bare = f"transformer/decoder/layer_{i}"
    assert bare not in names or g.layer(bare).num_params == 0


@pytest.mark.parametrize("path", ["logits", "training loss"])
def test_tied_lm_head_is_its_own_layer(path):
  # A GPT whose head multiplies by the word embeddings (tied) used to land in "gpt" or
  # "gpt/ln_f". By hand, per sample: 6 positions x 2 x 16 hidden x 40 vocab = 7,680 forward
  # FLOPs in "gpt/lm_head", which owns no weights (they stay with the embeddings).
  from cerebras_models.gpt import modeling as gpt  # pylint: disable=import-outside-toplevel
  cfg = gpt.GPTConfig(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_heads=2,
                      filter_size=32, max_position_embeddings=8)
  graph = tf.Graph()
  with graph.as_default():
    ids = tf.compat.v1.placeholder(tf.int32, [4, 6], "input_ids")
    if path == "logits":
      logits = gpt.gpt_model(ids, tf.ones_like(ids), cfg, training=True)
      loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=ids,
                                                                           logits=logits))
    else:  # what model_fn trains: the loss straight from the hidden states (no logits tensor)
      hidden = gpt.gpt_hidden(ids, tf.ones_like(ids), cfg, training=True)
      loss = tf.reduce_mean(gpt.lm_xent(hidden, ids, cfg))
    train_op = tf.compat.v1.train.AdamOptimizer(1e-3).minimize(loss)
  cap = capture.CapturedGraph(graph=graph, loss=loss, train_op=train_op,
                              inputs={"input_ids": ids}, batch_size=4,
                              optimizers=("AdamOptimizer",))
  g = lower.lower(cap, name="gpt", seq_len=6)
  head = g.layer("gpt/lm_head")
  assert head.num_params == 0
  if path == "logits":
    assert head.fwd_flops == pytest.approx(6 * 2 * 16 * 40, rel=0.01)
    assert head.bwd_flops == pytest.approx(2 * head.fwd_flops, rel=0.05)
  else:  # the loss joins the head: its softmax, argmax, gathers, < 8 FLOPs per logit
    assert 6 * 2 * 16 * 40 < head.fwd_flops < 6 * 2 * 16 * 40 + 8 * 6 * 40
    assert head.bwd_flops == pytest.approx(2 * 6 * 2 * 16 * 40, rel=0.1)
  assert "gpt/lm_head" in [l.name for l in g.layers[-3:]]
  # What stays in ln_f is a layer norm's: about 8 FLOPs per element of 6 x 16 = 768, not the
  # head's 7,680; nothing is left in the bare "gpt" scope but reshapes.
  assert g.layer("gpt/ln_f").fwd_flops < 10 * 6 * 16
  assert "gpt" not in [l.name for l in g.layers] or g.layer("gpt").fwd_flops < 10 * 6 * 16
  # The attention probabilities are measured, not guessed from FLOPs with a 64-wide head: the
  # layer holding each block's softmax works on 2 heads x 6 x 6 values of 2 bytes (the
  # engine's 16-bit activations) = 144 bytes a sample. The loss's softmax is not attention:
  # it reads the 6 x 40 logits, 480 bytes a sample, its own layer's transient work.
  pair = [l for l in g.layers if l.pair_share > 0]
  assert len(pair) == 2 and all(l.work_bytes == 2 * 6 * 6 * 2 for l in pair)
  assert sum(l.work_bytes for l in g.layers if l.pair_share == 0) == 6 * 40 * 2


def test_a_tied_head_outside_every_scope_is_named_by_its_op_and_line():
  # A Keras model_fn ties its head with `tf.matmul(x, emb.embeddings, transpose_b=True)` at the
  # top level: the largest layer of a user's GPT-3 XL (6% of the step) was reported as
  # "(root)", the report's bottleneck line said "largest layer (root)". By hand, per sample:
  # 6 positions x 2 x 16 hidden x 40 vocab = 7,680 forward FLOPs, and no weights of its own.
  graph = tf.Graph()
  with graph.as_default():
    ids = tf.compat.v1.placeholder(tf.int32, [4, 6], "input_ids")
    emb = tf.keras.layers.Embedding(40, 16)
    x = tf.keras.layers.Dense(16)(emb(ids))
    line = inspect.currentframe().f_lineno + 1
    logits = tf.matmul(x, emb.embeddings, transpose_b=True)
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=ids,
                                                                         logits=logits))
    train_op = tf.compat.v1.train.AdamOptimizer(1e-3).minimize(loss)
  cap = capture.CapturedGraph(graph=graph, loss=loss, train_op=train_op,
                              inputs={"input_ids": ids}, batch_size=4,
                              optimizers=("AdamOptimizer",))
  g = lower.lower(cap, name="keras_gpt", seq_len=6)
  heads = [l for l in g.layers if l.name.startswith("MatMul at ")]
  assert [l.name.rsplit("/", 1)[-1] for l in heads] == [f"test_attribution.py:{line}"]
  head = heads[0]
  assert head.num_params == 0
  # The loss's softmax and gathers join it (folded: < 1% of the FLOPs), < 8 FLOPs per logit.
  assert 6 * 2 * 16 * 40 <= head.fwd_flops < 6 * 2 * 16 * 40 + 8 * 6 * 40
  assert head.bwd_flops == pytest.approx(2 * 6 * 2 * 16 * 40, rel=0.1)
  assert "(root)" not in [l.name for l in g.layers]



def test_a_while_loop_outside_every_scope_is_named_by_its_op_and_line():
  # A hand-written recurrence, tf.while_loop(lambda i, h: i < 10, ...) in no scope, was
  # "(root)" with the loss's ops. By hand, per sample: 10 trips x 2 x 16 x 16 = 5,120 forward
  # matmul FLOPs (plus the tanh: 10 x 16).
  graph = tf.Graph()
  with graph.as_default():
    x = tf.compat.v1.placeholder(tf.float32, [4, 16], "x")
    y = tf.compat.v1.placeholder(tf.int32, [4], "y")
    w = tf.compat.v1.get_variable("w", [16, 16])
    line = inspect.currentframe().f_lineno + 1
    _, h = tf.while_loop(lambda i, h: i < 10, lambda i, h: (i + 1, tf.tanh(h @ w)), (0, x))
    logits = tf.compat.v1.layers.dense(h, 4, name="head")
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y,
                                                                         logits=logits))
    train_op = tf.compat.v1.train.AdamOptimizer(1e-3).minimize(loss)
  cap = capture.CapturedGraph(graph=graph, loss=loss, train_op=train_op,
                              inputs={"x": x, "y": y}, batch_size=4,
                              optimizers=("AdamOptimizer",))
  g = lower.lower(cap, name="recurrence")
  loops = [l for l in g.layers if l.name.startswith("while at ")]
  assert [l.name.rsplit("/", 1)[-1] for l in loops] == [f"test_attribution.py:{line}"]
  assert 10 * 2 * 16 * 16 <= loops[0].fwd_flops <= 10 * (2 * 16 * 16 + 16 * 8)


def test_a_tensor_passed_inside_a_folded_layer_is_not_kept_as_handed_on():
  # SwiGLU: silu(fc_gate(x)) * fc_in(x). The product sits in the `mlp` scope, a weightless
  # sliver that folds into fc_in; fc_in's output feeds it. Counted before the fold, fc_in
  # "handed on" both its output and the product: 2 x 6 x 32 values a sample. After the fold
  # it hands on only the product, 6 positions x 32 (filter) x 2 bytes = 384 bytes.
  from cerebras_models.gpt import modeling as gpt  # pylint: disable=import-outside-toplevel
  cfg = gpt.GPTConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_heads=2,
                      filter_size=32, max_position_embeddings=8, encoder_nonlinearity="swiglu",
                      norm_type="rmsnorm", position_embedding_type="rotary", rotary_dim=8)
  graph = tf.Graph()
  with graph.as_default():
    ids = tf.compat.v1.placeholder(tf.int32, [4, 6], "input_ids")
    loss = tf.reduce_mean(gpt.lm_xent(gpt.gpt_hidden(ids, tf.ones_like(ids), cfg, True), ids,
                                      cfg))
    train_op = tf.compat.v1.train.AdamOptimizer(1e-3).minimize(loss)
  cap = capture.CapturedGraph(graph=graph, loss=loss, train_op=train_op,
                              inputs={"input_ids": ids}, batch_size=4,
                              optimizers=("AdamOptimizer",))
  g = lower.lower(cap, name="gpt", seq_len=6)
  names = [l.name for l in g.layers]
  assert "gpt/decoder/layer_0/mlp" not in names  # folded
  assert g.layer("gpt/decoder/layer_0/mlp/fc_in").activation_bytes == 6 * 32 * 2
  assert g.layer("gpt/decoder/layer_0/mlp/fc_gate").activation_bytes == 6 * 32 * 2


def test_gradient_zeros_nothing_reads_are_no_layers_work():
  # tf.gradients makes a ZerosLike for each output of a custom gradient's IdentityN that
  # nothing differentiates (here GELU's input passthrough); TensorFlow never runs them, so
  # they must not add to a layer's backward FLOPs (the GPT head above gained 768 per GELU
  # once GELU had its own gradient).
  from cerebras_models.bert import modeling as bert  # pylint: disable=import-outside-toplevel
  graph = tf.Graph()
  with graph.as_default():
    x = tf.compat.v1.placeholder(tf.float32, [8, 4], "x")
    with tf.compat.v1.variable_scope("layer"):
      y = bert.gelu(bert.dense(x, 4, "dense", 0.02))
    loss = tf.reduce_mean(y)
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
  cap = capture.CapturedGraph(graph=graph, loss=loss, train_op=train_op, inputs={"x": x},
                              batch_size=8, optimizers=("GradientDescentOptimizer",))
  fwd = set(lower.forward_ops(cap))
  every = lower.backward_ops(graph, fwd)
  run = lower.backward_ops(graph, fwd, train_op)
  zeros = [op for op in every if op.type == "ZerosLike"]
  assert zeros and not [op for op in run if op.type == "ZerosLike"]
  # Both products of the MatMul's gradient run (tf.tuple groups them, so even x's, which no
  # variable needs); what is left out computes nothing: the zeros and an unread Identity.
  names = {op.name for op in run}
  assert {"gradients/layer/dense/MatMul_grad/MatMul",
          "gradients/layer/dense/MatMul_grad/MatMul_1"} <= names
  assert {op.type for op in every if op not in run} == {"ZerosLike", "Identity"}
