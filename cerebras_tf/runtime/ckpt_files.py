"""Checkpoint files found by name, without TensorFlow (the runner checks paths before TF starts).

tf.estimator writes `model.ckpt-N.{index,data-*,meta}`; the input pipeline's state sits beside
it as `input.ckpt-N.*` and is not a model checkpoint.
"""

import glob
import os
import re
from typing import List

MODEL_PREFIX = "model.ckpt"
_INDEX = re.compile(r"-(\d+)\.index$")


def step_of(prefix: str) -> int:
  """N of `.../model.ckpt-N`, -1 when the prefix has no step."""
  tail = prefix.rsplit("-", 1)[-1]
  return int(tail) if tail.isdigit() else -1


def list_checkpoints(model_dir: str) -> List[str]:
  """Model checkpoint prefixes in `model_dir` (by their `.index` files), oldest step first."""
  found = []
  for index in glob.glob(os.path.join(glob.escape(model_dir), MODEL_PREFIX + "-*.index")):
    m = _INDEX.search(index)
    if m:
      found.append((int(m.group(1)), index[:-len(".index")]))
  return [path for _, path in sorted(found)]


def latest_step(model_dir: str) -> int:
  """The step of the newest model checkpoint on disk, 0 when there is none."""
  found = list_checkpoints(model_dir)
  return step_of(found[-1]) if found else 0
