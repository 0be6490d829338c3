"""The input pipeline of CerebrasEstimator (the part TPUEstimator's _InputPipeline plays): the
batch rules of each mode, and the user's input_fn wrapped to get its batch.

One key holds the batch in every mode, params['batch_size'] (`batching.RESERVED_PARAMS_KEY`,
TPUEstimator's convention): in training the per-replica batch of the plan, in eval and predict
the mode's global batch (eval_input's batch_size, else the flat one; they run on one device).
The params sections keep the global batch.
"""

import warnings
from typing import Optional

import numpy as np
import tensorflow as tf
from tensorflow_estimator.python.estimator import util as estimator_util

from cerebras_tf.compiler import capture as capture_lib
from cerebras_tf.core import batching
from cerebras_tf.errors import ConfigError
from cerebras_tf.runtime import strategies
from cerebras_tf.runtime.input_fns import call_input_fn

ModeKeys = tf.estimator.ModeKeys

# The params section each mode's batch is read from (predict batches as eval does).
SECTION = {ModeKeys.TRAIN: "train_input", ModeKeys.EVAL: "eval_input",
           ModeKeys.PREDICT: "eval_input"}


def batch_size_for_mode(params: dict, mode: str) -> Optional[int]:
  """The global batch size the params imply for `mode` (nested YAML or flat params).

  Raises:
    ConfigError: a batch_size that is not an int > 0 (0, 2.5 or "8" were taken for no batch,
      2 or 8).
  """
  name = SECTION.get(mode, "train_input")
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


def check_batch(dataset, per_replica_batch: int, strategy: str) -> None:
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
        f"{per_replica_batch} (the global batch split by the {strategy} "
        f"plan); batch the dataset with params['{batching.RESERVED_PARAMS_KEY}'], the "
        f"per-replica batch the framework passes")


def with_batch(input_fn, batch: Optional[int]):
  """input_fn called with `batch` (the eval or predict global batch, batch_size_for_mode) in
  the reserved params key, as a training input_fn gets its per-replica batch there; None: as
  it is."""
  if not batch:
    return input_fn

  def wrapped(params, mode, config):
    params = {**params, batching.RESERVED_PARAMS_KEY: batch}
    return call_input_fn(input_fn, params=params, mode=mode, config=config)
  return wrapped


def per_replica(input_fn, per_replica_batch: int, strategy: str, distribution=None,
                named: bool = True):
  """A training input_fn called with the per-replica batch in the reserved params key (when
  the params `named` a batch: one taken from the data leaves params as the user gave them,
  as tf.estimator does), sharded for this worker, and refused with both numbers when its
  dataset's static batch is another.

  Args:
    strategy: the plan's execution strategy, for messages.
    distribution: the tf.distribute strategy the call trains under: a data-parallel one
      splits datasets only, so an input_fn returning tensors is refused by name.
  """
  def wrapped(params, mode, config, input_context=None):
    if named:
      params = {**params, batching.RESERVED_PARAMS_KEY: per_replica_batch}
    out = call_input_fn(input_fn, params=params, mode=mode, config=config,
                        input_context=input_context)
    if not isinstance(out, tf.data.Dataset) and isinstance(
        distribution, (tf.distribute.MirroredStrategy,
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
    check_batch(out, per_replica_batch, strategy)
    return out
  return wrapped


def without_autotune_model(input_fn):
  """input_fn whose tf.data.Dataset runs without tf.data's autotuning model: a training run
  that checkpoints the dataset's position (checkpoints.InputPositionHook), and evaluation and
  prediction on the engine path. A dataset whose options set `autotune.enabled` themselves
  keeps the user's choice.

  Why: in TF 2.15 the model's optimizer thread sleeps for a period that doubles up to 60 s, and
  destroying the iterator (the session's close, at the end of every train, evaluate or
  predict call) waits for that thread. When the position was saved just before the close,
  the cancellation did not wake it: BERT-tiny's train call stopped 34-57 s at its end in every
  run measured (600 and 1,800 steps, issue 42), none without that save or with this off. The
  demo's second evaluation ended 3.8 s after its last batch in three runs of three (at 11.06 s,
  the period's end), 0.04 s with this off; its first did not wait (why, not found). Off,
  AUTOTUNE map parallelism is TF's default (the host's cores, at most 16) and
  prefetch(AUTOTUNE) keeps its older buffer autotuner, which needs no thread; BERT-tiny's
  steps, losses and metrics were unchanged.
  """
  def wrapped(params, mode, config, input_context=None):
    out = call_input_fn(input_fn, params=params, mode=mode, config=config,
                        input_context=input_context)
    if isinstance(out, tf.data.Dataset) and _options(out).autotune.enabled is None:
      options = tf.data.Options()
      options.autotune.enabled = False
      out = out.with_options(options)
    return out
  return wrapped


def _options(dataset: tf.data.Dataset) -> tf.data.Options:
  """dataset.options() without the UserWarning it gives in a graph (every Estimator input_fn
  runs in one) that the value may not survive serialization: here the dataset was just built
  in this graph, where the legacy answer is the options its with_options calls set."""
  with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="To make it possible to preserve tf.data options",
                            category=UserWarning)
    return dataset.options()
