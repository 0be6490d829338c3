"""Which of TensorFlow's Python log records are this framework's, and showing them.

Our lines (the fit verdict, the engine time, progress: steps, loss, examples/s, ETA) go through
TensorFlow's logger at INFO, like tf.estimator's own. At TensorFlow's default verbosity (WARN)
a user's own script would show none of them; `our_info_shown` lets ours through for the
length of a train/evaluate/predict call and keeps TensorFlow's own INFO hidden.
"""

import contextlib
import logging

from cerebras_tf.core import source


def ours(record: logging.LogRecord) -> bool:
  """Logged from the framework's code or a reference model's (TensorFlow's logger reports the
  caller's file)."""
  return source.is_own(record.pathname)


@contextlib.contextmanager
def our_info_shown():
  """TensorFlow's logger at INFO for our records only, when it would hide INFO; nothing
  changes when INFO is shown already (the user's choice, or scripts/run.py's routing)."""
  logger = logging.getLogger("tensorflow")
  hidden_below = logger.getEffectiveLevel()
  if hidden_below <= logging.INFO:
    yield
    return

  def keep(record):
    return record.levelno >= hidden_below or ours(record)

  level = logger.level
  logger.addFilter(keep)
  logger.setLevel(logging.INFO)
  try:
    yield
  finally:
    logger.setLevel(level)
    logger.removeFilter(keep)
