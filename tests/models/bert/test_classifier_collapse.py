"""A fine-tuned classifier must not answer one class for every sentence (issue 44).

Warm-started from the demo's NSP-trained checkpoint, the shipped fine-tuning recipe once
answered "positive" for all 1,275 dev sentences of Rotten Tomatoes: accuracy 57.25%, exactly
the best constant answer. The eval metrics `accuracy_majority_baseline` (the best constant
answer's accuracy on the split evaluated) and `largest_predicted_class_share` (1.0 for such a
collapse) make that visible; these tests check the metrics on crafted predictions and on a
short real fine-tuning run.
"""

import os

import numpy as np
import pytest
import tensorflow as tf

from cerebras_models.bert import input as input_lib
from cerebras_models.bert import model
from cerebras_models.data import acquire
from cerebras_tf.params import load_params

tf1 = tf.compat.v1
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))))


def _metrics(labels, predictions, num_classes):
  """Runs model._classification_metrics over one batch of crafted labels and predictions."""
  with tf.Graph().as_default():
    ops = model._classification_metrics(  # pylint: disable=protected-access
        tf.constant(labels, tf.int32), {"predictions": tf.constant(predictions, tf.int32)},
        num_classes)
    with tf1.Session() as sess:
      sess.run(tf1.local_variables_initializer())
      sess.run({k: update for k, (_, update) in ops.items()})
      return sess.run({k: value for k, (value, _) in ops.items()})


def test_a_constant_answer_scores_the_majority_baseline_and_shows_as_collapse():
  # 229 positives of 400 (57.25%, Rotten Tomatoes dev's share); "positive" for everything.
  labels = [1] * 229 + [0] * 171
  m = _metrics(labels, [1] * 400, 2)
  assert m["accuracy"] == pytest.approx(0.5725)
  assert m["accuracy_majority_baseline"] == pytest.approx(0.5725)
  assert m["largest_predicted_class_share"] == pytest.approx(1.0)
  assert m["recall"] == pytest.approx(1.0) and m["precision"] == pytest.approx(0.5725)


def test_the_baseline_is_the_commonest_class_of_the_split_not_one_over_classes():
  # 3 classes, labels 2,2,2,1,0 (2 is commonest: 3/5); predictions 0,1,2,1,0: 3/5 right,
  # the commonest predicted class (0 or 1) covers 2/5.
  m = _metrics([2, 2, 2, 1, 0], [0, 1, 2, 1, 0], 3)
  assert m["accuracy_majority_baseline"] == pytest.approx(0.6)
  assert m["accuracy"] == pytest.approx(0.6)
  assert m["largest_predicted_class_share"] == pytest.approx(0.4)


@pytest.fixture(scope="module")
def rotten_tomatoes():
  try:
    paths = acquire.ensure_datasets(["vocab", "rotten_tomatoes"])
  except acquire.SourceUnavailableError as e:
    pytest.skip(f"data source unavailable here: {e}")
  return acquire.default_data_dir(), paths["vocab"]["vocab"]


@pytest.mark.slow
def test_fine_tuning_on_real_reviews_predicts_both_classes_and_beats_the_baseline(
    tmp_path, rotten_tomatoes):
  """The shipped recipe (from random weights, so no pretraining is needed here), shortened to
  STEPS of 32 with the warm-up and decay scaled to them, then the whole dev split (1,275
  sentences, 57.25% positive). Measured at 100 steps: accuracy 70.7% (the bar: 60.25%),
  largest predicted class share 0.60, 17 s on a 2-core VM (200 steps: 75.0%, 0.61, 26 s)."""
  data_dir, vocab = rotten_tomatoes
  params = load_params(os.path.join(ROOT, "configs", "params_bert_tiny_classifier.yaml"))
  steps = 100
  params["model"]["init_checkpoint"] = None
  for section in ("train_input", "eval_input"):
    params[section].update(data_dir=data_dir, vocab_file=vocab)
  peak = params["optimizer"]["learning_rate"][0]["end_learning_rate"]
  params["optimizer"]["learning_rate"] = peak
  params["optimizer"].update(warmup_steps=steps // 10, learning_rate_decay="linear")
  params["runconfig"].update(max_steps=steps)
  est = tf.estimator.Estimator(model.model_fn, model_dir=str(tmp_path / "m"), params=params,
                               config=tf.estimator.RunConfig(tf_random_seed=1))
  est.train(lambda params: input_lib.input_fn(params, tf.estimator.ModeKeys.TRAIN),
            max_steps=steps)
  m = est.evaluate(lambda params: input_lib.input_fn(params, tf.estimator.ModeKeys.EVAL))
  print({k: round(float(v), 4) for k, v in m.items()})
  assert m["accuracy_majority_baseline"] == pytest.approx(0.5725, abs=1e-4)  # 730 of 1,275
  assert m["largest_predicted_class_share"] < 0.9, m
  assert m["accuracy"] > m["accuracy_majority_baseline"] + 0.03, m
  assert np.isfinite(m["loss"])
