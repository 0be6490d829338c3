"""CerebrasEstimator evaluate and predict: progress, the batch in params, an endless dataset, the
checkpoint read (and read again when training deletes it), and a model_fn that fails in predict.
"""

import glob
import logging
import os

import pytest
import tensorflow as tf

from cerebras_tf import CerebrasEstimator, CSConfig
from cerebras_tf.errors import ConfigError, ModelFnError
from cerebras_tf.runtime import checkpoints
from cerebras_models.mlp.model import input_fn, model_fn
from estimator_fixtures import PARAMS, config_in, eval_input_fn, train_input_fn
from source_marks import line_of


def test_evaluation_shows_progress_then_its_total():
  """A long evaluation was silent until its metrics (tf.estimator's "Evaluation [n/N]" is INFO,
  hidden by default, and absent without `steps`). Hand-checked with a fake clock: batches of
  32, one every 2 s, a line at most every 10 s."""
  from cerebras_tf.runtime.hooks import BatchProgressHook  # pylint: disable=import-outside-toplevel
  now, lines = [0.0], []
  hook = BatchProgressHook(32, total_batches=20, every_s=10.0, log_fn=lines.append,
                          clock=lambda: now[0])
  hook.begin()
  for _ in range(20):
    now[0] += 2.0
    hook.after_run(None, None)
  hook.end(None)
  # First line at batch 6 (10 s after batch 1): 5 batches x 32 / 10 s = 16 examples/s;
  # 14 batches left at 0.5 batch/s = 28 s. Then batches 11 and 16, then the total.
  assert lines[0] == "eval batch 6/20 (192 examples)  16.0 examples/s  ETA 0:00:28"
  assert len(lines) == 4 and lines[-1] == "eval done: 20 batch(es) (640 examples) in 40.0 s"
  unknown = []
  hook = BatchProgressHook(None, None, what="predict", every_s=0.0, log_fn=unknown.append,
                           clock=lambda: now[0])
  hook.begin()
  for _ in range(3):
    now[0] += 4.0
    hook.after_run(None, None)
  assert unknown == ["predict batch 2  0.25 batches/s", "predict batch 3  0.25 batches/s"]


def test_evaluating_on_a_repeating_dataset_without_steps_is_refused_not_endless(tmp_path,
                                                                               caplog):
  """The training input_fn reused for eval: `.repeat()` and steps=None read batch after batch
  (8.8 M examples in 90 s in the trial, never ending), in every mode and with use_cs=False
  too. Now refused with the input_fn named; steps=N, or a dataset that ends, evaluates.
  predict on one is a generator without end (list() of it never returns): a warning, since
  taking a few is fine."""
  cfg = config_in(tmp_path, cs_config=CSConfig(execution_strategy="pipelined"))
  est = CerebrasEstimator(model_fn, config=cfg, params=PARAMS)
  est.train(train_input_fn, max_steps=5, use_cs=True)
  for use_cs in (True, False):
    with pytest.raises(ConfigError, match=r"the dataset of train_input_fn \(tests/"
                       r"estimator_fixtures.py:\d+\) repeats forever \(.repeat\(\)\) and steps is None"):
      est.evaluate(train_input_fn, use_cs=use_cs)
  assert est.evaluate(train_input_fn, steps=3, use_cs=True)["global_step"] == 5
  assert est.evaluate(eval_input_fn, use_cs=True)["global_step"] == 5
  with caplog.at_level(logging.WARNING):
    predictions = est.predict(lambda params: train_input_fn(params).map(lambda f, y: f),
                              use_cs=True)
    assert len([p for _, p in zip(range(600), predictions)]) == 600  # past its 512 rows
    predictions.close()  # leaves its graph (a suspended generator keeps it the default)
  assert "predict: the dataset of <lambda> (tests/test_estimator_eval_predict.py:" in caplog.text
  assert "repeats forever (.repeat()), so the predictions never end" in caplog.text
  filtered = lambda params: train_input_fn(params).filter(lambda f, y: True)  # noqa: E731
  assert tf.data.experimental.cardinality(filtered(PARAMS)) == tf.data.UNKNOWN_CARDINALITY
  # Unknown is not endless: a filter over a finite dataset ends. Steps bound this one.
  assert est.evaluate(filtered, steps=2, use_cs=True)["global_step"] == 5


