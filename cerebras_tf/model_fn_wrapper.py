"""The model_fn tf.estimator sees (the part TPUEstimator's _ModelFnWrapper plays), and the
record of the call it is built for.

The wrapper calls the user's model_fn by the Estimator's convention with the batch of the call
in params['batch_size'], seeds Keras-built layers from RunConfig.tf_random_seed, turns a
TPUEstimatorSpec into the EstimatorSpec TPUEstimator runs off-TPU, names what a failing
model_fn did in eval or predict, and checks the checkpoint the graph will restore against its
variables before the session restores it. What it needs of the call (that checkpoint, the
batch, predict's single examples, an engine run) is one frozen `CallContext`, which the
estimator swaps for the length of each train/evaluate/predict call.
"""

import contextlib
import dataclasses
import functools
import os
import random
from typing import Callable, Optional, Tuple

import tensorflow as tf
from keras.src import backend as keras_backend  # tf.keras of TF 2.15
# autograph_artifact: what tf.function marks its own wrappers with; TF exports no name for it.
from tensorflow.python.autograph.impl import api as autograph_api
from tensorflow_estimator.python.estimator import model_fn as model_fn_lib
from tensorflow_estimator.python.estimator import util as estimator_util

from cerebras_tf.compiler import capture as capture_lib
from cerebras_tf.compiler import compile as compile_lib
from cerebras_tf.compiler import lints
from cerebras_tf.core import batching
from cerebras_tf.errors import CerebrasTFError, ModelFnError, defined_at, keeping_kind
from cerebras_tf.runtime import bias_grad, checkpoints, precision
from cerebras_tf.runtime.hooks import CSProgressHook
from cerebras_tf.runtime.input_fns import call_with_supported_args

ModeKeys = tf.estimator.ModeKeys


@dataclasses.dataclass(frozen=True)
class EngineRun:
  """An engine training call as its training loop reads it: built once, before the call.

  Attributes:
    result: the compile it trains (plan, performance, the traced graph, report paths).
    last_step: the run's last step (None: no limit); progress and ETA count to it.
    every_n_steps: how often progress lines and the cerebras/* scalars are written.
    input_samples_per_sec: the input_fn's rate timed on this host (None: not timed).
  """

  result: compile_lib.CompileResult
  last_step: Optional[int]
  every_n_steps: int
  input_samples_per_sec: Optional[float] = None

  def progress_hook(self, loss: tf.Tensor, model_dir: str) -> CSProgressHook:
    """The progress hook of the call on `loss` (under a strategy: reduced over the replicas),
    with the wafer picture for TensorBoard."""
    png = None
    wafer = self.result.report_paths.get("wafer")
    if wafer and os.path.exists(wafer):
      with open(wafer, "rb") as fh:
        png = fh.read()
    return CSProgressHook(
        loss=loss, batch_size=self.result.plan.batch_size,
        simulated_samples_per_sec=self.result.performance.samples_per_sec,
        utilization=self.result.performance.utilization, summary_dir=model_dir,
        last_step=self.last_step, every_n_steps=self.every_n_steps, wafer_png=png,
        model_dir=model_dir, input_samples_per_sec=self.input_samples_per_sec)


@dataclasses.dataclass(frozen=True)
class CallContext:
  """What one train/evaluate/predict call tells the graph tf.estimator builds for it.

  Attributes:
    restore_from: the checkpoint the graph will restore (None: none, or a warm start).
    model_fn_batch: the batch the model_fn's features have, given it in params['batch_size']
      (per replica in training, the mode's batch in eval and predict; None: params as given).
    single_examples: (predict_keys,) while predict yields single examples, else None.
    engine: the record of an engine training call, else None.
  """

  restore_from: Optional[str] = None
  model_fn_batch: Optional[int] = None
  single_examples: Optional[Tuple] = None
  engine: Optional[EngineRun] = None

  replace = dataclasses.replace


