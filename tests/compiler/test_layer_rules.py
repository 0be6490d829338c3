"""The rules that turn a layer's counts into an ir.Layer (compiler/layer_rules.py), which the
traced lowering and the analytic graphs share. No TensorFlow: these run in a blink."""

import subprocess
import sys

import pytest

from cerebras_tf.analysis import analytic
from cerebras_tf.compiler import layer_rules as rules
from cerebras_tf.errors import ParamsError
from conftest import ROOT

T = rules.LayerTally


def test_a_weightless_layer_under_one_percent_folds_into_the_one_before():
  """Total forward 2,010 FLOPs: 1% is 20.1. The core (no weights, 10 FLOPs, 8 of them
  token-pair) goes into `value`, its counts added; `out` (10 FLOPs but weights) stays."""
  value = T("value", fwd_flops=1000.0, bwd_flops=2000.0, contraction_flops=1000.0, params=10)
  core = T("core", fwd_flops=10.0, bwd_flops=10.0, contraction_flops=8.0, pair_flops=8.0,
           work_bytes=64.0, io_bytes=4.0)
  big = T("big", fwd_flops=990.0, params=5)
  out = T("out", fwd_flops=10.0, params=1)
  seen = []
  kept, merged = rules.fold_small([value, core, big, out], 2010.0,
                                  lambda into, folded: seen.append((into.name, folded.name)))
  assert [t.name for t in kept] == ["value", "big", "out"]
  assert merged == {"core": "value"} and seen == [("value", "core")]
  assert (value.fwd_flops, value.bwd_flops, value.contraction_flops, value.pair_flops,
          value.work_bytes, value.io_bytes, value.params) == (1010.0, 2010.0, 1008.0, 8.0,
                                                              64.0, 4.0, 10)


def test_a_tiny_weightless_first_layer_folds_into_the_next_and_chains_resolve():
  """Input casts (1 FLOP of 1,001) go forward into the first real layer; a layer folded
  into a layer that folded on names the last one."""
  cast = T("cast", fwd_flops=1.0, spatial=["s0"])
  dense = T("dense", fwd_flops=1000.0, params=3, spatial=["s1"])
  kept, merged = rules.fold_small([cast, dense], 1001.0)
  assert [t.name for t in kept] == ["dense"] and merged == {"cast": "dense"}
  assert dense.fwd_flops == 1001.0 and dense.spatial == ["s1", "s0"]
  assert rules.final_name("a", {"a": "b", "b": "c"}) == "c"
  assert rules.final_name("c", {"a": "b", "b": "c"}) == "c"


@pytest.mark.parametrize("name,fwd,contraction,kind", [
    ("sparse_softmax_cross_entropy_loss", 10.0, 0.0, "loss"),
    ("head/CrossEntropy", 10.0, 10.0, "loss"),
    ("dense", 10.0, 5.0, "matmul"),        # exactly half: matmul
    ("norm", 10.0, 4.9, "elementwise"),
    ("reshape", 0.0, 0.0, "other"),
])
def test_layer_kind(name, fwd, contraction, kind):
  assert rules.layer_kind(name, fwd, contraction) == kind


@pytest.mark.parametrize("pair,dims,scaling", [
    (60.0, None, "quadratic"),              # 60 of 100 FLOPs are token pairs
    (50.0, (4 * 128, 64), "linear"),        # half is not "mostly"; [B * L, H] spans L
    (0.0, (4 * 20, 64), "none"),            # [B * 20, H]: 20 gathered positions
    (0.0, (4, 128, 64), "linear"),          # [B, L, H]
    (0.0, (4, 2), "none"),                  # [B, 2]: NSP logits
    (0.0, (4, 128), "linear"),              # [B, H] with H equal to a length: counted linear
    (0.0, None, "linear"),                  # unknown shape
    (0.0, (), "linear"),                    # a scalar
])
def test_token_scaling(pair, dims, scaling):
  assert rules.token_scaling(100.0, pair, dims, 4, (128,)) == scaling


