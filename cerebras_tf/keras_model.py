"""Keras models on the engine: a compiled `tf.keras.Model` as a model_fn, with its weights.

    model = tf.keras.Sequential([...]);  model.compile(optimizer, loss, metrics=[...])
    est = CerebrasEstimator.from_keras_model(model, config=CSRunConfig(...))
    est.train(input_fn, max_steps=100, use_cs=True)   # evaluate / predict / export_saved_model

This follows `tf.keras.estimator.model_to_estimator` (tensorflow_estimator's keras_lib, whose
model_fn is reused here): the model is cloned into the Estimator's graph in every mode,
features are a dict keyed by `model.input_names` (or one tensor for a single input), labels a
tensor (or a dict keyed by `model.output_names`), the loss and metrics are the ones given to
`model.compile`, and training starts from the model's weights when it was converted. What
differs: those weights are written when a graph first needs them, not at conversion (a
compile writes nothing: WarmStart) and all of them are warm-started, the non-trainable ones
too (model_to_estimator starts a batch norm's moving statistics afresh); a subclassed model is
warm-started too (model_to_estimator starts it from fresh initial values); checkpoints are name-based (tf.compat.v1 Saver, as every
Estimator writes); the compile report names the model (`model.name`) and its layers; and a
model under a mixed-precision policy trains with replicas (multi_replica, weight streaming
over several systems), where keras_lib's clone updates each replica's own AutoCastVariable
wrappers of the shared weights and tf.distribute refuses the update
(`_share_replicated_weights`).
"""

import hashlib
import inspect
import json
import os
import re
import zlib
from typing import Callable, Optional

import numpy as np
import tensorflow as tf
from keras.src.mixed_precision import autocast_variable  # tf.keras of TF 2.15
from tensorflow.python.checkpoint import checkpoint_management
from tensorflow.python.training.saving import saveable_object_util  # Saver's own names
from tensorflow_estimator.python.estimator import keras_lib

from cerebras_tf.errors import ConfigError, ModelFnError, defined_at

ModeKeys = tf.estimator.ModeKeys
_LOOKUP_LAYERS = (tf.keras.layers.TextVectorization, tf.keras.layers.StringLookup,
                  tf.keras.layers.IntegerLookup)
_GLOBAL_STEP = tf.compat.v1.GraphKeys.GLOBAL_STEP  # "global_step", what Saver names it
KERAS_DIR = "keras"  # <model_dir>/keras/keras_model.ckpt, as model_to_estimator names it


def _share_replicated_weights(clone_and_build):
  """keras_lib's `_clone_and_build_model`, whose clone trains on the shared variables when the
  model_fn runs once per replica.

  Under a mixed-precision policy a layer wraps each weight in an AutoCastVariable (float32
  storage, reads cast to the compute dtype). With replicas, every replica's clone makes its own
  wrappers of the one mirrored (or parameter-server) variable, so the optimizer's merge step
  sees a different object per replica and tf.distribute refuses the update ("colocate_vars_with
  must only be passed a variable created in this tf.distribute.Strategy.scope(), not:
  PerReplica"; tf.estimator alone fails alike). Handing the optimizer the
  wrapped variables, the same objects in every replica, trains as the policy means: the
  forward pass still reads through the wrappers (16-bit compute), the gradient and the update
  are the float32 weights'. One replica: the clone as keras_lib makes it.
  """

  def clone(*args, **kwargs):
    model = clone_and_build(*args, **kwargs)
    context = tf.distribute.get_replica_context()
    weights = getattr(model, "_collected_trainable_weights", None)
    if weights and context is not None and context.num_replicas_in_sync > 1:
      model._collected_trainable_weights = [  # pylint: disable=protected-access
          w._variable if isinstance(w, autocast_variable.AutoCastVariable) else w  # pylint: disable=protected-access
          for w in weights]
    return model

  clone.shares_replicated_weights = True
  return clone


# keras_lib's model_fn looks the function up at call time; installed once per process.
if not getattr(keras_lib._clone_and_build_model, "shares_replicated_weights", False):  # pylint: disable=protected-access
  keras_lib._clone_and_build_model = _share_replicated_weights(  # pylint: disable=protected-access
      keras_lib._clone_and_build_model)  # pylint: disable=protected-access


