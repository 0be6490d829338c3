"""T5: the relative position buckets and RMS norm against hand calculations, the span
corruption's invariants on real text, modelzoo's T5 keys, and a few training steps with
use_cs=True that match plain tf.estimator step by step."""

import contextlib
import math
import os

import numpy as np
import pytest
import tensorflow as tf

from cerebras_tf.errors import ParamsError
from cerebras_tf.params import load_params
from cerebras_tf.runtime import precision
from dtype_probe import call_dtypes
from event_losses import engine_and_plain_losses

tf1 = tf.compat.v1
STEPS = 4


@pytest.fixture(autouse=True)
def _t5_registered(monkeypatch):
  monkeypatch.setenv("CEREBRAS_TF_MODEL_MODULES", "cerebras_models.t5")


@pytest.fixture(scope="module")
def data_dir():
  from cerebras_models.data import ensure_datasets  # pylint: disable=import-outside-toplevel
  try:
    paths = ensure_datasets(["vocab", "bert_pretrain"])
  except Exception as e:  # pylint: disable=broad-except
    pytest.skip(f"the pretraining text cannot be prepared here: {e}")
  return os.path.dirname(os.path.dirname(paths["bert_pretrain"]["train"]))


def _yaml(tmp_path, data_dir, model="", train="", runconfig=""):
  """A modelzoo-style T5 file: no model.name (d_kv says it), modelzoo's key names."""
  vocab = os.path.join(data_dir, "vocab", "bert_uncased_vocab.txt")
  path = tmp_path / "params.yaml"
  path.write_text(
      f"train_input: {{data_processor: T5DynamicDataProcessor, data_dir: {data_dir}, "
      f"vocab_file: {vocab}, extra_ids: 100, src_max_sequence_length: 16, "
      f"tgt_max_sequence_length: 8, batch_size: 4, shuffle: false{train}}}\n"
      f"eval_input: {{data_processor: T5DynamicDataProcessor, data_dir: {data_dir}, "
      f"vocab_file: {vocab}, src_max_sequence_length: 16, tgt_max_sequence_length: 8, "
      f"batch_size: 4}}\n"
      f"model: {{d_model: 32, d_kv: 8, num_heads: 4, d_ff: 64, encoder_num_hidden_layers: 2, "
      f"decoder_num_hidden_layers: 1, dropout_rate: 0.0, attention_type: dot_product, "
      f"use_relative_attention_bias: true, use_ffn_bias: false, encoder_nonlinearity: relu, "
      f"decoder_nonlinearity: gelu, layer_norm_epsilon: 1.0e-6, "
      f"positional_embedding_type: fixed{model}}}\n"
      "optimizer: {optimizer_type: sgd, learning_rate: 0.5}\n"
      f"runconfig: {{max_steps: {STEPS}, tf_random_seed: 0, save_summary_steps: 1{runconfig}}}\n"
      "csconfig: {execution_strategy: pipelined}\n")
  return str(path)


def test_relative_position_buckets_by_hand():
  """32 buckets, max distance 128 (T5's). Bidirectional: 16 a direction, 8 exact; keys after
  the query take 16 + bucket. Distance 20: 8 + int(ln(20/8) / ln(128/8) * 8) = 8 + int(2.64)
  = 10; 100: 8 + int(ln(12.5) / ln(16) * 8) = 8 + int(7.29) = 15; 200 is past 128: the last
  bucket, 15 (31 after). One direction: 16 exact, 16 log
  buckets: 100 back -> 16 + int(ln(100/16) / ln(8) * 16) = 16 + int(14.10) = 30; keys after
  the query -> 0."""
  from cerebras_models.t5 import modeling  # pylint: disable=import-outside-toplevel
  rel = tf.constant([[0, -3, 3, -8, -20, 20, -200, 200, -100, 5]])
  both = modeling.relative_position_bucket(rel, True, 32, 128).numpy()[0]
  np.testing.assert_array_equal(both, [0, 3, 19, 8, 10, 26, 15, 31, 15, 21])
  back = modeling.relative_position_bucket(rel, False, 32, 128).numpy()[0]
  np.testing.assert_array_equal(back, [0, 3, 0, 8, 17, 0, 31, 0, 30, 0])


