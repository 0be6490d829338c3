"""Checkpoint files found by name, without TensorFlow (the runner checks paths before TF starts).

tf.estimator writes `model.ckpt-N.{index,data-*,meta}`; the input pipeline's state sits beside
it as `input.ckpt-N.*` and is not a model checkpoint.
"""

import glob
import os
import re
from typing import List, Optional

MODEL_PREFIX = "model.ckpt"
INPUT_PREFIX = "input.ckpt"   # CheckpointInputPipelineHook's files
INPUT_STATE = "checkpoint_input"  # and its state file
_INDEX = re.compile(r"-(\d+)\.index$")


def step_of(prefix: str) -> int:
  """N of `.../model.ckpt-N`, -1 when the prefix has no step."""
  tail = prefix.rsplit("-", 1)[-1]
  return int(tail) if tail.isdigit() else -1


def list_checkpoints(model_dir: str, prefix: str = MODEL_PREFIX) -> List[str]:
  """Model checkpoint prefixes in `model_dir` (by their `.index` files), oldest step first;
  `prefix=INPUT_PREFIX` lists the input pipeline's."""
  found = []
  for index in glob.glob(os.path.join(glob.escape(model_dir), prefix + "-*.index")):
    m = _INDEX.search(index)
    if m:
      found.append((int(m.group(1)), index[:-len(".index")]))
  return [path for _, path in sorted(found)]


def latest_step(model_dir: str) -> int:
  """The step of the newest model checkpoint on disk, 0 when there is none."""
  found = list_checkpoints(model_dir)
  return step_of(found[-1]) if found else 0


def paired_step(model_steps: List[int], input_steps: List[int]) -> Optional[int]:
  """The step a run that checkpoints its input pipeline resumes from: the newest step saved by
  both (a kill between the two saves leaves the model one save ahead); the newest model step
  when no step has both; None without model checkpoints."""
  if not model_steps:
    return None
  both = sorted(set(model_steps) & set(input_steps))
  return both[-1] if both else max(model_steps)


_STATE_LATEST = re.compile(r'^model_checkpoint_path:\s*"([^"]*)"', re.M)


def _saved_steps(model_dir: str, prefix: str, state_file: str) -> List[int]:
  """Steps of `prefix` checkpoints up to the one the state file names (files written after
  it, by a save that was cut off before it updated the state file, do not count)."""
  try:
    with open(os.path.join(model_dir, state_file)) as fh:
      m = _STATE_LATEST.search(fh.read())
  except OSError:
    return []
  if not m:
    return []
  latest = step_of(m.group(1))
  return [s for s in (step_of(p) for p in list_checkpoints(model_dir, prefix)) if s <= latest]


def resume_hint(model_dir: str) -> str:
  """'; the same command resumes from step N (checkpoints in DIR)', for a stopped run's line."""
  step = resume_step(model_dir)
  if step is None:
    return f"; no checkpoint in {model_dir} yet"
  return f"; the same command resumes from step {step:,} (checkpoints in {model_dir})"


def resume_step(model_dir: str) -> Optional[int]:
  """The step the next training run on `model_dir` starts from (None: from scratch), as
  runtime/checkpoints.align_input_state will choose it when the input state is live."""
  model = _saved_steps(model_dir, MODEL_PREFIX, "checkpoint")
  if not os.path.exists(os.path.join(model_dir, INPUT_STATE)):
    return max(model) if model else None
  return paired_step(model, _saved_steps(model_dir, INPUT_PREFIX, INPUT_STATE))
