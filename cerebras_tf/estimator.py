"""CerebrasEstimator: a tf.estimator.Estimator that can compile for and run on the engine.

`use_cs=False` (the default) is exactly the plain Estimator. With `use_cs=True`, `train`
first compiles (capture -> lower -> validate -> plan -> simulate -> report; cached), fails
fast when the model does not fit, then trains for real on the host with the engine's predicted
throughput logged beside the host's, and TensorBoard gets the simulated scalars and the wafer
picture.

tf.estimator.Estimator refuses subclasses that override `train`, `evaluate` or `predict`
(it checks the concrete class's own __dict__), so those live in a mixin placed before
Estimator in the MRO.
"""

import contextlib
import functools
import inspect
import os
import random
import re
import tempfile
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf
from keras.src import backend as keras_backend  # tf.keras of TF 2.15
from tensorflow_estimator.python.estimator import extenders
from tensorflow_estimator.python.estimator import model_fn as model_fn_lib
from tensorflow_estimator.python.estimator import util as estimator_util

import cerebras_tf
from cerebras_tf import keras_model as keras_model_lib
from cerebras_tf.compiler import capture as capture_lib
from cerebras_tf.compiler import compile as compile_lib
from cerebras_tf.compiler import lower as lower_lib
from cerebras_tf.core import batching, plans, source
from cerebras_tf.engine import report
from cerebras_tf.errors import (CerebrasTFError, ConfigError, DataError, FitError, ModelFnError,
                                NonFiniteLossError, TrainingError, defined_at, disk_full,
                                disk_full_path, keeping_kind, tf_error_text)
from cerebras_tf import registry
from cerebras_tf.run_config import CSConfig, CSRunConfig
from cerebras_tf.runtime import (checkpoints, dir_lock, host_memory, logs, strategies,
                                 tf_config)
from cerebras_tf.runtime.hooks import BatchProgressHook, CSProgressHook, GracefulInterrupt

# The reference models' ops are the framework's own: their optimizer is not a user's to lint.
source.add_own_code(*registry.installed_family_dirs())

# While TensorFlow's runtime has not started: a Keras model built after this import (as
# from_keras_model needs) would otherwise fix the process at one CPU device.
strategies.reserve_default_cpus()

ModeKeys = tf.estimator.ModeKeys
_SECTION = {ModeKeys.TRAIN: "train_input", ModeKeys.EVAL: "eval_input",
            ModeKeys.PREDICT: "eval_input"}


def _call_with_supported_args(fn, **kwargs):
  """Calls `fn` with the subset of kwargs its signature names (the Estimator's convention).

  Raises:
    ConfigError (a TypeError too): `fn` requires an argument by another name (`lambda p:
      ...`): tf.estimator's TypeError said only "missing 1 required positional argument".
  """
  args = estimator_util.fn_args(fn)
  _check_required_args(fn, kwargs)
  return fn(**{k: v for k, v in kwargs.items() if k in args})


