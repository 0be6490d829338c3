"""Long sequences compile through the TensorFlow graph (compile only: nothing trains here).

The overflows issue 40 found: dropout counted elements in int32 (BERT-Large at 10,256 tokens,
batch 30: attention probabilities of 30 x 16 x 10,256^2 = 50e9 elements, refused as "72
unsupported ops ... dynamic output shape"), and GPT built its causal mask as a numpy [S, S]
constant (64 GiB at 131,072 tokens: "Unable to allocate"). Two layers keep each test cheap:
the shapes that overflowed are per layer (the attention of one layer), not per depth.
"""

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