def test_rms_norm_has_no_centering_and_no_bias():
  """x / sqrt(mean(x^2) + eps) * scale (scale 1 at init): [3, 4] -> rms sqrt(12.5)."""
  from cerebras_models.t5 import modeling  # pylint: disable=import-outside-toplevel
  with tf.Graph().as_default():
    y = modeling.rms_norm(tf.constant([[3.0, 4.0]]), 0.0)
    names = [v.name for v in tf1.global_variables()]
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      out = sess.run(y)
  np.testing.assert_allclose(out, [[3 / math.sqrt(12.5), 4 / math.sqrt(12.5)]], rtol=1e-6)
  assert names == ["rms_norm/scale:0"]


def test_a_bfloat16_t5_keeps_its_residual_streams_float32_on_the_host_only():
  """As GPT's: both stacks' sublayers compute in bfloat16 and add into a float32 stream on the
  host; the engine's trace keeps 16 bits (its plans unchanged); the stacks' outputs are
  bfloat16 either way."""
  from cerebras_models.t5 import modeling  # pylint: disable=import-outside-toplevel
  config = modeling.T5Config(vocab_size=50, d_model=16, d_kv=4, num_heads=4, d_ff=32,
                             num_encoder_layers=2, num_decoder_layers=1, dropout_rate=0.1,
                             dtype="bfloat16")

  def streams(engine):
    with tf.Graph().as_default(), call_dtypes(modeling, "_residual") as seen, \
        (precision.tracing_for_engine() if engine else contextlib.nullcontext()):
      ids, mask = tf.zeros([2, 6], tf.int32), tf.ones([2, 6], tf.int32)
      enc_table, dec_table = modeling.embedding_tables(config)
      memory = modeling.encoder(ids, mask, enc_table, config, training=True)
      out = modeling.decoder(ids, memory, mask, dec_table, config, training=True)
      assert (memory.dtype, out.dtype) == (tf.bfloat16, tf.bfloat16)
    return seen

  # encoder: 2 layers x (self-attention, ffn); decoder: self-, cross-attention, ffn
  assert streams(engine=False) == [("float32", "float32")] * 7
  assert streams(engine=True) == [("bfloat16", "bfloat16")] * 7


def test_a_bfloat16_sublayer_is_dropped_out_in_the_float32_stream_with_the_exact_scale():
  """In bfloat16 the kept scale 1 / (1 - 0.1) would round to 1.109375 (kept values 0.16%
  short on average); added to the float32 stream, the sublayer's output is dropped out after
  its cast, at 1.1111111 exactly."""
  from cerebras_models.t5 import modeling  # pylint: disable=import-outside-toplevel
  config = modeling.T5Config(vocab_size=50, d_model=16, d_kv=4, num_heads=4, d_ff=32,
                             num_encoder_layers=1, dropout_rate=0.1, dtype="bfloat16")
  with tf.Graph().as_default():
    y = modeling._residual(tf.zeros([256, 16]), "ffn",  # pylint: disable=protected-access
                           lambda h: tf.ones_like(h), config, training=True)
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      out = sess.run(y)
  assert y.dtype == tf.float32
  kept = out[out > 0]
  assert 0.8 < kept.size / out.size < 1.0
  np.testing.assert_array_equal(kept, np.full(kept.shape, 1 / 0.9, np.float32))