def wrap(user_model_fn, context: Callable[[], CallContext], model_dir: Callable[[], str],
         init_checkpoint: Optional[str] = None):
  """The model_fn tf.estimator is given for `user_model_fn`.

  Args:
    context: the current call's CallContext (read while the graph is built).
    model_dir: the model_dir the call runs in (an engine run's is absolute), for messages.
    init_checkpoint: variables of the same name and shape start from it when the call
      restores no checkpoint (google-bert's init_checkpoint).
  """
  @functools.wraps(user_model_fn)
  def model_fn(features, labels, mode, params, config):
    if labels is not None and "labels" not in estimator_util.fn_args(user_model_fn):
      # tf.estimator's own check and words (this wrapper takes labels, so it cannot see it).
      raise ValueError("model_fn does not take labels, but input_fn returns labels.")
    call = context()
    if call.model_fn_batch:
      params = {**params, batching.RESERVED_PARAMS_KEY: call.model_fn_batch}
    try:
      # An engine training call: a bfloat16 BiasAdd's bias gradient summed in float32 (TF's
      # CPU kernel sums bfloat16 in bfloat16: runtime/bias_grad.py), whoever's layers made it.
      # (use_cs=False builds the graph tf.estimator would.)
      with keras_seeds(config.tf_random_seed), (
          bias_grad.on_the_host() if call.engine is not None else contextlib.nullcontext()):
        spec = call_with_supported_args(user_model_fn, through=_as_tf_estimator_calls(
            user_model_fn), features=features, labels=labels, mode=mode, params=params,
                                        config=config)
    except RuntimeError as e:
      if "`merge_call` called while defining a new graph" not in str(e):
        raise
      raise ModelFnError(lints.merge_in_cond_message(e, user_model_fn)) from e
    except (ValueError, TypeError, KeyError, AttributeError) as e:
      if mode == ModeKeys.TRAIN or isinstance(e, CerebrasTFError):
        raise  # TRAIN graphs were traced by the compiler, which names the line already
      message = " ".join(str(getattr(e, "message", e)).split())[:300].rstrip(".")
      what = "predict" if mode == ModeKeys.PREDICT else mode
      raise keeping_kind(ModelFnError, e, (
          f"{capture_lib.user_line(e)}model_fn failed in {what} mode: "
          f"{type(e).__name__}: {message}"
          f"{_predict_hint(mode, features, labels, message)}")) from e
    spec = as_estimator_spec(spec, user_model_fn)
    _check_spec(spec, mode, call, user_model_fn, model_dir, init_checkpoint)
    return spec
  # Under a distribution strategy tf.estimator calls the model_fn through autograph
  # (mirrored_run converts each replica's function), which transpiled this wrapper and every
  # function of ours it calls, in every process: 2.5% of the test suite's CPU (py-spy). Marked
  # as autograph's own, it runs as written; the user's model_fn alone is converted, as
  # tf.estimator converts it (_as_tf_estimator_calls).
  return autograph_api.autograph_artifact(model_fn)


def _as_tf_estimator_calls(user_model_fn):
  """`user_model_fn` as tf.estimator runs it here: converted by autograph inside a
  distribution strategy's replica (each replica's function is; Python `if` on a tensor becomes
  a tf.cond), as written otherwise (one device, no strategy)."""
  if tf.distribute.has_strategy() and not tf.distribute.in_cross_replica_context():
    return tf.__internal__.autograph.tf_convert(user_model_fn,
                                                tf.__internal__.autograph.control_status_ctx())
  return user_model_fn


def _check_spec(spec, mode, call: CallContext, user_model_fn, model_dir, init_checkpoint):
  """What the built graph is checked for before the session starts: a summed loss under
  replicas, products in a 16-bit type the CPU emulates and bfloat16 sums it rounds away
  (evaluation, prediction), scalar predictions to split, a Saver that misses variables, and
  the checkpoint to restore against the variables (or, with none, the init_checkpoint's
  matching ones)."""
  if mode == ModeKeys.TRAIN and spec.loss is not None:
    lints.say_summed_loss_across_replicas(spec.loss)
  if mode != ModeKeys.TRAIN and not precision.in_engine_trace():  # (training: the loop's lints)
    lints.say_emulated_products(tf.compat.v1.get_default_graph(), precision.emulated_dtypes())
    lints.say_bfloat16_sums(tf.compat.v1.get_default_graph())
  if mode == ModeKeys.PREDICT and call.single_examples is not None:
    _check_single_examples(spec.predictions, call.single_examples[0], user_model_fn)
  if mode == ModeKeys.TRAIN and spec.scaffold.saver is not None:
    checkpoints.check_saver_covers(spec.scaffold.saver, tf.compat.v1.get_default_graph(),
                                   f"model_fn{defined_at(user_model_fn)}")
  if call.restore_from and spec.scaffold.saver is None:
    # Before the session restores (and before a refused run writes anything). A Saver of
    # the model_fn's own may map other names onto the variables: it restores as it saves.
    checkpoints.check_matches(call.restore_from, tf.compat.v1.get_default_graph(), model_dir())
  elif init_checkpoint:  # no checkpoint to restore: start from the matching ones
    checkpoints.init_matching(init_checkpoint)


def as_estimator_spec(spec, user_model_fn) -> model_fn_lib.EstimatorSpec:
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


@contextlib.contextmanager
def keras_seeds(seed: Optional[int]):
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