def _check_required_args(fn, passed) -> None:
  try:
    parameters = inspect.signature(fn).parameters.values()
  except (TypeError, ValueError):  # a builtin or C callable: let the call speak
    return
  missing = [p.name for p in parameters if p.default is p.empty and p.name not in passed
             and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
  if not missing:
    return
  name = getattr(fn, "__name__", type(fn).__name__)
  raise keeping_kind(ConfigError, TypeError(), (  # a TypeError where tf.estimator's call failed
      f"{name}{defined_at(fn)} requires argument(s) {', '.join(repr(m) for m in missing)}, but "
      f"tf.estimator passes arguments by name, only {', '.join(sorted(passed))}: rename "
      f"{missing[0]!r} to one of those (the input_fn's is usually 'params'), or give it a "
      "default"))


def batch_size_for_mode(params: dict, mode: str) -> Optional[int]:
  """The global batch size the params imply for `mode` (nested YAML or flat params).

  Raises:
    ConfigError: a batch_size that is not an int > 0 (0, 2.5 or "8" were taken for no batch,
      2 or 8).
  """
  name = _SECTION.get(mode, "train_input")
  section = params.get(name)
  if isinstance(section, dict) and section.get("batch_size") is not None:
    return _checked_batch(section["batch_size"], f"params['{name}']['batch_size']")
  if params.get("batch_size") is not None:
    return _checked_batch(params["batch_size"], "params['batch_size']")
  return None


def _checked_batch(value, where: str) -> int:
  if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value > 0:
    return int(value)
  raise ConfigError(f"{where} must be an int > 0 (the global batch, split over the replicas), "
                    f"got {value!r}")


def _shows_our_info(method):
  """Our INFO lines (fit, engine time, progress) reach the terminal during `method` even at
  TensorFlow's default WARN verbosity (runtime/logs.py)."""

  @functools.wraps(method)
  def wrapped(*args, **kwargs):
    with logs.our_info_shown():
      return method(*args, **kwargs)
  return wrapped


def _as_estimator_spec(spec, user_model_fn) -> model_fn_lib.EstimatorSpec:
  """The user's model_fn result as an EstimatorSpec. A model_fn written for TPUEstimator
  returns a TPUEstimatorSpec (scaffold_fn, eval_metrics as (metric_fn, tensors), host_call):
  it becomes the EstimatorSpec TPUEstimator itself runs off-TPU (`as_estimator_spec`).
  Anything else is named, rather than tf.estimator's "model_fn should return an
  EstimatorSpec" surfacing as a failure to trace the model."""
  if isinstance(spec, model_fn_lib.EstimatorSpec):
    return spec
  if isinstance(spec, tf.compat.v1.estimator.tpu.TPUEstimatorSpec):
    return spec.as_estimator_spec()
  raise keeping_kind(ModelFnError, ValueError(), (
      f"model_fn{defined_at(user_model_fn)} returned {type(spec).__name__}, not a "
      f"tf.estimator.EstimatorSpec: return tf.estimator.EstimatorSpec(mode, loss=..., "
      f"train_op=...) (predictions=... in predict mode); model_fn should return an "
      f"EstimatorSpec"))


def _check_single_examples(predictions, predict_keys, user_model_fn) -> None:
  """predict(yield_single_examples=True) splits every prediction along its first (batch)
  dimension: a scalar one failed in tf.estimator with "IndexError: tuple index out of range"
  after the model was built and restored."""
  items = predictions.items() if isinstance(predictions, dict) else [(None, predictions)]
  for key, tensor in items:
    if key is not None and predict_keys and key not in predict_keys:
      continue
    if isinstance(tensor, tf.Tensor) and tensor.shape.rank == 0:
      what = f"predictions['{key}']" if key is not None else "predictions"
      raise ModelFnError(
          f"model_fn{defined_at(user_model_fn)}: {what} is a scalar, but predict yields one "
          f"result per example, taken along each prediction's first (batch) dimension: give "
          f"it that dimension (e.g. tf.fill([tf.shape(logits)[0]], value)), leave it out of "
          f"predictions, or call predict(..., yield_single_examples=False)")


def _merge_in_cond_message(error, user_model_fn) -> str:
  """A model_fn that applies its update inside a tf.cond or loop (its own gradient
  accumulation, usually) under host replicas: tf.distribute merges the replicas' gradients in
  apply_gradients, and cannot inside a cond; its error is a paragraph about tf.function."""
  where = capture_lib.user_line(error) or f"model_fn{defined_at(user_model_fn)}: "
  return (f"{where}the model_fn applies its update inside a tf.cond or a loop (gradient "
          f"accumulation?), which data-parallel host replicas cannot run: tf.distribute "
          f"merges the replicas' gradients in apply_gradients, and cannot inside a cond; "
          f"accumulate with cerebras_models.optimization.build_train_op "
          f"(optimizer.grad_accum_steps, which merges first), raise the batch instead, or "
          f"train pipelined")


def _predict_hint(mode, features, labels, message: str) -> str:
  """What a model_fn that fails in predict mode (predict, export) most likely did."""
  if mode != ModeKeys.PREDICT:
    return ""
  if isinstance(features, dict) and list(features) == ["feature"]:
    # tf.estimator.export.ServingInputReceiver wraps a bare tensor as {"feature": tensor}.
    return ("; features arrived as {'feature': tensor}: a ServingInputReceiver wraps a single "
            "tensor in a dict, return tf.estimator.export.TensorServingInputReceiver to pass "
            "it bare")
  if labels is None and "None" in message:
    return "; in predict mode labels is None: build the loss only for train and eval"
  return ""


class _CerebrasMethods:
  """train/evaluate/predict with `use_cs`; a mixin so tf.estimator accepts the subclass."""

  @_shows_our_info
  def train(self, input_fn, hooks=None, steps=None, max_steps=None, saving_listeners=None,
            use_cs=None, *, run_max_steps=None):
    """Trains; with use_cs=True compiles for the engine first and fails fast if it won't fit.

    Before anything is written, the model_dir's latest checkpoint is made restorable
    (runtime/checkpoints.py) and checked against the model's variables. `run_max_steps`: the
    last step of the whole run when this call is one round of it (train_and_eval); progress
    and ETA count to it. One training run per model_dir: a second one, in this process or
    another, gets a ConfigError (runtime/dir_lock.py).
    """
    with dir_lock.model_dir_lock(self.model_dir):
      return self._train(input_fn, hooks, steps, max_steps, saving_listeners, use_cs,
                         run_max_steps)

  def _train(self, input_fn, hooks, steps, max_steps, saving_listeners, use_cs, run_max_steps):
    checkpoints.ensure_restorable(self.model_dir)
    self._restore_from = checkpoints.latest(self.model_dir)
    self._say_warm_start_skipped()
    if max_steps is not None and self._restore_from and self._current_step() >= max_steps:
      # tf.estimator returns at once and says so only at INFO, in the log file.
      tf.compat.v1.logging.warning(
          "cerebras_tf: %s is at step %d already, max_steps is %d: nothing to train; raise "
          "max_steps, or give steps=N to train N more", self.model_dir, self._current_step(),
          max_steps)
    if not self._saves_checkpoints():
      tf.compat.v1.logging.warning(
          "cerebras_tf: checkpoints are off (save_checkpoints_steps and save_checkpoints_secs "
          "are both None, as tf.estimator reads it): the weights this call trains are not "
          "saved, so evaluate, predict, export and the next train call will not see them; set "
          "save_checkpoints_steps to keep them")
    try:
      if not self._resolve_use_cs(use_cs):
        self._say_off_engine(use_cs)
        self._retire_input_state()
        return tf.estimator.Estimator.train(self, input_fn, hooks=hooks, steps=steps,
                                            max_steps=max_steps,
                                            saving_listeners=saving_listeners)
      return self._train_on_engine(input_fn, hooks, steps, max_steps, saving_listeners,
                                   run_max_steps)
    except (tf.compat.v1.train.NanLossDuringTrainingError, NonFiniteLossError) as e:
      # Still the error tf.estimator raises, for code that catches it.
      raise keeping_kind(TrainingError, e, self._after_nan(e),
                         kind=tf.compat.v1.train.NanLossDuringTrainingError) from None
    except (tf.errors.ResourceExhaustedError, OSError) as e:
      if not disk_full(e):
        raise
      raise TrainingError(self._after_disk_full(e)) from e
    finally:
      self._restore_from = None

  def _train_on_engine(self, input_fn, hooks, steps, max_steps, saving_listeners,
                       run_max_steps):
    if self.config.task_type in ("evaluator", "ps"):  # RunConfig's TaskType values
      # tf.estimator's own refusal, before the compile calls the model_fn.
      raise ValueError(
          "Train has been called wrong configuration. Please use "
          "tf.estimator.train_and_evaluate which calls proper API according to given "
          f"configuration. Current configuration: {self.config}.")
    strategies.form_cluster(self.cs_config)
    result = self.compile(input_fn, mode=ModeKeys.TRAIN)
    self._raise_unless_fits(result)
    _raise_unless_host_holds(result)
    input_rate = self.time_input(input_fn, result)
    # Only a single-replica pipelined run saves its input pipeline's position (below): on
    # several workers tf.estimator's distributed loop refuses saving listeners ("Saving
    # listenor is not supported by the current Distribution Strategies"), which a pipelined
    # params file launched on 2 workers met at its first step.
    input_checkpointed = (result.plan.mode.saves_input_position
                          and result.plan.batching.host_replicas == 1
                          and self._saves_checkpoints())
    if input_checkpointed:
      checkpoints.match_input_state(self.model_dir, result.input_signature)
      checkpoints.align_input_state(self.model_dir)
      self._restore_from = checkpoints.latest(self.model_dir)
    else:
      self._retire_input_state()
    current = self._current_step()
    last_step = max_steps
    if last_step is None and steps is not None:
      last_step = current + steps
    self._log_engine_time(result, current, run_max_steps or last_step)
    self._cs_run = {"result": result, "last_step": run_max_steps or last_step,
                    "every": self._config.log_step_count_steps or 100,
                    "input_rate": input_rate}
    try:
      with self._runtime_for(result.plan) as (runtime, runtime_hooks):
        hooks = list(hooks or []) + runtime_hooks
        # The batch goes into params only when the params name one: a batch taken from the
        # data leaves params as the user gave them, as tf.estimator does.
        named = batch_size_for_mode(self.params, ModeKeys.TRAIN) is not None
        input_fn = self._per_replica_input_fn(input_fn, runtime.per_replica_batch, named)
        if input_checkpointed:
          # The input pipeline's position is checkpointed with the model, so a resumed run
          # neither repeats nor skips batches. "warn": pipelines that draw random numbers
          # (BERT's on-the-fly masking) save their position; their RNG state restarts.
          position = checkpoints.InputPositionHook(self, external_state_policy="warn")
          hooks = hooks + [position]
          saving_listeners = list(saving_listeners or []) + [position.listener]
        with GracefulInterrupt(self.model_dir) as interrupt, \
            self._model_fn_sees_batch(runtime.per_replica_batch if named else None):
          return tf.estimator.Estimator.train(self, input_fn, hooks=hooks + [interrupt.hook],
                                              steps=steps, max_steps=max_steps,
                                              saving_listeners=saving_listeners)
    except (ValueError, AttributeError) as e:
      # Raised by the optimizer's merge step, outside the replicas' model_fn calls.
      mixed = _mixed_policy_across_replicas(e, self._user_model_fn)
      if mixed is None:
        raise
      raise ModelFnError(mixed) from e
    except tf.compat.v1.train.NanLossDuringTrainingError:
      # tf.estimator's NanTensorHook checks every step, ours only fetches on logging steps.
      hook = self._cs_run.get("hook")
      if hook is None or hook.last_run_step() is None:
        raise
      raise NonFiniteLossError(float("nan"), hook.last_run_step()) from None
    finally:
      self._cs_run = None

  def time_input(self, input_fn, result):
    """Times the TRAIN input_fn alone on this host (half a second after warm-up) and says, in
    the log and report.txt's "input:" line, whether it could feed the simulated systems of
    `result` (a `compile` result that fits). Training calls it first; `--compile_only` too.

    Returns:
      The capture.InputRate, or None if not timed (a from_generator dataset, a pipeline that
      fails: training reports that itself, data that ends in the warm-up).
    """
    batch = batch_size_for_mode(self.params, ModeKeys.TRAIN)
    fn = self._per_replica_input_fn(input_fn, batch) if batch else input_fn
    try:
      rate = capture_lib.measure_input_rate(lambda: self._call_input_fn(fn, ModeKeys.TRAIN),
                                            batch_size=batch, seed=self.config.tf_random_seed)
    except tf.errors.OpError as e:
      # Training runs the same pipeline next and reports what is wrong with it in full.
      tf.compat.v1.logging.info("cerebras_tf: input not timed: %s", tf_error_text(e))
      return None
    except capture_lib.NotTimed as e:
      tf.compat.v1.logging.info("cerebras_tf: input not timed: %s", e)
      return None
    if rate is None:
      return None
    text = report.input_line(rate.samples_per_sec, rate.batches, rate.seconds, result.plan,
                             result.performance)
    short = rate.samples_per_sec < result.performance.samples_per_sec
    (tf.compat.v1.logging.warning if short else tf.compat.v1.logging.info)(
        "cerebras_tf: input: %s", text)
    path = result.report_paths.get("report")
    if path and os.path.exists(path):
      report.put_input_line(path, text)
    return rate

  def _say_warm_start_skipped(self) -> None:
    """A warm start applies only to a model_dir without checkpoints (tf.estimator skips it
    silently otherwise): a Keras model trained further in memory, or another warm_start_from,
    given for a model_dir that already has a run, trained on from the old checkpoint. Said at
    this estimator's first train call, when the checkpoint is not its own."""
    first, self._trained_once = not self._trained_once, True
    if not first or not self._restore_from:
      return
    keras_model = getattr(self._user_model_fn, "keras_model", None)
    if keras_model is not None:
      what = f"Keras model '{keras_model.name}'"  # saved at from_keras_model
    elif self._warm_start_settings:
      what = f"warm_start_from {self._warm_start_settings.ckpt_to_initialize_from}"
    elif self._init_checkpoint:
      what = f"init_checkpoint (--warm_start) {self._init_checkpoint}"
    else:
      return
    tf.compat.v1.logging.warning(
        "cerebras_tf: %s has a checkpoint (step %d), and training resumes from it: the "
        "weights of %s are not used (a warm start applies to a model_dir without "
        "checkpoints); use a new model_dir to start from them", self.model_dir,
        self._current_step(), what)

  def _saves_checkpoints(self) -> bool:
    return bool(self._config.save_checkpoints_steps or self._config.save_checkpoints_secs)

  def _say_off_engine(self, use_cs) -> None:
    """A CSConfig chosen by hand, then a train call that leaves use_cs unset: most likely
    tf.estimator.train_and_evaluate (it cannot pass use_cs), not a wish to skip the engine.
    Said once per estimator; the run is still the plain Estimator's."""
    if use_cs is not None or self._said_off_engine or self.cs_config == CSConfig():
      return
    self._said_off_engine = True
    tf.compat.v1.logging.warning(
        "cerebras_tf: train without use_cs runs as a plain tf.estimator.Estimator, so the "
        "CSConfig given (%s on %s) is not used; pass use_cs=True to train, or build "
        "CerebrasEstimator(..., use_cs=True) for tf.estimator.train_and_evaluate",
        self.cs_config.execution_strategy, self.cs_config.engine)

  def _retire_input_state(self) -> None:
    """A run that saves no input position: the chief retires the last one saved (see
    checkpoints.retire_input_state); other tasks of a cluster share the model_dir."""
    if self._config.is_chief:
      checkpoints.retire_input_state(self.model_dir)

  def _after_nan(self, error) -> str:
    """Moves non-finite checkpoints aside; the message says which checkpoint is now latest."""
    kept, moved = checkpoints.drop_nonfinite(
        self.model_dir, error.step if isinstance(error, NonFiniteLossError) else None)
    what = (f"loss is {error.loss} at step {error.step}" if isinstance(error, NonFiniteLossError)
            else "loss is NaN (tf.estimator's NanTensorHook)")
    if moved:
      where = (f"the latest checkpoint is now {os.path.basename(kept)}, the last one before "
               f"the loss diverged" if kept else "no checkpoint from before the divergence is left")
      saved = (f"{where} ({len(moved)} checkpoint(s) of the diverged weights moved to "
               f"{os.path.join(self.model_dir, 'nonfinite')})")
    else:
      saved = (f"the latest checkpoint {os.path.basename(kept)} is finite" if kept
               else "no checkpoint was written")
    return (f"{what}: training stopped; {saved}; lower optimizer.learning_rate, set "
            f"optimizer.max_gradient_norm, or enable loss scaling")

  def _after_disk_full(self, error) -> str:
    """Removes the partial files of the failed write; says what is intact and what to do."""
    checkpoints.remove_partial_writes(self.model_dir)
    kept = checkpoints.ensure_restorable(self.model_dir, log=lambda _: None)
    where = disk_full_path(error)
    saved = (f"checkpoints up to {os.path.basename(kept)} are intact" if kept
             else "no checkpoint was written")
    return (f"disk full while writing {where or self.model_dir}: training stopped; {saved} "
            f"and partial files "
            f"were removed; free some space (or choose another --model_dir) and rerun the "
            f"same command to resume")

  @_shows_our_info
  def evaluate(self, input_fn, steps=None, hooks=None, checkpoint_path=None, name=None,
               use_cs=None):
    """Evaluates a checkpoint (the initialized model when there is none, as tf.estimator);
    with use_cs=True the last compile must fit."""
    if steps is None:
      input_fn = _refusing_endless(input_fn)
    if name is None:
      name = _eval_name_of_this_task()
    input_fn, batch = self._for_engine(input_fn, ModeKeys.EVAL, use_cs)
    for attempt in range(_VANISHED_RETRIES + 1):
      self._restore_from = self._checkpoint_for("evaluate", checkpoint_path)
      progress = BatchProgressHook(batch_size_for_mode(self.params, ModeKeys.EVAL), steps)
      try:
        with self._model_fn_sees_batch(batch):
          # The checkpoint checked is the one restored (tf.estimator would look up the
          # latest again, and a training run may have saved another since).
          metrics = tf.estimator.Estimator.evaluate(
              self, input_fn, steps=steps, hooks=list(hooks or []) + [progress],
              checkpoint_path=checkpoint_path or self._restore_from, name=name)
        if not progress.batches:  # tf.estimator reports a loss of 0 and accuracy 0 for it
          raise DataError(f"the eval input_fn gave no batch at all: its data is empty or "
                          f"smaller than one batch of "
                          f"{batch_size_for_mode(self.params, ModeKeys.EVAL) or '?'} examples "
                          f"where partial batches are dropped; add eval data, or lower its "
                          f"batch size")
        return metrics
      except (tf.errors.NotFoundError, ValueError) as e:
        if not self._vanished(checkpoint_path, attempt, e):
          raise
      finally:
        self._restore_from = None
    raise AssertionError("unreachable")  # the last attempt returns or raises

  def predict(self, input_fn, predict_keys=None, hooks=None, checkpoint_path=None,
              yield_single_examples=True, use_cs=None):
    """Predicts from a checkpoint (the initialized model when there is none, as tf.estimator);
    with use_cs=True the last compile must fit."""
    restore_from = self._checkpoint_for("predict", checkpoint_path)
    input_fn, batch = self._for_engine(_saying_endless(input_fn), ModeKeys.PREDICT, use_cs)
    self._single_examples = (predict_keys,) if yield_single_examples else None
    for attempt in range(_VANISHED_RETRIES + 1):
      if attempt:
        restore_from = self._checkpoint_for("predict", checkpoint_path)
      self._restore_from = restore_from
      progress = BatchProgressHook(batch_size_for_mode(self.params, ModeKeys.PREDICT), None,
                                   what="predict")
      yielded = False
      try:
        with self._model_fn_sees_batch(batch):
          for prediction in tf.estimator.Estimator.predict(
              self, input_fn, predict_keys=predict_keys, hooks=list(hooks or []) + [progress],
              checkpoint_path=checkpoint_path or restore_from,
              yield_single_examples=yield_single_examples):
            yielded = True
            yield prediction
        self.last_predict_checkpoint = checkpoint_path or restore_from
        return
      except (tf.errors.NotFoundError, ValueError) as e:
        if yielded or not self._vanished(checkpoint_path, attempt, e):
          raise
      finally:
        self._restore_from = None
        self._single_examples = None

  def _for_engine(self, input_fn, mode, use_cs):
    """(input_fn, batch) for eval/predict: with use_cs the last compile must fit, and the
    input_fn and model_fn get the mode's batch; without, both as they are."""
    if not self._resolve_use_cs(use_cs):
      return input_fn, None
    self._check_last_compile()
    return self._batch_param_input_fn(input_fn, mode), batch_size_for_mode(self.params, mode)

  def _vanished(self, checkpoint_path, attempt: int, error) -> bool:
    """Whether evaluate/predict of the latest checkpoint should start again: a training run on
    the same model_dir deleted it (it keeps keep_checkpoint_max) before it was restored. A
    checkpoint the caller named is not swapped for another."""
    gone = self._restore_from and not tf.io.gfile.exists(self._restore_from + ".index")
    if not gone or checkpoint_path or attempt >= _VANISHED_RETRIES:
      return False
    tf.compat.v1.logging.warning(
        "cerebras_tf: %s was deleted while being read (a training run on this model_dir keeps "
        "its newest checkpoints only); taking the newest (%s)",
        os.path.basename(self._restore_from), type(error).__name__)
    return True

  def _check_last_compile(self) -> None:
    """Eval and predict run the graph the engine compiled for training: the last compile of
    this estimator must fit. (Their own input_fns are not compiled: an eval batch, or a
    predict input without labels, is not the training graph.)"""
    if self._last_compile is not None:
      self._raise_unless_fits(self._last_compile)

  def _checkpoint_for(self, what: str, checkpoint_path) -> Optional[str]:
    """The checkpoint eval/predict will restore; None for none (a warm start, which
    tf.estimator applies there too, e.g. a Keras model's own weights; or the initializers)."""
    if checkpoint_path:
      if not tf.io.gfile.isdir(checkpoint_path):
        checkpoints.check_whole(checkpoint_path)  # a copy cut short: one line, not RestoreV2's
      return checkpoint_path
    del what
    # None: tf.estimator runs initialization and says so ("Could not find trained model");
    # scripts/run.py refuses that (runner.require_checkpoint).
    return checkpoints.latest(self.model_dir)

  def _train_with_estimator_spec(self, estimator_spec, worker_hooks, hooks, global_step_tensor,
                                 saving_listeners):
    """tf.estimator's training loop, with the progress hook on the spec's loss: under a
    distribution strategy that is the loss reduced over the replicas, not replica 0's."""
    all_hooks = list(hooks) + list(worker_hooks)
    if any(isinstance(h, tf.compat.v1.train.StopAtStepHook) for h in all_hooks) \
        and not capture_lib.writes_reached(estimator_spec.train_op, [global_step_tensor]):
      what = (f"model_fn{defined_at(self._user_model_fn)}: its train_op does not advance the "
              f"global step, so steps/max_steps is never reached")
      fix = ("pass global_step=tf.compat.v1.train.get_global_step() to minimize() or "
             "apply_gradients(), or group tf.compat.v1.assign_add(global_step, 1) into the "
             "train_op")
      if not any(_users(h) for h in all_hooks):
        # Nothing of the user's can stop it: tf.estimator would train forever.
        raise ModelFnError(f"{what} and training would never end: {fix}")
      # A hook of the user's may stop it, as under tf.estimator.
      tf.compat.v1.logging.warning("cerebras_tf: %s: training ends when a hook stops it; %s",
                                   what, fix)
    _say_updates_not_run(tf.compat.v1.get_default_graph(), estimator_spec.train_op,
                         global_step_tensor)
    run = self._cs_run
    if run is not None:
      hooks = list(hooks) + [self._progress_hook(estimator_spec.loss, run)]
      _say_per_replica_variables(tf.compat.v1.get_default_graph(), self._train_distribution)
      _say_per_replica_clipping(tf.compat.v1.get_default_graph(), self._train_distribution)
      _say_replica_values(tf.compat.v1.get_default_graph(), self._train_distribution,
                          list(hooks) + list(estimator_spec.training_hooks),
                          estimator_spec.loss)
      _say_batch_norm_statistics(run["result"].graph.batch_norm_layers, run["result"].plan)
      checkpoints.keep_one_per_variable(tf.compat.v1.get_default_graph())
    return tf.estimator.Estimator._train_with_estimator_spec(  # pylint: disable=protected-access
        self, estimator_spec, worker_hooks, hooks, global_step_tensor, saving_listeners)


def _keras_parts(model, model_dir, config, custom_objects=None, metric_names_map=None,
                 export_outputs=None):
  """(model_fn, config, warm start) that train a compiled Keras `model` from its weights."""
  config = _as_cs_run_config(config)
  if model_dir is not None or config.model_dir is None:
    config = config.replace(model_dir=model_dir or tempfile.mkdtemp())
  # The warm-start checkpoint is read by weight servers in another directory.
  config = config.replace(model_dir=_absolute(config.model_dir))
  model_fn = keras_model_lib.model_fn_from_keras(model, custom_objects, metric_names_map,
                                                 export_outputs)
  return model_fn, config, keras_model_lib.save_warm_start(model, config, custom_objects)


def _users(hook) -> bool:
  """Whether a session hook is the user's (not TensorFlow's, nor one of ours)."""
  return not type(hook).__module__.startswith(("tensorflow", "cerebras_tf"))


@functools.lru_cache(maxsize=None)
def _hint_onednn_once() -> None:
  """Says once why host training is slower when TensorFlow was imported before cerebras_tf."""
  if cerebras_tf.ONEDNN_TOO_LATE:
    tf.compat.v1.logging.info(
        "cerebras_tf: oneDNN CPU kernels are off because TensorFlow was imported before "
        "cerebras_tf; import cerebras_tf first, or export TF_ENABLE_ONEDNN_OPTS=1, for about "
        "1.3x faster host training")


@contextlib.contextmanager
def _keras_seeds(seed: Optional[int]):
  """Keras-built layers (tf.compat.v1.layers, tf.keras.layers in a model_fn) seed their
  initializers from Python's `random`, not from the graph seed, so RunConfig.tf_random_seed left
  their initial weights different on every run and in every mode. While the model_fn runs they
  draw from a generator seeded with it: what tf.keras.utils.set_random_seed sets, without
  reseeding the process's own `random`, NumPy or TensorFlow generators. Per thread, as Keras
  keeps it: each MirroredStrategy replica thread draws the same sequence as one device."""
  if seed is None:
    yield
    return
  state = keras_backend._SEED_GENERATOR  # pylint: disable=protected-access
  before = getattr(state, "generator", None)
  state.generator = random.Random(seed)
  try:
    yield
  finally:
    state.generator = before


class CerebrasEstimator(_CerebrasMethods, tf.estimator.Estimator):
  """A tf.estimator.Estimator that targets the (simulated) Cerebras engine when use_cs=True.

  Args:
    model_fn: the user's `model_fn(features, labels, mode, params, config)`, unchanged.
    model_dir: checkpoints and summaries.
    compile_dir: where compile reports and the compile cache go (default `<model_dir>/cs_compile`).
    config: a `CSRunConfig` (a plain `RunConfig` means the default `CSConfig`).
    params: dict passed to model_fn and input_fn.
    warm_start_from: as for tf.estimator.Estimator.
    use_cs: legacy default for the `use_cs` argument of train/evaluate/predict.
    init_checkpoint: a checkpoint (or a model_dir) whose variables of the same name and shape
      initialize a training run that starts without a checkpoint (google-bert's
      init_checkpoint; `--warm_start` in scripts/run.py). Unlike `warm_start_from`, variables
      that differ are left to their initializers and counted in the log, so a changed model
      can start from an old one.
  """

  def __init__(self, model_fn, model_dir=None, compile_dir=None, config=None, params=None,
               warm_start_from=None, use_cs=None, init_checkpoint=None):
    # tf.estimator's checks, in its order and words, on the user's model_fn (tf.estimator
    # itself sees only the wrapper below).
    if config is not None and not isinstance(config, tf.estimator.RunConfig):
      raise ValueError(f"config must be an instance of `RunConfig`, but provided {config}.")
    if isinstance(model_fn, tf.keras.Model):
      # A compiled Keras model where a model_fn goes: what from_keras_model does.
      if warm_start_from is not None:
        raise ConfigError("CerebrasEstimator(keras_model, warm_start_from=...): a Keras model "
                          "starts from its own weights; load the others into it first")
      model_fn, config, warm_start_from = _keras_parts(keras_model_lib.load(model_fn),
                                                       model_dir, config)
      model_dir = config.model_dir
    if not model_fn:
      raise ValueError("model_fn must be provided to Estimator.")
    # params holding only the batch (the reserved key the input_fn reads it from, as
    # TPUEstimator's) may go to a model_fn without params: no batch written into the input_fn.
    only_batch = isinstance(params, dict) and set(params) == {batching.RESERVED_PARAMS_KEY}
    takes_params = "params" in estimator_util.fn_args(model_fn)
    model_fn_lib.verify_model_fn_args(model_fn,
                                      None if only_batch and not takes_params else params)
    self._user_model_fn = model_fn
    # Weight servers (another directory) run the restore ops: checkpoint paths are absolute.
    self._init_checkpoint = _absolute(init_checkpoint)
    warm_start_from = _absolute_warm_start(warm_start_from)
    self._default_use_cs = bool(use_cs)
    self._cs_run = None
    self._restore_from = None  # the checkpoint the graph being built will restore
    self._single_examples = None  # (predict_keys,) while predict yields single examples
    self._last_compile = None
    self.last_predict_checkpoint: Optional[str] = None  # what the last finished predict read
    self._said_cs_ip = False
    self._said_off_engine = False
    self._trained_once = False
    self._said_foreign_driver = False
    self._model_fn_batch: Optional[int] = None  # the batch the model_fn's features have
    for mode in (ModeKeys.TRAIN, ModeKeys.EVAL):
      batch_size_for_mode(params or {}, mode)  # refuses a batch_size that is not one
    # A RunConfig of the user's (a subclass with methods of its own) is kept as it is; the
    # engine's run converts it (_engine_config). model_dir is kept as given too: an engine
    # run makes it absolute for the processes it starts elsewhere (_runtime_for).
    config = CSRunConfig() if config is None else config
    # `~` expanded (a directory named "~" is never what was meant); relative stays relative.
    model_dir = _home(model_dir)
    if _home(config.model_dir) != config.model_dir:
      config = config.replace(model_dir=_home(config.model_dir))
    # `params or {}`: what tf.estimator keeps anyway, and its check of the wrapper (which takes
    # params) then does not warn "includes params argument" for every model_fn.
    super().__init__(model_fn=self._wrap_model_fn(model_fn), model_dir=model_dir,
                     config=config, params=params or {}, warm_start_from=warm_start_from)
    dir_lock.check_local(self.model_dir, "model_dir")
    _check_readable_path(self.model_dir)
    if compile_dir:
      dir_lock.check_local(compile_dir, "compile_dir")
    self._compile_dir = _absolute(compile_dir) or os.path.join(self.model_dir, "cs_compile")
    self._compiler = compile_lib.Compiler(self._compile_dir)
    _hint_onednn_once()

  @classmethod
  def from_keras_model(cls, keras_model=None, keras_model_path=None, model_dir=None,
                       compile_dir=None, config=None, params=None, custom_objects=None,
                       metric_names_map=None, export_outputs=None, use_cs=None):
    """A CerebrasEstimator that trains a compiled tf.keras.Model, from its current weights.

    Arguments as for `tf.keras.estimator.model_to_estimator` (features keyed by
    `model.input_names`); see cerebras_tf/keras_model.py for what differs.
    """
    model = keras_model_lib.load(keras_model, keras_model_path, custom_objects)
    model_fn, config, warm = _keras_parts(model, model_dir, config, custom_objects,
                                          metric_names_map, export_outputs)
    return cls(model_fn, compile_dir=compile_dir, config=config, params=params,
               warm_start_from=warm, use_cs=use_cs)

  def get_keras_weights(self, checkpoint_path=None) -> list:
    """The trained weights of an estimator made by `from_keras_model`, in the order of the
    Keras model's `weights`: `model.set_weights(est.get_keras_weights())` on the model built
    again (Keras invalidates the one it converted: its fit, evaluate and save fail).

    Args:
      checkpoint_path: a checkpoint prefix (default: the latest in model_dir).
    """
    names = getattr(self._user_model_fn, "keras_weight_names", None)
    if names is None:
      raise ConfigError("get_keras_weights: this estimator was not made by from_keras_model; "
                        "read variables by name with get_variable_value")
    checkpoint = checkpoint_path or self.latest_checkpoint()
    if checkpoint is None:
      raise ConfigError(f"get_keras_weights: no checkpoint in model_dir {self.model_dir}: "
                        "nothing trained yet")
    return keras_model_lib.trained_weights(names, checkpoint,
                                           self._user_model_fn.keras_model.name)

  def add_metrics(self, metric_fn) -> "CerebrasEstimator":
    """`tf.estimator.add_metrics` for a CerebrasEstimator: the same model, config, params, warm
    start and use_cs default, with `metric_fn`'s metrics added to evaluation. (TF's own returns
    a plain tf.estimator.Estimator, which trains without the engine.)

    Args:
      metric_fn: as tf.estimator.add_metrics's: takes any of predictions, features, labels,
        config; returns {name: (value, update_op)}.
    """
    extenders._verify_metric_fn_args(metric_fn)  # pylint: disable=protected-access
    user_model_fn = self._user_model_fn

    @functools.wraps(user_model_fn)  # keeps a Keras model_fn's name and cache token
    def model_fn(features, labels, mode, params, config):
      spec = _as_estimator_spec(_call_with_supported_args(
          user_model_fn, features=features, labels=labels, mode=mode, params=params,
          config=config), user_model_fn)
      if mode != ModeKeys.EVAL:
        return spec
      metrics = dict(spec.eval_metric_ops or {})
      metrics.update(extenders._call_metric_fn(  # pylint: disable=protected-access
          metric_fn, features, labels, spec.predictions, config))
      return spec._replace(eval_metric_ops=metrics)

    return type(self)(model_fn, compile_dir=self._compile_dir, config=self.config,
                      params=self.params, warm_start_from=self._warm_start_settings,
                      use_cs=self._default_use_cs, init_checkpoint=self._init_checkpoint)

  @property
  def model_fn(self):
    """tf.estimator's model_fn bound to params. Another estimator that trains with it (the
    plain Estimator tf.estimator.add_metrics returns) trains without the engine: said once."""
    bound = tf.estimator.Estimator.model_fn.fget(self)

    def public_model_fn(features, labels, mode, config):
      if mode == ModeKeys.TRAIN and not self._said_foreign_driver:
        self._said_foreign_driver = True
        tf.compat.v1.logging.warning(
            "cerebras_tf: another estimator is training this CerebrasEstimator's model_fn "
            "(tf.estimator.add_metrics returns a plain tf.estimator.Estimator): it trains "
            "without the engine; use est.add_metrics(metric_fn), which keeps a "
            "CerebrasEstimator")
      return bound(features, labels, mode, config)
    return public_model_fn

  # --- configuration ----------------------------------------------------------------------

  @property
  def compile_dir(self) -> str:
    return self._compile_dir

  @property
  def cs_config(self) -> CSConfig:
    """The config's CSConfig; the default one for a plain RunConfig."""
    return getattr(self.config, "cs_config", None) or CSConfig()

  def _engine_config(self) -> CSRunConfig:
    """The config as a CSRunConfig with an absolute model_dir, for an engine run: its weight
    servers and worker processes run in another directory."""
    config = self.config
    if not isinstance(config, CSRunConfig):
      config = CSRunConfig.from_run_config(config)
    return config.replace(model_dir=_absolute(config.model_dir))

  def _resolve_use_cs(self, use_cs) -> bool:
    return self._default_use_cs if use_cs is None else bool(use_cs)

  def _current_step(self) -> int:
    ckpt = tf.train.latest_checkpoint(self.model_dir)
    if not ckpt:
      return 0
    try:
      return int(tf.train.load_variable(ckpt, tf.compat.v1.GraphKeys.GLOBAL_STEP))
    except (tf.errors.NotFoundError, ValueError):
      return 0

  # --- the runtime for the plan's execution strategy ----------------------------------------

  @contextlib.contextmanager
  def _runtime_for(self, plan):
    """Trains one call with the plan's runtime (runtime/strategies.py); yields it and the
    hooks its scope asks the train call to add."""
    config = self._engine_config()
    runtime = strategies.runtime_for(plan, config, config.model_dir, self.cs_config)
    # tf.estimator copies these five out of its RunConfig when it is built; a train call with
    # another runtime swaps them, and puts them back after.
    saved = (self._config, self._train_distribution, self._session_config, self._device_fn,
             self._model_dir)
    # tf.estimator's own `loss = ..., step = ...` line and steps/s summary stay (INFO: at
    # TensorFlow's default verbosity, and on scripts/run.py's terminal, only ours show).
    cfg = runtime.config
    self._config, self._train_distribution = cfg, cfg.train_distribute
    self._session_config, self._device_fn = cfg.session_config, cfg.device_fn
    self._model_dir = cfg.model_dir
    try:
      with runtime.scope() as scope_hooks:
        yield runtime, list(scope_hooks or [])
    finally:
      (self._config, self._train_distribution, self._session_config, self._device_fn,
       self._model_dir) = saved

  @contextlib.contextmanager
  def _model_fn_sees_batch(self, batch: Optional[int]):
    """The model_fn gets the batch its features have in params['batch_size'], as the input_fn
    that made them did (TPUEstimator's convention): per replica in training, the eval batch
    in eval and predict. A model_fn that reshapes by it got the global batch under
    multi_replica and failed on its half-size features."""
    previous, self._model_fn_batch = self._model_fn_batch, batch
    try:
      yield
    finally:
      self._model_fn_batch = previous

  def _batch_param_input_fn(self, input_fn, mode: str):
    """input_fn called with the mode's global batch (eval_input's batch_size, else the flat
    one) in the reserved params key, as a training input_fn gets its per-replica batch there:
    one key holds the batch in every mode (TPUEstimator passes its eval batch there too).
    Eval and predict run on one device."""
    batch = batch_size_for_mode(self.params, mode)
    if not batch:
      return input_fn

    def wrapped(params, mode, config):
      params = {**params, batching.RESERVED_PARAMS_KEY: batch}
      return _call_with_supported_args(input_fn, params=params, mode=mode, config=config)
    return wrapped

  def _per_replica_input_fn(self, input_fn, per_replica_batch: int, named: bool = True):
    """input_fn called with the per-replica batch in the reserved params key `batch_size`
    (TPUEstimator's convention; the params sections keep the global batch); a dataset whose
    static batch is another number is refused with both numbers."""
    def wrapped(params, mode, config, input_context=None):
      if named:
        params = {**params, batching.RESERVED_PARAMS_KEY: per_replica_batch}
      out = _call_with_supported_args(input_fn, params=params, mode=mode, config=config,
                                      input_context=input_context)
      if not isinstance(out, tf.data.Dataset) and isinstance(
          self._train_distribution, (tf.distribute.MirroredStrategy,
                                     tf.distribute.MultiWorkerMirroredStrategy)):
        # tf.distribute splits datasets only ("input_fn must return a tf.data.Dataset").
        raise ConfigError(
            f"the input_fn returned a {type(out).__name__} of tensors, not a "
            f"tf.data.Dataset: multi_replica splits a dataset across the replicas (queue-based "
            f"helpers such as numpy_input_fn make tensors); return "
            f"tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(params['batch_size']), "
            f"or train pipelined or weight_streaming")
      if "input_context" not in estimator_util.fn_args(input_fn):
        out = strategies.shard_for_input_pipeline(out, input_context)
      _check_batch(out, per_replica_batch, self.cs_config)
      return out
    return wrapped

  # --- the model_fn seen by tf.estimator -------------------------------------------------

  def _wrap_model_fn(self, user_model_fn):
    @functools.wraps(user_model_fn)
    def model_fn(features, labels, mode, params, config):
      if labels is not None and "labels" not in estimator_util.fn_args(user_model_fn):
        # tf.estimator's own check and words (this wrapper takes labels, so it cannot see it).
        raise ValueError("model_fn does not take labels, but input_fn returns labels.")
      if self._model_fn_batch:
        params = {**params, batching.RESERVED_PARAMS_KEY: self._model_fn_batch}
      try:
        with _keras_seeds(config.tf_random_seed):
          spec = _call_with_supported_args(user_model_fn, features=features, labels=labels,
                                           mode=mode, params=params, config=config)
      except RuntimeError as e:
        if "`merge_call` called while defining a new graph" not in str(e):
          raise
        raise ModelFnError(_merge_in_cond_message(e, user_model_fn)) from e
      except (ValueError, TypeError, KeyError, AttributeError) as e:
        if mode == ModeKeys.TRAIN or isinstance(e, CerebrasTFError):
          raise  # TRAIN graphs were traced by the compiler, which names the line already
        message = " ".join(str(getattr(e, "message", e)).split())[:300].rstrip(".")
        what = "predict" if mode == ModeKeys.PREDICT else mode
        raise keeping_kind(ModelFnError, e, (
            f"{capture_lib.user_line(e)}model_fn failed in {what} mode: "
            f"{type(e).__name__}: {message}"
            f"{_predict_hint(mode, features, labels, message)}")) from e
      spec = _as_estimator_spec(spec, user_model_fn)
      if mode == ModeKeys.TRAIN and spec.loss is not None:
        _say_summed_loss_across_replicas(spec.loss)
      if mode == ModeKeys.PREDICT and self._single_examples is not None:
        _check_single_examples(spec.predictions, self._single_examples[0], user_model_fn)
      if mode == ModeKeys.TRAIN and spec.scaffold.saver is not None:
        checkpoints.check_saver_covers(spec.scaffold.saver, tf.compat.v1.get_default_graph(),
                                       f"model_fn{defined_at(user_model_fn)}")
      if self._restore_from and spec.scaffold.saver is None:
        # Before the session restores (and before a refused run writes anything). A Saver of
        # the model_fn's own may map other names onto the variables: it restores as it saves.
        checkpoints.check_matches(self._restore_from, tf.compat.v1.get_default_graph(),
                                  self.model_dir)
      elif self._init_checkpoint:  # no checkpoint to restore: start from the matching ones
        checkpoints.init_matching(self._init_checkpoint)
      return spec
    return model_fn

  def _progress_hook(self, loss, run):
    result = run["result"]
    png = None
    wafer = result.report_paths.get("wafer")
    if wafer and os.path.exists(wafer):
      with open(wafer, "rb") as fh:
        png = fh.read()
    run["hook"] = CSProgressHook(
        loss=loss, batch_size=result.plan.batch_size,
        simulated_samples_per_sec=result.performance.samples_per_sec,
        utilization=result.performance.utilization, summary_dir=self.model_dir,
        last_step=run["last_step"], every_n_steps=run["every"],
        wafer_png=png, model_dir=self.model_dir,
        input_samples_per_sec=run["input_rate"] and run["input_rate"].samples_per_sec)
    return run["hook"]

  # --- compile ----------------------------------------------------------------------------

  @_shows_our_info
  def compile(self, input_fn, validate_only=False, mode=ModeKeys.TRAIN):
    """Compiles the model for the engine in the configured execution strategy.

    The pipeline is compiler/compile.py's; this gathers what it needs: how to call the user's
    input_fn and model_fn, the params, the CSConfig and what the host can run.

    Args:
      input_fn: the training input_fn (its element spec fixes the input shapes).
      validate_only: stop after checking every op against the engine's kernels.
      mode: only TRAIN graphs are compiled (the engine trains); other modes reuse them.

    Returns:
      A `CompileResult` (plan, performance, report paths, whether it came from the cache).

    Raises:
      UnsupportedOpError: an op has no engine kernel (names op, type and source line).
      CompileError: the graph cannot be captured with static shapes.
    """
    del mode  # The engine compiles the training graph; eval/predict reuse it.
    host = strategies.host_devices(self.cs_config)  # before anything starts TF's runtime
    global_batch = batch_size_for_mode(self.params, ModeKeys.TRAIN)
    with self._model_fn_sees_batch(global_batch):
      result = self._compiler.compile(
          model_fn=self._user_model_fn,
          call_input_fn=lambda: self._call_input_fn(
              self._per_replica_input_fn(input_fn, global_batch) if global_batch else input_fn,
              ModeKeys.TRAIN),
          call_model_fn=lambda f, l: self._call_model_fn(f, l, ModeKeys.TRAIN, self.config),
          params=self.params, cs_config=self.cs_config, global_batch=global_batch, host=host,
          seed=self.config.tf_random_seed, validate_only=validate_only)
    if validate_only:
      tf.compat.v1.logging.info("cerebras_tf: validation passed: every op has an engine kernel")
    else:
      previous, self._last_compile = self._last_compile, result
      self._log_compile(result, previous)
    return result

  def _log_compile(self, result, previous=None):
    kept = [f"{k} {v}" for k, v in ((k, getattr(self.config, k, None))
                                    for k in ("cs_ip", "system_name", "stack_params")) if v]
    if kept and not self._said_cs_ip:
      # Validated and kept (scripts written for hardware carry them), never used.
      self._said_cs_ip = True
      tf.compat.v1.logging.warning(
          "cerebras_tf: %s kept but not used: this build has no remote runtime or software "
          "stack to pass them to; the embedded simulated engine compiles and TensorFlow "
          "trains on this host", "; ".join(kept))
    how = "compile cache hit" if result.cached else "compiled"
    if result.cached and previous is not None and previous.plan == result.plan:
      # A notebook's train/evaluate loop: the summary above still holds; say so in one line.
      tf.compat.v1.logging.info(
          "cerebras_tf: %s in %.2fs: the plan of this estimator's last compile (%s on %s, "
          "%s samples/s predicted)", how, result.seconds, result.plan.execution_strategy,
          result.plan.engine, f"{result.performance.samples_per_sec:,.1f}")
      return
    tf.compat.v1.logging.info("cerebras_tf: %s in %.2fs; reports in %s\n%s", how, result.seconds,
                              result.compile_dir,
                              report.format_summary(result.plan, result.performance))

  def _log_engine_time(self, result, current: int, last_step: Optional[int]):
    """What a user buying time on the hardware asks first: how long this run would take."""
    if last_step is None or last_step <= current:
      return
    t = report.engine_time(result.plan, result.graph, result.performance, last_step - current)
    if t is not None:
      host = ("; steps this short are likely paced by the host, see report.txt"
              if report.host_may_pace(result.performance) else "")
      tf.compat.v1.logging.info(
          "cerebras_tf: steps %d -> %d (%s samples) would take %s on %d x %s, predicted "
          "engine time%s; this machine's own ETA is in the progress lines", current, last_step,
          f"{t.samples:,}", t.text(), result.plan.num_csx, result.plan.engine, host)

  def _raise_unless_fits(self, result):
    if not result.plan.fits:
      raise FitError(f"model does not fit {result.plan.engine} in {result.plan.execution_strategy} "
                     f"mode: {result.plan.reason}")


_CROSS_REPLICA_UPDATE = re.compile(r"(^|/)update_\d+(_\d+)?/")


def _say_per_replica_variables(graph, distribution) -> None:
  """Under data parallelism (multi_replica), a non-trainable variable the step writes (a
  counter) with aggregation NONE gets one copy per host replica, each updated by its own
  replica, and a read sees the first: `examples_seen` counted half the examples on 2 replicas.
  tf.distribute says nothing in graph mode; this says it once per training call."""
  if not isinstance(distribution, (tf.distribute.MirroredStrategy,
                                   tf.distribute.MultiWorkerMirroredStrategy)):
    return
  # Writes from a replica's own step; strategy.extended.update (an optimizer's apply) writes
  # every copy alike, under `update_<device>` scopes; initializers end in /Assign; a Saver
  # the model_fn made (in its scaffold) writes what it restores.
  written = {op.inputs[0].name for op in graph.get_operations()
             if op.type in ("AssignAddVariableOp", "AssignSubVariableOp", "AssignVariableOp")
             and op.inputs and not op.name.endswith("/Assign")
             and not _CROSS_REPLICA_UPDATE.search(op.name) and not _restores(op)}
  for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES):
    copies = getattr(v, "values", None)
    if (v.trainable or getattr(v, "aggregation", None) != tf.VariableAggregation.NONE
        or not copies or len(copies) < 2):
      continue
    if any(c.handle.name in written for c in copies):
      tf.compat.v1.logging.warning(
          "cerebras_tf: %s is written by the training step with aggregation NONE: each of "
          "the %d host replicas keeps its own copy, and a read (a checkpoint) sees the "
          "first's; create it with aggregation=tf.VariableAggregation.SUM (a count) or MEAN",
          v.name.split(":")[0], len(copies))


