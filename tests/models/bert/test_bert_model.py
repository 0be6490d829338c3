"""BERT: google-bert checkpoint compatibility, heads, optimizer, input pipeline, configs."""

import contextlib
import glob
import math
import os
import time
import warnings
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_text as tft

import bert_test_base as base
from bert_test_base import tf1
from cerebras_tf.errors import DataError
from cerebras_tf.compiler import capture
from cerebras_tf.runtime import precision
from cerebras_models import embedding, optimization
from cerebras_models.bert import heads, input as input_lib, model, modeling

TRAIN, EVAL, PREDICT = (tf.estimator.ModeKeys.TRAIN, tf.estimator.ModeKeys.EVAL,
                        tf.estimator.ModeKeys.PREDICT)
needs_fixture = pytest.mark.skipif(
    not os.path.exists(os.path.join(base.GOOGLE_BERT_TINY, "model.ckpt.index")),
    reason="google_bert_tiny fixture not found at %s" % base.GOOGLE_BERT_TINY)


def google_tiny_params(**model_overrides):
  """Params for the google_bert_tiny checkpoint, warm-started through model.init_checkpoint."""
  cfg = modeling.BertConfig.from_google_json(os.path.join(base.GOOGLE_BERT_TINY,
                                                          "bert_config.json"))
  m = {f: getattr(cfg, f) for f in ("vocab_size", "hidden_size", "num_hidden_layers",
                                    "num_heads", "filter_size", "max_position_embeddings",
                                    "type_vocab_size", "dropout_rate", "attention_dropout_rate",
                                    "initializer_range")}
  m.update(name="bert", task="pretraining",
           init_checkpoint=os.path.join(base.GOOGLE_BERT_TINY, "model.ckpt"))
  m.update(model_overrides)
  return {"model": m, "runconfig": {}}


def load_fixture():
  inputs = np.load(os.path.join(base.GOOGLE_BERT_TINY, "inputs.npz"))
  ref = np.load(os.path.join(base.GOOGLE_BERT_TINY, "outputs.npz"))
  return base.npz_features(inputs), {k: ref[k] for k in ref.files}


def as_reference_layout(out):
  """This model's outputs in outputs.npz's layout."""
  got = dict(out)
  got["all_encoder_layers"] = np.transpose(out["all_encoder_layers"], (1, 0, 2, 3))
  got["masked_lm_log_probs"] = out["masked_lm_log_probs"].reshape(
      -1, out["masked_lm_log_probs"].shape[-1])
  if "masked_lm_loss" in out:
    got["total_loss"] = out["masked_lm_loss"] + out["next_sentence_loss"]
  return got


