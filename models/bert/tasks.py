"""BERT's fine-tuning tasks beyond sequence classification, as Cerebras modelzoo's TF releases
have them: token classification (NER, TAPE secondary structure), question answering (SQuAD
spans), extractive summarization (BertSum) and regression (TAPE fluorescence, stability).

Each is `model.task` of the bert family; the backbone is models/bert/modeling.py, the optimizer
models/optimization.py. The heads and losses carry modelzoo's meaning (learned from its
BertTokenClassifierModel, BertQuestionAnsweringModel, BertSummarizationModel and Genentech's
BertRegressionModel; written here):

  token_classification      sequence_output -> dropout(encoder_output_dropout_rate) ->
                            dense [H, C] (scope cls/token_classifier): per-token softmax.
                            Loss: sum over real tokens of the cross-entropy * loss_weight /
                            batch (include_padding_in_loss: false), else the mean over every
                            token.
  question_answering        sequence_output -> dense [H, 2] (scope cls/squad): start and end
                            logits over the sequence. Loss: mean start CE + mean end CE.
  extractive_summarization  sequence_output at each sentence's [CLS] (cls_indices) -> dense
                            [H, 1] (scope cls/summarization): a sigmoid per sentence. Loss:
                            sum of the real sentences' (cls_weights) binary cross-entropy /
                            batch * loss_weight.
  regression                pooled_output (pooler with cls_nonlinearity) -> dropout
                            (cls_dropout_rate, 0 unless given) -> dense [H, n] (scope
                            cls/regression). Loss: mean squared error.

Features (besides token_ids, segment_ids, padding_mask [B, S] int32, 1 = real token):
  token_classification      labels [B, S] int32
  question_answering        labels [B, 2] int32 (start, end); PREDICT: unique_ids [B] int32
  extractive_summarization  cls_indices [B, C] int32, cls_weights [B, C] float32,
                            labels [B, C] int32
  regression                labels [B, n] float32

Input (`input_fn`): modelzoo's TFRecords as its processors read them (NER: data_dir's
*.tfrecord*, input_ids/input_mask/segment_ids/label_ids; SQuAD: data_file, start_positions/
end_positions or unique_ids; BertSum: data_dir's *.tfrecord*, its input_mask 1 = padding,
cls_indices/cls_weights/labels), or `synthetic: true`: random token sequences whose labels are
a fixed function of the tokens (so a model can learn them), drawn from the graph seed. TAPE's
protein records (fluorescence, stability, secondary structure) are read synthetic only.
"""

import os
from typing import Any, Dict, Mapping, Optional

import numpy as np
import tensorflow as tf

from cerebras_models import fields, graph_mode, optimization
from cerebras_models.bert import input as base_input
from cerebras_models.bert import model as base_model
from cerebras_models.bert import modeling
from cerebras_tf.core import batching
from cerebras_tf.errors import DataError
from cerebras_tf.runtime import checkpoints
from cerebras_tf.modelzoo import tf_files

tf1 = tf.compat.v1
ModeKeys = tf.estimator.ModeKeys

TOKEN_CLASSIFICATION = "token_classification"
QUESTION_ANSWERING = "question_answering"
SUMMARIZATION = "extractive_summarization"
REGRESSION = "regression"
TASKS = (TOKEN_CLASSIFICATION, QUESTION_ANSWERING, SUMMARIZATION, REGRESSION)

# What PREDICT yields per task.
PREDICT_KEYS = {
    TOKEN_CLASSIFICATION: ("predictions", "probabilities"),
    QUESTION_ANSWERING: ("start_logits", "end_logits", "start_predictions",
                         "end_predictions"),
    SUMMARIZATION: ("probabilities", "predictions"),
    REGRESSION: ("predictions",),
}


# ---------------------------------------------------------------------------------------------
# Heads (pure graph functions; logits float32 whatever the compute dtype).

def _dense(x, units: int, scope: str, config) -> tf.Tensor:
  """x @ kernel + bias under `scope`, float32 out.  [..., H] -> [..., units]."""
  with tf1.variable_scope(scope):
    return tf.cast(modeling.dense(x, units, "output", config.initializer_range), tf.float32)