def _say_batch_norm_statistics(norms: Sequence[str], plan: plans.Plan) -> None:
  """Batch normalization takes its statistics over one group of samples: on the engine one
  replica's (multi_replica) or one micro-batch of one system's (weight streaming), on the host
  one host replica's. Said once per training call: the plan's own note when the engine's
  groups have fewer than batching.BATCH_NORM_MIN_SAMPLES samples (with 1, a dense feature's
  variance is 0), and, when the host groups the batch differently, both splits and the
  setting that makes them one. `norms`: the compiled graph's batch-norm layers
  (`ir.LayerGraph.batch_norm_layers`)."""
  split = plan.batching
  if not norms:
    return
  if not split.keeps_batch_norm:
    note = next((n for n in plan.notes if n.startswith("batch normalization (")), None)
    if note:
      tf.compat.v1.logging.warning("cerebras_tf: %s", note)
  engine, host = split.batch_norm_groups, split.host_replicas
  if engine == host:
    return
  shown = ", ".join(norms[:3]) + (f" and {len(norms) - 3} more" if len(norms) > 3 else "")
  if plan.mode.replicates:
    on_engine = (f"the multi_replica plan's {split.engine_replicas} engine replicas see "
                 f"{split.per_engine_replica} sample(s) each")
    fix = (f"csconfig.num_replicas={host} makes the engine's replicas the host's, or train "
           f"pipelined (one replica, the whole batch of {split.global_batch})")
  elif plan.mode.streams_weights:
    on_engine = (f"the weight-streaming plan's {split.num_systems} system(s) x "
                 f"{split.micro_batches} micro-batch(es) see {split.batch_norm_samples} "
                 f"sample(s) each")
    fixes = []
    if split.micro_batches > 1:
      fixes.append(f"the host does not micro-batch: csconfig.micro_batch_size="
                   f"{split.per_system} (the whole per-system batch, if the wafer holds it)")
    if split.num_systems != host:
      fixes.append(f"{split.num_systems} host replicas (one a system: run in a fresh process, "
                   f"or call cerebras_tf.runtime.strategies.reserve_logical_cpus("
                   f"{split.num_systems}) before building the model)")
    fix = " and ".join(fixes) + " make the engine's groups the host's"
  else:
    on_engine = f"the {plan.execution_strategy} plan normalizes over the whole batch"
    fix = "training on one worker reproduces the engine's"
  tf.compat.v1.logging.warning(
      "cerebras_tf: batch normalization (%s) takes its statistics over one group of samples: "
      "%s, this host trains %d replica(s) of %d, so these losses are not the engine's%s; %s",
      shown, on_engine, host, split.per_host_replica,
      " (the statistics of 1 sample are that sample's own)" if split.batch_norm_samples == 1
      else "", fix)