def test_modelzoo_keys_and_refusals(tmp_path, data_dir):
  params = load_params(_yaml(tmp_path, data_dir))
  model, inp = params["model"], params["train_input"]
  assert model["name"] == "t5" and (model["num_encoder_layers"], model["num_decoder_layers"]) \
      == (2, 1)
  assert (inp["max_source_length"], inp["max_target_length"]) == (16, 8)
  assert model["decoder_nonlinearity"] == "gelu" and "position_embedding_type" not in model
  # 16 text tokens: round(2.4) = 2 noise in 1 span -> 16 - 2 + 1 + 1 = 16 source tokens and
  # 2 + 1 + 1 = 4 decoder tokens; modelzoo's 512 -> 568 text tokens, 85 noise in 28 spans:
  # 568 - 85 + 28 + 1 = 512 and 85 + 28 + 1 = 114 (its tgt_max_sequence_length).
  from cerebras_models.t5 import raw_length  # pylint: disable=import-outside-toplevel
  assert raw_length(16) == (16, 16, 4, 1) and raw_length(512) == (568, 512, 114, 28)
  with pytest.raises(ParamsError, match=r"max_target_length 3 is shorter than the 4 decoder"):
    load_params(_yaml(tmp_path, data_dir, train=", tgt_max_sequence_length: 3"))
  with pytest.raises(ParamsError, match=r"use_projection_bias_in_attention: the t5 model does "
                                        r"not apply it"):
    load_params(_yaml(tmp_path, data_dir, model=", use_projection_bias_in_attention: true"))
  with pytest.raises(ParamsError, match=r"runconfig.mode predict: the t5 model trains"):
    load_params(_yaml(tmp_path, data_dir, runconfig=", mode: predict"))


def test_span_corruption_on_real_text_restores_the_chunk(tmp_path, data_dir):
  """Putting each target span back at its sentinel in the source gives the text chunk back;
  sentinels count down from the top id; the decoder input is the target shifted right."""
  from cerebras_models.t5 import input as input_lib  # pylint: disable=import-outside-toplevel
  params = load_params(_yaml(tmp_path, data_dir, train=", src_max_sequence_length: 64, "
                             "tgt_max_sequence_length: 16"))
  vocab, ids = input_lib.vocabulary(params["train_input"])
  assert vocab == 30522 + 100
  features, labels = next(iter(input_lib.input_fn(params, "train")))
  f = {k: v.numpy() for k, v in features.items()}
  labels = labels.numpy()
  assert f["encoder_input_ids"].shape == (4, 64) and labels.shape == (4, 16)
  raw, _, dec_len, spans = (70, 64, 14, 3)
  for row in range(4):
    source = f["encoder_input_ids"][row][f["encoder_mask"][row] == 1]
    target = labels[row][f["decoder_mask"][row] == 1]
    assert len(source) == 64 and len(target) == dec_len and source[-1] == target[-1] == ids["end"]
    np.testing.assert_array_equal(f["decoder_input_ids"][row][:dec_len],
                                  np.concatenate([[0], target[:-1]]))
    sentinels = [vocab - 1 - j for j in range(spans)]
    assert [t for t in source if t >= 30522] == sentinels
    assert [t for t in target if t >= 30522] == sentinels
    spans_of = {}
    for t in target[:-1]:
      if t >= 30522:
        current = spans_of.setdefault(t, [])
      else:
        current.append(t)
    restored = [t for s in source[:-1] for t in (spans_of[s] if s >= 30522 else [s])]
    assert len(restored) == raw and sum(map(len, spans_of.values())) == round(0.15 * raw)