def token_logits(sequence_output, num_classes: int, config, training: bool, rate: float):
  """[B, S, H] -> [B, S, C] float32 (dropout on the encoder output first)."""
  return _dense(modeling.dropout(sequence_output, rate, training), num_classes,
                "cls/token_classifier", config)


def span_logits(sequence_output, config):
  """[B, S, H] -> (start [B, S], end [B, S]) float32."""
  logits = _dense(sequence_output, 2, "cls/squad", config)
  return logits[:, :, 0], logits[:, :, 1]


def sentence_logits(sequence_output, cls_indices, config):
  """The hidden state at each sentence's [CLS] -> one logit.  [B, S, H], [B, C] -> [B, C]."""
  picked = tf.gather(sequence_output, tf.cast(cls_indices, tf.int32), batch_dims=1)  # [B, C, H]
  return _dense(picked, 1, "cls/summarization", config)[:, :, 0]


def regression_outputs(pooled_output, num_values: int, config, training: bool, rate: float):
  """[B, H] -> [B, n] float32."""
  return _dense(modeling.dropout(pooled_output, rate, training), num_values, "cls/regression",
                config)


# ---------------------------------------------------------------------------------------------
# Losses (modelzoo's reductions; see the module doc).

def token_loss(logits, labels, padding_mask, loss_weight: float, include_padding: bool):
  """logits [B, S, C], labels [B, S], padding_mask [B, S] (1 = real) -> scalar."""
  per_token = tf.nn.sparse_softmax_cross_entropy_with_logits(
      labels=tf.cast(labels, tf.int32), logits=logits)  # [B, S]
  if include_padding:
    return tf.reduce_mean(per_token)
  batch = tf.cast(tf.shape(logits)[0], tf.float32)
  return tf.reduce_sum(per_token * tf.cast(padding_mask, tf.float32)) * loss_weight / batch


def span_loss(start_logits, end_logits, labels):
  """start/end logits [B, S], labels [B, 2] (start, end) -> mean start CE + mean end CE."""
  labels = tf.cast(labels, tf.int32)
  start = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels[:, 0],
                                                         logits=start_logits)
  end = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels[:, 1], logits=end_logits)
  return tf.reduce_mean(start) + tf.reduce_mean(end)


def sentence_loss(logits, labels, weights, loss_weight: float):
  """logits, labels, weights [B, C] -> sum(w * BCE) / B * loss_weight (modelzoo's softmax
  over [0, logit] is this sigmoid cross-entropy)."""
  per = tf.nn.sigmoid_cross_entropy_with_logits(labels=tf.cast(labels, tf.float32),
                                                logits=logits)
  batch = tf.cast(tf.shape(logits)[0], tf.float32)
  return tf.reduce_sum(per * tf.cast(weights, tf.float32)) / batch * loss_weight


def regression_loss(predictions, labels):
  """[B, n], [B, n] -> the mean squared error."""
  return tf.reduce_mean(tf.square(predictions - tf.cast(labels, tf.float32)))


def _pearson(x, y):
  """Streaming Pearson correlation of two [N] float32 tensors: (value, update op)."""
  means = [tf1.metrics.mean(t) for t in (x, y, x * y, x * x, y * y)]
  (mx, my, mxy, mxx, myy) = [m for m, _ in means]
  cov, vx, vy = mxy - mx * my, mxx - mx * mx, myy - my * my
  return (tf.math.divide_no_nan(cov, tf.sqrt(tf.maximum(vx * vy, 0.0))),
          tf.group(*[u for _, u in means]))


# ---------------------------------------------------------------------------------------------
# model_fn