def _say_summed_loss_across_replicas(loss) -> None:
  """A loss summed over the batch (tf.reduce_sum) under data parallelism: each host replica
  sums its 1/R share, and tf.distribute's optimizers, taking the loss for a mean, divide the
  replicas' gradients by R, so every update is 1/R of the one-device one (SGD's step halved on
  2 replicas, silently). Said once per graph, from the first replica."""
  ctx = tf.distribute.get_replica_context()
  if not tf.distribute.has_strategy() or ctx is None or ctx.num_replicas_in_sync < 2:
    return
  r = ctx.num_replicas_in_sync
  if tf.get_static_value(ctx.replica_id_in_sync_group) not in (0, None):
    return
  if tf.compat.v1.distribute.get_loss_reduction() != tf.distribute.ReduceOp.MEAN:
    return  # tf.compat.v1.losses with reduction=SUM: the optimizer does not divide
  op = loss.op
  while op.type in ("Identity", "Cast") and op.inputs:
    op = op.inputs[0].op
  rank = op.inputs[0].shape.rank if op.type == "Sum" else None
  axes = tf.get_static_value(op.inputs[1]) if rank else None
  if axes is None or 0 not in {int(a) % rank for a in np.atleast_1d(axes)}:
    return
  where = lower_lib.user_source(op)
  tf.compat.v1.logging.warning(
      "cerebras_tf: %sthe loss is a sum over the batch (tf.reduce_sum): each of the %d host "
      "replicas sums its 1/%d share and the optimizer, taking the loss for a mean, divides "
      "their gradients by %d, so each update is 1/%d of the one-device one; use a mean, or "
      "tf.compat.v1.losses.* with reduction=SUM (the optimizer then does not divide)",
      f"{where}: " if where else "", r, r, r, r)


