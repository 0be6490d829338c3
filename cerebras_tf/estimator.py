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
import os
import tempfile
import time
from typing import Optional

import tensorflow as tf
from tensorflow_estimator.python.estimator import extenders
from tensorflow_estimator.python.estimator import model_fn as model_fn_lib
from tensorflow_estimator.python.estimator import util as estimator_util

import cerebras_tf
from cerebras_tf import input_pipeline, model_fn_wrapper
from cerebras_tf import keras_model as keras_model_lib
from cerebras_tf import registry
from cerebras_tf.compiler import capture as capture_lib
from cerebras_tf.compiler import compile as compile_lib
from cerebras_tf.compiler import lints
from cerebras_tf.core import batching, source
from cerebras_tf.engine import report
from cerebras_tf.errors import (ConfigError, DataError, FitError, ModelFnError,
                                NonFiniteLossError, TrainingError, defined_at, disk_full,
                                keeping_kind, tf_error_text)
from cerebras_tf.input_pipeline import batch_size_for_mode
from cerebras_tf.model_fn_wrapper import CallContext, EngineRun
from cerebras_tf.run_config import CSConfig, CSRunConfig
from cerebras_tf.runtime import (checkpoints, dir_lock, host_memory, input_fns, logs, onednn,
                                 precision, strategies, tf_config)
from cerebras_tf.runtime.hooks import BatchProgressHook, GracefulInterrupt, with_checkpoint_saver
from cerebras_tf.runtime.input_fns import call_with_supported_args

# The reference models' ops are the framework's own: their optimizer is not a user's to lint.
source.add_own_code(*registry.installed_family_dirs())

# While TensorFlow's runtime has not started: a Keras model built after this import (as
# from_keras_model needs) would otherwise fix the process at one CPU device.
strategies.reserve_default_cpus()

ModeKeys = tf.estimator.ModeKeys
# The strategies whose tf.estimator training loop (with a cluster) saves through
# MonitoredTrainingSession rather than a CheckpointSaverHook of its own (its names, as it checks).
_COLLECTIVE = ("CollectiveAllReduceStrategy", "CollectiveAllReduceStrategyV1",
               "MultiWorkerMirroredStrategy")