def load(keras_model=None, keras_model_path: Optional[str] = None, custom_objects=None):
  """The compiled Keras model given, or loaded from `keras_model_path` (exactly one)."""
  if (keras_model is None) == (keras_model_path is None):
    raise ConfigError("give exactly one of keras_model (a compiled tf.keras.Model) and "
                      "keras_model_path (a model saved with model.save)")
  if keras_model_path is not None:
    if not os.path.exists(keras_model_path):
      raise ConfigError(f"keras_model_path {keras_model_path}: no such file or directory")
    keras_model = tf.keras.models.load_model(keras_model_path, custom_objects=custom_objects)
  if not isinstance(keras_model, tf.keras.Model):
    raise ConfigError(f"keras_model must be a tf.keras.Model, got {type(keras_model).__name__}")
  if (not hasattr(keras_model, "_compile_time_distribution_strategy")
      and any(c.__module__.endswith(".training_v1") for c in type(keras_model).__mro__)):
    # Keras swaps Sequential/Functional's base class to its graph-mode training_v1.Model
    # when an estimator first clones a model, for every instance; one built before then
    # then fails deep in keras_lib ('... has no attribute _compile_time_distribution_strategy';
    # tf.keras.estimator.model_to_estimator too).
    raise ConfigError(f"Keras model '{keras_model.name}' was built before an estimator in "
                      f"this process converted Keras to graph mode, which invalidates models "
                      f"made before it (Keras says so itself; model.save fails too): build the "
                      f"model again (call the code that makes it) for this estimator")
  for step in ("train_step", "test_step"):
    method = getattr(type(keras_model), step, None)
    if method is not None and not getattr(method, "__module__", "").startswith("keras."):
      # keras_lib (and model_to_estimator) build the loss from model.compile and never call
      # it: a custom step would be skipped without a word.
      raise ConfigError(
          f"Keras model '{keras_model.name}' overrides {step}{defined_at(method)}: the "
          f"estimator trains "
          f"and evaluates model.compile's loss, optimizer and metrics (as "
          f"tf.keras.estimator.model_to_estimator does) and would skip it; write that step as "
          f"a model_fn for CerebrasEstimator, or drop the override")
  lookups = [m for m in keras_model.submodules if isinstance(m, _LOOKUP_LAYERS)]
  if lookups:
    # Its table cannot be cloned into the Estimator's graph (model_to_estimator fails the
    # same way, "Attempting to capture an EagerTensor"), and the engine computes no strings.
    raise ConfigError(
        f"Keras model '{keras_model.name}' has the lookup layer '{lookups[0].name}' "
        f"({type(lookups[0]).__name__}): its vocabulary table cannot be cloned into the "
        f"estimator's graph, and the engine computes no strings; map the text to ids in "
        f"the input_fn (a {type(lookups[0]).__name__} built there with vocabulary=<this "
        f"layer>.get_vocabulary()) and build the model on the ids")
  if keras_model._is_graph_network:  # pylint: disable=protected-access
    _check_clonable(keras_model)
  if not getattr(keras_model, "optimizer", None):
    raise ConfigError(f"Keras model '{keras_model.name}' is not compiled: call "
                      f"model.compile(optimizer, loss, metrics) before putting it on the engine")
  if isinstance(keras_model.optimizer, tf.keras.optimizers.experimental.Optimizer):
    # tf.estimator runs the legacy optimizers only (keras_lib converts the same way).
    keras_model.optimizer = tf.keras.__internal__.optimizers.convert_to_legacy_optimizer(
        keras_model.optimizer)
  return keras_model


def _check_clonable(keras_model) -> None:
  """A Sequential or functional model is cloned into the estimator's graph from its layers'
  configs (as model_to_estimator does): a custom layer taking __init__ arguments without a
  get_config failed there, at train, with Keras' NotImplementedError traceback."""
  for layer in keras_model.submodules:
    if not isinstance(layer, tf.keras.layers.Layer):
      continue
    # Keras' graph-mode Layer.get_config refuses such a layer (base_layer_v1): the default
    # get_config (marked _is_default) with __init__ arguments it does not know.
    args = set(inspect.getfullargspec(type(layer).__init__).args) - {
        "self", "name", "trainable", "dtype", "dynamic", "batch_input_shape"}
    if args and hasattr(layer.get_config, "_is_default"):
      raise ConfigError(
          f"Keras model '{keras_model.name}': layer '{layer.name}' ({type(layer).__name__}"
          f"{defined_at(type(layer).__init__)}) takes __init__ arguments but has no "
          f"get_config(), so it cannot be cloned into the estimator's graph; add get_config() "
          f"returning them ({{**super().get_config(), 'arg': self.arg}})")


