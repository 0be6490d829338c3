"""Mixture of experts in the GPT family (modelzoo's `model.moe`).

The router's ops (TopKV2, one-hot, cumsum, segment-sum dispatch, gather combine) compile; the
experts' FLOPs are counted per routed token (top_k of num_experts, capped by the capacity), by
hand below; a tiny MoE GPT trains with use_cs=True with the losses of plain tf.estimator,
evaluates and exports; Mixtral 8x7B's params (modelzoo's keys) compile.
"""

import math
import os

import numpy as np
import pytest
import tensorflow as tf

from cerebras_tf import CerebrasEstimator, CSConfig, CSRunConfig
from cerebras_tf.compiler import capture, lower
from cerebras_tf.errors import ParamsError
from cerebras_tf.params import load_params
from cerebras_models.gpt import export, modeling
from cerebras_models.gpt.model import model_fn
from event_losses import engine_and_plain_losses, summary_losses

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))))
tf1 = tf.compat.v1
H, F, E, K, B, S = 16, 32, 4, 2, 4, 6  # hidden, expert filter, experts, top_k, batch, seq


@pytest.fixture(autouse=True)
def _gpt_registered(monkeypatch):
  """The gpt family by module name too: found without the installed entry points."""
  monkeypatch.setenv("CEREBRAS_TF_MODEL_MODULES", "cerebras_models.gpt")


def _experts_flops(capacity_factor):
  """(forward, backward) FLOPs per step of the experts layer, as the compiler counts them."""
  cfg = modeling.GPTConfig(vocab_size=40, hidden_size=H, num_hidden_layers=1, num_heads=2,
                           filter_size=F, max_position_embeddings=8,
                           encoder_nonlinearity="swiglu", use_ffn_bias=False, num_experts=E,
                           top_k=K, capacity_factor=capacity_factor)
  graph = tf.Graph()
  with graph.as_default():
    ids = tf1.placeholder(tf.int32, [B, S], "input_ids")
    hidden = modeling.gpt_hidden(ids, tf.ones_like(ids), cfg, training=True)
    loss = tf.reduce_mean(modeling.lm_xent(hidden, ids, cfg))
    train_op = tf1.train.AdamOptimizer(1e-3).minimize(loss)
  cap = capture.CapturedGraph(graph=graph, loss=loss, train_op=train_op,
                              inputs={"input_ids": ids}, batch_size=B,
                              optimizers=("AdamOptimizer",))
  layer = lower.lower(cap, name="gpt", seq_len=S).layer("gpt/decoder/layer_0/moe/experts")
  return layer.fwd_flops * B, layer.bwd_flops * B


@pytest.mark.parametrize("capacity_factor, rows", [
    # Dropless: room for every token in every expert (4 x 24 = 96 slots), 2 x 24 = 48 routed.
    (None, K * B * S),
    # capacity ceil(1.0 x 24 x 2 / 4) = 12 per expert: 48 slots, all of them routed.
    (1.0, K * B * S),
    # capacity ceil(0.5 x 24 x 2 / 4) = 6 per expert: 24 slots; half the routed tokens drop.
    (0.5, 24),
])
def test_expert_flops_are_counted_per_routed_token(capacity_factor, rows):
  """By hand: each expert row runs fc_gate and fc_in (H -> F) and fc_out (F -> H), 3 matmuls
  of 2 x H x F = 1,024 FLOPs: 3,072 per row; 48 rows: 147,456 forward, and the backward's
  two matmuls per forward one 294,912. SwiGLU's elementwise ops (sigmoid, silu's and the
  gate's products: 3-4 per element of [rows, F]) and the dispatch/combine's few per token
  add at most 7%. Counting every slot (all 4 experts on every token) would be 2x."""
  fwd, bwd = _experts_flops(capacity_factor)
  matmuls = 3 * 2 * H * F * rows
  assert matmuls <= fwd <= 1.09 * matmuls, (fwd, matmuls)
  assert 2 * matmuls <= bwd <= 1.15 * 2 * matmuls, (bwd, matmuls)