def _shows_our_info(method):
  """Our INFO lines (fit, engine time, progress) reach the terminal during `method` even at
  TensorFlow's default WARN verbosity (runtime/logs.py)."""

  @functools.wraps(method)
  def wrapped(*args, **kwargs):
    with logs.our_info_shown():
      return method(*args, **kwargs)
  return wrapped


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
    restore_from = checkpoints.resume_point(self.model_dir)
    self._say_warm_start_skipped(restore_from)
    at = None if max_steps is None or not restore_from else checkpoints.current_step(self.model_dir)
    if at is not None and at >= max_steps:
      # tf.estimator returns at once and says so only at INFO, in the log file.
      tf.compat.v1.logging.warning(
          "cerebras_tf: %s is at step %d already, max_steps is %d: nothing to train; raise "
          "max_steps, or give steps=N to train N more", self.model_dir, at, max_steps)
    if not self._saves_checkpoints():
      tf.compat.v1.logging.warning(
          "cerebras_tf: checkpoints are off (save_checkpoints_steps and save_checkpoints_secs "
          "are both None, as tf.estimator reads it): the weights this call trains are not "
          "saved, so evaluate, predict, export and the next train call will not see them; set "
          "save_checkpoints_steps to keep them")
    try:
      self._write_keras_warm_start()
      with self._during(restore_from=restore_from):
        if self._resolve_use_cs(use_cs):
          return self._train_on_engine(input_fn, hooks, steps, max_steps, saving_listeners,
                                       run_max_steps)
        self._say_off_engine(use_cs)
        # A run that saves no input position (checkpoints.resume_order).
        with self._during(restore_from=checkpoints.resume_order(self.model_dir, None,
                                                                self._config.is_chief)):
          return tf.estimator.Estimator.train(self, input_fn, hooks=hooks, steps=steps,
                                              max_steps=max_steps,
                                              saving_listeners=saving_listeners)
    except (tf.compat.v1.train.NanLossDuringTrainingError, NonFiniteLossError) as e:
      # Still the error tf.estimator raises, for code that catches it.
      raise keeping_kind(TrainingError, e, checkpoints.after_nonfinite(self.model_dir, e),
                         kind=tf.compat.v1.train.NanLossDuringTrainingError) from None
    except (tf.errors.ResourceExhaustedError, OSError) as e:
      if not disk_full(e):
        raise
      raise TrainingError(checkpoints.after_disk_full(self.model_dir, e)) from e

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
    host_memory.check_holds(result.graph, result.plan)
    input_rate = self.time_input(input_fn, result)
    # Only a single-replica pipelined run saves its input pipeline's position (below): on
    # several workers tf.estimator's distributed loop refuses saving listeners ("Saving
    # listenor is not supported by the current Distribution Strategies"), which a pipelined
    # params file launched on 2 workers met at its first step.
    input_checkpointed = (result.plan.mode.saves_input_position
                          and result.plan.batching.host_replicas == 1
                          and self._saves_checkpoints())
    restore_from = checkpoints.resume_order(
        self.model_dir, result.input_signature if input_checkpointed else None,
        self._config.is_chief)
    current = checkpoints.current_step(self.model_dir)
    last_step = max_steps
    if last_step is None and steps is not None:
      last_step = current + steps
    self._log_engine_time(result, current, run_max_steps or last_step)
    run = EngineRun(result, run_max_steps or last_step, self._config.log_step_count_steps or 100,
                    input_rate and input_rate.samples_per_sec)
    try:
      with self._runtime_for(result.plan) as (runtime, runtime_hooks):
        hooks = list(hooks or []) + runtime_hooks
        # The batch goes into params only when the params name one: a batch taken from the
        # data leaves params as the user gave them, as tf.estimator does.
        named = batch_size_for_mode(self.params, ModeKeys.TRAIN) is not None
        input_fn = input_pipeline.per_replica(
            input_fn, runtime.per_replica_batch, self.cs_config.execution_strategy,
            runtime.config.train_distribute, named)
        if input_checkpointed:
          # The input pipeline's position is checkpointed with the model, so a resumed run
          # neither repeats nor skips batches. "warn": pipelines that draw random numbers
          # (BERT's on-the-fly masking) save their position; their RNG state restarts.
          input_fn = input_pipeline.without_autotune_model(input_fn)
          position = checkpoints.InputPositionHook(self, external_state_policy="warn")
          hooks = hooks + [position]
          saving_listeners = list(saving_listeners or []) + [position.listener]
        with GracefulInterrupt(self.model_dir) as interrupt, self._during(
            restore_from=restore_from, engine=run,
            model_fn_batch=runtime.per_replica_batch if named else None):
          return tf.estimator.Estimator.train(self, input_fn, hooks=hooks + [interrupt.hook],
                                              steps=steps, max_steps=max_steps,
                                              saving_listeners=saving_listeners)
    except (ValueError, AttributeError) as e:
      # Raised by the optimizer's merge step, outside the replicas' model_fn calls.
      mixed = lints.mixed_policy_across_replicas(e, self._user_model_fn, self.params)
      if mixed is None:
        raise
      raise ModelFnError(mixed) from e

  def time_input(self, input_fn, result):
    """Times the TRAIN input_fn alone on this host (half a second after warm-up) and says, in
    the log and report.txt's "input:" line, whether it could feed the simulated systems of
    `result` (a `compile` result that fits). Training calls it first; `--compile_only` too.
    A rerun takes an earlier process's timing of the same pipeline on this host from the
    compile cache (1.7 s of a BERT-tiny run's start-up), unless that one was short of the plan.

    Returns:
      The capture.InputRate, or None if not timed (a from_generator dataset, a pipeline that
      fails: training reports that itself, data that ends in the warm-up).
    """
    batch = batch_size_for_mode(self.params, ModeKeys.TRAIN)
    fn = input_pipeline.per_replica(input_fn, batch, self.cs_config.execution_strategy,
                                    self._train_distribution) if batch else input_fn
    try:
      rate = capture_lib.measure_input_rate(lambda: self._call_input_fn(fn, ModeKeys.TRAIN),
                                            batch_size=batch, seed=self.config.tf_random_seed,
                                            built=getattr(result, "built_input", None),
                                            store=self._compiler.cache,
                                            enough=result.performance.samples_per_sec)
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
    if rate.timed_at is not None:
      when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(rate.timed_at))
      text += f" (as timed on this host at {when}: the same pipeline, files and seed)"
    elif rate.timed_before:
      text += " (as timed earlier in this process: the same pipeline, files and seed)"
    short = rate.samples_per_sec < result.performance.samples_per_sec
    (tf.compat.v1.logging.warning if short else tf.compat.v1.logging.info)(
        "cerebras_tf: input: %s", text)
    path = result.report_paths.get("report")
    if path and os.path.exists(path):
      report.put_input_line(path, text)
    return rate

  def _say_warm_start_skipped(self, restore_from: Optional[str]) -> None:
    """A warm start applies only to a model_dir without checkpoints (tf.estimator skips it
    silently otherwise): a Keras model trained further in memory, or another warm_start_from,
    given for a model_dir that already has a run, trained on from the old checkpoint. Said at
    this estimator's first train call, when the checkpoint is not its own."""
    first = "train" not in self._once
    self._once.add("train")
    if not first or not restore_from:
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
        checkpoints.current_step(self.model_dir), what)

  def _saves_checkpoints(self) -> bool:
    return bool(self._config.save_checkpoints_steps or self._config.save_checkpoints_secs)

  def _say_off_engine(self, use_cs) -> None:
    """A CSConfig chosen by hand, then a train call that leaves use_cs unset: most likely
    tf.estimator.train_and_evaluate (it cannot pass use_cs), not a wish to skip the engine.
    Said once per estimator; the run is still the plain Estimator's."""
    if use_cs is not None or "off engine" in self._once or self.cs_config == CSConfig():
      return
    self._once.add("off engine")
    tf.compat.v1.logging.warning(
        "cerebras_tf: train without use_cs runs as a plain tf.estimator.Estimator, so the "
        "CSConfig given (%s on %s) is not used; pass use_cs=True to train, or build "
        "CerebrasEstimator(..., use_cs=True) for tf.estimator.train_and_evaluate",
        self.cs_config.execution_strategy, self.cs_config.engine)

  @_shows_our_info
  def evaluate(self, input_fn, steps=None, hooks=None, checkpoint_path=None, name=None,
               use_cs=None):
    """Evaluates a checkpoint (the initialized model when there is none, as tf.estimator);
    with use_cs=True the last compile must fit."""
    self._write_keras_warm_start()
    if steps is None:
      input_fn = input_fns.refusing_endless(input_fn)
    if name is None:
      name = tf_config.eval_name_of_this_task()
    input_fn, batch = self._for_engine(input_fn, ModeKeys.EVAL, use_cs)
    for attempt in range(checkpoints.VANISHED_RETRIES + 1):
      restore_from = checkpoints.to_read(self.model_dir, checkpoint_path)
      progress = BatchProgressHook(batch_size_for_mode(self.params, ModeKeys.EVAL), steps)
      try:
        with self._during(restore_from=restore_from, model_fn_batch=batch):
          # The checkpoint checked is the one restored (tf.estimator would look up the
          # latest again, and a training run may have saved another since).
          metrics = tf.estimator.Estimator.evaluate(
              self, input_fn, steps=steps, hooks=list(hooks or []) + [progress],
              checkpoint_path=checkpoint_path or restore_from, name=name)
        if not progress.batches:  # tf.estimator reports a loss of 0 and accuracy 0 for it
          raise DataError(f"the eval input_fn gave no batch at all: its data is empty or "
                          f"smaller than one batch of "
                          f"{batch_size_for_mode(self.params, ModeKeys.EVAL) or '?'} examples "
                          f"where partial batches are dropped; add eval data, or lower its "
                          f"batch size")
        return metrics
      except (tf.errors.NotFoundError, ValueError) as e:
        if not checkpoints.vanished(restore_from, bool(checkpoint_path), attempt, e):
          raise
    raise AssertionError("unreachable")  # the last attempt returns or raises

  def predict(self, input_fn, predict_keys=None, hooks=None, checkpoint_path=None,
              yield_single_examples=True, use_cs=None):
    """Predicts from a checkpoint (the initialized model when there is none, as tf.estimator);
    with use_cs=True the last compile must fit."""
    self._write_keras_warm_start()
    restore_from = checkpoints.to_read(self.model_dir, checkpoint_path)
    input_fn, batch = self._for_engine(input_fns.saying_endless(input_fn), ModeKeys.PREDICT,
                                       use_cs)
    single = (predict_keys,) if yield_single_examples else None
    for attempt in range(checkpoints.VANISHED_RETRIES + 1):
      if attempt:
        restore_from = checkpoints.to_read(self.model_dir, checkpoint_path)
      progress = BatchProgressHook(batch_size_for_mode(self.params, ModeKeys.PREDICT), None,
                                   what="predict")
      yielded = False
      try:
        with self._during(restore_from=restore_from, model_fn_batch=batch,
                          single_examples=single):
          for prediction in tf.estimator.Estimator.predict(
              self, input_fn, predict_keys=predict_keys, hooks=list(hooks or []) + [progress],
              checkpoint_path=checkpoint_path or restore_from,
              yield_single_examples=yield_single_examples):
            yielded = True
            yield prediction
        self.last_predict_checkpoint = checkpoint_path or restore_from
        return
      except (tf.errors.NotFoundError, ValueError) as e:
        if yielded or not checkpoints.vanished(restore_from, bool(checkpoint_path), attempt, e):
          raise

  def _export_all_saved_models(self, *args, **kwargs):
    """tf.estimator's export (every export method's), which reads the warm start when the
    model_dir has no checkpoint."""
    self._write_keras_warm_start()
    return tf.estimator.Estimator._export_all_saved_models(self, *args, **kwargs)  # pylint: disable=protected-access

  def _write_keras_warm_start(self) -> None:
    """A Keras model's weights, taken at construction, written before a graph may read them
    (keras_model.WarmStart: a compile alone writes nothing), and all of them warm-started,
    the non-trainable ones (batch norm's moving statistics) too."""
    if self._keras_warm_start is not None:
      self._keras_warm_start.write()
      self._warm_start_settings = self._keras_warm_start.settings()

  def _for_engine(self, input_fn, mode, use_cs):
    """(input_fn, batch) for eval/predict: with use_cs the last compile must fit (eval and
    predict run the graph compiled for training; their own input_fns are not compiled), and
    the input_fn and model_fn get the mode's batch, its dataset without tf.data's autotuning
    thread (input_pipeline.without_autotune_model); without, both as they are."""
    if not self._resolve_use_cs(use_cs):
      return input_fn, None
    if self._last_compile is not None:
      self._raise_unless_fits(self._last_compile)
    batch = batch_size_for_mode(self.params, mode)
    input_fn = input_pipeline.with_batch(input_fn, batch)
    return input_pipeline.without_autotune_model(input_fn), batch

  def _train_with_estimator_spec(self, estimator_spec, worker_hooks, hooks, global_step_tensor,
                                 saving_listeners):
    """tf.estimator's training loop, after the training graph's lints (compiler/lints.py), with
    an engine run's progress hook on the spec's loss: under a distribution strategy that is
    the loss reduced over the replicas, not replica 0's."""
    graph, train_op = tf.compat.v1.get_default_graph(), estimator_spec.train_op
    lints.check_global_step_advances(train_op, global_step_tensor,
                                     list(hooks) + list(worker_hooks),
                                     f"model_fn{defined_at(self._user_model_fn)}")
    lints.say_updates_not_run(graph, train_op, global_step_tensor)
    if onednn.active():
      lints.say_slow_attention_scores(graph)
    lints.say_emulated_products(graph, precision.emulated_dtypes())
    lints.say_bfloat16_sums(graph)
    lints.say_16_bit_variables(graph)
    run, progress = self._call.engine, None
    if run is not None:
      progress = run.progress_hook(estimator_spec.loss, self.model_dir)
      hooks = list(hooks) + [progress]
      lints.say_data_parallel(graph, self._train_distribution,
                              hooks + list(estimator_spec.training_hooks), estimator_spec.loss,
                              run.result.graph.batch_norm_layers, run.result.plan)
      checkpoints.keep_one_per_variable(graph)
    if type(self._train_distribution).__name__ not in _COLLECTIVE or not self._config.cluster_spec:
      # (a collective strategy's loop saves through MonitoredTrainingSession instead)
      estimator_spec = with_checkpoint_saver(estimator_spec, list(worker_hooks) + list(hooks),
                                             self._config, self._model_dir)
    try:
      return tf.estimator.Estimator._train_with_estimator_spec(  # pylint: disable=protected-access
          self, estimator_spec, worker_hooks, hooks, global_step_tensor, saving_listeners)
    except tf.compat.v1.train.NanLossDuringTrainingError:
      # tf.estimator's NanTensorHook checks every step, ours only fetches on logging steps.
      if progress is None or progress.last_run_step() is None:
        raise
      raise NonFiniteLossError(float("nan"), progress.last_run_step()) from None


