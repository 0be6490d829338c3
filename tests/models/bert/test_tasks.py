"""modelzoo's BERT fine-tuning tasks (models/bert/tasks.py): token classification, SQuAD spans,
BertSum and regression.

Each trains 3 steps with use_cs=True with plain tf.estimator's per-step losses (same seed, same
synthetic input), starts at the loss a hand calculation gives for a fresh head, and predicts
from the file's predict_input through run.py. modelzoo's TFRecords are read as its processors
read them (BertSum's input_mask is 1 for padding).
"""

import glob
import json
import math
import os

import numpy as np
import pytest
import tensorflow as tf

from cerebras_tf import CerebrasEstimator, CSConfig, CSRunConfig, cli
from cerebras_tf.errors import DataError
from cerebras_tf.params import load_params
from cerebras_models.bert import tasks

from event_losses import summary_losses

SEQ, BATCH, STEPS, VOCAB = 16, 4, 3, 40

PARAMS = """\
train_input: {{synthetic: true, batch_size: 4, max_sequence_length: 16, max_cls_tokens: 4,
              max_predictions_per_seq: 2}}
eval_input: {{synthetic: true, batch_size: 4, max_sequence_length: 16, max_cls_tokens: 4,
             max_predictions_per_seq: 2}}
predict_input: {{synthetic: true, batch_size: 8, max_sequence_length: 16, max_cls_tokens: 4,
                max_predictions_per_seq: 2}}
model:
  name: bert
  task: {task}
  vocab_size: 40
  hidden_size: 32
  num_hidden_layers: 2
  num_heads: 2
  filter_size: 64
  max_position_embeddings: 16
  dropout_rate: 0.0
  attention_dropout_rate: 0.0
  encoder_output_dropout_rate: 0.0
  num_classes: 5
  num_regression_values: 2
  {extra}
optimizer: {{optimizer_type: adamw, learning_rate: 0.001}}
runconfig: {{max_steps: 3, tf_random_seed: 0, save_summary_steps: 1}}
"""


def _first_loss_range(task):
  """Where a fresh head's first loss must fall (weights ~ N(0, 0.02): logits near 0).
  token_classification with include_padding_in_loss: mean CE over every token = ln 5.
  question_answering: start CE + end CE over 16 positions = 2 ln 16.
  extractive_summarization: sentences every 16 // 4 = 4 tokens, starts 0, 4, 8, 12, those below
    the real length (8..16) count: 2 to 4 a sequence, each ln 2 (sigmoid at 0).
  regression: mean squared error against labels mean(id) / 40 * (1, 2) with ids uniform in
    [3, 40): label ~ 0.54 and 1.08, so (0.54^2 + 1.08^2) / 2 ~ 0.73 (outputs near 0)."""
  return {"token_classification": (0.9 * math.log(5), 1.1 * math.log(5)),
          "question_answering": (0.95 * 2 * math.log(16), 1.05 * 2 * math.log(16)),
          "extractive_summarization": (2 * math.log(2) * 0.95, 4 * math.log(2) * 1.05),
          "regression": (0.5, 1.0)}[task]


PREDICT_KEYS = {"token_classification": {"predictions", "probabilities"},
                "question_answering": {"start_logits", "end_logits", "start_predictions",
                                       "end_predictions", "unique_ids"},
                "extractive_summarization": {"probabilities", "predictions"},
                "regression": {"predictions"}}


EVAL_METRICS = {"token_classification": {"token_accuracy"},
                "question_answering": {"start_accuracy", "end_accuracy"},
                "extractive_summarization": {"sentence_accuracy"},
                "regression": {"mean_squared_error", "pearson_correlation"}}


@pytest.mark.parametrize("task", tasks.TASKS)
def test_task_trains_on_the_engine_as_plain_tf_estimator_and_predicts(tmp_path, task):
  extra = "include_padding_in_loss: true" if task == "token_classification" else ""
  path = tmp_path / "params.yaml"
  path.write_text(PARAMS.format(task=task, extra=extra))
  params = load_params(str(path))
  plain = tf.estimator.Estimator(tasks.family_model_fn, model_dir=str(tmp_path / "plain"),
                                 params=params, config=tf.estimator.RunConfig(
                                     tf_random_seed=0, save_summary_steps=1))
  plain.train(tasks.family_input_fn, max_steps=STEPS)
  est = CerebrasEstimator(tasks.family_model_fn, params=params, config=CSRunConfig(
      model_dir=str(tmp_path / "cs"), tf_random_seed=0, save_summary_steps=1,
      cs_config=CSConfig(execution_strategy="pipelined")))
  est.train(tasks.family_input_fn, max_steps=STEPS, use_cs=True)
  want, got = summary_losses(plain.model_dir), summary_losses(est.model_dir)
  assert len(got) == STEPS, got
  np.testing.assert_allclose(got, want, rtol=1e-5)
  low, high = _first_loss_range(task)
  assert low <= got[0] <= high, (task, got)
  metrics = plain.evaluate(tasks.family_input_fn, steps=2)
  assert EVAL_METRICS[task] <= set(metrics) and np.isfinite(metrics["loss"]), metrics

  # run.py --mode predict reads predict_input (batch 8) over the 256 synthetic examples.
  assert cli.main(["run.py", "--params", str(path), "--mode", "predict",
                   "--model_dir", plain.model_dir]) == 0
  (out,) = glob.glob(os.path.join(plain.model_dir, "predictions", "*.jsonl"))
  rows = [json.loads(line) for line in open(out, encoding="utf-8")]
  assert len(rows) == tasks.SYNTHETIC_EXAMPLES
  assert set(rows[0]) == PREDICT_KEYS[task]
  if task == "token_classification":
    assert len(rows[0]["predictions"]) == SEQ and len(rows[0]["probabilities"][0]) == 5
  if task == "regression":
    assert len(rows[0]["predictions"]) == 2


