"""One training run per model_dir (plain Python: the CLI takes it before TensorFlow starts).

Two runs on one model_dir interleave their checkpoints, and the second one's resume reads the
first one's half-written files. `CerebrasEstimator.train` takes the lock for every training
call and the CLI for a whole train_and_eval, so it is re-entrant within a thread.

The path rules of a model_dir live here too: local (`check_local`), readable back by
TensorFlow's checkpoint reader (`check_readable`), `~` expanded and, for processes that run in
another directory, absolute (`expand_home`, `absolute`).
"""

import contextlib
import fcntl
import os
import threading
from typing import Dict, Optional, Tuple

from cerebras_tf.errors import ConfigError
from cerebras_tf.runtime import tf_config

LOCK_FILE = ".cerebras_tf.lock"

_held: Dict[str, Tuple[int, int]] = {}  # realpath -> (thread id, depth)
_guard = threading.Lock()


def check_local(path: str, key: str) -> None:
  """A model_dir or compile_dir must be on a local (or mounted) filesystem: the run lock is
  an flock, and the input positions, compile cache and reports are plain files beside the
  checkpoints. A URL (gs://, hdfs://, ram://) made a local directory named `gs:` instead."""
  if "://" in path:
    raise ConfigError(f"{key} {path} is a filesystem URL; cerebras_tf keeps its run lock, "
                      f"compile reports and input positions beside the checkpoints on a local "
                      f"filesystem: use a local path (a bucket mounted with gcsfuse is one)")


def check_readable(model_dir: str) -> None:
  """TensorFlow's checkpoint reader takes its path as a glob pattern: under a model_dir named
  `runs/bert[2]` every checkpoint is written and none is ever read back (the resume said
  "checkpoint ... is corrupt")."""
  found = sorted(set("[]*?") & set(model_dir))
  if found:
    raise ConfigError(
        f"model_dir {model_dir} contains {' '.join(found)}, which TensorFlow's checkpoint "
        f"reader takes as a glob pattern: its checkpoints could be written but never read "
        f"back; choose a name without [ ] * ?")


def absolute(path: Optional[str]) -> Optional[str]:
  """A local path made absolute, `~` expanded (as scripts/run.py does); None and URLs
  (gs://...) as they are."""
  return os.path.abspath(os.path.expanduser(path)) if path and "://" not in path else path


def expand_home(path: Optional[str]) -> Optional[str]:
  """`~` expanded (a directory named "~" is never what was meant); relative stays relative."""
  return os.path.expanduser(path) if path and "://" not in path else path


def _owner_message(model_dir: str, holder: str) -> str:
  return (f"model_dir {model_dir} is in use by another training run ({holder}); wait for it "
          "to finish, or use another model_dir")


@contextlib.contextmanager
def model_dir_lock(model_dir: str):
  """Holds `model_dir/.cerebras_tf.lock` (an flock, so a killed run never leaves a stale
  lock) for the block. Only the chief of a cluster takes it: its workers share the model_dir.

  Raises:
    ConfigError: another process, or another thread of this one, is training in model_dir.
  """
  task = tf_config.current()
  if task is not None and task.task_type not in (None, "chief"):
    yield
    return
  try:
    os.makedirs(model_dir, exist_ok=True)
  except OSError as e:
    raise ConfigError(f"model_dir {model_dir} cannot be created ({e.strerror or e}); choose a "
                      "writable model_dir") from e
  key, me = os.path.realpath(model_dir), threading.get_ident()
  with _guard:
    owner, depth = _held.get(key, (me, 0))
    if owner != me:
      raise ConfigError(_owner_message(model_dir, f"thread {owner} of this process"))
    _held[key] = (me, depth + 1)
  try:
    if depth:
      yield
    else:
      with _flock(model_dir):
        yield
  finally:
    with _guard:
      if depth:
        _held[key] = (me, depth)
      else:
        del _held[key]


@contextlib.contextmanager
def _flock(model_dir: str):
  try:
    fh = open(os.path.join(model_dir, LOCK_FILE), "a+")  # pylint: disable=consider-using-with
  except OSError as e:
    raise ConfigError(f"model_dir {model_dir} is not writable ({e.strerror or e}); choose a "
                      "writable model_dir") from e
  with fh:
    try:
      fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
      fh.seek(0)
      raise ConfigError(_owner_message(model_dir, fh.read().strip() or "another process")
                        ) from None
    fh.seek(0)
    fh.truncate()
    fh.write(f"pid {os.getpid()}")
    fh.flush()
    try:
      yield
    finally:
      fh.seek(0)
      fh.truncate()
      fcntl.flock(fh, fcntl.LOCK_UN)