_SUMMARY_OPS = ("ScalarSummary", "HistogramSummary", "ImageSummary", "AudioSummaryV2",
                "TensorSummaryV2", "WriteScalarSummary", "WriteHistogramSummary",
                "WriteSummary", "WriteImageSummary")
_REPLICA_SCOPE = re.compile(r"^replica_\d+/")


def _reads_the_batch(tensor, limit: int = 100000) -> bool:
  """Whether `tensor`'s value comes from the input batch (an iterator's output), so each
  host replica has its own; a learning rate or a weight norm is the same in all."""
  seen, stack = set(), [tensor.op]
  while stack and len(seen) < limit:
    op = stack.pop()
    if op in seen:
      continue
    seen.add(op)
    if op.type in ("IteratorGetNext", "IteratorGetNextSync", "MultiDeviceIteratorGetNextFromShard"):
      return True
    stack.extend(t.op for t in op.inputs)
  return False


def replica_valued(graph, hooks, loss=None) -> Sequence[str]:
  """The user's summaries (by tag) and hook-read tensors (by name) whose value is one host
  replica's under data parallelism: made in the model_fn from the batch, outside the
  framework's global loss. tf.estimator writes replica 0's; the loss summary is the reduced
  one."""
  names = []
  loss_op = loss.op if loss is not None else None
  for op in graph.get_operations():
    if op.type not in _SUMMARY_OPS or _REPLICA_SCOPE.match(op.name):
      continue
    tag_t, value = (op.inputs[0], op.inputs[1]) if op.type.endswith("Summary") or \
        op.type == "TensorSummaryV2" else (op.inputs[2], op.inputs[3])
    if value.op is loss_op or not _reads_the_batch(value):
      continue
    tag = tf.get_static_value(tag_t)
    tag = tag.decode() if isinstance(tag, bytes) else op.name
    if tag not in ("loss",):
      names.append(f"summary '{tag}'")
  for hook in hooks:
    tensors = getattr(hook, "_tensors", None)  # LoggingTensorHook and the like
    if not isinstance(tensors, dict):
      continue
    for tag, t in tensors.items():
      try:
        t = graph.as_graph_element(t) if not isinstance(t, tf.Tensor) else t
      except (KeyError, ValueError, TypeError):
        continue
      if isinstance(t, tf.Tensor) and t.graph is graph and t.op is not loss_op and \
          _reads_the_batch(t):
        names.append(f"{type(hook).__name__} tensor '{t.name}'")
  return names


