"""Checkpoint health before a run resumes: corrupt checkpoints and a torn input-state pair.

* A run killed while writing a checkpoint can leave a `.data` file shorter than its `.index`
  says, or garbage; tf.estimator would then fail deep inside restore. The latest checkpoint is
  read back in full first; a damaged one is renamed `*.corrupt` (nothing is deleted) and the
  `checkpoint` state file is pointed at the newest intact one, with one warning line.
* The model and the input pipeline (tf.data.experimental.CheckpointInputPipelineHook) are saved
  one after the other, so a kill between the two leaves the model a save ahead of the input.
  Resuming then would repeat a stretch of batches; instead both resume from the newest step
  that has both.
"""

import os
from typing import List, Optional

import tensorflow as tf

from cerebras_tf.errors import DataError

INPUT_STATE = "checkpoint_input"  # CheckpointInputPipelineHook's state file name


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
  latest = state.model_checkpoint_path
  latest = latest if os.path.isabs(latest) else os.path.join(model_dir, latest)
  base = latest.rsplit("-", 1)[0]
  found = {p[:-len(".index")] for p in tf.io.gfile.glob(base + "-*.index")}
  found.add(latest)
  return sorted((p for p in found if _step(p) <= _step(latest)), key=_step)


def _step(prefix: str) -> int:
  tail = prefix.rsplit("-", 1)[-1]
  return int(tail) if tail.isdigit() else -1


def ensure_restorable(model_dir: str, log=tf.compat.v1.logging.warning) -> Optional[str]:
  """Makes `model_dir` resume from an intact, consistent checkpoint; returns its prefix.

  Returns None when there is no checkpoint (a fresh run).

  Raises:
    DataError: checkpoints exist but none of them reads back.
  """
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
    paths, chosen = good, good[-1]
  inputs = _paths(model_dir, INPUT_STATE)
  if inputs:
    input_steps = {_step(p): p for p in inputs}
    both = [p for p in paths if _step(p) in input_steps]
    if both and both[-1] != chosen:
      log(f"cerebras_tf: the input pipeline was saved at step {max(input_steps)}, the model at "
          f"{_step(chosen)}; resuming both from step {_step(both[-1])}")
      chosen = both[-1]
    if both:
      step = _step(chosen)
      tf.compat.v1.train.update_checkpoint_state(
          model_dir, input_steps[step], [p for s, p in sorted(input_steps.items()) if s <= step],
          latest_filename=INPUT_STATE)
  if chosen != paths[-1] or why is not None:
    tf.compat.v1.train.update_checkpoint_state(
        model_dir, chosen, [p for p in paths if _step(p) <= _step(chosen)])
  return chosen