def test_evaluate_and_predict_take_the_newest_when_training_deletes_theirs(tmp_path, caplog,
                                                                          monkeypatch):
  """`--mode eval` in a second terminal while training saves every few seconds (keep 2): the
  checkpoint picked was deleted before it was restored, and eval failed with "file not found
  ... run prepare_data.py" or a ValueError traceback. The deletion is staged here: the first
  pick is a checkpoint whose files are removed before it is read."""
  cfg = config_in(tmp_path, cs_config=CSConfig(execution_strategy="pipelined")).replace(
      save_checkpoints_steps=2, keep_checkpoint_max=0)
  est = CerebrasEstimator(model_fn, config=cfg, params=PARAMS)
  est.train(train_input_fn, max_steps=4, use_cs=True)
  real = checkpoints.to_read
  picks = []

  def stale_first(model_dir, checkpoint_path):
    picks.append(model_dir)
    if len(picks) == 1:
      old = os.path.join(cfg.model_dir, "model.ckpt-2")
      for f in glob.glob(old + ".*"):
        os.remove(f)  # the training run's keep_checkpoint_max, mid-read
      return old
    return real(model_dir, checkpoint_path)
  monkeypatch.setattr(checkpoints, "to_read", stale_first)
  assert est.evaluate(eval_input_fn, steps=1, use_cs=True)["global_step"] == 4
  assert "model.ckpt-2 was deleted while being read" in caplog.text and len(picks) == 2
  picks.clear()
  (tmp_path / "model" / "model.ckpt-2.index").write_text("")  # picked again, then "deleted"
  assert len(list(est.predict(eval_input_fn, use_cs=True))) > 0
  assert est.last_predict_checkpoint.endswith("model.ckpt-4") and len(picks) == 2
  # A checkpoint the caller names is not swapped for another.
  with pytest.raises((tf.errors.NotFoundError, ValueError)):
    est.evaluate(eval_input_fn, steps=1,
                 checkpoint_path=os.path.join(cfg.model_dir, "model.ckpt-2"))


def test_eval_and_predict_input_fns_get_their_batch_in_params(tmp_path):
  """params['batch_size'] holds the batch in every mode with use_cs=True: the per-replica
  training batch, eval_input's for evaluate and predict (a registered user model whose
  input_fn batched with it trained, then failed at eval with KeyError: 'batch_size')."""
  params = {**PARAMS, "eval_input": {"batch_size": 8}}
  seen = {}

  def input_fn_(params, mode):
    seen.setdefault(mode, params["batch_size"])
    return input_fn({k: v for k, v in params.items() if k != "eval_input"}, mode)
  est = CerebrasEstimator(model_fn, config=config_in(tmp_path), params=params)
  est.train(lambda params: input_fn_(params, "train"), max_steps=2, use_cs=True)
  est.evaluate(lambda params: input_fn_(params, "eval"), steps=1, use_cs=True)
  next(iter(est.predict(lambda params: input_fn_(params, "infer"), use_cs=True)))
  assert seen == {"train": 16, "eval": 8, "infer": 8}


def test_a_model_fn_that_fails_in_predict_names_its_line(tmp_path):
  def needs_labels(features, labels, mode, params):
    logits = tf.compat.v1.layers.dense(features["x"], PARAMS["num_classes"])
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)  # LINE: loss
    step = tf.compat.v1.train.get_or_create_global_step()
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=tf.compat.v1.train
                                      .GradientDescentOptimizer(0.1).minimize(loss, step))
  _predict_fails_after_training(
      tmp_path, needs_labels, train_input_fn, PARAMS,
      rf"^tests/test_estimator_eval_predict.py:{line_of(__file__, 'LINE: loss')}: model_fn "
      r"failed in predict mode: ValueError: .*; in predict mode labels is None: build the loss only "
      r"for train and eval$")


def _predict_fails_after_training(tmp_path, model_fn_, train_input, params, pattern):
  """Trains one step, then predicts on the same input without labels: a ModelFnError."""
  est = CerebrasEstimator(model_fn_, config=config_in(tmp_path), params=params)
  est.train(train_input, max_steps=1, use_cs=True)
  with pytest.raises(ModelFnError, match=pattern):
    next(iter(est.predict(lambda params: train_input(params).map(lambda f, l: f),
                          use_cs=True)))