def _say_replica_values(graph, distribution, hooks, loss) -> None:
  """In multi_replica each host replica trains on 1/R of the batch; a summary the model_fn
  writes, or a tensor a hook reads by name, is replica 0's value on its share, not the
  global one (only the loss is reduced over the replicas). Said once per training call,
  naming them."""
  replicas = getattr(distribution, "num_replicas_in_sync", 1)
  if replicas < 2:
    return
  names = replica_valued(graph, hooks, loss)
  if names:
    tf.compat.v1.logging.warning(
        "cerebras_tf: in multi_replica each of the %d host replicas trains on 1/%d of the "
        "batch, and these hold replica 0's value on its share, not the global one: %s (the "
        "loss is the global mean); average them in a metric, or train pipelined to see the "
        "whole batch's", replicas, replicas, ", ".join(names))


_GLOBAL_NORM_CLIP = re.compile(r"(?:^|/)clip_by_global_norm(?:_\d+)?/")


def _say_per_replica_clipping(graph, distribution) -> None:
  """A model_fn that clips its gradients by their global norm (google-research/bert's
  optimizer does) clips, under data parallelism, each host replica's 1/R share of the
  gradient by the whole limit: the update can be up to R times the one-device step (the
  reference models' optimizer sums first). tf.distribute says nothing; this names the line,
  once per training call."""
  replicas = getattr(distribution, "num_replicas_in_sync", 1)
  if replicas < 2:
    return
  for op in graph.get_operations():
    if _GLOBAL_NORM_CLIP.search(op.name) and not lower_lib.built_by_cerebras_tf(op):
      where = lower_lib.user_source(op)
      tf.compat.v1.logging.warning(
          "cerebras_tf: %sthe model_fn clips its gradients by their global norm in each of "
          "the %d host replicas: each clips its own 1/%d share by the whole limit, so a "
          "clipped update is up to %dx the one-device one; clip the replicas' sum (the "
          "reference optimizer, cerebras_models.optimization.build_train_op, does), or "
          "train pipelined", f"{where}: " if where else "", replicas, replicas, replicas)
      return


