"""Reads the per-step losses out of scripts/run.py's progress lines (stdout)."""

import re

# `step 12/24  loss 1.23456  host ...`: the step just taken (global_step after it) and the
# loss of the global batch.
_LINE = re.compile(r"^step (\d+)(?:/\d+)?  loss (\S+)", re.M)


def losses_by_step(stdout: str) -> dict:
  """{global_step before the step (0 for the first): loss}, tf.estimator's numbering."""
  return {int(step) - 1: float(loss) for step, loss in _LINE.findall(stdout)}