def architecture_token(keras_model) -> str:
  """A hash of what the compiler sees of the model: its layers, their types and weight shapes,
  the loss and the optimizer (the compile cache must not confuse two Keras models)."""
  # A lookup table's weight (TextVectorization's vocabulary) is a handler without a shape.
  layers = [(m.name, type(m).__name__,
             [list(w.shape) if hasattr(w, "shape") else type(w).__name__ for w in m.weights])
            for m in keras_model.submodules if isinstance(m, tf.keras.layers.Layer)]
  try:
    arch = keras_model.to_json()
  except (NotImplementedError, TypeError, ValueError):
    arch = type(keras_model).__qualname__  # subclassed: its layers above say the rest
  blob = json.dumps([keras_model.name, arch, layers, repr(keras_model.loss),
                     _optimizer_config(keras_model.optimizer)], sort_keys=True, default=repr)
  return hashlib.sha256(blob.encode()).hexdigest()[:20]


def _optimizer_config(optimizer):
  """The optimizer's get_config(); a tf.compat.v1.train optimizer given to model.compile (Keras
  wraps it in a TFOptimizer, which has none) is named by both classes and its plain
  hyperparameters (its learning rate, momentum...)."""
  try:
    return optimizer.get_config()
  except NotImplementedError:
    inner = getattr(optimizer, "optimizer", optimizer)
    return [type(optimizer).__name__, type(inner).__name__,
            {k: v for k, v in sorted(vars(inner).items())
             if isinstance(v, (bool, int, float, str))}]


def model_fn_from_keras(keras_model, custom_objects=None, metric_names_map=None,
                        export_outputs=None) -> Callable:
  """A tf.estimator model_fn(features, labels, mode) that runs a compiled Keras model.

  keras_lib's model_fn: the model is cloned into the Estimator's graph; TRAIN returns the
  compiled loss and the optimizer's update, EVAL the loss and the compiled metrics, PREDICT
  the outputs by `model.output_names` with a serving signature. The function carries
  `keras_model`, `model_name` (reports name the model) and `cache_token` (the compile cache
  key includes the architecture).
  """
  fn = keras_lib._create_keras_model_fn(  # pylint: disable=protected-access
      keras_model, custom_objects=custom_objects, save_object_ckpt=False,
      metric_names_map=metric_names_map, export_outputs=export_outputs)

  subclassed = not keras_model._is_graph_network  # pylint: disable=protected-access
  input_names = [] if subclassed else list(keras_model.input_names)

  def model_fn(features, labels, mode, params=None):
    # `params` is taken (and left to the input_fn) so that `from_keras_model(..., params=)`
    # works: tf.estimator refuses params for a model_fn without the argument.
    del params
    if isinstance(features, dict) and len(features) == 1 and len(input_names) <= 1:
      # One feature for one input: whatever its key (a subclassed model has no input names,
      # an unnamed keras.Input is "input_1"), the model gets the tensor itself.
      features = next(iter(features.values()))
    elif isinstance(features, dict) and set(input_names) - set(features):
      missing = sorted(set(input_names) - set(features))
      unused = sorted(set(features) - set(input_names))
      fix = (f"name that keras.Input after the feature (tf.keras.Input(..., "
             f"name='{unused[0]}'))" if len(missing) == len(unused) == 1 else
             "name each keras.Input after its feature (tf.keras.Input(..., name=...))")
      raise ModelFnError(
          f"the Keras model's inputs are {', '.join(input_names)}, the input_fn's features "
          f"{', '.join(sorted(features))}: no feature for {', '.join(missing)}; {fix}, or "
          f"key the features dict by the input names")
    return fn(features, labels, mode)

  model_fn.keras_model = keras_model
  # Read now: Keras invalidates the model once the estimator has cloned it in a graph.
  model_fn.keras_weight_names = [w.name.split(":")[0] for w in keras_model.weights]
  model_fn.model_name = f"keras:{keras_model.name}"
  model_fn.cache_token = architecture_token(keras_model)
  return model_fn


