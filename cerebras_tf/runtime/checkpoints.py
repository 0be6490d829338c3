"""Checkpoint health: corrupt checkpoints, a torn input-state pair, a damaged state file,
a checkpoint of another model, and non-finite checkpoints after a NaN.

* A run killed while writing a checkpoint can leave a `.data` file shorter than its `.index`
  says, or garbage; tf.estimator would then fail deep inside restore. The latest checkpoint is
  read back in full first; a damaged one is renamed `*.corrupt` (nothing is deleted) and the
  `checkpoint` state file is pointed at the newest intact one, with one warning line.
* The model and the input pipeline (tf.data.experimental.CheckpointInputPipelineHook) are saved
  one after the other, so a kill between the two leaves the model a save ahead of the input.
  Resuming then would repeat a stretch of batches; instead both resume from the newest step
  that has both (`align_input_state`, for the runs that save input positions). A run that
  saves none (weight streaming, multi-replica) retires the input state as it starts, so a
  later run never rolls its steps back.
* An empty or unparsable `checkpoint` state file makes TF either raise or silently start from
  scratch (and overwrite the checkpoints of the same steps). It is renamed
  `checkpoint.corrupt` and rebuilt from the `.index` files on disk.
* A checkpoint whose variables differ from the model's (another hidden size, a renamed layer)
  is refused by name and shape before any file is written (`check_matches`).
* After a NaN, the checkpoints that hold non-finite values are moved to `<model_dir>/nonfinite/`
  so that the latest checkpoint is the last finite one (`drop_nonfinite`).
* The resume order: which checkpoint a train call resumes from (`resume_point`, then
  `resume_order` once its input is known), which one evaluate/predict read (`to_read`), and
  when they take the newest again because training deleted theirs (`vanished`).
"""

import glob
import os
import re
import shutil
from typing import Dict, Iterable, List, Optional, Set, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.python.data.ops import iterator_ops  # GLOBAL_ITERATORS: what the hook saves

from cerebras_tf.errors import ConfigError, DataError, NonFiniteLossError, disk_full_path
from cerebras_tf.runtime import ckpt_files
from cerebras_tf.runtime.hooks import input_ran_out
from cerebras_tf.runtime.ckpt_files import list_checkpoints, step_of

INPUT_STATE = ckpt_files.INPUT_STATE  # CheckpointInputPipelineHook's state file name
INPUT_SIGNATURE = INPUT_STATE + ".signature"  # the input it was saved from (match_input_state)


