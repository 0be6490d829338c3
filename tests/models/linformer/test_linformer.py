"""The Linformer family (modelzoo's TF Linformer): BERT's encoder with each layer's keys and
values projected along the sequence, S -> k (projected_dims).

Its attention with E = F = identity (k = S, no bias) is BERT's self-attention exactly; the
projections have the shapes and count of the paper (per layer E [S, k] and F, or E alone
with shared k/v); padded positions do not reach the real ones; modelzoo's Linformer keys
load; a tiny Linformer trains with use_cs=True with the losses of plain tf.estimator.
The family is new: before the wheel is reinstalled the tests name it through
CEREBRAS_TF_MODEL_MODULES.
"""

import os

import numpy as np
import pytest
import tensorflow as tf

from cerebras_tf.params import load_params
from cerebras_models import linformer as linformer_family
from cerebras_models.bert import modeling as bert
from cerebras_models.fields import schema_of
from cerebras_models.linformer import modeling
from cerebras_models.linformer.config import LinformerConfig
from cerebras_models.linformer.model import model_fn
from event_losses import engine_and_plain_losses

tf1 = tf.compat.v1
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))))
B, S, H, N, V, P = 4, 8, 16, 2, 40, 3  # batch, sequence, hidden, heads, vocab, predictions


@pytest.fixture(autouse=True)
def _registered(monkeypatch):
  monkeypatch.setenv("CEREBRAS_TF_MODEL_MODULES", "cerebras_models.linformer")


def _config(**kw):
  return LinformerConfig(vocab_size=V, hidden_size=H, num_hidden_layers=2, num_heads=N,
                         filter_size=32, max_position_embeddings=S, dropout_rate=0.0,
                         attention_dropout_rate=0.0, use_segment_embedding=False, **kw)


def test_identity_projections_give_berts_attention():
  """k = S with E = F = I and zero biases: E^T k = k, so every score and context is BERT's."""
  config = _config(projected_dims=S)
  rng = np.random.RandomState(0)
  with tf.Graph().as_default():
    x = tf.constant(rng.randn(B * S, H).astype(np.float32))
    mask = tf.ones([B, S], tf.int32)
    with tf1.variable_scope("layer", reuse=tf1.AUTO_REUSE):
      want = bert.self_attention(x, bert.attention_bias(mask), B, S, config, False)
      got = modeling.linformer_attention(x, None, B, S, config, False, padding_mask=mask)
    (e,) = [v for v in tf1.global_variables() if "E_projection/kernel" in v.name]
    (f,) = [v for v in tf1.global_variables() if "F_projection/kernel" in v.name]
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      sess.run([e.assign(tf.eye(S)), f.assign(tf.eye(S))])
      want, got = sess.run([want, got])
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("style, per_layer", [
    # E [8, 3] + bias [3] and F alike: 2 * (24 + 3) = 54 a layer; shared k/v: E only, 27.
    ("linformer-shared-heads", 54), ("linformer-shared-kv", 27)])
def test_projections_per_layer_and_padding_does_not_reach_real_tokens(style, per_layer):
  config = _config(projected_dims=3, attention_style=style)
  rng = np.random.RandomState(1)
  ids = rng.randint(5, V, size=(B, S)).astype(np.int32)
  pad = np.ones((B, S), np.int32)
  pad[:, 5:] = 0
  other = ids.copy()
  other[:, 5:] = rng.randint(5, V, size=(B, 3))  # other tokens in the padded slots
  with tf.Graph().as_default():
    tokens = tf1.placeholder(tf.int32, [B, S])
    features = {"token_ids": tokens, "segment_ids": tf.zeros([B, S], tf.int32),
                "padding_mask": tf.constant(pad)}
    out = modeling.linformer_model(features, config, False, with_pooler=False)
    names = {v.name: v.shape.as_list() for v in tf1.trainable_variables()}
    lin = sum(int(np.prod(s)) for n, s in names.items() if "_projection" in n)
    assert lin == 2 * per_layer
    assert names["bert/encoder/layer_1/attention/self/E_projection/kernel:0"] == [S, 3]
    assert ("bert/encoder/layer_0/attention/self/F_projection/kernel:0" in names) == (
        style == "linformer-shared-heads")
    # bert.num_parameters counts the pooler, which a masked-LM-only Linformer has not.
    total = sum(int(np.prod(s)) for s in names.values())
    assert total == modeling.num_parameters(config, S) - (H * H + H)
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      a = sess.run(out["sequence_output"], {tokens: ids})
      b = sess.run(out["sequence_output"], {tokens: other})
  np.testing.assert_allclose(a[:, :5], b[:, :5], rtol=1e-5, atol=1e-6)
  assert np.abs(a[:, 5:] - b[:, 5:]).max() > 1e-3  # the padded slots themselves did change


