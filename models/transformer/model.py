"""`model_fn` for the encoder-decoder Transformer: English -> Spanish translation.

Features (models/transformer/input.py): source_ids, source_padding_mask [B, S];
target_input_ids, target_padding_mask [B, T]; source_lengths, target_lengths [B];
source_text, target_text [B] strings (eval). Labels: target_output_ids [B, T].
A SavedModel is fed `source_text` only: tokenization happens in this graph then.

TRAIN   label-smoothed cross-entropy over real target tokens.
EVAL    loss, token accuracy, cross-entropy (unsmoothed), and BLEU (sacrebleu, detokenized
        decoder output vs the raw reference) over the whole eval split, with
        bleu_copy_baseline: the BLEU of the source text itself against the references.
PREDICT translation (string), output_ids, score: greedy (beam_width 1) or beam search.
"""


import numpy as np
import tensorflow as tf

from cerebras_models import graph_mode
from cerebras_models import losses
from cerebras_models import optimization
from cerebras_models.transformer import decoding
from cerebras_models.transformer import input as input_lib
from cerebras_models.transformer import modeling
from cerebras_models.transformer import vocab as vocab_lib
from cerebras_tf.runtime import precision

tf1 = tf.compat.v1
ModeKeys = tf.estimator.ModeKeys


def smoothed_xent(logits, labels, weights, smoothing: float):
  """Label-smoothed cross-entropy, the mean over real tokens.

  The target puts 1 - smoothing on the label and smoothing / V on every token, so the loss is
  (1 - smoothing) * nll + smoothing * mean_v(-log p_v); no [B, T, V] one-hot is built.

  Args:
    logits: [B, T, V] float32.  labels: [B, T] int32.  weights: [B, T] (1 = real token).
  Returns:
    (loss scalar, per-token nll [B, T]).
  """
  per_token = losses.sparse_softmax_xent(logits, labels, smoothing)
  nll = per_token  # for the metrics only: nll = loss + s * (mean_v l_v - l[label])
  if smoothing:
    nll += smoothing * (tf.reduce_mean(logits, axis=-1) - tf.gather(logits, labels, batch_dims=2))
  weights = tf.cast(weights, tf.float32)
  return tf.reduce_sum(per_token * weights) / tf.maximum(tf.reduce_sum(weights), 1.0), nll


def host_training_loss(decoder_output, labels, weights, config, smoothing: float):
  """smoothed_xent's loss, from the tied output layer directly (losses.
  output_layer_token_mean: no [B*T, V] gradient tensor), for training on the host. The engine's trace and EVAL keep the logits form, so the engine's
  figures do not depend on how the host computes.

  Args:
    decoder_output: [B, T, H].  labels: [B, T] int32.  weights: [B, T] (1 = real token).
  Returns:
    the mean loss over real tokens.
  """
  with tf1.variable_scope("transformer", reuse=True):
    _, table = modeling.embedding_tables(config)
  with tf1.name_scope("transformer/"):
    return losses.output_layer_token_mean(decoder_output, table, labels, weights, smoothing)


def decode(source_ids, source_padding_mask, encoder_output, config, max_length: int,
           beam_width: int, alpha: float):
  """Decodes from the encoder output.  -> (ids [B, max_length] int32, scores [B])."""
  batch = tf.shape(source_ids)[0]
  with tf1.variable_scope("transformer", reuse=tf1.AUTO_REUSE):
    k = max(int(beam_width), 1)
    enc = decoding.tile_beams(encoder_output, k) if k > 1 else encoder_output
    mask = decoding.tile_beams(source_padding_mask, k) if k > 1 else source_padding_mask
    cross_kv = modeling.cross_key_values(enc, config)
    cross_bias = modeling.padding_bias(mask)
    cache = modeling.init_cache(batch * k, max_length, config)

    def step(ids, i, cache):
      with tf1.variable_scope(tf1.get_variable_scope(), reuse=True):
        return modeling.decode_step(ids, i, cache, cross_kv, cross_bias, config, max_length)

    if k == 1:
      return decoding.greedy_decode(step, cache, batch, max_length, vocab_lib.START_ID,
                                    vocab_lib.END_ID, vocab_lib.PAD_ID)
    ids, scores = decoding.beam_search(step, cache, batch, k, max_length, alpha,
                                       vocab_lib.START_ID, vocab_lib.END_ID, vocab_lib.PAD_ID)
    return ids[:, 0], scores[:, 0]