class InputPositionHook(tf.data.experimental.CheckpointInputPipelineHook):
  """Saves the input pipeline's position with the model (TF's CheckpointInputPipelineHook),
  at exactly the model's checkpoint steps, and stands down when there is none: an input_fn
  that returns tensors rather than a tf.data.Dataset makes no iterator, and TF's hook then
  fails with "No variables to save".

  TF's hook saves on a timer of its own. With `save_checkpoints_secs` the two timers drift
  apart (model at 1371 and 2932, input at 1426 and 2999), no step has both, and a run killed
  there resumed from step 0. Here the position is written by `listener`, a saving listener
  of the model's CheckpointSaverHook: every model save, and only those, has its input twin.

  An input that ran out (a dataset without .repeat()) keeps no position: restored at its end,
  every later train call stopped at once, having trained nothing. Its state is retired
  instead, so the next call starts a new pass over the data, as tf.estimator's would."""

  def __init__(self, estimator, external_state_policy: str = "warn"):
    super().__init__(estimator, external_state_policy=external_state_policy)
    self._model_dir = estimator.model_dir
    self._keep = estimator.config.keep_checkpoint_max
    self._active = True
    self._first_run = True
    self.listener = _SavedWithTheModel(self)

  def begin(self):
    self._active = bool(tf.compat.v1.get_collection(iterator_ops.GLOBAL_ITERATORS))
    if not self._active:
      tf.compat.v1.logging.info(
          "cerebras_tf: the input_fn returned tensors, not a tf.data.Dataset: its position "
          "is not checkpointed (a resumed run calls it afresh)")
      return
    super().begin()
    # TF's iterator saver keeps 5 whatever the model keeps: retain what the model retains.
    saver = self._checkpoint_saver_hook._saver  # pylint: disable=protected-access
    saver.saver_def.max_to_keep = self._keep or 0  # (0: all, as the model's)
    # No input.ckpt-N.meta: the position is restored through this graph's saver, and the
    # model's checkpoint of the same step has the meta graph (TF's hook wrote the whole graph
    # again at each save: BERT-tiny's 1.1 MB, ~0.1 s of CPU a save).
    self._checkpoint_saver_hook._save_graph_def = False  # pylint: disable=protected-access

  def after_create_session(self, session, coord):
    if self._active:
      super().after_create_session(session, coord)

  def before_run(self, run_context):
    # Only TF's first-run part: restore the position, or save the starting one (the
    # iterator is initialized by then). Later saves come from `listener`.
    if self._active and self._first_run:
      self._first_run = False
      try:
        self._restore_or_save_initial_ckpt(run_context.session)
      except (tf.errors.UnimplementedError,  # "GeneratorDataset does not support ..."
              tf.errors.FailedPreconditionError) as e:  # an iterator of the input_fn's own
        self._stand_down(e)

  def _stand_down(self, error) -> None:
    """A dataset that cannot save its position (from_generator, tf.data service): the run
    trains on as tf.estimator's would, its input restarting on resume. A position an
    earlier run saved no longer pairs with the model's checkpoints, so it is retired."""
    self._active = False
    lines = [l.strip() for l in str(getattr(error, "message", error)).splitlines()]
    why = next((l for l in lines if "checkpointing" in l), lines[0] if lines else "")
    tf.compat.v1.logging.warning(
        "cerebras_tf: the input_fn's dataset cannot save its position (%s): training goes "
        "on, but a resumed run starts the input_fn afresh and repeats batches; build it from "
        "from_tensor_slices, TFRecordDataset or another checkpointable source to resume "
        "exactly", why)
    retire_input_state(self._model_dir)

  def after_run(self, run_context, run_values):
    pass

  def end(self, session):
    if self._active and input_ran_out():
      retire_input_state(self._model_dir, log=lambda _: None)

  def save(self, session, step: int) -> None:
    """Writes the position at `step`, the model's checkpoint step."""
    if self._active and not self._first_run and not input_ran_out():
      try:
        self._checkpoint_saver_hook._save(session, step)  # pylint: disable=protected-access
      except tf.errors.UnimplementedError as e:  # from_generator saves at step 0, not later
        self._stand_down(e)


class _SavedWithTheModel(tf.estimator.CheckpointSaverListener):
  """The model's CheckpointSaverHook calls this after each save (its first one, at session
  creation, comes before the iterator is initialized: InputPositionHook saves that one)."""

  def __init__(self, hook: InputPositionHook):
    self._hook = hook

  def after_save(self, session, global_step_value):
    self._hook.save(session, int(global_step_value))


def _readable(prefix: str) -> Optional[str]:
  """None when every tensor of the checkpoint reads back, else the reason."""
  try:
    reader = tf.train.load_checkpoint(prefix)
    for name in reader.get_variable_to_shape_map():
      reader.get_tensor(name)
    return None
  except Exception as e:  # pylint: disable=broad-except  # truncation raises IndexError too
    return " ".join(str(getattr(e, "message", e)).split("\n")[0].split())[:200] or type(e).__name__


def _quarantine(prefix: str) -> None:
  for path in tf.io.gfile.glob(prefix + ".*"):
    if not path.endswith(".corrupt"):
      tf.io.gfile.rename(path, path + ".corrupt", overwrite=True)


def _paths(model_dir: str, latest_filename: Optional[str] = None) -> List[str]:
  """Checkpoint prefixes up to the state file's latest, oldest first.

  Found from the `.index` files, not the state file's list: with keep_checkpoint_max 0, TF
  keeps every checkpoint but lists only the last.
  """
  state = tf.train.get_checkpoint_state(model_dir, latest_filename=latest_filename)
  if state is None or not state.model_checkpoint_path:
    return []
  latest = state.model_checkpoint_path  # TF has joined a relative entry to model_dir
  base = latest.rsplit("-", 1)[0]
  found = {p[:-len(".index")] for p in tf.io.gfile.glob(base + "-*.index")}
  found.add(latest)
  return sorted((p for p in found if step_of(p) <= step_of(latest)), key=step_of)