def _say_updates_not_run(graph, train_op, global_step) -> None:
  """Names the non-trainable variables whose writes the train_op never runs: batch
  normalization's moving statistics when its update ops (the UPDATE_OPS collection of
  tf.compat.v1.layers, a Keras layer's `.updates`) are left out of the train_op. They keep
  their initial values, which eval and predict then read; tf.estimator says nothing."""
  handles = {}
  for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES):
    if not v.trainable and v is not global_step:
      handles.update((name, v.name.split(":")[0]) for name in capture_lib.handle_names(v))
  written = {}
  for op in graph.get_operations():
    if op.type in capture_lib.READS or op.name.endswith("/Assign") or _restores(op):
      continue  # reads, initializers, a Saver's restores
    for t in op.inputs:
      name = handles.get(t.name) or handles.get(t.op.name)
      if name:
        written.setdefault(name, set()).add(op)
  if not written:
    return
  run = set(capture_lib.ancestors(train_op))
  unrun = sorted(name for name, ops in written.items() if not ops & run)
  if unrun:
    more = f" (and {len(unrun) - 1} more)" if len(unrun) > 1 else ""
    tf.compat.v1.logging.warning(
        "cerebras_tf: %s%s is written by ops the train_op does not run (batch normalization's "
        "moving statistics, say), so it keeps its initial value, and eval and predict read "
        "that: build the train_op under tf.control_dependencies(tf.compat.v1.get_collection("
        "tf.compat.v1.GraphKeys.UPDATE_OPS)) (tf.compat.v1.layers), adding a Keras model's "
        ".updates", unrun[0], more)