def test_token_scaling_without_lengths_or_flops_is_linear():
  assert rules.token_scaling(100.0, 0.0, (4, 2), 4, ()) == "linear"
  assert rules.token_scaling(0.0, 0.0, (4, 2), 4, (128,)) == "linear"


@pytest.mark.parametrize("names,found", [
    (["AdamOptimizer"], ("adam", 2)),
    (["adamw"], ("adam", 2)),
    (["LAMB"], ("lamb", 2)),
    (["SGD", "ResourceApplyKerasMomentum"], ("momentum", 1)),
    (["ResourceApplyGradientDescent"], ("gradientdescent", 0)),
    (["sgd"], ("gradientdescent", 0)),
    (["Novograd"], None),
])
def test_optimizer_slots(names, found):
  assert rules.optimizer_slots(names) == found


def test_to_layer_divides_by_the_batch_and_prices_the_state():
  """A batch of 4: 400 forward FLOPs are 100 per sample; 10 params at 4 bytes are 40 bytes
  of weights, 40 of gradients and 2 x 40 of Adam slots; 30 of 100 FLOPs token pairs."""
  t = T("enc/attention", fwd_flops=400.0, bwd_flops=800.0, contraction_flops=300.0,
        pair_flops=120.0, activation_bytes=64.0, work_bytes=32.0, io_bytes=16.0, params=10,
        batch_norm=True)
  layer = rules.to_layer(t, 4, 4, 2, "linear")
  assert (layer.fwd_flops, layer.bwd_flops, layer.activation_bytes, layer.work_bytes,
          layer.io_bytes) == (100.0, 200.0, 16.0, 8.0, 4.0)
  assert (layer.weight_bytes, layer.grad_bytes, layer.optimizer_bytes) == (40, 40, 80)
  assert layer.kind == "matmul" and layer.pair_share == pytest.approx(0.3)
  assert layer.token_scaling == "linear" and layer.batch_norm


def test_analytic_graphs_fold_and_price_by_the_same_rules():
  """An MLP 8 -> 16 -> 4 with its softmax loss, per sample by hand: dense_0 2 x 8 x 16 + 16
  (ReLU) = 272, dense_1 2 x 16 x 4 = 128, the loss (5 + 2) x 4 = 28 FLOPs: 7% of 428, so it
  stays a layer. After 4096 -> 4096 (33.5 MFLOPs) the loss's 28 are under 1%: it folds into
  the logits, which then hand nothing on (the logits stay inside one layer)."""
  g = analytic.mlp_graph([8, 16, 4], 1)
  assert [l.name for l in g.layers] == ["mlp/dense_0", "mlp/dense_1", "loss"]
  assert [l.fwd_flops for l in g.layers] == [272.0, 128.0, 28.0]
  assert g.layer("loss").kind == "loss" and g.layer("mlp/dense_0").kind == "matmul"
  wide = analytic.mlp_graph([4096, 4096, 4], 1)  # loss 28 of 2 x 4096^2 + ...: folds
  assert [l.name for l in wide.layers] == ["mlp/dense_0", "mlp/dense_1"]
  assert wide.layer("mlp/dense_1").activation_bytes == 0.0
  assert wide.layer("mlp/dense_1").fwd_flops == 2 * 4096 * 4 + 28


def test_an_unknown_optimizer_is_one_line_naming_the_known_ones():
  with pytest.raises(ParamsError, match=r"optimizer 'novograd'.*adam, adamw, lamb"):
    analytic.mlp_graph([8, 4], 1, optimizer="novograd")


def test_the_rules_and_the_analytic_graphs_load_without_tensorflow():
  code = ("import sys; import cerebras_tf.analysis.analytic, cerebras_tf.compiler.layer_rules; "
          "print('tensorflow' in sys.modules)")
  out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                       text=True, check=True)
  assert out.stdout.strip() == "False", out.stderr