def ensure_restorable(model_dir: str, log=tf.compat.v1.logging.warning) -> Optional[str]:
  """Makes `model_dir` resume from an intact checkpoint; returns its prefix.

  Returns None when there is no checkpoint (a fresh run).

  Raises:
    DataError: checkpoints exist but none of them reads back.
  """
  repair_state(model_dir, log)
  paths = _paths(model_dir)
  if not paths:
    return None
  chosen = paths[-1]
  why = _readable(chosen)
  if why is not None:
    good = [p for p in paths[:-1] if _readable(p) is None]
    _quarantine(chosen)
    if not good:
      raise DataError(f"checkpoint {chosen} is corrupt ({why}) and no earlier checkpoint in "
                      f"{model_dir} reads back; move the model_dir aside to start over")
    log(f"cerebras_tf: checkpoint {os.path.basename(chosen)} is corrupt ({why}); renamed it "
        f"*.corrupt and resuming from {os.path.basename(good[-1])}")
    chosen = good[-1]
    tf.compat.v1.train.update_checkpoint_state(model_dir, chosen, good)
  return chosen


def align_input_state(model_dir: str, log=tf.compat.v1.logging.warning) -> Optional[str]:
  """For a run that checkpoints its input pipeline: model and input resume from the newest
  step that has both (a kill between the two saves leaves the model one save ahead). Returns
  the model checkpoint the run resumes from.

  Only the input-checkpointing runs call this: a run that does not save input positions must
  not be rolled back to one, and it retires the input state as it starts
  (`retire_input_state`), so its steps are never undone by a later run.
  """
  paths = _paths(model_dir)
  inputs = _paths(model_dir, INPUT_STATE)
  if not paths or not inputs:
    return paths[-1] if paths else None
  chosen = paths[-1]
  input_steps = {step_of(p): p for p in inputs}
  paired = ckpt_files.paired_step([step_of(p) for p in paths], list(input_steps))
  if paired not in input_steps:
    return chosen
  if paired != step_of(chosen):
    log(f"cerebras_tf: the input pipeline was saved at step {max(input_steps)}, the model at "
        f"{step_of(chosen)}; resuming both from step {paired}")
    chosen = next(p for p in paths if step_of(p) == paired)
    tf.compat.v1.train.update_checkpoint_state(
        model_dir, chosen, [p for p in paths if step_of(p) <= step_of(chosen)])
  if step_of(chosen) != max(input_steps):  # rewrite only what changes
    step = step_of(chosen)
    tf.compat.v1.train.update_checkpoint_state(
        model_dir, input_steps[step], [p for s, p in sorted(input_steps.items()) if s <= step],
        latest_filename=INPUT_STATE)
  return chosen


_DATA = "; data: "


def _input_change(saved: str, signature: str) -> Optional[Tuple[str, str]]:
  """(what, old -> new) that differs between two input signatures (capture.input_signature),
  or None. A signature recorded before data files were part of it matches on its shapes."""
  old_shapes, _, old_data = saved.partition(_DATA)
  shapes, _, data = signature.partition(_DATA)
  if old_shapes != shapes:
    return "the input changed", f"{old_shapes} -> {shapes}"
  if old_data and old_data != data:
    return "the input reads other data files", f"{old_data} -> {data or 'none'}"
  return None