def _ensure_decoder_variables(source_ids, source_padding_mask, config):
  """Creates every variable with one teacher-forced pass (never run): variables cannot be
  created inside the decoding while loop."""
  start = tf.fill([tf.shape(source_ids)[0], 1], vocab_lib.START_ID)
  return modeling.transformer(source_ids, source_padding_mask, start, config, False)


def bleu_stats(hypotheses, references):
  """sacrebleu's sufficient statistics summed over a batch of strings -> [10] float64:
  [sys_len, ref_len, correct 1-4, total 1-4]."""
  from sacrebleu.metrics import BLEU  # pylint: disable=import-outside-toplevel

  def stats(hyps, refs):
    hyps = [h.decode("utf-8") for h in hyps.numpy()]
    refs = [r.decode("utf-8") for r in refs.numpy()]
    if not hyps:
      return np.zeros([10], np.float64)
    return np.sum(BLEU()._extract_corpus_statistics(hyps, [refs]), axis=0).astype(np.float64)  # pylint: disable=protected-access

  out = tf.py_function(stats, [hypotheses, references], tf.float64)
  out.set_shape([10])
  return out


def bleu_from_stats(s) -> float:
  """Corpus BLEU (sacrebleu's default: exp smoothing) from summed statistics."""
  from sacrebleu.metrics import BLEU  # pylint: disable=import-outside-toplevel
  s = [int(round(x)) for x in np.asarray(s).tolist()]
  if s[0] == 0:
    return 0.0
  return float(BLEU.compute_bleu(s[2:6], s[6:10], s[0], s[1], smooth_method="exp").score)


def bleu_metric(hypotheses, references):
  """tf1-style streaming BLEU: (value, update_op) over the whole eval run."""
  total = tf1.Variable(tf.zeros([10], tf.float64), trainable=False, name="bleu_stats",
                       collections=[tf1.GraphKeys.LOCAL_VARIABLES,
                                    tf1.GraphKeys.METRIC_VARIABLES])
  update = total.assign_add(bleu_stats(hypotheses, references))
  value = tf.py_function(lambda s: np.float32(bleu_from_stats(s.numpy())), [total.read_value()],
                         tf.float32)
  value.set_shape([])
  return value, update


def _fed_by_placeholders(features) -> bool:
  """True when the compiler traces the graph (its capture feeds placeholders), not the host."""
  return features["source_ids"].op.type == "Placeholder"


def trim_padding(features, labels):
  """Cuts every [B, L] tensor to the batch's longest real sequence.

  The host-side counterpart of VTS: the input keeps the static shape the engine compiles for,
  and with length buckets most of it is padding the host need not compute on.
  """
  src_len = tf.reduce_max(tf.reduce_sum(features["source_padding_mask"], 1))
  tgt_len = tf.reduce_max(tf.reduce_sum(features["target_padding_mask"], 1))
  out = dict(features)
  for key, length in (("source_ids", src_len), ("source_padding_mask", src_len),
                      ("target_input_ids", tgt_len), ("target_padding_mask", tgt_len)):
    out[key] = features[key][:, :length]
  return out, labels[:, :tgt_len]


def _vocab(params):
  return vocab_lib.read_vocab(input_lib.vocab_file(params))