def _keras_parts(model, model_dir, config, custom_objects=None, metric_names_map=None,
                 export_outputs=None):
  """(model_fn, config, warm start) that train a compiled Keras `model` from its weights."""
  config = _as_cs_run_config(config)
  if model_dir is not None or config.model_dir is None:
    config = config.replace(model_dir=model_dir or tempfile.mkdtemp())
  # The warm-start checkpoint is read by weight servers in another directory.
  config = config.replace(model_dir=dir_lock.absolute(config.model_dir))
  model_fn = keras_model_lib.model_fn_from_keras(model, custom_objects, metric_names_map,
                                                 export_outputs)
  return model_fn, config, keras_model_lib.warm_start(model, config, custom_objects)


@functools.lru_cache(maxsize=None)
def _hint_onednn_once() -> None:
  """Says once why host training is slower when TensorFlow was imported before cerebras_tf."""
  if cerebras_tf.ONEDNN_TOO_LATE and not onednn.active():
    tf.compat.v1.logging.info(
        "cerebras_tf: oneDNN CPU kernels are off because TensorFlow was imported before "
        "cerebras_tf; import cerebras_tf first, or export TF_ENABLE_ONEDNN_OPTS=1, for about "
        "1.3x faster host training")


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
    self._init_checkpoint = dir_lock.absolute(init_checkpoint)
    # A Keras model's weights, written where warm_start_from points before a graph reads them.
    self._keras_warm_start = None
    if isinstance(warm_start_from, keras_model_lib.WarmStart):
      self._keras_warm_start, warm_start_from = warm_start_from, warm_start_from.path
    warm_start_from = _absolute_warm_start(warm_start_from)
    self._default_use_cs = bool(use_cs)
    # What the current call tells the graph being built (model_fn_wrapper.CallContext).
    self._call = CallContext()
    self._last_compile = None  # this estimator's last compile: eval/predict need it to fit
    self.last_predict_checkpoint: Optional[str] = None  # what the last finished predict read
    self._once = set()  # what this estimator has said (or done: "train") once
    for mode in (ModeKeys.TRAIN, ModeKeys.EVAL):
      batch_size_for_mode(params or {}, mode)  # refuses a batch_size that is not one
    # A RunConfig of the user's (a subclass with methods of its own) is kept as it is; the
    # engine's run converts it (_engine_config). model_dir is kept as given too: an engine
    # run makes it absolute for the processes it starts elsewhere (_runtime_for).
    config = CSRunConfig() if config is None else config
    # `~` expanded (a directory named "~" is never what was meant); relative stays relative.
    model_dir = dir_lock.expand_home(model_dir)
    if dir_lock.expand_home(config.model_dir) != config.model_dir:
      config = config.replace(model_dir=dir_lock.expand_home(config.model_dir))
    # `params or {}`: what tf.estimator keeps anyway, and its check of the wrapper (which takes
    # params) then does not warn "includes params argument" for every model_fn.
    wrapped = model_fn_wrapper.wrap(model_fn, self._current_call, self._current_model_dir,
                                    self._init_checkpoint)
    super().__init__(model_fn=wrapped, model_dir=model_dir,
                     config=config, params=params or {}, warm_start_from=warm_start_from)
    # Every session this estimator starts (evaluate, predict, export, use_cs=False training
    # too) skips TF's TFG round trip; est.config stays the user's (runtime/strategies.py).
    self._session_config = strategies.quick_session_config(self._session_config)
    dir_lock.check_local(self.model_dir, "model_dir")
    dir_lock.check_readable(self.model_dir)
    if compile_dir:
      dir_lock.check_local(compile_dir, "compile_dir")
    self._compile_dir = dir_lock.absolute(compile_dir) or os.path.join(self.model_dir, "cs_compile")
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
    # {} for None (tf.estimator keeps `params or {}`): the model_fn takes params, and
    # tf.estimator warns of a model_fn that takes them when none are passed.
    return cls(model_fn, compile_dir=compile_dir, config=config, params=params or {},
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
      spec = model_fn_wrapper.as_estimator_spec(call_with_supported_args(
          user_model_fn, features=features, labels=labels, mode=mode, params=params,
          config=config), user_model_fn)
      if mode != ModeKeys.EVAL:
        return spec
      metrics = dict(spec.eval_metric_ops or {})
      metrics.update(extenders._call_metric_fn(  # pylint: disable=protected-access
          metric_fn, features, labels, spec.predictions, config))
      return spec._replace(eval_metric_ops=metrics)

    return type(self)(model_fn, compile_dir=self._compile_dir, config=self.config,
                      params=self.params,
                      warm_start_from=self._keras_warm_start or self._warm_start_settings,
                      use_cs=self._default_use_cs, init_checkpoint=self._init_checkpoint)

  @property
  def model_fn(self):
    """tf.estimator's model_fn bound to params. Another estimator that trains with it (the
    plain Estimator tf.estimator.add_metrics returns) trains without the engine: said once."""
    bound = tf.estimator.Estimator.model_fn.fget(self)
    # Another estimator reads the warm start (tf.estimator.add_metrics passes it on).
    self._write_keras_warm_start()

    def public_model_fn(features, labels, mode, config):
      if mode == ModeKeys.TRAIN and "foreign driver" not in self._once:
        self._once.add("foreign driver")
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
    return config.replace(model_dir=dir_lock.absolute(config.model_dir))

  def _resolve_use_cs(self, use_cs) -> bool:
    return self._default_use_cs if use_cs is None else bool(use_cs)

  # --- the runtime for the plan's execution strategy ----------------------------------------

  # The wrapper reads these while a graph is built. Methods, not two lambdas on one line:
  # MirroredStrategy's AutoGraph converts what the model_fn calls and warned, on every
  # multi_replica run, that it could not parse those lambdas' source.
  def _current_call(self) -> CallContext:
    return self._call

  def _current_model_dir(self) -> str:
    return self.model_dir

  @contextlib.contextmanager
  def _during(self, **changes):
    """The call context (model_fn_wrapper.CallContext) with `changes` for the length of the
    block: the checkpoint to restore, the batch the model_fn sees, an engine run's record."""
    previous = self._call
    self._call = previous.replace(**changes)
    try:
      yield
    finally:
      self._call = previous

  @contextlib.contextmanager
  def _runtime_for(self, plan):
    """Trains one call with the plan's runtime (runtime/strategies.py); yields it and the
    hooks its scope asks the train call to add."""
    config = self._engine_config()
    runtime = strategies.runtime_for(plan, config, config.model_dir, self.cs_config)
    # tf.estimator copies these five out of its RunConfig when it is built, and its train
    # reads them there (no public setter, no per-call argument); the runtime's config exists
    # only once the plan does, so a train call swaps them and puts them back after: the face's
    # only writes of the base class's fields.
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

  # --- the model_fn seen by tf.estimator -------------------------------------------------

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
    # The engine computes in 16 bits on any host; so does its trace (runtime/precision.py).
    with self._during(model_fn_batch=global_batch), precision.tracing_for_engine():
      result = self._compiler.compile(
          model_fn=self._user_model_fn,
          call_input_fn=lambda: self._call_input_fn(
              input_pipeline.per_replica(input_fn, global_batch,
                                         self.cs_config.execution_strategy,
                                         self._train_distribution)
              if global_batch else input_fn,
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
    if kept and "cs_ip" not in self._once:
      # Validated and kept (scripts written for hardware carry them), never used.
      self._once.add("cs_ip")
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


def _as_cs_run_config(config) -> CSRunConfig:
  """A `config` argument as a CSRunConfig: None is the default one (tf.estimator's own default
  would be a plain RunConfig, without a cs_config); a plain RunConfig is converted."""
  if config is None:
    return CSRunConfig()
  return config if isinstance(config, CSRunConfig) else CSRunConfig.from_run_config(config)


def _absolute_warm_start(warm_start_from):
  """`warm_start_from` (a path or WarmStartSettings) with its checkpoint path absolute."""
  if isinstance(warm_start_from, str):
    return dir_lock.absolute(warm_start_from)
  if isinstance(warm_start_from, tf.estimator.WarmStartSettings):
    return warm_start_from._replace(
        ckpt_to_initialize_from=dir_lock.absolute(warm_start_from.ckpt_to_initialize_from))
  return warm_start_from