def test_modelzoo_linformer_keys_load(tmp_path):
  """A modelzoo Linformer file's model keys (no model.name): the family from projected_dims,
  its style and k applied, RoBERTa's masked LM only."""
  (tmp_path / "p.yaml").write_text(
      "train_input: {data_processor: BertMlmOnlyTfRecordsDynamicMaskProcessor, batch_size: 8,"
      " max_sequence_length: 16, max_predictions_per_seq: 3, steps: 30000}\n"
      "model: {disable_nsp: true, hidden_size: 16, num_hidden_layers: 1, num_heads: 2, "
      "filter_size: 32, max_position_embeddings: 16, use_segment_embedding: false, "
      "projected_dims: 4, attention_style: linformer-shared-kv, disable_attention: false, "
      "future_implementations: true, mlm_loss_scaling: precomputed_num_masked, "
      "layer_norm_epsilon: 1e-5, use_projection_bias_in_attention: true}\n"
      "optimizer: {optimizer_type: adamw, learning_rate: 0.001}\n"
      "runconfig: {max_steps: 10}\n")
  params = load_params(str(tmp_path / "p.yaml"))
  assert params["model"]["name"] == "linformer"
  assert params["model"]["projected_dims"] == 4
  assert params["model"]["attention_style"] == "linformer-shared-kv"
  assert params["model"]["mlm_loss_weight"] is None  # the mean over the masked positions
  config = LinformerConfig.from_params(params["model"])
  assert (config.projected_dims, config.shared_kv, config.layer_norm_epsilon) == (4, True, 1e-5)


def test_the_config_is_the_schema_and_checks_python_by_its_rules():
  """LinformerConfig declares the model keys: the schema's Fields are its fields', its
  defaults modelzoo's Linformer's (not BERT's), and a Python value is refused by the rule the
  YAML's is."""
  model = linformer_family.SCHEMA["model"]
  assert all(model[k] is f for k, f in schema_of(LinformerConfig).items())
  config = LinformerConfig()
  assert (config.use_segment_embedding, config.layer_norm_epsilon) == (False, 1e-8)
  assert (config.projected_dims, config.shared_kv) == (256, False)
  with pytest.raises(ValueError, match="^model.attention_style must be one of "
                     "linformer-shared-heads, linformer-shared-kv, got 'shared'$"):
    LinformerConfig(attention_style="shared")
  with pytest.raises(ValueError, match="^model.projected_dims must be an int >= 1, got 0$"):
    LinformerConfig(projected_dims=0)


def _input_fn(params, repeat=True):
  del params
  rng = np.random.RandomState(0)
  n = 12
  ids = rng.randint(5, V, size=(n, S)).astype(np.int32)
  positions = np.stack([rng.choice(S, P, replace=False) for _ in range(n)]).astype(np.int32)
  labels = np.take_along_axis(ids, positions, 1)
  pad = np.ones((n, S), np.int32)
  pad[::2, 6:] = 0
  features = {"token_ids": ids, "segment_ids": np.zeros((n, S), np.int32), "padding_mask": pad,
              "masked_lm_positions": positions, "masked_lm_ids": labels,
              "masked_lm_weights": np.ones((n, P), np.float32)}
  ds = tf.data.Dataset.from_tensor_slices((features, np.zeros(n, np.int32)))
  return (ds.repeat() if repeat else ds.take(8)).batch(B, drop_remainder=True)


def test_trains_on_the_engine_as_plain_tf_estimator(tmp_path):
  """5 SGD steps of a 2-layer Linformer (k = 4 of 8, shared heads): the per-step losses with
  use_cs=True are plain tf.estimator's; the first is about ln(40) = 3.69 (uniform guesses)."""
  (tmp_path / "p.yaml").write_text(
      f"train_input: {{batch_size: {B}, max_sequence_length: {S}, max_predictions_per_seq: "
      f"{P}}}\n"
      f"model: {{name: linformer, vocab_size: {V}, hidden_size: {H}, num_hidden_layers: 2, "
      f"num_heads: {N}, filter_size: 32, max_position_embeddings: {S}, projected_dims: 4, "
      f"attention_style: linformer-shared-heads, disable_nsp: true, dropout_rate: 0.0, "
      f"attention_dropout_rate: 0.0}}\n"
      "optimizer: {optimizer_type: sgd, learning_rate: 0.5}\n"
      "runconfig: {max_steps: 5}\n")
  params = load_params(str(tmp_path / "p.yaml"))
  want, got, est = engine_and_plain_losses(model_fn, _input_fn, tmp_path, 5, params)
  assert len(got) == 5 and abs(got[0] - np.log(V)) < 0.5, got
  np.testing.assert_allclose(got, want, rtol=1e-5)
  assert got[-1] < got[0]
  metrics = est.evaluate(lambda params: _input_fn(params, repeat=False), use_cs=True)
  assert 0.0 <= metrics["masked_lm_accuracy"] <= 1.0


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["pipelined", "multi_replica", "weight_streaming"])
def test_tiny_config_compiles_in_every_mode(tmp_path, strategy):
  """configs/params_linformer_tiny.yaml on the prepared BERT pretraining data, through run.py
  --compile_only, one layer (the layers repeat)."""
  from cerebras_tf import cli  # pylint: disable=import-outside-toplevel
  from cerebras_models.data import acquire  # pylint: disable=import-outside-toplevel
  data = acquire.default_data_dir()
  if not os.path.exists(os.path.join(data, "bert_pretrain")):
    pytest.skip(f"no bert_pretrain in {data}: scripts/prepare_data.py prepares it")
  config = os.path.join(ROOT, "configs", "params_linformer_tiny.yaml")
  assert cli.main(["run.py", "--params", config, "--compile_only", "--execution_strategy",
                   strategy, "--model_dir", str(tmp_path / "m"),
                   "--params_override", "model.num_hidden_layers=1",
                   "--params_override", f"train_input.data_dir={data}",
                   "--params_override", f"eval_input.data_dir={data}"]) == 0
  report = open(tmp_path / "m" / "cs_compile" / "report.txt", encoding="utf-8").read()
  assert strategy in report and "E_projection" in report