def test_mixtral_params_compile_with_its_parameter_count():
  """modelzoo's Mixtral 8x7B keys (model.moe with num_experts 8, top_k 2) load; the graph's
  46.7B parameters are Mixtral's published count: per layer attention 4096 x (4096 + 2 x 1024)
  for Q, K, V (grouped K/V: 8 heads of 128) + 4096 x 4096 out = 41.9M and 8 experts x 3 x 4096 x 14336 = 1,409M, router
  32,768, two RMSNorms 8,192; x 32 layers, + embeddings and head 2 x 32000 x 4096 + ln_f."""
  params = load_params(os.path.join(ROOT, "configs", "params_mixtral_8x7b.yaml"))
  cfg = modeling.GPTConfig.from_params(params["model"])
  assert (cfg.num_experts, cfg.top_k, cfg.load_balancing_loss_coef) == (8, 2, 0.02)
  per_layer = (4096 * (4096 + 2 * 1024) + 4096 * 4096 + 8 * 3 * 4096 * 14336 + 4096 * 8 + 2 * 4096)
  expected = 32 * per_layer + 2 * 32000 * 4096 + 4096
  assert expected == 46_702_792_704
  with tf.Graph().as_default():
    ids = tf1.placeholder(tf.int32, [1, 16])
    modeling.gpt_hidden(ids, tf.ones_like(ids), cfg, training=False)
    counted = sum(int(np.prod(v.shape)) for v in tf1.trainable_variables())
  assert counted + 32000 * 4096 == expected  # + the untied head, built by lm_logits


def test_moe_keys_are_checked(tmp_path):
  bad = tmp_path / "p.yaml"
  head = "train_input: {synthetic: true, batch_size: 4}\n"
  bad.write_text(head + "model: {name: gpt, moe: {num_experts: 4, top_k: 5}}\n")
  with pytest.raises(ParamsError, match=r"model.moe.top_k 5 must be between 1 and num_experts 4"):
    load_params(str(bad))
  bad.write_text(head + "model: {name: gpt, moe: {num_experts: 4, routing_algorithm: hash}}\n")
  with pytest.raises(ParamsError, match=r"model.moe.routing_algorithm 'hash' is not built"):
    load_params(str(bad))


def _params(tmp_path):
  (tmp_path / "p.yaml").write_text(
      "train_input: {synthetic: true, batch_size: 4, max_sequence_length: 8}\n"
      "eval_input: {synthetic: true, batch_size: 4, max_sequence_length: 8}\n"
      "model: {name: gpt, vocab_size: 32, hidden_size: 16, num_hidden_layers: 2, num_heads: 2,"
      " filter_size: 32, max_position_embeddings: 8, nonlinearity: swiglu,"
      " moe: {num_experts: 4, top_k: 2, load_balancing_loss_coef: 0.1}}\n"
      "optimizer: {optimizer_type: sgd, learning_rate: 0.5}\n"
      "runconfig: {max_steps: 5}\n")
  return load_params(str(tmp_path / "p.yaml"))


def _input_fn(params, repeat=True):
  del params
  rng = np.random.RandomState(0)
  ids = rng.randint(1, 32, size=(20, 9)).astype(np.int32)
  ds = tf.data.Dataset.from_tensor_slices(({"token_ids": ids[:, :-1],
                                            "padding_mask": np.ones((20, 8), np.int32)},
                                           ids[:, 1:]))
  return (ds.repeat() if repeat else ds.take(8)).batch(4, drop_remainder=True)


def test_moe_gpt_trains_on_the_engine_as_plain_tf_estimator(tmp_path):
  """5 SGD steps of a 2-layer MoE GPT (top-2 of 4 experts, load-balancing loss): the per-step
  losses with use_cs=True are plain tf.estimator's; it evaluates and exports."""
  params = _params(tmp_path)
  want, got, est = engine_and_plain_losses(model_fn, _input_fn, tmp_path, 5, params)
  assert len(got) == 5 and got[0] > math.log(32) * 0.8, got
  np.testing.assert_allclose(got, want, rtol=1e-5)
  report = open(os.path.join(est.model_dir, "cs_compile", "report.txt"), encoding="utf-8").read()
  assert "moe/experts" in report and "moe/router" in report
  metrics = est.evaluate(lambda params: _input_fn(params, repeat=False), use_cs=True)
  assert np.isfinite(metrics["loss"]) and 0 <= metrics["accuracy"] <= 1
  path = est.export_saved_model(str(tmp_path / "export"),
                                lambda: export.serving_input_receiver_fn(params))
  fn = tf.saved_model.load(path.decode()).signatures["serving_default"]
  out = fn(token_ids=tf.ones([2, 8], tf.int32), padding_mask=tf.ones([2, 8], tf.int32))
  assert out["next_token"].shape == (2, 8)