class CheckpointCompatibilityTest(base.BertTestCase):
  """google-research/bert's own outputs for its own checkpoint, reproduced through model_fn."""

  def eval_outputs(self, **model_overrides):
    features, _ = load_fixture()
    params = google_tiny_params(**model_overrides)

    def build():
      feats = {k: tf.constant(v) for k, v in features.items()}
      return model.model_fn(feats, None, EVAL, params)

    sess, spec = self.run_graph(build)
    self.last_session = sess
    return as_reference_layout(sess.run(spec.predictions)), spec

  @needs_fixture
  def test_matches_google_bert_outputs(self):
    got, _ = self.eval_outputs()
    _, ref = load_fixture()
    diffs = {k: float(np.max(np.abs(got[k] - ref[k]))) for k in ref}
    print("max abs diff vs google-bert:", diffs)
    for key, diff in diffs.items():
      self.assertLess(diff, 1e-5, "%s differs by %g" % (key, diff))

  @needs_fixture
  def test_pretraining_eval_metrics(self):
    _, spec = self.eval_outputs()
    sess = self.last_session
    with sess.graph.as_default():
      sess.run(tf1.local_variables_initializer())
      sess.run([op for _, op in spec.eval_metric_ops.values()])
      values = sess.run({k: v for k, (v, _) in spec.eval_metric_ops.items()})
    _, ref = load_fixture()
    self.assertAllClose(values["masked_lm_loss"], ref["masked_lm_example_loss"].mean(), atol=1e-5)
    self.assertAllClose(values["next_sentence_loss"], ref["next_sentence_loss"], atol=1e-5)
    mlm_acc = np.mean(ref["masked_lm_log_probs"].argmax(-1) == [47, 323, 359, 314, 193, 337])
    self.assertAllClose(values["masked_lm_accuracy"], mlm_acc)
    nsp_acc = np.mean(ref["next_sentence_log_probs"].argmax(-1) == [0, 1])
    self.assertAllClose(values["next_sentence_accuracy"], nsp_acc)

  @needs_fixture
  def test_eval_scores_the_labelled_slots_alone_and_agrees_with_every_slots_values(self):
    """EVAL's loss and masked-LM metrics come from the output layer on the slots of nonzero
    weight (heads.masked_lm_scores; most of BERT-tiny's eval step, half the demo's slots are
    padding): no [B*P, V] tensor feeds them, and they equal the weighted means of the
    every-slot log-probs the spec still carries (google-bert's fixture, two slots unweighted)."""
    features, _ = load_fixture()
    features["masked_lm_weights"] = np.array([[1, 1, 0], [1, 0, 1]], np.float32)
    params = google_tiny_params(disable_nsp=True)
    vocab = params["model"]["vocab_size"]

    def build():
      return model.model_fn({k: tf.constant(v) for k, v in features.items()}, None, EVAL, params)

    sess, spec = self.run_graph(build)
    scored = [op for _, update in spec.eval_metric_ops.values() for op in
              capture.ancestors(update)] + list(capture.ancestors(spec.loss))
    full = [t.name for op in scored for t in op.outputs
            if t.shape.rank == 2 and t.shape.as_list() == [6, vocab]]
    self.assertEqual(full, [], "eval's loss and metrics read every slot's logits")
    sess.run([op for _, op in spec.eval_metric_ops.values()])
    values, loss, got = sess.run(
        ({k: v for k, (v, _) in spec.eval_metric_ops.items()}, spec.loss, spec.predictions))
    log_probs = got["masked_lm_log_probs"].reshape(6, vocab)  # every slot, as before
    ids, w = features["masked_lm_ids"].reshape(-1), features["masked_lm_weights"].reshape(-1)
    example = -log_probs[np.arange(6), ids]
    self.assertAllClose(loss, np.sum(w * example) / (np.sum(w) + 1e-5), atol=1e-5)
    self.assertAllClose(values["masked_lm_loss"], np.sum(w * example) / np.sum(w), atol=1e-5)
    self.assertAllClose(values["masked_lm_accuracy"],
                        np.sum(w * (log_probs.argmax(-1) == ids)) / np.sum(w))
    self.assertAllEqual(got["masked_lm_predictions"].reshape(-1), log_probs.argmax(-1))

  @needs_fixture
  def test_estimator_predict_warm_starts_from_init_checkpoint(self):
    features, ref = load_fixture()
    params = google_tiny_params(predict_all_outputs=True)
    est = tf.estimator.Estimator(model.model_fn, model_dir=self.get_temp_dir(), params=params)
    feed = {k: v for k, v in features.items() if not k.startswith("masked_lm_i")
            and not k.startswith("masked_lm_w") and k != "next_sentence_label"}
    preds = list(est.predict(lambda: tf.data.Dataset.from_tensor_slices(feed).batch(2),
                             yield_single_examples=False))
    got = as_reference_layout(preds[0])
    for key in ("sequence_output", "pooled_output", "masked_lm_log_probs",
                "next_sentence_log_probs"):
      self.assertAllClose(got[key], ref[key], atol=1e-5, rtol=0, msg=key)

  @needs_fixture
  def test_variable_names_and_shapes_match_checkpoint(self):
    with open(os.path.join(base.GOOGLE_BERT_TINY, "variables.txt")) as f:
      expected = sorted(line.split()[0] + " " + line.split()[1] for line in f if line.strip())
    with tf.Graph().as_default():
      features, _ = load_fixture()
      model.model_fn({k: tf.constant(v) for k, v in features.items()}, None, EVAL,
                     google_tiny_params(init_checkpoint=None))
      got = sorted("%s [%s]" % (v.op.name, ",".join(map(str, v.shape.as_list())))
                   for v in tf1.trainable_variables())
    self.assertEqual(got, expected)

  @needs_fixture
  def test_untied_mlm_output_leaves_the_rows_of_words_not_in_the_input_alone(self):
    """share_embedding_weights: false (issue 44): the masked-LM output gets its own [V, H]
    matrix, so the loss's gradient reaches an input-embedding row only for the tokens in the
    batch. Tied, every row is pushed as a wrong answer (the collapse of rare words)."""
    features, _ = load_fixture()
    in_input = np.unique(features["token_ids"])

    def grad_rows(tied):
      def build():
        feats = {k: tf.constant(v) for k, v in features.items()}
        spec = model.model_fn(feats, None, EVAL, google_tiny_params(
            init_checkpoint=None, share_embedding_weights=tied))
        table, = [v for v in tf1.trainable_variables() if "word_embeddings" in v.name]
        names = {v.op.name: v.shape.as_list() for v in tf1.trainable_variables()}
        return tf.convert_to_tensor(tf.gradients(spec.loss, table)[0]), names
      sess, (grad, names) = self.run_graph(build)
      moved = np.flatnonzero(np.abs(sess.run(grad)).sum(axis=1))
      return moved, names

    moved, names = grad_rows(tied=False)
    vocab = names["bert/embeddings/word_embeddings"][0]
    self.assertEqual(names["cls/predictions/output_weights"],
                     names["bert/embeddings/word_embeddings"])
    # Only the input's rows (a token seen only under the padding mask gets none either).
    self.assertTrue(set(moved) <= set(in_input), set(moved) - set(in_input))
    self.assertGreater(len(moved), len(in_input) // 2)
    moved_tied, names_tied = grad_rows(tied=True)
    self.assertNotIn("cls/predictions/output_weights", names_tied)
    self.assertEqual(len(moved_tied), vocab)  # the softmax touches every row

  @needs_fixture
  def test_bfloat16_keeps_float32_weights_and_stays_close(self):
    # bfloat16 forced: a CPU without bf16 math computes float32 (tests/models/test_bf16.py).
    with mock.patch.dict(os.environ, {precision.FORCE_ENV: "1"}):
      got, _ = self.eval_outputs(mixed_precision=True)
    _, ref = load_fixture()
    # bf16 has an 8-bit mantissa: agreement to a few 1e-2 is all one can ask.
    self.assertAllClose(got["masked_lm_log_probs"], ref["masked_lm_log_probs"], atol=0.1)
    self.assertAllClose(got["sequence_output"], ref["sequence_output"], atol=0.15)
    self.assertLess(abs(got["total_loss"] - ref["total_loss"]), 0.05)

  def test_gelu_is_the_tanh_form(self):
    # The checkpoint fixture cannot tell erf from tanh GELU (4.5e-6); values far from 0 can.
    x = np.linspace(-6.0, 6.0, 241).astype(np.float32)
    tanh_form = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    erf_form = 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    got = self.evaluate(modeling.gelu(tf.constant(x)))
    self.assertAllClose(got, tanh_form, atol=1e-6, rtol=0)
    self.assertGreater(np.max(np.abs(got - erf_form)), 1e-4)
    self.assertIs(modeling.activation(modeling.BertConfig()), modeling.gelu)

  def test_gelu_gradient_is_the_derivative_of_the_tanh_form(self):
    # Its own gradient, and the XLA-compiled form's (gelu_fused), against TF's chain rule
    # through google-bert's expression, in float32 and (the mixed-precision activations)
    # bfloat16.
    x = np.linspace(-6.0, 6.0, 241).astype(np.float32)
    dy = np.cos(x).astype(np.float32)
    for gelu in (modeling.gelu, modeling.gelu_fused):
      for dtype, tol in ((tf.float32, 1e-5), (tf.bfloat16, 2e-2)):
        xt = tf.constant(x, dtype)
        with tf.GradientTape(persistent=True) as tape:
          tape.watch(xt)
          ours = gelu(xt)
          ref = 0.5 * xt * (1.0 + tf.tanh(math.sqrt(2 / math.pi)
                                          * (xt + 0.044715 * tf.pow(xt, 3))))
        got, want = (tf.cast(tape.gradient(y, xt, output_gradients=tf.constant(dy, dtype)),
                             tf.float32) for y in (ours, ref))
        self.assertAllClose(got, want, atol=tol, rtol=tol, msg=f"{gelu.__name__} {dtype}")
        self.assertGreater(float(tf.reduce_max(tf.abs(want))), 1.0)


  def test_the_fused_gelu_has_gelus_values(self):
    # XLA's own tanh and operation order: within a few float32 ulps of gelu's values (|y| <= 6);
    # in bfloat16 (the mixed-precision activations) within its rounding. Its gradient: above.
    x = np.linspace(-6.0, 6.0, 241).astype(np.float32)
    for dtype, tol in ((tf.float32, 3e-6), (tf.bfloat16, 2e-2)):
      fused, plain = (gelu(tf.constant(x, dtype)) for gelu in (modeling.gelu_fused, modeling.gelu))
      self.assertEqual(fused.dtype, dtype)
      self.assertAllClose(tf.cast(fused, tf.float32), tf.cast(plain, tf.float32), atol=tol * 4,
                          rtol=tol, msg=str(dtype))

  def test_the_fused_gelu_computes_bfloat16_in_float32_and_rounds_once(self):
    # A bfloat16 x (the mixed-precision activations) is computed in float32 inside the XLA
    # function, faster on the CPU than XLA's bfloat16 math (issue 42): its values and gradient
    # are the float32 computation on the same inputs rounded once to bfloat16. Computing in
    # bfloat16 misses this by up to 0.03 at |x| <= 6.
    x = tf.cast(tf.constant(np.linspace(-6.0, 6.0, 241), tf.float32), tf.bfloat16)
    dy = tf.cast(tf.cos(tf.cast(x, tf.float32)), tf.bfloat16)
    with tf.GradientTape(persistent=True) as tape:
      tape.watch(x)
      x32 = tf.cast(x, tf.float32)
      tape.watch(x32)
      y16, y32 = modeling.gelu_fused(x), modeling.gelu_fused(x32)
    g16 = tape.gradient(y16, x, output_gradients=dy)
    g32 = tape.gradient(y32, x32, output_gradients=tf.cast(dy, tf.float32))
    self.assertEqual((y16.dtype, g16.dtype), (tf.bfloat16, tf.bfloat16))
    self.assertAllEqual(tf.cast(y16, tf.float32), tf.cast(tf.cast(y32, tf.bfloat16), tf.float32))
    self.assertAllEqual(tf.cast(g16, tf.float32), tf.cast(tf.cast(g32, tf.bfloat16), tf.float32))

  def test_residual_dropout_of_a_bfloat16_layer_keeps_the_float32_scale(self):
    # add_and_norm drops out after the cast to float32: in bfloat16 the kept scale
    # 1 / (1 - 0.1) = 1.1111 rounds to 1.109375, a mean of 0.9 * 1.109375 = 0.99844 where
    # float32's is 1. Over 2^21 ones the mean's std is sqrt(0.9 * 0.1) * 1.111 / 2^10.5 =
    # 2.3e-4, so 0.99844 lies 6.8 std under 1 and the 5e-4 bound below fails it.
    cfg = modeling.BertConfig(hidden_size=512, num_heads=8, dropout_rate=0.1, dtype="bfloat16")
    x = tf.ones([4096, 512], tf.bfloat16)
    seen = []
    with mock.patch.object(modeling, "layer_norm", lambda y, eps: seen.append(y) or y):
      modeling.add_and_norm(x, tf.zeros_like(x), cfg, training=True)
    self.assertEqual(seen[0].dtype, tf.float32)
    kept = seen[0].numpy()
    self.assertAllClose(kept[kept > 0], np.full([(kept > 0).sum()], 1 / 0.9), rtol=1e-7)
    self.assertAllClose(kept.mean(), 1.0, atol=5e-4)

  def test_only_a_host_training_layer_calls_the_fused_gelu(self):
    # The engine's trace must keep the ops the compiler checks (an XLA call is no engine
    # kernel); evaluation and prediction graphs keep them too (a SavedModel that needs no XLA).
    cfg = modeling.BertConfig(hidden_size=8, num_hidden_layers=1, num_heads=2, filter_size=16,
                              dropout_rate=0.0, attention_dropout_rate=0.0)

    def layer_ops(training, engine=False):
      graph = tf.Graph()
      with graph.as_default(), (precision.tracing_for_engine() if engine
                                else contextlib.nullcontext()):
        x = tf.zeros([2 * 4, 8])
        modeling.transformer_layer(x, tf.zeros([2, 1, 1, 4]), 2, 4, cfg, training)
      calls = [op for op in graph.get_operations() if "PartitionedCall" in op.type]
      return calls, {op.type for op in graph.get_operations()
                     if op.name.startswith("intermediate/")}

    calls, types = layer_ops(training=True)
    self.assertEqual([op.name.split("/")[0] for op in calls], ["intermediate"])
    self.assertIn("gelu_forward_fused", calls[0].get_attr("f").name)
    self.assertNotIn("Tanh", types)
    for kwargs in ({"training": False}, {"training": True, "engine": True}):
      calls, types = layer_ops(**kwargs)
      self.assertEqual(calls, [], kwargs)
      self.assertIn("Tanh", types, kwargs)


class HeadsAndTrainingTest(base.BertTestCase):

  @needs_fixture
  def test_classifier_head_names_and_warm_start_leaves_head_fresh(self):
    features, _ = load_fixture()
    params = google_tiny_params(task="classification", num_classes=3)

    def build():
      feats = {k: tf.constant(features[k]) for k in ("token_ids", "segment_ids", "padding_mask")}
      spec = model.model_fn(feats, tf.constant([0, 2]), EVAL, params)
      names = {v.op.name: v.shape.as_list() for v in tf1.trainable_variables()}
      return spec, names

    sess, (spec, names) = self.run_graph(build)
    self.assertEqual(names["cls/classifier/output_weights"], [3, 64])
    self.assertEqual(names["cls/classifier/output_bias"], [3])
    self.assertNotIn("cls/predictions/output_bias", names)
    probs, loss = sess.run([spec.predictions["probabilities"], spec.loss])
    self.assertEqual(probs.shape, (2, 3))
    self.assertAllClose(probs.sum(-1), [1.0, 1.0], atol=1e-6)
    self.assertTrue(np.isfinite(loss))
    # Backbone came from the checkpoint, the fresh head did not.
    with sess.graph.as_default():
      pooler = sess.run([v for v in tf1.global_variables()
                         if v.op.name == "bert/pooler/dense/bias"][0])
    ckpt = tf.train.load_variable(os.path.join(base.GOOGLE_BERT_TINY, "model.ckpt"),
                                  "bert/pooler/dense/bias")
    self.assertAllEqual(pooler, ckpt)

  def test_tiny_model_learns_toy_mlm(self):
    # Toy language: a sentence repeats one of 20 words. A masked word can only be read off its
    # context, so the MLM loss falls from log(20) only if attention and heads learn.
    rng = np.random.RandomState(0)
    params = base.tiny_params(vocab_size=32, hidden_size=32, filter_size=64)
    params["optimizer"].update(learning_rate=3e-3, weight_decay_rate=0.0)
    b, s, p = 16, 16, 3

    def batch():
      start = rng.randint(0, 20, size=(b, 1))
      ids = np.repeat(start + 5, s, axis=1)
      pos = np.stack([rng.choice(np.arange(1, s), p, replace=False) for _ in range(b)])
      masked = ids.copy()
      np.put_along_axis(masked, pos, 4, axis=1)  # [MASK]
      return {"token_ids": masked.astype(np.int32), "segment_ids": np.zeros((b, s), np.int32),
              "padding_mask": np.ones((b, s), np.int32), "masked_lm_positions": pos.astype(np.int32),
              "masked_lm_ids": np.take_along_axis(ids, pos, 1).astype(np.int32),
              "masked_lm_weights": np.ones((b, p), np.float32),
              "next_sentence_label": rng.randint(0, 2, size=b).astype(np.int32)}

    def build():
      phs = {k: tf1.placeholder(tf.as_dtype(v.dtype), v.shape) for k, v in batch().items()}
      spec = model.model_fn(phs, None, TRAIN, params)
      return phs, spec

    sess, (phs, spec) = self.run_graph(build)
    mlm = spec.predictions["masked_lm_loss"]
    losses = []
    for _ in range(100):
      feed = {phs[k]: v for k, v in batch().items()}
      losses.append(sess.run([spec.train_op, mlm], feed)[1])
    first, last = np.mean(losses[:10]), np.mean(losses[-10:])
    self.assertGreater(first, 2.5)
    self.assertLess(last, 0.3 * first, "MLM loss %.3f -> %.3f" % (first, last))


class RobertaStyleTest(base.BertTestCase):
  """modelzoo's RoBERTa config: `use_segment_embedding: False`, `disable_nsp: True` and
  `mask_whole_word`. The first failed tracing ("not supported by BERT"), the other two were
  unknown keys."""

  def test_no_segments_no_nsp_trains_on_the_masked_lm_loss_alone(self):
    params = base.tiny_params(use_segment_embedding=False, disable_nsp=True)
    rng = np.random.RandomState(0)
    b, s, p = 4, 16, 3
    feats = {"token_ids": rng.randint(5, 40, (b, s)).astype(np.int32),
             "segment_ids": np.ones((b, s), np.int32), "padding_mask": np.ones((b, s), np.int32),
             "masked_lm_positions": rng.randint(1, s, (b, p)).astype(np.int32),
             "masked_lm_ids": rng.randint(5, 40, (b, p)).astype(np.int32),
             "masked_lm_weights": np.ones((b, p), np.float32),
             "next_sentence_label": np.zeros(b, np.int32)}

    def build():
      spec = model.model_fn({k: tf.constant(v) for k, v in feats.items()}, None, TRAIN, params)
      return spec, {v.op.name for v in tf1.trainable_variables()}

    sess, (spec, names) = self.run_graph(build)
    self.assertNotIn("bert/embeddings/token_type_embeddings", names)
    self.assertFalse([n for n in names if n.startswith(("bert/pooler", "cls/seq_relationship"))])
    self.assertIn("bert/embeddings/position_embeddings", names)
    loss, mlm = sess.run([spec.loss, spec.predictions["masked_lm_loss"]])
    self.assertEqual(loss, mlm)  # no next-sentence term
    # The parameter count follows: no type table (2 x 32) and no pooler (32 x 32 + 32).
    full = modeling.num_parameters(modeling.BertConfig(
        vocab_size=len(base.VOCAB), hidden_size=32, num_hidden_layers=2, num_heads=2,
        filter_size=64, max_position_embeddings=64))
    lean = modeling.num_parameters(modeling.BertConfig(
        vocab_size=len(base.VOCAB), hidden_size=32, num_hidden_layers=2, num_heads=2,
        filter_size=64, max_position_embeddings=64, use_segment_embedding=False))
    self.assertEqual(full - lean, 2 * 32)

  def test_whole_word_masking_masks_every_piece_of_a_picked_word(self):
    # Rows of words: [CLS] w1 w2##a w3##b##c ... [SEP]; ids >= 20 continue a word.
    continues = np.zeros(40, bool)
    continues[20:] = True
    rows, words_of = [], []
    rng = np.random.RandomState(0)
    for _ in range(32):
      row, words = [2], []
      for _ in range(rng.randint(4, 9)):
        word = [rng.randint(5, 20)] + list(rng.randint(20, 40, rng.randint(0, 3)))
        words.append(list(range(len(row), len(row) + len(word))))
        row += word
      rows.append(row + [3])
      words_of.append(words)
    special = {t: i for i, t in enumerate(base.SPECIAL)}
    with tf.Graph().as_default():
      tf1.set_random_seed(1)
      out = input_lib.mask_tokens(tf.ragged.constant(rows, dtype=tf.int64), special, 40, 12,
                                  0.3, continues=tf.constant(continues))
      with tf1.Session() as sess:
        _, positions, originals = (v.to_list() for v in sess.run(out))
    picked_some = 0
    for r, words in enumerate(words_of):
      chosen = set(positions[r])
      for word in words:
        self.assertIn(len(chosen & set(word)), (0, len(word)), (r, word, chosen))
      picked_some += any(len(w) > 1 and set(w) <= chosen for w in words)
      self.assertAllEqual(originals[r], [rows[r][i] for i in positions[r]])
      self.assertNotIn(0, positions[r])  # never [CLS]
    self.assertGreater(picked_some, 5)  # multi-piece words were picked, whole

  def test_masking_equals_tensorflow_texts_for_the_same_draws(self):
    """input_lib.mask_language_model reads and writes the picked positions with flat-index
    ops; tft.mask_language_model with a ragged batch_gather. Given the same selector draws
    and a chooser that marks each value (id + 1000), both return the same masked ids,
    positions and originals: per piece and over whole words, with tf-text's deterministic
    FirstNItemSelector and with the random selector BERT's pipeline uses (graph-seeded)."""
    rng = np.random.RandomState(3)
    rows = [[2] + list(rng.randint(5, 40, rng.randint(0, 12))) + [3] for _ in range(24)]
    continues = np.zeros(40, bool)
    continues[25:] = True
    special = {t: i for i, t in enumerate(base.SPECIAL)}
    unselectable = [special["[CLS]"], special["[SEP]"], special["[PAD]"]]

    class Marked(tft.MaskValuesChooser):
      def get_mask_values(self, masked_lm_ids):
        return masked_lm_ids + 1000

    def run(mask_fn, whole_words, random_selector):
      with tf.Graph().as_default():
        tf1.set_random_seed(7)
        ids = tf.ragged.constant(rows, dtype=tf.int64)
        if whole_words:
          ids = input_lib.group_words(ids, tf.constant(continues))
        if random_selector:
          selector = tft.RandomItemSelector(5, 0.3, unselectable_ids=unselectable,
                                            shuffle_fn=input_lib._row_shuffle_fn())  # pylint: disable=protected-access
        else:
          selector = tft.FirstNItemSelector(3, unselectable_ids=unselectable)
        out = mask_fn(ids, selector, Marked(40, special["[MASK]"]))
        with tf1.Session() as sess:
          return [v.to_list() for v in sess.run(out)]

    for whole_words in (False, True):
      for random_selector in (False, True):
        ours = run(input_lib.mask_language_model, whole_words, random_selector)
        theirs = run(lambda i, s, c: tft.mask_language_model(i, s, c), whole_words,
                     random_selector)
        self.assertEqual(ours, theirs, (whole_words, random_selector))
        masked, positions, originals = ours
        self.assertGreater(sum(map(len, positions)), 20)
        for r, row in enumerate(rows):
          self.assertEqual(originals[r], [row[i] for i in positions[r]])
          self.assertEqual(masked[r], [v + 1000 if i in positions[r] else v
                                       for i, v in enumerate(row)])

  def test_a_pair_tokenized_in_one_call_is_each_side_tokenized_alone(self):
    vocab_file = os.path.join(self.make_data_dir(), "vocab", "bert_uncased_vocab.txt")
    a = ["The movie , a great plot .", "", "dull dull dull", "zzqx unknown"]
    b = ["", "a movie", "The plot . A dull movie", "great"]
    with tf.Graph().as_default():
      tokenizer = input_lib.make_tokenizer(vocab_file, base.SPECIAL.index("[UNK]"))
      pair = input_lib.tokenize_pair(tokenizer, tf.constant(a), tf.constant(b))
      alone = [input_lib.tokenize(tokenizer, tf.constant(t)) for t in (a, b)]
      with tf1.Session() as sess:
        sess.run(tf1.tables_initializer())
        pair, alone = sess.run([pair, alone])
    pair, alone = [t.to_list() for t in pair], [t.to_list() for t in alone]
    self.assertEqual(pair, alone)
    self.assertEqual([len(r) for r in pair[0]], [len(r) for r in alone[0]])
    self.assertEqual(pair[0][1], [])
    self.assertGreater(len(pair[1][2]), len(pair[0][2]))


  def test_packing_keeps_what_tensorflow_texts_trimmers_keep(self):
    """pack_pair / pack_single trim from the lengths and a ragged slice (issue 42: the
    trimmers' graphs took 0.15-0.4 s of every input build): the same tokens as
    tft.RoundRobinTrimmer and tft.WaterfallTrimmer, for every budget up to past both
    segments, rows empty, short and long on either side."""
    rng = np.random.default_rng(0)
    len_a, len_b = rng.integers(0, 13, 300), rng.integers(0, 13, 300)
    a = tf.RaggedTensor.from_row_lengths(tf.range(int(len_a.sum()), dtype=tf.int64), len_a)
    b = tf.RaggedTensor.from_row_lengths(tf.range(int(len_b.sum()), dtype=tf.int64) + 10**6,
                                         len_b)
    for budget in range(27):
      want_a, want_b = tft.RoundRobinTrimmer(budget).trim([a, b])
      keep_a, keep_b = input_lib.round_robin_lengths(a.row_lengths(), b.row_lengths(), budget)
      self.assertEqual(input_lib.first_n(a, keep_a).to_list(), want_a.to_list(), budget)
      self.assertEqual(input_lib.first_n(b, keep_b).to_list(), want_b.to_list(), budget)
      for packed, want in [
          (input_lib.pack_pair(a, b, budget + 3, 101, 102),
           tft.combine_segments([want_a, want_b], start_of_sequence_id=101,
                                end_of_segment_id=102)),
          (input_lib.pack_single(a, budget + 2, 101, 102),
           tft.combine_segments(tft.WaterfallTrimmer(budget).trim([a]),
                                start_of_sequence_id=101, end_of_segment_id=102))]:
        self.assertEqual([t.to_list() for t in packed], [t.to_list() for t in want], budget)
    # A 100,000-token text beside a pair side split in int32 (the trimmer takes either).
    long = tf.RaggedTensor.from_row_lengths(tf.range(100_003, dtype=tf.int64), [100_000, 3])
    short = tf.RaggedTensor.from_row_splits(tf.range(50, dtype=tf.int64), tf.constant([0, 0, 50],
                                                                                     tf.int32))
    ids, _ = input_lib.pack_pair(long, short, 128, 101, 102)
    self.assertEqual(ids.row_lengths().numpy().tolist(), [128, 56])
    # Row 0: b empty, so a keeps 125 of its tokens: [CLS] 0..124 [SEP] [SEP].
    self.assertEqual(ids.to_list()[0][:3] + ids.to_list()[0][-3:], [101, 0, 1, 124, 102, 102])

class OptimizationTest(base.BertTestCase):

  def test_adamw_excludes_layer_norm_and_bias_from_weight_decay(self):
    def build():
      tvars = [tf1.get_variable(n, [3], initializer=tf1.ones_initializer())
               for n in ("layer/dense/kernel", "layer/dense/bias", "layer/LayerNorm/gamma",
                         "layer/LayerNorm/beta")]
      opt = optimization.AdamWeightDecayOptimizer(0.1, weight_decay_rate=0.5)
      step = opt.apply_gradients([(tf.zeros([3]), v) for v in tvars])  # zero grads: decay only
      return tvars, step, opt

    sess, (tvars, step, opt) = self.run_graph(build)
    sess.run(step)
    kernel, bias, gamma, beta = sess.run(tvars)
    self.assertAllClose(kernel, [1 - 0.1 * 0.5] * 3)
    for value in (bias, gamma, beta):
      self.assertAllEqual(value, [1.0] * 3)
    self.assertFalse(opt.decays("bert/encoder/layer_0/attention/output/LayerNorm/beta"))
    self.assertTrue(opt.decays("bert/encoder/layer_0/attention/self/query/kernel"))
    self.assertTrue(opt.decays("bert/embeddings/word_embeddings"))

  def test_weight_decay_waits_for_the_gradient(self):
    # The forward pass reads w late (a 0.3 s host op first): the decay, which needs nothing
    # but w and the rate, used to run at the step's start, so the pass read the decayed
    # w * (1 - lr * wd) = 2 * 0.75 = 1.5. It must read 2.0 and the update use that gradient.
    def build():
      w = tf1.get_variable("dense/kernel", initializer=[2.0])
      late = tf.numpy_function(lambda: (time.sleep(0.3), np.float32(0.0))[1], [], tf.float32)
      with tf.control_dependencies([late]):
        seen = tf.identity(w.read_value())
      opt = optimization.AdamWeightDecayOptimizer(0.5, weight_decay_rate=0.5)
      return w, seen, opt.minimize(tf.reduce_sum(seen * seen), var_list=[w])

    sess, (w, seen, step) = self.run_graph(build)
    read, _ = sess.run([seen, step])
    self.assertAllEqual(read, [2.0])
    # w - lr * (m / (sqrt(v) + eps) + wd * w), g = 4: m = 0.4, v = 0.016 -> 2 - 0.5 (3.16 + 1)
    # (float32 rounding of 2 - 2.08; a missing decay would be 0.5 off)
    self.assertAllClose(sess.run(w), [2.0 - 0.5 * (0.4 / (np.sqrt(0.016) + 1e-6) + 1.0)],
                        atol=1e-4)

  def test_embedding_lookup_reads_the_table_densely(self):
    # tf.gather on the variable (ResourceGather) puts it in copy-on-read mode, and every later
    # read and update of BERT's word table copied its 15.6 MB. Same rows, same gradient.
    def build():
      table = tf1.get_variable("word_embeddings", initializer=np.arange(12.0).reshape(4, 3)
                               .astype(np.float32))
      ids = tf.constant([[3, 1], [3, 0]])
      ours = embedding.lookup(table, ids)
      ref = tf.gather(table, ids)
      weights = tf.constant(np.arange(12.0).reshape(2, 2, 3).astype(np.float32))
      grads = [tf.convert_to_tensor(tf.gradients(tf.reduce_sum(t * weights), table)[0])
               for t in (ours, ref)]
      return ours, ref, grads

    sess, (ours, ref, grads) = self.run_graph(build)
    self.assertAllEqual(*sess.run([ours, ref]))
    self.assertAllEqual(*sess.run(grads))
    readers = {op.type for op in ours.op.inputs[0].op.outputs[0].consumers()}
    self.assertEqual(ours.op.type, "GatherV2")
    self.assertEqual(ours.op.inputs[0].op.type, "ReadVariableOp")
    self.assertNotIn("ResourceGather", readers)

  def test_no_embedding_table_is_read_by_resource_gather(self):
    # The token-type table too: its ResourceGather took 2.45 ms of a 235 ms fp32 step on the
    # AVX2 host (its [4096, 128] rows, one thread), its dense read's GatherV2 0.3 ms.
    def build():
      config = modeling.BertConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1,
                                   num_heads=2, filter_size=16)
      ids = tf.constant([[1, 2, 3], [4, 5, 6]])
      x, _ = modeling.embeddings(ids, tf.constant([[0, 0, 1], [0, 1, 1]]), config, True)
      return x

    sess, _ = self.run_graph(build)
    types = {op.type for op in sess.graph.get_operations()}
    self.assertIn("GatherV2", types)
    self.assertNotIn("ResourceGather", types)

  def test_fused_adamw_is_google_berts_update(self):
    # google-bert's AdamWeightDecayOptimizer by hand, 3 updates, no bias correction:
    # m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; w -= lr (m / (sqrt(v) + eps) + wd w).
    rng = np.random.RandomState(0)
    w0, grads = rng.randn(6).astype(np.float32), rng.randn(3, 6).astype(np.float32)
    lr, wd, b1, b2, eps = 0.1, 0.5, 0.9, 0.999, 1e-6

    def build():
      w = tf1.get_variable("dense/kernel", initializer=w0)
      g = tf1.placeholder(tf.float32, [6])
      opt = optimization.AdamWeightDecayOptimizer(lr, weight_decay_rate=wd)
      return w, g, opt.apply_gradients([(g, w)])

    sess, (w, g, step) = self.run_graph(build)
    self.assertIn("ResourceApplyAdam", [op.type for op in sess.graph.get_operations()])
    want, m, v = w0.astype(np.float64), 0.0, 0.0
    for grad in grads:
      sess.run(step, {g: grad})
      m = b1 * m + (1 - b1) * grad
      v = b2 * v + (1 - b2) * grad.astype(np.float64) ** 2
      want = want - lr * (m / (np.sqrt(v) + eps) + wd * want)
    # float32 vs float64 over 3 updates of ~0.3: 1e-4 is far below a missing decay (~0.02)
    # or a bias correction (x0.32 on the first step).
    self.assertAllClose(sess.run(w), want, rtol=1e-4, atol=1e-5)

  def train_linear(self, accum, micro_batch, updates):
    """Weights of a linear regression after `updates` AdamW updates on fixed data."""
    rng = np.random.RandomState(0)
    x = rng.randn(updates * 8, 4).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0], np.float32) + 0.1).astype(np.float32)
    opt = {"optimizer_type": "adamw", "learning_rate": 0.05, "weight_decay_rate": 0.1,
           "max_gradient_norm": 0.5, "grad_accum_steps": accum}

    def build():
      xp, yp = tf1.placeholder(tf.float32, [None, 4]), tf1.placeholder(tf.float32, [None])
      w = tf1.get_variable("dense/kernel", [4], initializer=tf1.zeros_initializer())
      b = tf1.get_variable("dense/bias", [], initializer=tf1.zeros_initializer())
      loss = tf.reduce_mean(tf.square(tf.linalg.matvec(xp, w) + b - yp))
      train_op, _ = optimization.build_train_op(loss, opt, total_steps=updates * accum)
      return xp, yp, w, b, train_op

    sess, (xp, yp, w, b, train_op) = self.run_graph(build)
    for i in range(0, len(x), micro_batch):
      sess.run(train_op, {xp: x[i:i + micro_batch], yp: y[i:i + micro_batch]})
    step = sess.run(tf1.train.get_global_step(sess.graph))
    return np.append(*sess.run([w, b])), step

  def test_grad_accumulation_equals_one_big_batch(self):
    big, big_steps = self.train_linear(accum=1, micro_batch=8, updates=5)
    acc, acc_steps = self.train_linear(accum=4, micro_batch=2, updates=5)
    self.assertEqual((big_steps, acc_steps), (5, 20))  # global_step counts micro-batches
    self.assertAllClose(acc, big, atol=1e-6, rtol=0)
    self.assertGreater(np.abs(big).max(), 0.1)  # it did train

  def test_learning_rate_segments_warm_up_then_decay(self):
    opt = {"learning_rate": [
        {"scheduler": "Linear", "initial_learning_rate": 0.0, "end_learning_rate": 1.0,
         "steps": 10},
        {"scheduler": "Linear", "initial_learning_rate": 1.0, "end_learning_rate": 0.0,
         "steps": 90}]}
    with tf.Graph().as_default():
      step = tf1.placeholder(tf.int64, [])
      lr = optimization.learning_rate_schedule(opt, step, 100)
      with tf1.Session() as sess:
        got = [sess.run(lr, {step: s}) for s in (0, 5, 10, 55, 100, 150)]
    self.assertAllClose(got, [0.0, 0.5, 1.0, 0.5, 0.0, 0.0], atol=1e-6)