def _restores(assign) -> bool:
  """Whether a variable write assigns a value read from a checkpoint (through Identity ops)."""
  value = assign.inputs[1].op if len(assign.inputs) > 1 else None
  while value is not None and value.type == "Identity" and value.inputs:
    value = value.inputs[0].op
  return value is not None and value.type in ("RestoreV2", "Restore", "RestoreSlice")


# evaluate/predict of the latest checkpoint start again this often when a training run deletes
# it mid-read (a run saving every few seconds with keep_checkpoint_max 2, say).
_VANISHED_RETRIES = 3


def _raise_unless_host_holds(result) -> None:
  """TensorFlow runs the numerics on this machine, in float32: weights, gradients and optimizer
  slots (a copy per host replica), and the activations the gradient reads, for this worker's
  share of the batch. A model whose state cannot fit here made the weight server segfault on
  allocation, four restarts and minutes later; a 2048x2048 CNN at batch 16 (21 GB of kept
  activations, 24 GB free) ended in an allocator dump and a segfault (exit 139). Weight
  streaming with a TF_CONFIG cluster's own weight servers keeps the state on their hosts.

  The activations counted are a lower bound (TensorFlow's backward pass needs more on top: the
  CNN above peaked at about 1.4x), so only a run that cannot fit is refused."""
  cluster = tf_config.current()
  remote_state = (result.plan.mode.streams_weights and cluster
                  and cluster.ps)
  graph, batching_ = result.graph, result.plan.batching
  copies = max(1, batching_.host_replicas_per_worker)
  state = 0 if remote_state else graph.state_bytes * copies
  activations = graph.host_activation_bytes * batching_.per_worker
  need, have = state + activations, host_memory.available_bytes()
  if have is None or need <= have:
    return
  parts = []
  if state:
    parts.append(f"{report.fmt_bytes(state)} for {graph.num_params:,} float32 parameters with "
                 f"their gradients and {graph.optimizer} state"
                 f"{f', {copies} host replicas' if copies > 1 else ''}")
  if activations:
    parts.append(f"{report.fmt_bytes(activations)} at least for the activations the gradient "
                 f"reads, {batching_.per_worker} samples a step")
  fix = ("make the model smaller" if state > have
         else "lower train_input.batch_size (params['batch_size']), or the input size")
  raise FitError(
      f"training this model on this machine needs about {report.fmt_bytes(need)} of memory "
      f"(TensorFlow runs the numerics here: {'; '.join(parts)}), and {report.fmt_bytes(have)} "
      f"is available; the engine's answers (fit, speed, placement) need no training "
      f"(--compile_only, or CerebrasEstimator.compile); to train here, {fix}")


def _eval_name_of_this_task() -> Optional[str]:
  """None (model_dir/eval) on the chief or without a cluster; "worker_0" on worker 0, so its
  events go to model_dir/eval_worker_0: tasks evaluating in the same second wrote the same
  event file name into model_dir/eval and clobbered the chief's."""
  cluster = tf_config.non_chief_task()
  return None if cluster is None else f"{cluster.task_type}_{cluster.task_index}"


def _as_cs_run_config(config) -> CSRunConfig:
  """A `config` argument as a CSRunConfig: None is the default one (tf.estimator's own default
  would be a plain RunConfig, without a cs_config); a plain RunConfig is converted."""
  if config is None:
    return CSRunConfig()
  return config if isinstance(config, CSRunConfig) else CSRunConfig.from_run_config(config)


def _absolute(path: Optional[str]) -> Optional[str]:
  """A local path made absolute, `~` expanded (as scripts/run.py does); None and URLs
  (gs://...) as they are."""
  return os.path.abspath(os.path.expanduser(path)) if path and "://" not in path else path


def _home(path: Optional[str]) -> Optional[str]:
  return os.path.expanduser(path) if path and "://" not in path else path


def _check_readable_path(model_dir: str) -> None:
  """TensorFlow's checkpoint reader takes its path as a glob pattern: under a model_dir named
  `runs/bert[2]` every checkpoint is written and none is ever read back (the resume said
  "checkpoint ... is corrupt")."""
  found = sorted(set("[]*?") & set(model_dir))
  if found:
    raise ConfigError(
        f"model_dir {model_dir} contains {' '.join(found)}, which TensorFlow's checkpoint "
        f"reader takes as a glob pattern: its checkpoints could be written but never read "
        f"back; choose a name without [ ] * ?")


def _absolute_warm_start(warm_start_from):
  """`warm_start_from` (a path or WarmStartSettings) with its checkpoint path absolute."""
  if isinstance(warm_start_from, str):
    return _absolute(warm_start_from)
  if isinstance(warm_start_from, tf.estimator.WarmStartSettings):
    return warm_start_from._replace(
        ckpt_to_initialize_from=_absolute(warm_start_from.ckpt_to_initialize_from))
  return warm_start_from


def _mixed_policy_across_replicas(error, user_model_fn) -> Optional[str]:
  """What to do when a Keras mixed-precision policy meets multi_replica's per-replica model_fn
  calls: each replica's model wraps the shared (mirrored) weights in an AutoCastVariable of
  its own, so an update over the model's variables differs between replicas and tf.distribute
  regroups it as PerReplica (the plain Estimator with MirroredStrategy fails alike)."""
  policy = tf.keras.mixed_precision.global_policy()
  if policy.compute_dtype == policy.variable_dtype or "PerReplica" not in str(error):
    return None
  keras_model = getattr(user_model_fn, "keras_model", None)
  ways = ("set the policy back to 'float32' for this run" if keras_model is not None else
          "leave var_list out of minimize()/compute_gradients() (it then takes the trainable "
          "variables, which are shared), or set the policy back to 'float32' for this run")
  who = (f"Keras model '{keras_model.name}'" if keras_model is not None else
         f"model_fn{defined_at(user_model_fn)}")
  return (f"{who}: multi_replica cannot update weights through "
          f"the Keras mixed-precision policy '{policy.name}': each replica's model wraps the "
          f"shared weights in its own AutoCastVariable, so the replicas' updates do not match "
          f"({type(error).__name__}: {str(error).splitlines()[0][:120]}); {ways} (the engine's "
          f"estimate assumes 16-bit compute either way), or train pipelined or "
          f"weight_streaming, where it trains as it is")


def _refusing_endless(input_fn):
  """An eval input_fn that refuses a dataset without end: evaluate(steps=None) reads until the
  input ends, and a training input_fn reused for eval (`.repeat()`) ran forever."""
  def wrapped(params, mode, config):
    out = _call_with_supported_args(input_fn, params=params, mode=mode, config=config)
    if _endless(out):
      raise ConfigError(
          f"evaluate: the dataset of {_name_at(input_fn)} repeats forever (.repeat()) "
          f"and steps is None, so the evaluation would never end; pass steps=N "
          f"(--eval_steps), or build the eval dataset without .repeat()")
    return out
  return wrapped


def _saying_endless(input_fn):
  """A predict input_fn that warns of a dataset without end: the predictions generator never
  ends either (`list(est.predict(...))` runs until memory does); taking a few with
  itertools.islice is fine, so it is not refused."""
  def wrapped(params, mode, config):
    out = _call_with_supported_args(input_fn, params=params, mode=mode, config=config)
    if _endless(out):
      tf.compat.v1.logging.warning(
          "cerebras_tf: predict: the dataset of %s repeats forever (.repeat()), so the "
          "predictions never end: take what you need (itertools.islice), or build the predict "
          "dataset without .repeat()", _name_at(input_fn))
    return out
  return wrapped


def _name_at(fn) -> str:
  return f"{getattr(fn, '__name__', type(fn).__name__)}{defined_at(fn)}"


def _endless(dataset) -> bool:
  """Whether a dataset's cardinality is known to be infinite. In graph mode it is a tensor:
  run alone (it builds the dataset, reads nothing). Unknown (a filter, a generator) is not."""
  if not isinstance(dataset, tf.data.Dataset):
    return False
  cardinality = dataset.cardinality()
  if tf.executing_eagerly():
    return int(cardinality) == tf.data.INFINITE_CARDINALITY
  try:
    with tf.compat.v1.Session(graph=cardinality.graph) as session:
      return int(session.run(cardinality)) == tf.data.INFINITE_CARDINALITY
  except tf.errors.OpError:  # it needs a feed or an initialized resource: not known
    return False


def _check_batch(dataset, per_replica_batch: int, cs_config) -> None:
  """Refuses an input_fn whose dataset has a static batch other than the per-replica batch."""
  if not isinstance(dataset, tf.data.Dataset):
    return
  if capture_lib.unbatched(*capture_lib.element_spec(dataset)):
    return  # compiled as one sample a step (capture.py said so)
  dims = {int(s.shape[0]) for s in tf.nest.flatten(dataset.element_spec)
          if isinstance(s, tf.TensorSpec) and s.shape.rank and s.shape[0] is not None}
  if dims and dims != {per_replica_batch}:
    raise ConfigError(
        f"the input_fn returned batches of {sorted(dims)[0]} samples, but each replica must get "
        f"{per_replica_batch} (the global batch split by the {cs_config.execution_strategy} "
        f"plan); batch the dataset with params['{batching.RESERVED_PARAMS_KEY}'], the "
        f"per-replica batch the framework passes")
