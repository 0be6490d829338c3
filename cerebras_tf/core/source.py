"""Which source files are the framework's own, not the user's: this package, and the reference
model packages beside it (the face adds their directories; the framework imports no model).

Log routing shows our records on the terminal; the compiler names the user's line of an op and
lints only the user's ops. Pure Python.
"""

import os
from typing import Set

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_OWN_DIRS: Set[str] = {_PACKAGE_DIR}


def add_own_code(*directories: str) -> None:
  """Counts files under `directories` as the framework's own (the reference models')."""
  _OWN_DIRS.update(os.path.normpath(os.path.abspath(d)) + os.sep for d in directories)


def is_own(path: str) -> bool:
  """Whether a source file (a frame's or a log record's) is the framework's own code."""
  return os.path.normpath(os.path.abspath(path)).startswith(tuple(_OWN_DIRS))