def _users_router(features, labels, mode, params):
  """The issue's own router: top-2 of 4 experts by tf.math.top_k, gather dispatch, a
  segment-sum combine and a load-balancing loss, in a plain model_fn."""
  del params
  x, batch, experts = features["x"], 8, 4
  seeded = tf1.glorot_uniform_initializer
  probs = tf.nn.softmax(tf1.layers.dense(x, experts, kernel_initializer=seeded(1), name="router"))
  gate, chosen = tf.math.top_k(probs, 2)                                 # [B, 2]
  expert_of = tf.reshape(chosen, [-1])                                   # [2B]
  token_of = tf.reshape(tf.tile(tf.range(batch)[:, None], [1, 2]), [-1])
  w = tf1.get_variable("experts", [experts, 6, 5],
                       initializer=seeded(3))
  rows = tf.einsum("nd,ndh->nh", tf.gather(x, token_of), tf.gather(w, expert_of))
  rows *= tf.reshape(gate, [-1, 1])
  h = tf.nn.relu(tf.math.unsorted_segment_sum(rows, token_of, batch))   # [B, 5]
  logits = tf1.layers.dense(h, 3, kernel_initializer=seeded(2), name="logits")
  balance = experts * tf.reduce_sum(tf.reduce_mean(tf.one_hot(expert_of, experts), 0) *
                                    tf.reduce_mean(probs, 0))
  loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits) + 0.01 * balance
  train_op = tf1.train.GradientDescentOptimizer(0.5).minimize(loss, tf1.train.get_global_step())
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def test_a_users_own_top_k_router_trains_as_plain_tf_estimator(tmp_path):
  """It was refused: "unsupported op 'TopKV2' ... move it into the input_fn", which a router
  on learned weights cannot do."""
  def input_fn(params):
    del params
    rng = np.random.RandomState(1)
    x = rng.randn(32, 6).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices(({"x": x}, (x[:, 0] > 0).astype(np.int32) +
                                               (x[:, 1] > 0))).repeat().batch(8, True)
  plain = tf.estimator.Estimator(_users_router, model_dir=str(tmp_path / "plain"),
                                 config=tf.estimator.RunConfig(tf_random_seed=0,
                                                               save_summary_steps=1))
  plain.train(input_fn, max_steps=4)
  est = CerebrasEstimator(_users_router, config=CSRunConfig(
      model_dir=str(tmp_path / "cs"), tf_random_seed=0, save_summary_steps=1,
      cs_config=CSConfig(execution_strategy="pipelined")))
  est.train(input_fn, max_steps=4, use_cs=True)
  np.testing.assert_allclose(summary_losses(est.model_dir), summary_losses(plain.model_dir),
                             rtol=1e-6)


def test_expert_flops_are_the_same_in_every_mode(tmp_path):
  """The routed-token count is the compiler's, before planning: pipelined and weight
  streaming cost the experts layer the same FLOPs per step, and multi_replica's replicas
  share them (each its 1/R of the batch)."""
  import json  # pylint: disable=import-outside-toplevel
  from cerebras_tf import cli  # pylint: disable=import-outside-toplevel
  path = _params(tmp_path) and str(tmp_path / "p.yaml")
  per_step = {}
  for mode in ("pipelined", "weight_streaming", "multi_replica"):
    out = tmp_path / mode
    assert cli.main(["run.py", "--params", path, "--compile_only", "--model_dir", str(out),
                     "--execution_strategy", mode]) == 0
    plan = json.load(open(out / "cs_compile" / "plan.json", encoding="utf-8"))
    per_step[mode] = sum(l["flops"] for l in plan["layers"] if l["name"].endswith("moe/experts"))
  assert per_step["pipelined"] > 0
  assert per_step["weight_streaming"] == pytest.approx(per_step["pipelined"])
  assert per_step["multi_replica"] == pytest.approx(per_step["pipelined"])