def trained_weights(weight_names, checkpoint: str, model_name: str) -> list:
  """The values `checkpoint` holds for a Keras model's weights (their names, in the model's
  `weights` order): what `set_weights` takes on a model of the same architecture.

  Raises:
    ConfigError: the checkpoint lacks one (a subclassed model whose weights the clone named
      otherwise, or a checkpoint of another model).
  """
  reader = tf.train.load_checkpoint(checkpoint)
  have = reader.get_variable_to_shape_map()
  missing = [n for n in weight_names if n not in have]
  if missing:
    more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
    raise ConfigError(f"checkpoint {checkpoint} has no variable '{missing[0]}'{more} of Keras "
                      f"model '{model_name}'; read them by name with est.get_variable_value")
  return [reader.get_tensor(n) for n in weight_names]


def _weights_set(keras_model) -> bool:
  return keras_model.built and bool(keras_model.weights)


def _input_spec(keras_model):
  """The input TensorSpec(s) of a subclassed model that has weights: from its first call, or
  from the shape given to `model.build`."""
  spec = keras_model.save_spec(dynamic_batch=True)
  if spec is not None:
    args = spec[0]
    return args[0] if len(args) == 1 else args
  shape = getattr(keras_model, "_build_input_shape", None)
  if shape is None:
    raise ConfigError(f"Keras model '{keras_model.name}' is subclassed and has weights but no "
                      f"input shape: call model.build(input_shape) or model(x) once first")
  return tf.TensorSpec(tf.TensorShape(shape), keras_model.dtype or tf.float32)