def test_trains_with_use_cs_as_plain_estimator_and_evaluates(tmp_path, data_dir):
  """4 SGD steps of a 2 + 1 layer T5 on the span-corrupted text: the per-step losses with
  use_cs=True are plain tf.estimator's; the first is about ln(V) (V = 30,622: 10.33); one
  relative-bias table per stack; eval reports accuracy and perplexity = exp(cross-entropy)."""
  from cerebras_models.t5 import input as input_lib  # pylint: disable=import-outside-toplevel
  from cerebras_models.t5.model import model_fn  # pylint: disable=import-outside-toplevel
  params = load_params(_yaml(tmp_path, data_dir))

  def input_fn(params, mode="train"):
    return input_lib.input_fn(params, mode)

  want, got, est = engine_and_plain_losses(model_fn, input_fn, tmp_path, STEPS, params)
  assert len(got) == STEPS and abs(got[0] - math.log(30622)) < 1.5, got
  np.testing.assert_allclose(got, want, rtol=1e-5)
  names = tf.train.list_variables(est.model_dir)
  tables = sorted(n for n, _ in names if n.endswith("relative_attention_bias"))
  assert tables == ["t5/decoder/relative_attention_bias", "t5/encoder/relative_attention_bias"]
  assert not any("position" in n for n, _ in names)
  metrics = est.evaluate(lambda params: input_lib.input_fn(params, "eval"), steps=2,
                         use_cs=True)
  assert 0 <= metrics["token_accuracy"] <= 1
  np.testing.assert_allclose(metrics["perplexity"], math.exp(metrics["cross_entropy"]),
                             rtol=1e-4)


def test_the_hosts_training_loss_and_gradients_are_the_logits_forms(tmp_path, data_dir,
                                                                    monkeypatch):
  """On the host, TRAIN takes its loss from the output layer directly (losses.
  dense_sparse_softmax_xent on the real target tokens, no [B*T, V] gradient tensor); the
  engine's trace and EVAL keep logits -> masked_xent. Both forms of one batch, in one graph
  with the same weights (a padded target token included): the same loss and gradients.
  (The dense form is taken where oneDNN is on; said on here, whatever the test's process.)"""
  from cerebras_models import losses  # pylint: disable=import-outside-toplevel
  from cerebras_models.t5 import input as input_lib  # pylint: disable=import-outside-toplevel
  from cerebras_models.t5 import model as model_lib  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(losses, "onednn_active", lambda: True)
  params = load_params(_yaml(tmp_path, data_dir))
  with tf.Graph().as_default():
    tf1.set_random_seed(0)
    tf1.train.get_or_create_global_step()
    iterator = tf1.data.make_initializable_iterator(
        input_lib.input_fn(params, "train").take(1).cache().repeat())
    features, labels = iterator.get_next()
    spec = model_lib.model_fn(features, labels, tf.estimator.ModeKeys.TRAIN, params)
    with tf1.variable_scope("", reuse=True):
      x, table = model_lib.modeling.t5_output_layer(
          features["encoder_input_ids"], features["encoder_mask"],
          features["decoder_input_ids"],
          model_lib.modeling.T5Config.from_params(params["model"], 30622), True)
    reference, _ = model_lib.masked_xent(model_lib.modeling.t5_logits(x, table), labels,
                                         features["decoder_mask"])
    variables = tf1.trainable_variables()
    grads = [tf.convert_to_tensor(g) for g in  # IndexedSlices (a table's rows) made dense
             tf.gradients(spec.loss, variables) + tf.gradients(reference, variables)]
    vocab = 30622
    wide = [t.name for op in tf1.get_default_graph().get_operations() if "gradients" in op.name
            and op.name.startswith("gradients/t5/weighted_rows") for t in op.outputs
            if t.shape.as_list() == [None, vocab]]  # [rows, V]; [K, V] is d_table's
    with tf1.Session() as sess:
      sess.run((tf1.global_variables_initializer(), tf1.tables_initializer()))
      sess.run(iterator.initializer)
      mask, got, want, g = sess.run((features["decoder_mask"], spec.loss, reference, grads))
  assert 0 < mask.sum() < mask.size  # some target tokens are padding
  assert wide == [], wide
  np.testing.assert_allclose(got, want, rtol=1e-5)
  n = len(variables)
  for a, b, v in zip(g[:n], g[n:], variables):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6, err_msg=v.name)