def heads_and_loss(task: str, features, labels, outputs, config, model: Mapping[str, Any],
                   training: bool):
  """(loss or None without labels, tensors dict, eval metric ops fn) for one task."""
  if labels is None:
    labels = features.get("labels")
  mask = features["padding_mask"]
  if task == TOKEN_CLASSIFICATION:
    rate = model.get("encoder_output_dropout_rate")
    logits = token_logits(outputs["sequence_output"], int(model.get("num_classes") or 2),
                          config, training, 0.1 if rate is None else rate)
    t = {"logits": logits, "probabilities": tf.nn.softmax(logits),
         "predictions": tf.argmax(logits, -1, output_type=tf.int32)}
    loss = None if labels is None else token_loss(
        logits, labels, mask, float(model.get("loss_weight") or 1.0),
        bool(model.get("include_padding_in_loss")))
    metrics = lambda: {"token_accuracy": tf1.metrics.accuracy(
        tf.cast(labels, tf.int32), t["predictions"], weights=mask)}
  elif task == QUESTION_ANSWERING:
    start, end = span_logits(outputs["sequence_output"], config)
    t = {"start_logits": start, "end_logits": end,
         "start_predictions": tf.argmax(start, -1, output_type=tf.int32),
         "end_predictions": tf.argmax(end, -1, output_type=tf.int32)}
    if "unique_ids" in features:  # matches a window to its question at predict
      t["unique_ids"] = tf.reshape(features["unique_ids"], [-1])
    loss = None if labels is None else span_loss(start, end, labels)
    metrics = lambda: {
        "start_accuracy": tf1.metrics.accuracy(tf.cast(labels[:, 0], tf.int32),
                                               t["start_predictions"]),
        "end_accuracy": tf1.metrics.accuracy(tf.cast(labels[:, 1], tf.int32),
                                             t["end_predictions"])}
  elif task == SUMMARIZATION:
    logits = sentence_logits(outputs["sequence_output"], features["cls_indices"], config)
    t = {"logits": logits, "probabilities": tf.sigmoid(logits),
         "predictions": tf.cast(logits >= 0.0, tf.int32)}
    weights = features["cls_weights"]
    loss = None if labels is None else sentence_loss(logits, labels, weights,
                                                     float(model.get("loss_weight") or 1.0))
    metrics = lambda: {"sentence_accuracy": tf1.metrics.accuracy(
        tf.cast(labels, tf.int32), t["predictions"], weights=weights)}
  elif task == REGRESSION:
    rate = model.get("cls_dropout_rate")
    preds = regression_outputs(outputs["pooled_output"],
                               int(model.get("num_regression_values") or 1), config, training,
                               0.0 if rate is None else rate)
    t = {"predictions": preds}
    loss = None if labels is None else regression_loss(preds, labels)
    metrics = lambda: {
        "mean_squared_error": tf1.metrics.mean_squared_error(tf.cast(labels, tf.float32),
                                                              preds),
        "pearson_correlation": _pearson(tf.reshape(preds, [-1]),
                                        tf.reshape(tf.cast(labels, tf.float32), [-1]))}
  else:
    raise ValueError(f"model.task {task!r} is not one of {', '.join(TASKS)}")
  return loss, t, metrics


def _has_checkpoint(run_config) -> bool:
  model_dir = getattr(run_config, "model_dir", None)
  return bool(model_dir and tf.train.latest_checkpoint(model_dir))


def model_fn(features, labels, mode, params, config=None):
  """tf.estimator model_fn for the tasks of this module (see its doc)."""
  run_config = config
  model = params["model"]
  task = model["task"]
  config = modeling.BertConfig.from_params(model)
  training = mode == ModeKeys.TRAIN
  outputs = modeling.bert_model(features["token_ids"], features["segment_ids"],
                                features["padding_mask"], config, training,
                                with_pooler=task == REGRESSION)
  loss, t, metrics = heads_and_loss(task, features, labels if mode != ModeKeys.PREDICT
                                    else None, outputs, config, model, training)
  runconfig = params.get("runconfig") or {}
  init_checkpoint = model.get("init_checkpoint") or runconfig.get("init_checkpoint")
  if init_checkpoint and not _has_checkpoint(run_config):
    checkpoints.init_matching(init_checkpoint)
  if mode == ModeKeys.PREDICT:
    preds = {k: t[k] for k in PREDICT_KEYS[task] + ("unique_ids",) if k in t}
    export = {tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY:
              tf.estimator.export.PredictOutput(preds)}
    return tf.estimator.EstimatorSpec(mode, predictions=preds, export_outputs=export)
  if loss is None:
    raise ValueError(f"BERT {task} needs labels to train or evaluate (features['labels'] or "
                     f"the input's labels)")
  if mode == ModeKeys.EVAL:
    return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops=metrics())
  train_op, logs = optimization.build_train_op(loss, params["optimizer"],
                                               int(runconfig.get("max_steps") or 0))
  tf1.summary.scalar("learning_rate", logs["learning_rate"])
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


# ---------------------------------------------------------------------------------------------
# Input

SYNTHETIC_EXAMPLES = 256  # distinct synthetic examples (repeated when training)