class WarmStart:
  """A Keras model's weights as the estimator's warm start, `<model_dir>/keras/keras_model.ckpt`.

  The weights are taken when the estimator is made (as model_to_estimator takes them) and
  written when the estimator first builds a graph that may read them (`write`: before train,
  evaluate, predict and export), so a compile writes nothing, however large the model:
  keras_lib writes them at once, in a training graph with the optimizer's slots, and a
  warm start reads only the trainable variables. An existing checkpoint is kept when the
  model_dir resumes from its own (the warm start does not apply) or holds these same weights
  (another worker wrote them); otherwise it is replaced: keras_lib kept it, so a model trained
  further in Keras and converted again for a model_dir that had not trained yet silently
  started from the old weights.

  Attributes:
    path: the checkpoint, written or to be written (what `warm_start_from` names).
  """

  def __init__(self, keras_model, config, custom_objects=None):
    keras_dir = os.path.join(config.model_dir, KERAS_DIR)
    latest = tf.train.latest_checkpoint(keras_dir)
    resumes = latest and tf.train.latest_checkpoint(config.model_dir)
    self.path = latest if resumes else os.path.join(keras_dir, "keras_model.ckpt")
    self._model, self._custom_objects = keras_model, custom_objects
    self._seed, self._session_config = config.tf_random_seed, config.session_config
    self._weights = None if resumes else keras_model.get_weights()
    self._settings = None
    if self._weights is not None and keras_model.optimizer:
      # The first clone in a graph swaps the model's class to Keras' graph-mode one, whose
      # _get_compile_args this model cannot answer; Keras' clone_and_build_model keeps the
      # answer on the model the same way, but only when it compiles the clone, and the
      # warm start's clone is not compiled and may come first.
      compile_args = keras_model._get_compile_args()  # pylint: disable=protected-access
      keras_model._get_compile_args = lambda: compile_args  # pylint: disable=protected-access

  def write(self) -> None:
    """Writes the weights taken at construction under the names the Estimator's graph gives
    the model's clone (its variables are never initialized: the values go straight to
    SaveV2). Once: the weights are let go when written (a failure, a full disk, keeps them for
    the next call); a checkpoint of the same weights (another worker's) is kept."""
    if self._weights is None:
      return
    keras_dir = os.path.dirname(self.path)
    digest = _digest(self._weights)
    if tf.train.latest_checkpoint(keras_dir) and _read(self.path + _DIGEST) == digest:
      self._weights = None
      return
    model, optimizer = self._model, self._model.optimizer
    tf.io.gfile.makedirs(keras_dir)
    with tf.Graph().as_default():
      tf.compat.v1.random.set_random_seed(self._seed)
      tf.compat.v1.train.create_global_step()
      features = None
      if not model._is_graph_network:  # pylint: disable=protected-access
        # keras_lib would leave a subclassed model at fresh initial values: build the clone
        # the way the model_fn does, on inputs of the model's own shapes.
        features = tf.nest.map_structure(
            lambda s: tf.compat.v1.placeholder(s.dtype, s.shape), _input_spec(model))
      # PREDICT: the clone's variables are the layers', named as in the training graph; an
      # uncompiled clone needs no optimizer or metrics (Keras' metrics keep the graph of the
      # last compile and refuse a new one).
      clone = keras_lib._clone_and_build_model(  # pylint: disable=protected-access
          ModeKeys.PREDICT, model, custom_objects=self._custom_objects, features=features)
      # The global step too: an export before any training restores every variable of its
      # graph from this checkpoint (tf.estimator's export without one in the model_dir).
      step = tf.compat.v1.train.get_global_step()
      names = [_checkpoint_name(w) for w in clone.weights] + [_GLOBAL_STEP]
      weights = list(self._weights) + [np.zeros([], step.dtype.as_numpy_dtype)]
      values = [tf.compat.v1.placeholder(w.dtype, w.shape) for w in weights]
      save = tf.raw_ops.SaveV2(prefix=self.path, tensor_names=names,
                               shape_and_slices=[""] * len(names), tensors=values)
      with tf.compat.v1.Session(config=self._session_config) as sess:
        sess.run(save, dict(zip(values, weights)))
    # What Saver.save writes (the public twin logs a deprecation warning).
    checkpoint_management.update_checkpoint_state_internal(keras_dir, self.path)
    with tf.io.gfile.GFile(self.path + _DIGEST, "w") as fh:
      fh.write(digest)
    self._weights = None
    if not model._is_graph_network:  # pylint: disable=protected-access
      # The clone was built in place: give the model back its own layers' state.
      tf.compat.v2.keras.__internal__.models.in_place_subclassed_model_state_restoration(model)
      model.optimizer = optimizer  # the restoration leaves it unset; the model_fn needs it


  def settings(self) -> "tf.estimator.WarmStartSettings":
    """The warm start of every weight the checkpoint holds, by name. tf.estimator's default
    (and model_to_estimator's) starts only the trainable variables, so a batch norm's moving
    statistics started fresh: a trained Keras model evaluated worse than in Keras. The
    optimizer's slots and the global step start fresh, as before."""
    if self._settings is None:
      names = [n for n, _ in tf.train.list_variables(self.path) if n != _GLOBAL_STEP]
      # One pattern matched against each global variable's name ("dense/kernel:0").
      pattern = "^(?:" + "|".join(re.escape(n) for n in names) + r")(?::\d+)?$"
      self._settings = tf.estimator.WarmStartSettings(ckpt_to_initialize_from=self.path,
                                                      vars_to_warm_start=[pattern])
    return self._settings


_DIGEST = ".crc32"  # beside the checkpoint: which weights it holds


def _digest(weights) -> str:
  """A CRC-32 of the weights' shapes, dtypes and bytes (identity, not security)."""
  crc = 0
  for w in weights:
    crc = zlib.crc32(f"{w.shape}{w.dtype}".encode(), crc)
    crc = zlib.crc32(np.ascontiguousarray(w).view(np.uint8).reshape(-1), crc)
  return f"{crc:08x}"


def _read(path: str) -> Optional[str]:
  return tf.io.gfile.GFile(path).read() if tf.io.gfile.exists(path) else None


def _checkpoint_name(variable) -> str:
  """The name tf.compat.v1.train.Saver saves `variable` under (a mixed-precision clone's
  weights are AutoCastVariables around it)."""
  variable = getattr(variable, "_variable", variable)
  (name,) = saveable_object_util.op_list_to_dict([variable])
  return name


def warm_start(keras_model, config, custom_objects=None) -> Optional[WarmStart]:
  """The model's WarmStart; None when it has no weights yet (a subclassed model never
  called): the Estimator initializes it."""
  return WarmStart(keras_model, config, custom_objects) if _weights_set(keras_model) else None
