"""No reference model computes attention scores in the form TF 2.15's oneDNN runs slowly
(compiler/lints.slow_attention_scores).

TensorFlow's remapper fuses BatchMatMul * scale + addend into one oneDNN op; with a
[1, 1, L, L] addend (a causal bias) that op took 0.7-1.2 s where the unfused ops take 5 ms
([32, 4, 128, 32] queries and keys, and the Transformer-tiny decoder's at eval batch 100:
benchmarks/bench_eval_speed.py, table b). The Transformer's evaluation spent most of its time
there. Its scores are now an einsum, which the remapper leaves alone, as GPT's were. BERT's
[B, 1, 1, S] padding bias is not that slow case, but its fused op still cost about 0.6 ms more
an attention than the einsum (fwd and bwd at BERT-tiny's [32, 2, 128, 64]); BERT's scores are an
einsum too.
"""

import os

import pytest
import tensorflow as tf

from cerebras_tf.compiler import lints
from cerebras_tf.params import load_params
from cerebras_tf.registry import get_model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
tf1 = tf.compat.v1

# The families with a causal (decoder) self-attention, shrunk to one layer.
CAUSAL = {
    "transformer": ("params_transformer_tiny.yaml", ["model.num_hidden_layers=1"]),
    "gpt": ("params_gpt_tiny.yaml", ["model.num_hidden_layers=1"]),
    "t5": ("params_t5_tiny.yaml", ["model.encoder_num_hidden_layers=1",
                                   "model.decoder_num_hidden_layers=1"]),
}


def test_the_check_finds_the_pattern():
  with tf.Graph().as_default() as graph:
    q = tf1.placeholder(tf.float32, [None, 4, None, 32])
    causal = tf1.placeholder(tf.float32, [1, 1, None, None])
    tf.identity(tf.matmul(q, q, transpose_b=True) * 0.17 + causal, name="slow")
    tf.identity(tf.matmul(q, q, transpose_b=True) / tf.sqrt(32.0) + causal, name="divided")
    tf.identity(tf.einsum("bnqd,bnkd->bnqk", q, q) * 0.17 + causal, name="einsum")
    padding = tf1.placeholder(tf.float32, [None, 1, 1, None])
    tf.identity(tf.matmul(q, q, transpose_b=True) * 0.17 + padding, name="padding")
  assert [op.name for op in lints.slow_attention_scores(graph)] == ["add", "add_1"]


def _eval_graph(config, overrides):
  """EVAL's graph of a shipped config: the forward pass training shares (and the
  Transformer's decoding)."""
  params = load_params(os.path.join(ROOT, "configs", config), overrides)
  model_fn, input_fn = get_model(params["model"]["name"]).resolve()
  with tf.Graph().as_default() as graph:
    tf1.train.get_or_create_global_step()
    features, labels = tf1.data.make_initializable_iterator(
        input_fn(params, "eval")).get_next()
    model_fn(features, labels, tf.estimator.ModeKeys.EVAL, params)
  return graph


@pytest.mark.parametrize("family", sorted(CAUSAL))
def test_no_attention_takes_the_slow_fusion(family):
  assert lints.slow_attention_scores(_eval_graph(*CAUSAL[family])) == []


def test_bert_scores_are_an_einsum_the_remapper_leaves_unfused():
  graph = _eval_graph("params_bert_tiny_msl128.yaml", ["model.num_hidden_layers=1"])
  scaled_products = [op.name for op in graph.get_operations()
                     if op.type in ("Mul", "RealDiv") and any(
                         t.op.type in ("BatchMatMulV2", "BatchMatMul") for t in op.inputs)]
  assert scaled_products == []
  assert any(op.type == "Einsum" and "attention/self" in op.name
             for op in graph.get_operations())


# (config, overrides, head size, attentions in the one-layer graph)
SCALED = {
    "bert": ("params_bert_tiny_msl128.yaml", ["model.num_hidden_layers=1"], 64, 1),
    "gpt": (*CAUSAL["gpt"], 64, 1),
    "transformer": (*CAUSAL["transformer"], 32, 3),  # encoder self, decoder self and cross
}


@pytest.mark.parametrize("family", sorted(SCALED))
def test_the_scale_multiplies_the_queries_not_the_scores(family):
  # 1/sqrt(D) on q ([B, S, H] elements) and not on q.k ([B, N, S, S]): at BERT-tiny's shape
  # half the elements, forward and backward. Each attention has exactly one such scale, and
  # its product feeds the scores' einsum (through reshapes and transposes).
  config, overrides, d, attentions = SCALED[family]
  graph = _eval_graph(config, overrides)

  def scalar(t):  # 1/sqrt(D); in bfloat16 (the YAMLs' mixed precision on a bf16 CPU) rounded
    value = tf.get_static_value(t)
    tolerance = 1e-7 if t.dtype == tf.float32 else d ** -0.5 * 2.0 ** -8
    return value is not None and value.size == 1 and abs(float(value) - d ** -0.5) < tolerance

  scales = [op for op in graph.get_operations()
            if op.type == "Mul" and any(scalar(t) for t in op.inputs)]
  assert len(scales) == attentions, [op.name for op in scales]
  for op in scales:
    source = next(t.op for t in op.inputs if not scalar(t))
    assert source.type not in ("Einsum", "BatchMatMulV2", "Cast"), (op.name, source.type)
    consumers = op.outputs[0].consumers()
    while consumers and consumers[0].type in ("Reshape", "Transpose"):
      consumers = consumers[0].outputs[0].consumers()
    assert [c.type for c in consumers] == ["Einsum"], (op.name, [c.type for c in consumers])