def _bare_features_model_fn(features, labels, mode, params):
  """Features are one tensor, not a dict; in predict mode labels.shape fails if asked to."""
  logits = tf.compat.v1.layers.dense(features, PARAMS["num_classes"])
  if mode == tf.estimator.ModeKeys.PREDICT and params.get("touch_labels"):
    logits += tf.zeros([labels.shape[0], 1])  # LINE: labels
  if mode == tf.estimator.ModeKeys.PREDICT:
    return tf.estimator.EstimatorSpec(mode, predictions={"logits": logits})
  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
  step = tf.compat.v1.train.get_or_create_global_step()
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=tf.compat.v1.train
                                    .GradientDescentOptimizer(0.1).minimize(loss, step))


def _bare_features_input(params):
  return train_input_fn(params).map(lambda f, l: (f["x"], l))


def test_a_serving_receiver_that_wraps_a_bare_tensor_is_told_the_one_that_does_not(tmp_path):
  """A model_fn that takes one feature tensor, exported with ServingInputReceiver(x, ...):
  TF hands the model_fn {"feature": x}, and the error was the model_fn's dense layer failing
  to read a dict's shape, with a hint that labels are None in predict mode (unrelated)."""
  est = CerebrasEstimator(_bare_features_model_fn, config=config_in(tmp_path), params=PARAMS)
  est.train(_bare_features_input, max_steps=1, use_cs=True)

  def wrapping():
    x = tf.compat.v1.placeholder(tf.float32, [None, PARAMS["input_dim"]])
    return tf.estimator.export.ServingInputReceiver(x, {"x": x})
  with pytest.raises(ModelFnError) as raised:
    est.export_saved_model(str(tmp_path / "export"), wrapping)
  message = str(raised.value)
  assert "features arrived as {'feature': tensor}" in message, message
  assert "TensorServingInputReceiver" in message and "labels is None" not in message

  def bare():
    x = tf.compat.v1.placeholder(tf.float32, [None, PARAMS["input_dim"]])
    return tf.estimator.export.TensorServingInputReceiver(x, {"x": x})
  assert os.path.isdir(est.export_saved_model(str(tmp_path / "export"), bare))


def test_a_model_fn_that_reads_labels_in_predict_is_named_not_a_traceback(tmp_path):
  """`labels.shape` in predict mode raised AttributeError, which was not caught: a traceback
  through tf.estimator instead of the model_fn's line."""
  _predict_fails_after_training(
      tmp_path, _bare_features_model_fn, _bare_features_input,
      {**PARAMS, "touch_labels": True},
      rf"^tests/test_estimator_eval_predict.py:{line_of(__file__, 'LINE: labels')}: model_fn "
      r"failed in predict mode: AttributeError: 'NoneType' object has no attribute 'shape'; in "
      r"predict mode labels is None")


def _scalar_prediction_model_fn(features, labels, mode, params):
  logits = tf.compat.v1.layers.dense(features, PARAMS["num_classes"])
  if mode == tf.estimator.ModeKeys.PREDICT:
    return tf.estimator.EstimatorSpec(mode, predictions={
        "logits": logits, "temperature": tf.constant(1.5)})
  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
  step = tf.compat.v1.train.get_or_create_global_step()
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=tf.compat.v1.train
                                    .GradientDescentOptimizer(0.1).minimize(loss, step))


def test_a_scalar_prediction_is_named_when_predict_yields_single_examples(tmp_path):
  """predict() splits each prediction along its batch dimension: a scalar one failed inside
  tf.estimator with "IndexError: tuple index out of range". Now the key is named; batched
  results (yield_single_examples=False) and predict_keys without it still work."""
  est = CerebrasEstimator(_scalar_prediction_model_fn, config=config_in(tmp_path), params=PARAMS)
  est.train(_bare_features_input, max_steps=1, use_cs=True)
  features = lambda params: _bare_features_input(params).map(lambda f, l: f).take(2)
  with pytest.raises(ModelFnError, match=r"^model_fn \(tests/test_estimator_eval_predict.py:\d+\): "
                     r"predictions\['temperature'\] is a scalar, but predict yields one "
                     r"result per example"):
    next(iter(est.predict(features, use_cs=True)))
  batches = list(est.predict(features, use_cs=True, yield_single_examples=False))
  assert len(batches) == 2 and batches[0]["temperature"] == 1.5
  assert batches[0]["logits"].shape == (PARAMS["batch_size"], PARAMS["num_classes"])
  rows = list(est.predict(features, use_cs=True, predict_keys=["logits"]))
  assert len(rows) == 2 * PARAMS["batch_size"] and list(rows[0]) == ["logits"]