def match_input_state(model_dir: str, signature: str, log=tf.compat.v1.logging.warning) -> bool:
  """Keeps the saved input position only for the input it was saved from: a run whose traced
  input (`signature`: names, dtypes, shapes, batch and data files included) differs from the one recorded
  beside the input state retires that state, so the input starts afresh and the model is not
  rolled back to pair with it. (Restored into a pipeline of another batch, TF's iterator
  failed the first step with "Incompatible shapes at component 0: expected [64,...] but got
  [32,...]".) Records `signature` for the next run. Returns whether the state was kept.

  Before the first run that records one, a saved position is kept (nothing to compare).
  """
  path = os.path.join(model_dir, INPUT_SIGNATURE)
  try:
    with open(path, encoding="utf-8") as fh:
      saved = fh.read()
  except FileNotFoundError:
    saved = None
  kept = True
  change = _input_change(saved, signature) if saved is not None else None
  if change and tf.io.gfile.exists(os.path.join(model_dir, INPUT_STATE)):
    log(f"cerebras_tf: {change[0]} since its position was saved ({change[1]}); the input "
        f"starts from its beginning, the model from its latest checkpoint")
    retire_input_state(model_dir, log=lambda _: None)
    kept = False
  if saved != signature:
    os.makedirs(model_dir, exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as fh:
      fh.write(signature)
    os.replace(path + ".tmp", path)
  return kept


def retire_input_state(model_dir: str, log=tf.compat.v1.logging.info) -> bool:
  """Renames the input state file `checkpoint_input.retired` as a training run that saves no
  input positions starts (weight streaming, multi-replica, the plain Estimator): the model
  checkpoints it writes do not pair with the last input position, which would otherwise roll
  a later pipelined run back to it. The `input.ckpt-*` files stay. Returns whether it did.

  At the start, not after the run's first save: tf.estimator takes no saving listener under a
  distribution strategy. A run that dies before saving anything costs only the input's place
  (a later pipelined run starts its input afresh), never model steps."""
  state_file = os.path.join(model_dir, INPUT_STATE)
  if not tf.io.gfile.exists(state_file):
    return False
  tf.io.gfile.rename(state_file, state_file + ".retired", overwrite=True)
  log(f"cerebras_tf: this run does not save the input pipeline's position, so the one an "
      f"earlier pipelined run saved no longer pairs with the model's checkpoints: retired it "
      f"({INPUT_STATE}.retired); a later pipelined run starts its input afresh")
  return True


def repair_state(model_dir: str, log=tf.compat.v1.logging.warning) -> None:
  """An empty or unparsable `checkpoint` state file beside checkpoints: renamed
  `checkpoint.corrupt` and rebuilt from the newest readable checkpoint on disk."""
  state_file = os.path.join(model_dir, "checkpoint")
  if not os.path.isfile(state_file):
    return
  try:
    state = tf.train.get_checkpoint_state(model_dir)
  except ValueError:  # an empty file
    state = None
  if state is not None and state.model_checkpoint_path:
    return
  found = list_checkpoints(model_dir)
  if not found:
    return
  os.replace(state_file, state_file + ".corrupt")
  good = [p for p in found if _readable(p) is None]
  if not good:
    raise DataError(f"{state_file} was damaged and no checkpoint in {model_dir} reads back; "
                    "move the model_dir aside to start over")
  tf.compat.v1.train.update_checkpoint_state(model_dir, good[-1], good)
  log(f"cerebras_tf: {state_file} was empty or damaged; renamed it checkpoint.corrupt and "
      f"resuming from {os.path.basename(good[-1])}")


def latest(model_dir: str) -> Optional[str]:
  """The latest checkpoint prefix of model_dir, None when there is none (a damaged state file
  counts as none only when no checkpoint is on disk)."""
  try:
    found = tf.train.latest_checkpoint(model_dir)
  except ValueError:
    found = None
  if found is None:
    on_disk = list_checkpoints(model_dir)
    return on_disk[-1] if on_disk else None
  return found


# --- the resume order: which checkpoint a call reads, and in what order it is put right ------

def resume_point(model_dir: str) -> Optional[str]:
  """The checkpoint a train call resumes from, read before anything is written: the state file
  and a corrupt latest checkpoint are put right first (ensure_restorable). None: no checkpoint.
  Once the run's input is known, `resume_order` may move it."""
  ensure_restorable(model_dir)
  return latest(model_dir)


def resume_order(model_dir: str, input_signature: Optional[str], is_chief: bool) -> Optional[str]:
  """The checkpoint a train call resumes from once it knows its input. A run that saves its
  input pipeline's position (`input_signature`: the traced input's, CompileResult's) resumes
  model and input from the newest step that has both, after retiring a position saved from
  other input (match_input_state, align_input_state). A run that saves none (None) retires
  the last one saved, on the chief only: other tasks of a cluster share the model_dir."""
  if input_signature is None:
    if is_chief:
      retire_input_state(model_dir)
  else:
    match_input_state(model_dir, input_signature)
    align_input_state(model_dir)
  return latest(model_dir)


def to_read(model_dir: str, checkpoint_path: Optional[str]) -> Optional[str]:
  """The checkpoint evaluate/predict restore: the one named (checked whole: a copy cut short is
  one line, not RestoreV2's), else the latest; None for none (tf.estimator then runs the
  initializers, or a warm start, and says "Could not find trained model")."""
  if checkpoint_path:
    if not tf.io.gfile.isdir(checkpoint_path):
      check_whole(checkpoint_path)
    return checkpoint_path
  return latest(model_dir)


# evaluate/predict of the latest checkpoint start again this often when a training run deletes
# it mid-read (a run saving every few seconds with keep_checkpoint_max 2, say).
VANISHED_RETRIES = 3


def vanished(restore_from: Optional[str], named: bool, attempt: int, error) -> bool:
  """Whether evaluate/predict of the latest checkpoint should start again (its `attempt`-th
  try failed with `error`): a training run on the same model_dir deleted `restore_from` (it
  keeps keep_checkpoint_max) before it was restored. A checkpoint the caller `named` is not
  swapped for another."""
  gone = restore_from and not tf.io.gfile.exists(restore_from + ".index")
  if not gone or named or attempt >= VANISHED_RETRIES:
    return False
  tf.compat.v1.logging.warning(
      "cerebras_tf: %s was deleted while being read (a training run on this model_dir keeps "
      "its newest checkpoints only); taking the newest (%s)",
      os.path.basename(restore_from), type(error).__name__)
  return True


def _fmt_shape(shape) -> str:
  return "[" + ", ".join(str(d) for d in shape) + "]"


def mismatches(checkpoint: str, variables: Iterable[Tuple[str, List[int]]]):
  """(name, shape in the checkpoint or None, shape in the model) of each model variable that
  the checkpoint lacks or holds with another shape."""
  in_ckpt = dict(tf.train.list_variables(checkpoint))
  out = []
  for name, shape in variables:
    theirs = in_ckpt.get(name)
    if theirs is None or list(theirs) != list(shape):
      out.append((name, theirs, list(shape)))
  return out


def _wrapped(variables) -> Set[int]:
  """ids of the variables that another variable of `variables` wraps: an
  `AggregatingVariable`'s (CentralStorageStrategy: weight streaming on several systems) and a
  `MirroredVariable`'s per-device copies (multi_replica)."""
  out = set()
  for v in variables:
    inner = getattr(v, "_v", None)
    if inner is not None and hasattr(inner, "_aggregating_container"):
      out.add(id(inner))
    if isinstance(v, tf.distribute.DistributedValues):
      out.update(id(c) for c in getattr(v, "_values", ()))
  return out


def keep_one_per_variable(graph: tf.Graph) -> int:
  """Leaves each variable once in `graph`'s global-variables collection (what the Saver saves);
  returns how many entries it dropped.

  A Keras model's legacy optimizer (CerebrasEstimator.from_keras_model) puts its slots in the
  collection both as the strategy's wrapper and as the variables it wraps: under
  CentralStorageStrategy the Saver refused the pair ("At least two variables have the same
  name: training/Adam/dense/bias/m"); under MirroredStrategy it saved each replica's copy
  ("training/Adam/.../m/replica_1"), which a checkpoint written in another mode lacks. The
  wrapper stays: it saves and restores under the one name every mode writes.
  """
  coll = graph.get_collection_ref(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
  wrapped = _wrapped(coll)
  kept = [v for v in coll if id(v) not in wrapped]
  dropped = len(coll) - len(kept)
  coll[:] = kept
  return dropped


def graph_variables(graph: tf.Graph) -> List[Tuple[str, List[int]]]:
  """(checkpoint name, shape) of the variables a Saver of `graph` would restore."""
  out = {}
  coll = graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
  wrapped = _wrapped(coll)
  for v in coll:
    if id(v) in wrapped:
      continue
    name = v.name.split(":")[0]
    shape = v.shape.as_list() if v.shape.rank is not None else None
    if shape is not None and None not in shape:
      out[name] = shape
  return sorted(out.items())


def check_matches(checkpoint: str, graph: tf.Graph, model_dir: str) -> None:
  """Refuses (ConfigError) a checkpoint that lacks a variable of the model or holds one with
  another shape; called while the graph is built, before anything is written."""
  ours = graph_variables(graph)
  if _object_based(checkpoint):
    return  # TF's Saver restores it by the object graph (model_to_estimator's checkpoints)
  diff = mismatches(checkpoint, ours)
  if not diff:
    return
  name, theirs, ours = diff[0]
  more = f" (and {len(diff) - 1} more)" if len(diff) > 1 else ""
  trainable = {v.name.split(":")[0]
               for v in graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)}
  if all(t is None and _optimizer_state(n, trainable) for n, t, _ in diff):
    # Another optimizer_type, grad_accum_steps, ...: every weight is there.
    raise ConfigError(
        f"checkpoint {checkpoint} holds every weight of this model but not the optimizer "
        f"state this run needs ('{name}' {_fmt_shape(ours)}{more}): the optimizer or its "
        f"settings changed since it was written; keep the optimizer it was trained with, or "
        f"start a new model_dir with --warm_start {checkpoint} (CerebrasEstimator("
        f"init_checkpoint=...) in Python): the weights are restored, the step and the "
        f"optimizer state start afresh")
  what = (f"variable '{name}' is {_fmt_shape(theirs)} there and {_fmt_shape(ours)} in this model"
          if theirs is not None else f"it has no variable '{name}' {_fmt_shape(ours)} of this model")
  raise ConfigError(
      f"checkpoint {checkpoint} does not match this model: {what}{more}; it was written by "
      f"another model (or by this one before a change): use a new --model_dir, keep the params "
      f"it was trained with, or start a new model_dir with --warm_start {checkpoint} "
      f"(CerebrasEstimator(init_checkpoint=...) in Python) to reuse the variables that match")


def _object_based(checkpoint: str) -> bool:
  """Whether a checkpoint is object-based (tf.train.Checkpoint, Keras's): its keys are object
  paths, and TF's Saver, failing by name, restores it by its object graph (an Estimator's
  own, name-based checkpoints have no object graph)."""
  return any(name == "_CHECKPOINTABLE_OBJECT_GRAPH"
             for name, _ in tf.train.list_variables(checkpoint))


def check_saver_covers(saver, graph: tf.Graph, who: str) -> None:
  """Refuses (ConfigError) a model_fn's own Saver (scaffold.saver) that leaves out variables
  of the training graph: a Saver made before minimize() saves no optimizer state, and a
  checkpoint without it cannot resume the run (check_matches refuses it then, after the
  training it would have continued). The names are read off the Saver's SaveV2 ops."""
  scope = saver.saver_def.save_tensor_name.split("/", 1)[0] + "/"
  saved = []
  for op in graph.get_operations():
    if op.type == "SaveV2" and op.name.startswith(scope):
      names = tf.get_static_value(op.inputs[1])
      if names is None:
        return  # names computed at run time: nothing to compare
      saved.extend(n.decode() for n in names.ravel())
  ours = graph_variables(graph)
  if not saved or len(saved) >= len(ours):  # renamed (a dict var_list), not fewer
    return
  missing = [name for name, _ in ours if name not in set(saved)]
  more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
  raise ConfigError(
      f"{who}: the Saver in its scaffold saves {len(saved)} of the {len(ours)} variables "
      f"(not '{missing[0]}'{more}), so a checkpoint it writes cannot resume this training; "
      f"a Saver saves the variables that exist when it is made: make it after the "
      f"optimizer's minimize(), or leave scaffold.saver unset")


def _optimizer_state(name: str, trainable: Set[str]) -> bool:
  """Whether a non-trainable variable is an optimizer's, not the model's: a slot or an
  accumulator of a trainable variable (dense/kernel/Momentum, grad_accum/dense/kernel, Keras's
  training/Adam/dense/kernel/m) or Adam's beta powers and Keras's iteration count."""
  if name in trainable:
    return False
  if name.rsplit("/", 1)[-1] in ("beta1_power", "beta2_power", "iter", "iterations"):
    return True
  padded = f"/{name}/"
  return any(f"/{t}/" in padded for t in trainable)


def _finite(prefix: str) -> bool:
  reader = tf.train.load_checkpoint(prefix)
  for name, dtype in reader.get_variable_to_dtype_map().items():
    if dtype.is_floating and not np.all(np.isfinite(reader.get_tensor(name))):
      return False
  return True


def drop_nonfinite(model_dir: str, diverged_at: Optional[int] = None
                   ) -> Tuple[Optional[str], List[str]]:
  """Moves the checkpoints of a diverged run to `<model_dir>/nonfinite/` and points the state
  files at the newest one left. Returns (that prefix or None, the moved prefixes).

  Moved: every checkpoint holding NaN or Inf, and with `diverged_at` = k (the loss of step k
  was not finite) every checkpoint from step k - 1 on: step k's loss was computed on the
  weights saved as step k - 1, so those weights, finite or not, are where the run diverged.
  """
  found = list_checkpoints(model_dir)
  moved = []
  while found and ((diverged_at is not None and step_of(found[-1]) >= diverged_at - 1)
                   or not _finite(found[-1])):
    bad = found.pop()
    aside = os.path.join(model_dir, "nonfinite")
    os.makedirs(aside, exist_ok=True)
    for path in glob.glob(os.path.join(glob.escape(model_dir), f"*.ckpt-{step_of(bad)}.*")):
      os.replace(path, os.path.join(aside, os.path.basename(path)))
    moved.append(bad)
  if not moved:
    return (found[-1] if found else None), moved
  if found:
    tf.compat.v1.train.update_checkpoint_state(model_dir, found[-1], found)
    inputs = {step_of(p): p for p in _paths(model_dir, INPUT_STATE)}
    keep = [p for s, p in sorted(inputs.items()) if s <= step_of(found[-1])]
    if keep:
      tf.compat.v1.train.update_checkpoint_state(model_dir, keep[-1], keep,
                                                 latest_filename=INPUT_STATE)
  else:
    for name in ("checkpoint", INPUT_STATE):
      if os.path.exists(os.path.join(model_dir, name)):
        os.replace(os.path.join(model_dir, name), os.path.join(model_dir, "nonfinite", name))
  return (found[-1] if found else None), moved


def remove_partial_writes(model_dir: str) -> List[str]:
  """Deletes what an interrupted write leaves in model_dir: `*.tmp<hex>` files (graph.pbtxt,
  the checkpoint state) and `*.ckpt-N_temp` directories (a checkpoint being written). Only
  those names: nothing a finished save wrote is touched. Returns what was removed."""
  removed = []
  if not os.path.isdir(model_dir):
    return removed
  for name in os.listdir(model_dir):
    path = os.path.join(model_dir, name)
    if re.search(r"\.tmp[0-9a-f]{32}$", name) and os.path.isfile(path):
      os.remove(path)
    elif re.search(r"\.ckpt-\d+_temp$", name) and os.path.isdir(path):
      shutil.rmtree(path)
    else:
      continue
    removed.append(name)
  return sorted(removed)


def after_nonfinite(model_dir: str, error) -> str:
  """After a NaN/Inf loss (`error`: NonFiniteLossError, or tf.estimator's NanLossDuringTraining
  Error): moves the non-finite checkpoints aside (drop_nonfinite); the message says which
  checkpoint is now latest and what to change."""
  kept, moved = drop_nonfinite(
      model_dir, error.step if isinstance(error, NonFiniteLossError) else None)
  what = (f"loss is {error.loss} at step {error.step}" if isinstance(error, NonFiniteLossError)
          else "loss is NaN (tf.estimator's NanTensorHook)")
  if moved:
    where = (f"the latest checkpoint is now {os.path.basename(kept)}, the last one before "
             f"the loss diverged" if kept else "no checkpoint from before the divergence is left")
    saved = (f"{where} ({len(moved)} checkpoint(s) of the diverged weights moved to "
             f"{os.path.join(model_dir, 'nonfinite')})")
  else:
    saved = (f"the latest checkpoint {os.path.basename(kept)} is finite" if kept
             else "no checkpoint was written")
  return (f"{what}: training stopped; {saved}; lower optimizer.learning_rate, set "
          f"optimizer.max_gradient_norm, or enable loss scaling")


def after_disk_full(model_dir: str, error) -> str:
  """After a write failed for a full disk: removes its partial files; the message says what is
  intact and what to do."""
  remove_partial_writes(model_dir)
  kept = ensure_restorable(model_dir, log=lambda _: None)
  where = disk_full_path(error)
  saved = (f"checkpoints up to {os.path.basename(kept)} are intact" if kept
           else "no checkpoint was written")
  return (f"disk full while writing {where or model_dir}: training stopped; {saved} "
          f"and partial files "
          f"were removed; free some space (or choose another --model_dir) and rerun the "
          f"same command to resume")


def current_step(model_dir: str) -> int:
  """The global step of model_dir's latest checkpoint; 0 without one (or without the step)."""
  ckpt = tf.train.latest_checkpoint(model_dir)
  if not ckpt:
    return 0
  try:
    return int(tf.train.load_variable(ckpt, tf.compat.v1.GraphKeys.GLOBAL_STEP))
  except (tf.errors.NotFoundError, ValueError):
    return 0


def check_whole(prefix: str) -> None:
  """DataError naming the checkpoint when its data files hold fewer bytes than its index says
  its tensors take (a copy cut short, a disk that filled): TensorFlow finds out only when an
  initializer reads the missing part, as 141 lines ending in "Read less bytes than requested".
  Sizes only, nothing is read; a string tensor's size is not known and counts as 0."""
  reader = tf.train.load_checkpoint(prefix)
  dtypes = reader.get_variable_to_dtype_map()
  need = sum(int(np.prod(shape, dtype=np.int64)) * (dtypes[name].size if dtypes[name] != tf.string
                                                    else 0)
             for name, shape in reader.get_variable_to_shape_map().items())
  files = tf.io.gfile.glob(prefix + ".data-?????-of-?????")
  have = sum(tf.io.gfile.stat(f).length for f in files)
  if have < need:
    raise DataError(f"checkpoint {prefix} is damaged: its data files hold {have:,} bytes, its "
                    f"index names {need:,} (a copy cut short, or a disk that filled while it "
                    f"was written); use another checkpoint, or copy this one again")


# Warm starts already logged by this process: one line per checkpoint and outcome.
_WARM_STARTS_SAID = set()


def init_matching(checkpoint: str, var_list=None) -> Dict[str, tf.Variable]:
  """Warm-starts the graph variables that a checkpoint holds with the same name and shape
  (tf.compat.v1.train.init_from_checkpoint: the initializers read the checkpoint).

  Args:
    checkpoint: checkpoint prefix (or a directory with a `checkpoint` state file).
    var_list: candidate variables (default: all global variables, so optimizer slots and
      accumulators of a training checkpoint come back too; never the global step).
  Returns:
    the assignment map {checkpoint name: graph variable} that was applied.
  """
  tf1 = tf.compat.v1
  if tf.io.gfile.isdir(checkpoint):
    checkpoint = latest(checkpoint) or checkpoint
  check_whole(checkpoint)
  in_ckpt = dict(tf1.train.list_variables(checkpoint))
  variables = var_list if var_list is not None else tf1.global_variables()
  assignment, mismatched, missing = {}, [], []
  for var in variables:
    name = var.op.name
    if name == tf1.GraphKeys.GLOBAL_STEP or name.endswith("global_step"):
      continue  # a warm start begins at step 0
    if name not in in_ckpt:
      missing.append(name)
    elif list(in_ckpt[name]) != var.shape.as_list():
      mismatched.append(name)
    else:
      assignment[name] = var  # the variable itself: Keras variables are not in tf1's store
  tf1.train.init_from_checkpoint(checkpoint, assignment)
  trainable = {v.op.name for v in tf1.trainable_variables()}
  said = (checkpoint, len(assignment), len(missing), len(mismatched))
  if said in _WARM_STARTS_SAID:
    return assignment  # the compiler's trace of model_fn(TRAIN), then training's own graph
  _WARM_STARTS_SAID.add(said)
  tf1.logging.info("cerebras_tf: warm start from %s: restored %d variables (%d of %d trainable); "
                   "%d not in the checkpoint, %d with another shape %s",
                   checkpoint, len(assignment), len(trainable & set(assignment)),
                   len(trainable), len(missing), len(mismatched), mismatched[:5])
  return assignment
