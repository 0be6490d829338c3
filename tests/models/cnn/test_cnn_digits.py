"""The reference CNN (model.name: cnn) on the real digits images, through the Keras path.

Data: scikit-learn's digits.csv.gz from its pinned wheel (acquire.py "digits"), prepared into
the shared cache once (a 10.9 MB download, about 2 s), then only verified.
"""

import os

import numpy as np
import pytest
import tensorflow as tf

from cerebras_tf import CerebrasEstimator, CSConfig, CSRunConfig
from cerebras_models.cnn import model as cnn
from cerebras_models.data import acquire
from cerebras_tf.params import load_params
from cerebras_tf.registry import get_model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))))


@pytest.fixture(scope="module")
def digits():
  try:
    acquire.ensure_datasets(["digits"])
  except acquire.SourceUnavailableError as e:
    pytest.skip(f"data source unavailable here: {e}")
  return cnn.load_split("train"), cnn.load_split("test")


def test_digits_split_is_real_and_leak_free(digits):
  (x_train, y_train), (x_test, y_test) = digits
  assert x_train.shape == (1437, 8, 8, 1) and x_test.shape == (360, 8, 8, 1)
  assert set(np.unique(y_test)) == set(range(10))
  assert 0.0 <= x_train.min() and x_train.max() == 1.0
  train_images = {x.tobytes() for x in x_train}
  assert not any(x.tobytes() in train_images for x in x_test)
  # The trivial baseline is about one class in ten.
  assert 0.05 < cnn.majority_class_accuracy(y_train, y_test) < 0.15


def test_cnn_trains_on_the_engine_and_beats_the_baseline(tmp_path, digits):
  """200 steps of batch 32 (4.5 epochs) with use_cs=True: held-out accuracy at least 0.8,
  the majority-class baseline about 0.1 (the full 600-step config reaches about 0.99)."""
  (_, y_train), (_, y_test) = digits
  params = load_params(os.path.join(ROOT, "configs", "params_cnn_digits.yaml"))
  model_fn, input_fn = get_model("cnn").resolve()
  est = CerebrasEstimator(model_fn, params=params, config=CSRunConfig(
      model_dir=str(tmp_path / "m"), tf_random_seed=1, cs_config=CSConfig(
          execution_strategy="pipelined")))
  train = lambda params: input_fn(params, tf.estimator.ModeKeys.TRAIN)  # noqa: E731
  evaluate = lambda params: input_fn(params, tf.estimator.ModeKeys.EVAL)  # noqa: E731
  est.train(train, max_steps=200, use_cs=True)
  result = est.compile(train)
  assert result.plan.fits
  assert {"conv0", "conv1", "dense", "logits"} <= {l.name for l in result.graph.layers}
  metrics = est.evaluate(evaluate, use_cs=True)
  baseline = cnn.majority_class_accuracy(y_train, y_test)
  print(f"digits: held-out accuracy {metrics['accuracy']:.4f}, majority baseline {baseline:.4f}")
  assert metrics["accuracy"] >= baseline + 0.7, (metrics, baseline)