class InputPipelineTest(base.BertTestCase):

  def test_masking_rate_split_determinism_and_fresh_masks_per_epoch(self):
    data_dir = self.make_data_dir()
    params = base.with_overrides(base.tiny_params(data_dir), "train_input", shuffle=False,
                                 max_predictions_per_seq=8, batch_size=16)
    with warnings.catch_warnings(record=True) as said:
      warnings.simplefilter("always")
      batches = self.take(input_lib.input_fn, params, TRAIN, 8)  # 64 pairs: 2 epochs
    # The graph seed reaching the masking draws is the design, not a warning for every run.
    self.assertEqual([str(w.message) for w in said if "from outer graph" in str(w.message)], [])
    again = self.take(input_lib.input_fn, params, TRAIN, 8)
    for (a, _), (b, _) in zip(batches, again):  # same graph seed -> same masks
      for k in a:
        self.assertAllEqual(a[k], b[k])

    vocab = {t: i for i, t in enumerate(base.VOCAB)}
    special = [vocab[t] for t in ("[CLS]", "[SEP]", "[PAD]")]
    counts, selected, maskable = np.zeros(3), 0, 0
    for f, labels in batches:
      self.assertEqual(f["token_ids"].shape, (16, 32))
      self.assertAllEqual(labels, f["next_sentence_label"])
      for i in range(16):
        n = int(f["masked_lm_weights"][i].sum())
        real = f["token_ids"][i][f["padding_mask"][i] == 1]
        candidates = int(np.sum(~np.isin(real, special))) + np.sum(
            np.isin(real[f["masked_lm_positions"][i][:n]], special))  # random picks may be special
        self.assertEqual(n, min(8, math.ceil(0.15 * candidates)))
        selected, maskable = selected + n, maskable + candidates
        for pos, orig in zip(f["masked_lm_positions"][i][:n], f["masked_lm_ids"][i][:n]):
          self.assertNotIn(orig, special)
          now = f["token_ids"][i][pos]
          counts[0 if now == vocab["[MASK]"] else 1 if now == orig else 2] += 1
    frac = counts / counts.sum()
    self.assertAllClose(frac, [0.8, 0.1, 0.1], atol=0.07)
    self.assertBetween(selected / maskable, 0.13, 0.2)

    # Epoch 2 (batches 4..7) repeats epoch 1's text with new masks.
    for e1, e2 in zip(batches[:4], batches[4:]):
      self.assertAllEqual(e1[0]["segment_ids"], e2[0]["segment_ids"])
      self.assertNotAllEqual(e1[0]["masked_lm_positions"], e2[0]["masked_lm_positions"])

  def test_estimator_fine_tunes_classifier_with_f1(self):
    # Also proves the tokenizer's lookup table is built inside the Estimator's own graphs.
    params = base.tiny_params(self.make_data_dir(), task="classification")
    params["eval_input"].update(batch_size=48)
    est = tf.estimator.Estimator(model.model_fn, model_dir=self.get_temp_dir(), params=params,
                                 config=tf.estimator.RunConfig(tf_random_seed=1))
    est.train(lambda params: input_lib.input_fn(params, TRAIN), max_steps=50)
    metrics = est.evaluate(lambda params: input_lib.input_fn(params, EVAL))
    for key in ("accuracy", "precision", "recall", "f1", "loss"):
      self.assertIn(key, metrics)
    p, r = metrics["precision"], metrics["recall"]
    self.assertAllClose(metrics["f1"], 2 * p * r / max(p + r, 1e-9), atol=1e-5)
    self.assertGreater(metrics["accuracy"], 0.8)  # sentiment words make this easy


  def test_classification_reads_tab_separated_text_as_its_records(self):
    """Fine-tuning data mostly comes as TSV (GLUE's `sentence<TAB>label` with a header); it
    was refused as "not TFRecords". The same rows as TSV give the same batches as records;
    a file whose lines are not sentence<TAB>integer is refused by file and line."""
    data_dir = self.make_data_dir()
    spec = {"sentence": tf.io.FixedLenFeature([], tf.string),
            "label": tf.io.FixedLenFeature([], tf.int64)}
    records = os.path.join(data_dir, "rotten_tomatoes", "dev.tfrecord")
    rows = [tf.io.parse_single_example(r, spec) for r in tf.data.TFRecordDataset(records)]
    tsv = os.path.join(self.get_temp_dir(), "dev.tsv")
    with open(tsv, "w", encoding="utf-8") as f:
      f.write("sentence\tlabel\n" + "".join(
          f"{r['sentence'].numpy().decode()}\t{int(r['label'])}\n" for r in rows))
    params = base.tiny_params(data_dir, task="classification")
    as_records = self.take(input_lib.input_fn, params, EVAL, 2)
    params["eval_input"]["file_pattern"] = tsv
    as_tsv = self.take(input_lib.input_fn, params, EVAL, 2)
    for (a, la), (b, lb) in zip(as_records, as_tsv):
      self.assertAllEqual(la, lb)
      for k in a:
        self.assertAllEqual(a[k], b[k])
    with open(tsv, "a", encoding="utf-8") as f:
      f.write("a line, with a comma, 1\n")
    with self.assertRaisesRegex(DataError, rf"dev.tsv:{len(rows) + 2} has 1 tab-separated "
                                           r"field\(s\) where the file's header has 2"):
      input_lib.input_fn(params, EVAL)

  def write_tsv(self, name, text):
    path = os.path.join(self.get_temp_dir(), name)
    with open(path, "w", encoding="utf-8") as f:
      f.write(text)
    return path

  def test_glue_pair_tasks_read_their_columns_and_label_words(self):
    """GLUE's pair tasks trained on the wrong column, silently: QQP's `id` was read as the
    sentence (the text before the first tab) and its question pair ignored. The header's
    names choose the columns (QQP, MRPC's label first, RTE's word labels numbered in sorted
    order, google-bert's), a pair packs as [CLS] a [SEP] b [SEP] with segments 0 and 1, and
    all three layouts give the same batches for the same rows."""
    data_dir = self.make_data_dir()
    pairs = [("good movie", "the plot", "entailment"), ("a dull film", "it ran", "not_entailment"),
             ("great fun", "a bird flew", "entailment"), ("bad plot", "the cat sat", "entailment")]
    rte = self.write_tsv("rte.tsv", "index\tsentence1\tsentence2\tlabel\n" + "".join(
        f"{i}\t{a}\t{b}\t{l}\n" for i, (a, b, l) in enumerate(pairs)))
    qqp = self.write_tsv("qqp.tsv", "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n" +
                         "".join(f"{70 + i}\t{i}\t{i}\t{a}\t{b}\t{int(l != 'entailment')}\n"
                                 for i, (a, b, l) in enumerate(pairs)))
    mrpc = self.write_tsv("mrpc.tsv", "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n" +
                          "".join(f"{int(l != 'entailment')}\t{i}\t{i}\t{a}\t{b}\n"
                                  for i, (a, b, l) in enumerate(pairs)))
    bare = self.write_tsv("bare.tsv", "".join(  # no header: a pair, then an integer label
        f"{a}\t{b}\t{int(l != 'entailment')}\n" for a, b, l in pairs))
    params = base.tiny_params(data_dir, task="classification")
    params["eval_input"].update(batch_size=4, max_sequence_length=12)
    ids = {t: i for i, t in enumerate(base.VOCAB)}
    got = {}
    for name, path in (("rte", rte), ("qqp", qqp), ("mrpc", mrpc), ("bare", bare)):
      params["eval_input"]["file_pattern"] = path
      got[name] = self.take(input_lib.input_fn, params, EVAL, 1)[0]
    features, labels = got["rte"]
    self.assertAllEqual(labels, [0, 1, 0, 0])  # entailment < not_entailment
    first = [ids[t] for t in ("[CLS]", "good", "movie", "[SEP]", "the", "plot", "[SEP]")]
    self.assertAllEqual(features["token_ids"][0][:7], first)
    self.assertAllEqual(features["segment_ids"][0][:8], [0, 0, 0, 0, 1, 1, 1, 0])
    for name in ("qqp", "mrpc", "bare"):
      self.assertAllEqual(got[name][1], labels)
      for k in features:
        self.assertAllEqual(got[name][0][k], features[k])

  def test_label_words_are_numbered_by_the_training_files(self):
    """Eval numbers word labels as training did (its own file may hold fewer classes); a
    word training never saw, more words than model.num_classes, and CoLA's header-less four
    columns are each one line."""
    data_dir = self.make_data_dir()
    header = "sentence1\tsentence2\tgold_label\n"
    train = self.write_tsv("mnli_train.tsv", header + "a cat\tthe dog\tneutral\n"
                           "a cat\ta cat\tentailment\nbig\tsmall\tcontradiction\n")
    dev = self.write_tsv("mnli_dev.tsv", header + "a cat\ta cat\tentailment\n")
    params = base.tiny_params(data_dir, task="classification", num_classes=3)
    params["train_input"]["file_pattern"] = train
    params["eval_input"].update(file_pattern=dev, batch_size=1)
    self.assertAllEqual(self.take(input_lib.input_fn, params, EVAL, 1)[0][1], [1])
    self.write_tsv("mnli_dev.tsv", header + "a cat\ta cat\tentailed\n")
    with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                r"a label in eval_input.*s data is not one of the training "
                                r"data.*s labels \(contradiction, entailment, neutral\)"):
      self.take(input_lib.input_fn, params, EVAL, 1)
    params["model"]["num_classes"] = 2
    with self.assertRaisesRegex(DataError, r"mnli_train.tsv labels its examples with 3 words "
                                           r"\(contradiction, entailment, neutral\) but "
                                           r"model.num_classes is 2: set it to 3"):
      input_lib.input_fn(params, TRAIN)
    params["train_input"]["file_pattern"] = self.write_tsv(
        "cola.tsv", "gj04\t1\t\tThe cat sat.\ngj04\t0\t*\tCat the sat.\n")
    with self.assertRaisesRegex(DataError, r"cola.tsv:1 is not sentence<TAB>label or "
                                           r"sentence1<TAB>sentence2<TAB>label: .* \(4 columns "
                                           r"here\); give the file a header naming its columns"):
      input_lib.input_fn(params, TRAIN)
    # Word labels without a header: line 1 is data, not a header to skip.
    params["eval_input"]["file_pattern"] = self.write_tsv(
        "words.tsv", "a good movie\tpositive\na bad film\tnegative\n")
    params["train_input"]["file_pattern"] = params["eval_input"]["file_pattern"]
    params["eval_input"]["batch_size"] = 2
    self.assertAllEqual(self.take(input_lib.input_fn, params, EVAL, 1)[0][1], [1, 0])


