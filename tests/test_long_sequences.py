"""Long sequences compile through the TensorFlow graph (compile only: nothing trains here).

The overflows issue 40 found: dropout counted elements in int32 (BERT-Large at 10,256 tokens,
batch 30: attention probabilities of 30 x 16 x 10,256^2 = 50e9 elements, refused as "72
unsupported ops ... dynamic output shape"), and GPT built its causal mask as a numpy [S, S]
constant (64 GiB at 131,072 tokens: "Unable to allocate"). Two layers keep each test cheap:
the shapes that overflowed are per layer (the attention of one layer), not per depth.
"""

import pytest

from cerebras_tf import cli

O = "--params_override"


def _compile(capsys, tmp_path, params, *overrides):
  argv = ["run.py", "--params", params, "--compile_only", "--execution_strategy",
          "weight_streaming", "--model_dir", str(tmp_path / "m")]
  for o in overrides:
    argv += [O, o]
  code = cli.main(argv)
  out, err = capsys.readouterr()
  return code, out, err


@pytest.mark.slow
def test_bert_large_at_10256_tokens_batch_30(capsys, tmp_path):
  code, out, err = _compile(
      capsys, tmp_path, "configs/params_bert_large_msl128.yaml",
      "train_input.max_sequence_length=10256", "model.max_position_embeddings=10256",
      "train_input.batch_size=30", "model.num_hidden_layers=2")
  assert code == 0, err
  assert "compiled for cs2 (weight_streaming)" in out


def test_gpt_at_131072_tokens(capsys, tmp_path):
  """Llama-3.1-8B's context (its 8 K/V groups, RMSNorm, rotary base 500,000) at a small width."""
  seq, kv_groups = 131072, 8
  code, out, err = _compile(
      capsys, tmp_path, "configs/params_gpt_tiny.yaml",
      f"train_input.max_sequence_length={seq}", f"eval_input.max_sequence_length={seq}",
      f"model.max_position_embeddings={seq}", "model.position_embedding_type=rotary",
      "train_input.batch_size=1", "train_input.synthetic=true", "model.num_heads=8",
      f"model.num_kv_groups={kv_groups}", "model.rotary_dim=16", "model.norm_type=rmsnorm",
      "model.rope_theta=500000.0")
  assert code == 0, err
  assert "compiled for cs2 (weight_streaming)" in out


@pytest.mark.slow
def test_pubmedbert_large_at_512_tokens_batch_1024(capsys, tmp_path):
  # Attention probabilities of 1024 x 16 x 512^2 = 2^32 elements: int32's count wrapped to 0
  # ("Cannot reshape a tensor with 0 elements"). BERT-Large's shapes: PubMedBERT-Large's
  # differ in its vocabulary only (28,895 words; the data here is written with BERT's).
  code, out, err = _compile(
      capsys, tmp_path, "configs/params_bert_large_msl128.yaml",
      "train_input.max_sequence_length=512", "train_input.batch_size=1024",
      "model.num_hidden_layers=1")
  assert code == 0, err
  assert "compiled for cs2 (weight_streaming)" in out


def test_t5_11b_sized_transformer_at_batch_310_builds_static_shapes():
  """T5-11B's widths (d_model 1024, 128 heads, d_ff 65,536) at batch 310 and 512 tokens: the
  feed-forward activation of 310 x 512 x 65,536 = 1.04e10 elements made dropout's int32
  count wrap ("Cannot reshape a tensor with 1811939328 elements"). Graph only (one layer
  each side): every dropout tensor keeps its static shape."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from cerebras_models.transformer import modeling  # pylint: disable=import-outside-toplevel
  tf1 = tf.compat.v1
  config = modeling.TransformerConfig(vocab_size=32128, hidden_size=1024, num_heads=128,
                                      filter_size=65536, num_encoder_layers=1,
                                      num_decoder_layers=1, max_position_embeddings=512,
                                      dtype="bfloat16")
  with tf.Graph().as_default():
    ids = tf1.placeholder(tf.int32, [310, 512])
    out = modeling.transformer(ids, tf.ones([310, 512], tf.int32), ids, config, training=True)
    assert out["logits"].shape.as_list() == [310, 512, 32128]
    ops = [op for op in tf1.get_default_graph().get_operations() if "/dropout/" in op.name]
    assert ops and all(o.shape.is_fully_defined() for op in ops for o in op.outputs)


def test_compiler_element_counts_are_exact_past_int32():
  """The compiler's sizes are numpy int64 products (Python ints after): exact past 2^31."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from cerebras_tf.compiler import lower  # pylint: disable=import-outside-toplevel
  shape = [30, 16, 10256, 10256]
  assert lower._static_size(tf.TensorShape(shape)) == 30 * 16 * 10256 * 10256  # pylint: disable=protected-access