def _int(values):
  return tf.train.Feature(int64_list=tf.train.Int64List(value=list(values)))


def test_modelzoo_records_are_read_as_its_processors_read_them(tmp_path):
  """NER: input_mask 1 = real token (google-bert's writer); BertSum: 1 = padding (its
  writer's tf.equal(input_ids, pad_id))."""
  ner_dir, sum_dir = tmp_path / "ner", tmp_path / "bertsum"
  ner_dir.mkdir()
  sum_dir.mkdir()
  ids = [2, 7, 8, 3] + [0] * 4
  with tf.io.TFRecordWriter(str(ner_dir / "train.tfrecord")) as w:
    w.write(tf.train.Example(features=tf.train.Features(feature={
        "input_ids": _int(ids), "input_mask": _int([1] * 4 + [0] * 4),
        "segment_ids": _int([0] * 8), "label_ids": _int([0, 1, 2, 0] + [0] * 4)}))
            .SerializeToString())
  with tf.io.TFRecordWriter(str(sum_dir / "train.tfrecord")) as w:
    w.write(tf.train.Example(features=tf.train.Features(feature={
        "input_ids": _int(ids), "input_mask": _int([0] * 4 + [1] * 4),
        "segment_ids": _int([0, 0, 1, 1] + [0] * 4), "cls_indices": _int([0, 2]),
        "labels": _int([1, 0]),
        "cls_weights": tf.train.Feature(float_list=tf.train.FloatList(value=[1.0, 1.0]))}))
            .SerializeToString())

  def first(task, data_dir):
    params = {"model": {"task": task, "vocab_size": 10},
              "train_input": {"data_dir": str(data_dir), "batch_size": 1,
                              "max_sequence_length": 8, "max_cls_tokens": 2, "shuffle": False}}
    features, labels = next(iter(tasks.family_input_fn(params, tf.estimator.ModeKeys.TRAIN)))
    return features, labels

  features, labels = first("token_classification", ner_dir)
  assert features["padding_mask"].numpy().tolist() == [[1] * 4 + [0] * 4]
  assert labels.numpy().tolist() == [[0, 1, 2, 0, 0, 0, 0, 0]]
  features, labels = first("extractive_summarization", sum_dir)
  assert features["padding_mask"].numpy().tolist() == [[1] * 4 + [0] * 4]
  assert features["cls_indices"].numpy().tolist() == [[0, 2]]
  assert labels.numpy().tolist() == [[1, 0]]
  with pytest.raises(DataError, match="synthetic: true"):
    first("token_classification", tmp_path / "empty")


def test_modelzoo_losses_by_hand():
  """Token loss without padding: sum over real tokens * loss_weight / batch; BertSum: sum of
  the real sentences' binary CE / batch * loss_weight."""
  logits = tf.constant([[[0.0, 0.0], [0.0, 0.0], [5.0, 0.0]]])  # [1, 3, 2]
  labels = tf.constant([[0, 1, 1]])
  mask = tf.constant([[1, 1, 0]])
  # Two real tokens, each ln 2 at equal logits; the padded one (CE 5.0067) is left out.
  got = tasks.token_loss(logits, labels, mask, 0.5, include_padding=False)
  np.testing.assert_allclose(got.numpy(), 2 * math.log(2) * 0.5 / 1, rtol=1e-6)
  got = tasks.token_loss(logits, labels, mask, 0.5, include_padding=True)
  np.testing.assert_allclose(got.numpy(), (2 * math.log(2) + 5 + math.log1p(math.exp(-5))) / 3,
                             rtol=1e-6)
  # Sentences: logit 0 (ln 2) and logit 2 with label 1 (ln(1 + e^-2)); the third weighs 0.
  got = tasks.sentence_loss(tf.constant([[0.0, 2.0, 9.0]]), tf.constant([[0, 1, 0]]),
                            tf.constant([[1.0, 1.0, 0.0]]), 0.25)
  np.testing.assert_allclose(got.numpy(), (math.log(2) + math.log1p(math.exp(-2))) * 0.25,
                             rtol=1e-6)