def write_google_bert_records(path, inputs):
  """inputs.npz as google-research/bert's create_pretraining_data.py writes examples (its
  write_instance_to_example_files: int64 lists, masked_lm_weights float, next_sentence_labels
  a list of one)."""
  def ints(v):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(x) for x in v]))
  with tf.io.TFRecordWriter(path) as w:
    for i in range(len(inputs["input_ids"])):
      feature = {"input_ids": ints(inputs["input_ids"][i]),
                 "input_mask": ints(inputs["input_mask"][i]),
                 "segment_ids": ints(inputs["token_type_ids"][i]),
                 "masked_lm_positions": ints(inputs["masked_lm_positions"][i]),
                 "masked_lm_ids": ints(inputs["masked_lm_ids"][i]),
                 "masked_lm_weights": tf.train.Feature(float_list=tf.train.FloatList(
                     value=inputs["masked_lm_weights"][i])),
                 "next_sentence_labels": ints([inputs["next_sentence_labels"][i]])}
      w.write(tf.train.Example(features=tf.train.Features(feature=feature))
              .SerializeToString())
  return path


class PreMaskedRecordsTest(base.BertTestCase):
  """Most BERT pretraining data is google-research/bert's pre-masked TFRecords. The pipeline
  read only text pairs ("the input records have no feature 'text_a'"); it now reads those
  files as written, checked against google-bert's own losses on its own checkpoint."""

  def params(self, **section):
    path = write_google_bert_records(os.path.join(self.get_temp_dir(), "pre.tfrecord"),
                                     np.load(os.path.join(base.GOOGLE_BERT_TINY, "inputs.npz")))
    params = google_tiny_params()
    params["eval_input"] = dict(file_pattern=path, batch_size=2, max_sequence_length=16,
                                max_predictions_per_seq=3, **section)
    return params

  @needs_fixture
  def test_google_bert_records_give_google_berts_losses(self):
    params = self.params()
    features, _ = load_fixture()
    (got, labels), = self.take(input_lib.input_fn, params, EVAL, 1)
    for key, value in features.items():
      self.assertAllEqual(got[key], value, msg=key)
    self.assertAllEqual(labels, features["next_sentence_label"])
    # No checkpoint in model_dir: evaluation runs on the warm start (google-bert's weights).
    est = tf.estimator.Estimator(model.model_fn, model_dir=self.get_temp_dir(), params=params)
    metrics = est.evaluate(lambda params: input_lib.input_fn(params, EVAL), steps=1)
    _, ref = load_fixture()
    self.assertAllClose(metrics["masked_lm_loss"], ref["masked_lm_example_loss"].mean(),
                        atol=1e-5)
    self.assertAllClose(metrics["next_sentence_loss"], ref["next_sentence_loss"], atol=1e-5)

  @needs_fixture
  def test_records_written_for_another_length_are_named_with_the_keys_to_set(self):
    params = self.params()
    params["eval_input"].update(max_sequence_length=128, max_predictions_per_seq=20)
    with self.assertRaisesRegex(
        DataError, r"pre.tfrecord holds google-research/bert pre-masked examples written with "
                   r"--max_seq_length=16 --max_predictions_per_seq=3, but "
                   r"eval_input.max_sequence_length is 128 and max_predictions_per_seq is 20: "
                   r"set them to 16 and 3"):
      input_lib.input_fn(params, EVAL)