def synthetic_examples(task: str, num: int, seq: int, vocab_size: int, seed: int,
                       num_classes: int = 2, max_cls_tokens: int = 50,
                       num_values: int = 1) -> Dict[str, np.ndarray]:
  """`num` examples of `task` (features and `labels`), numpy, fixed by `seed`. Tokens are
  ids in [1, vocab_size) over a random real length >= seq / 2, 0 (padding) after; labels are
  a function of the tokens:
    token_classification  token id mod num_classes (0 on padding)
    question_answering    the span [start, end] is marked by ids 1 (start) and 2 (end)
    extractive_summarization  sentences every max(2, seq // max_cls_tokens) tokens, each led
                          by its [CLS] slot; a sentence is in the summary when the token after
                          its [CLS] is even
    regression            the mean of the real token ids / vocab_size, times 1, 2, ... n
  """
  rng = np.random.RandomState(seed)
  low = min(3, vocab_size - 1)
  ids = rng.randint(low, vocab_size, size=(num, seq)).astype(np.int32)
  lengths = rng.randint(max(seq // 2, 2), seq + 1, size=num)
  mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int32)
  ids *= mask
  out = {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": mask}
  if task == TOKEN_CLASSIFICATION:
    out["labels"] = (ids % num_classes) * mask
  elif task == QUESTION_ANSWERING:
    start = rng.randint(1, lengths - 1)
    end = np.minimum(start + rng.randint(0, 4, size=num), lengths - 1)
    rows = np.arange(num)
    ids[rows, start], ids[rows, end] = 1 % vocab_size, 2 % vocab_size
    out["labels"] = np.stack([start, end], 1).astype(np.int32)
    out["unique_ids"] = np.arange(num, dtype=np.int32)
  elif task == SUMMARIZATION:
    stride = max(2, seq // max_cls_tokens)
    starts = np.arange(0, seq, stride)[:max_cls_tokens]
    cls = np.zeros((num, max_cls_tokens), np.int32)
    cls[:, :len(starts)] = starts
    weights = ((cls < lengths[:, None]) & (np.arange(max_cls_tokens) < len(starts))
               ).astype(np.float32)
    cls *= weights.astype(np.int32)
    nxt = np.take_along_axis(ids, np.minimum(cls + 1, seq - 1), 1)
    out.update(cls_indices=cls, cls_weights=weights,
               labels=((nxt % 2 == 0) * weights).astype(np.int32),
               segment_ids=((np.arange(seq) // stride) % 2)[None, :].repeat(num, 0)
               .astype(np.int32) * mask)
  elif task == REGRESSION:
    mean = (ids.sum(1) / np.maximum(mask.sum(1), 1) / vocab_size).astype(np.float32)
    out["labels"] = mean[:, None] * np.arange(1, num_values + 1, dtype=np.float32)[None, :]
  return out


def _records_spec(task: str, seq: int, max_cls: int, predict: bool):
  ints = lambda n: tf.io.FixedLenFeature([n], tf.int64)
  spec = {"input_ids": ints(seq), "input_mask": ints(seq), "segment_ids": ints(seq)}
  if task == TOKEN_CLASSIFICATION:
    spec["label_ids"] = ints(seq)
  elif task == QUESTION_ANSWERING:
    spec.update({"unique_ids": ints(1)} if predict else
                {"start_positions": ints(1), "end_positions": ints(1)})
  elif task == SUMMARIZATION:
    spec.update(cls_indices=ints(max_cls), labels=ints(max_cls),
                cls_weights=tf.io.FixedLenFeature([max_cls], tf.float32))
  return spec


def _from_records(task: str, ex: Dict[str, tf.Tensor]) -> Dict[str, tf.Tensor]:
  """modelzoo's record fields -> the features here."""
  ex = {k: tf.cast(v, tf.int32) if v.dtype == tf.int64 else v for k, v in ex.items()}
  mask = ex["input_mask"]
  if task == SUMMARIZATION:  # BertSum's writer stores 1 for padding
    mask = 1 - mask
  out = {"token_ids": ex["input_ids"], "segment_ids": ex["segment_ids"], "padding_mask": mask}
  if task == TOKEN_CLASSIFICATION:
    out["labels"] = ex["label_ids"]
  elif task == QUESTION_ANSWERING:
    if "unique_ids" in ex:
      out["unique_ids"] = ex["unique_ids"][:, 0]
    else:
      out["labels"] = tf.concat([ex["start_positions"], ex["end_positions"]], 1)
  elif task == SUMMARIZATION:
    out.update(cls_indices=ex["cls_indices"], cls_weights=ex["cls_weights"],
               labels=ex["labels"])
  return out


def _record_files(task: str, section, section_name: str):
  if task == QUESTION_ANSWERING:
    path = section.get("data_file")
    if not path or not tf.io.gfile.exists(path):
      raise DataError(f"{section_name}.data_file {path}: no such file; question answering "
                      f"reads modelzoo's SQuAD TFRecord (qa/input/json2tfrecords.py writes "
                      f"it), or set {section_name}.synthetic: true")
    return [path]
  if task == REGRESSION or (task == TOKEN_CLASSIFICATION and section.get("num_classes")):
    raise DataError(f"{section_name}: TAPE's protein records are not read here; set "
                    f"{section_name}.synthetic: true")
  dirs = tf_files.data_dirs(section.get("data_dir"))
  files = sorted(f for d in dirs for f in tf.io.gfile.glob(os.path.join(d, "*.tfrecord*")))
  if not files:
    raise DataError(f"{section_name}.data_dir {section.get('data_dir')}: no *.tfrecord* files; "
                    f"BERT {task} reads modelzoo's TFRecords there, or set "
                    f"{section_name}.synthetic: true")
  return files


def input_fn(params, mode=ModeKeys.TRAIN, input_context=None):
  """(features, labels) batches for `params["model"]["task"]`; PREDICT: features only."""
  training, predict = mode == ModeKeys.TRAIN, mode == ModeKeys.PREDICT
  section = params["train_input"] if training else (params.get("eval_input")
                                                    or params["train_input"])
  section_name = "train_input" if training else "eval_input"
  model = params["model"]
  task = model["task"]
  batch = batching.input_batch_size(params, section)
  seq = int(section.get("max_sequence_length") or 128)
  max_cls = int(section.get("max_cls_tokens") or 50)
  runconfig = params.get("runconfig") or {}
  seed = section.get("shuffle_seed")
  seed = runconfig.get("tf_random_seed") if seed is None else seed
  if section.get("synthetic"):
    data = synthetic_examples(task, SYNTHETIC_EXAMPLES, seq, int(model["vocab_size"]),
                              (0 if seed is None else int(seed)) + (0 if training else 1),
                              int(model.get("num_classes") or 2), max_cls,
                              int(model.get("num_regression_values") or 1))
    ds = tf.data.Dataset.from_tensor_slices(data)
  else:
    files = _record_files(task, section, section_name)
    spec = _records_spec(task, seq, max_cls, predict)
    ds = tf.data.TFRecordDataset(files)
    ds = ds.map(lambda r: _from_records(task, tf.io.parse_single_example(r, spec)),
                num_parallel_calls=fields.parallel_calls(section))
  if input_context is not None:
    ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
  if training and section.get("shuffle", True):
    ds = ds.shuffle(int(section.get("shuffle_buffer") or SYNTHETIC_EXAMPLES), seed=seed)
  if training and section.get("repeat", True):
    ds = ds.repeat()

  def split(ex):
    if predict:
      ex = dict(ex)
      ex.pop("labels", None)
      return ex
    return ex, ex["labels"]
  ds = ds.map(split).batch(batch, drop_remainder=training)
  return ds.prefetch(fields.prefetch_batches(section))


def is_task(params: Mapping[str, Any]) -> Optional[str]:
  """The task of this module that params' model.task names, else None."""
  task = (params.get("model") or {}).get("task")
  return task if task in TASKS else None


@graph_mode.model_fn_as_written
def family_model_fn(features, labels, mode, params, config=None):
  """The bert family's model_fn: this module's tasks here, pretraining and classification in
  model.py."""
  fn = model_fn if is_task(params) else base_model.model_fn
  return fn(features, labels, mode, params, config)


def family_input_fn(params, mode=ModeKeys.TRAIN, input_context=None):
  """The bert family's input_fn: this module's tasks here, the others in input.py."""
  fn = input_fn if is_task(params) else base_input.input_fn
  return fn(params, mode, input_context)