@graph_mode.model_fn_as_written
def model_fn(features, labels, mode, params):
  """tf.estimator model_fn; see the module docstring."""
  model_params = params["model"]
  tokens = _vocab(params)
  config = modeling.TransformerConfig.from_params(
      dict(model_params, vocab_size=model_params.get("vocab_size") or len(tokens)))
  if config.vocab_size < len(tokens):
    raise ValueError("model.vocab_size %d < %d tokens in the vocabulary"
                     % (config.vocab_size, len(tokens)))
  training = mode == ModeKeys.TRAIN
  section = params.get("eval_input") or params["train_input"]
  max_src = int(section.get("max_source_length") or 64)
  max_decode = int(model_params.get("max_decode_length") or section.get("max_target_length")
                   or 64)
  beam_width = int(model_params.get("beam_width") or 1)
  alpha = float(model_params.get("length_penalty") or 0.0)

  if "source_ids" not in features:  # serving: raw English strings
    tokenizer = vocab_lib.Tokenizer(tokens)
    features = dict(features, **input_lib.serving_features(tokenizer, features["source_text"],
                                                           max_src))
  src, src_mask = features["source_ids"], features["source_padding_mask"]

  if mode == ModeKeys.PREDICT:
    enc = _ensure_decoder_variables(src, src_mask, config)["encoder_output"]
    ids, scores = decode(src, src_mask, enc, config, max_decode, beam_width, alpha)
    text = vocab_lib.Tokenizer(tokens).detokenize(ids)
    preds = {"translation": text, "output_ids": ids, "score": scores}
    if "source_text" in features:
      preds["source_text"] = features["source_text"]
    return tf.estimator.EstimatorSpec(
        mode, predictions=preds,
        export_outputs={"serving_default": tf.estimator.export.PredictOutput(preds)})

  if model_params.get("trim_padding", True) and not _fed_by_placeholders(features):
    features, labels = trim_padding(features, labels)
    src, src_mask = features["source_ids"], features["source_padding_mask"]
  out = modeling.transformer(src, src_mask, features["target_input_ids"], config, training)
  weights = features["target_padding_mask"]
  smoothing = float(model_params.get("label_smoothing") or 0.0)
  if training and config.tie_output_projection and not precision.in_engine_trace():
    loss = host_training_loss(out["decoder_output"], labels, weights, config, smoothing)
    nll = None  # EVAL's metric only
  else:
    loss, nll = smoothed_xent(out["logits"], labels, weights, smoothing)
  predictions = tf.argmax(out["logits"], axis=-1, output_type=tf.int32)

  if mode == ModeKeys.EVAL:
    w = tf.cast(weights, tf.float32)
    metrics = {"token_accuracy": tf1.metrics.accuracy(labels, predictions, weights=w),
               "cross_entropy": tf1.metrics.mean(nll, weights=w)}
    if "target_text" in features and model_params.get("eval_bleu", True):
      eval_beams = int(model_params.get("eval_beam_width") or beam_width)
      ids, _ = decode(src, src_mask, out["encoder_output"], config, max_decode, eval_beams,
                      alpha)
      hyps = vocab_lib.Tokenizer(tokens).detokenize(ids)
      metrics["bleu"] = bleu_metric(hyps, features["target_text"])
      if "source_text" in features:  # the baseline: the English source as the 'translation'
        metrics["bleu_copy_baseline"] = bleu_metric(features["source_text"],
                                                    features["target_text"])
    return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops=metrics)

  runconfig = params.get("runconfig") or {}
  train_op, logs = optimization.build_train_op(loss, params["optimizer"],
                                               int(runconfig.get("max_steps") or 0))
  tf1.summary.scalar("learning_rate", logs["learning_rate"])
  acc = tf.reduce_sum(tf.cast(tf.equal(predictions, labels), tf.float32) * tf.cast(weights,
                      tf.float32)) / tf.maximum(tf.cast(tf.reduce_sum(weights), tf.float32), 1.0)
  tf1.summary.scalar("token_accuracy", acc)
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def serving_input_receiver_fn():
  """Raw English sentences in: `source_text` [None] string."""
  text = tf1.placeholder(tf.string, [None], name="source_text")
  return tf.estimator.export.ServingInputReceiver({"source_text": text}, {"source_text": text})