class ConfigsTest(base.BertTestCase):

  def test_all_bert_configs_validate_and_build(self):
    from cerebras_tf.params import load_params  # pylint: disable=import-outside-toplevel
    files = sorted(glob.glob(os.path.join(base.REPO, "configs", "params_bert_*.yaml")))
    self.assertGreaterEqual(len(files), 8)
    sizes = {}
    for path in files:
      params = load_params(path)
      config = modeling.BertConfig.from_params(params["model"])
      self.assertEqual(config.filter_size, 4 * config.hidden_size)
      sizes[os.path.basename(path)] = modeling.num_parameters(config)
    # BERT-base's backbone is the well-known ~110M parameters.
    self.assertBetween(sizes["params_bert_base_msl128.yaml"], 108e6, 111e6)
    self.assertTrue(load_params(os.path.join(base.REPO, "configs",
                                             "params_bert_base_msl128.yaml"))["model"][
                                                 "mixed_precision"])


@pytest.mark.parametrize("act,negatives", [("tanh", True), ("relu", False)])
def test_pooler_nonlinearity_is_applied(act, negatives):
  # modelzoo's cls_nonlinearity (TAPE's classifier: relu) is the pooler's activation here.
  from cerebras_models.bert import modeling  # pylint: disable=import-outside-toplevel
  config = modeling.BertConfig.from_params({"vocab_size": 50, "hidden_size": 32,
                                            "num_hidden_layers": 1, "num_heads": 2,
                                            "filter_size": 64, "pooler_nonlinearity": act})
  with tf.Graph().as_default():
    pooled = modeling.pooler(tf.random.normal([64, 4, 32], seed=1), config)
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      out = sess.run(pooled)
  assert (out < 0).any() == negatives and (out > 0).any()
