"""The framework's own error types.

Every user-facing mistake (bad YAML, unknown key, an op the engine has no kernel for, a model
that does not fit) raises a subclass of `CerebrasTFError`. Its message is one line that names
the file, key or op and says what to do; `scripts/run.py` prints it to stderr and exits 2.
"""

import errno
import functools
import inspect
import os
import re
from typing import Optional

# What an error about missing or corrupt data tells the user to run: the script in a checkout
# (scripts/ beside this package), else the console command the install put on PATH.
_CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREPARE_DATA = ("python scripts/prepare_data.py"
                if os.path.isfile(os.path.join(_CHECKOUT, "scripts", "prepare_data.py"))
                else "cerebras-prepare-data")


def defined_at(fn) -> str:
  """` (file:line)` of a Python function's definition, through partials and wrappers, for a
  message that names the user's code; '' for a callable without Python code."""
  code = getattr(inspect.unwrap(getattr(fn, "func", fn)), "__code__", None)
  return f" ({os.path.relpath(code.co_filename)}:{code.co_firstlineno})" if code else ""


def disk_full(error: BaseException) -> bool:
  """Whether an error is a full disk: an OSError with ENOSPC, or a TensorFlow error (or the
  event writer's RuntimeError) whose message says so."""
  if isinstance(error, OSError) and error.errno == errno.ENOSPC:
    return True
  return "No space left on device" in str(getattr(error, "message", error))


def disk_full_path(error: BaseException) -> Optional[str]:
  """The file a disk-full error was writing, when it says."""
  found = re.search(r"(\S+); No space left on device", str(getattr(error, "message", error)))
  return found.group(1) if found else getattr(error, "filename", None)


def tf_error_text(e: BaseException) -> str:
  """The op's own message of a TF error, one line. A graph-mode error starts with 'Graph
  execution error:' and a Python stack; the op's message follows the `Node: '...'` line."""
  text = str(getattr(e, "message", e))
  m = re.search(r"\nNode: '[^'\n]*'\n(.*?)(?:\n\s*\[\[|$)", text, re.S)
  lines = [line for line in text.split("\n") if line.strip()]
  if m:
    body = m.group(1)
  elif len(lines) > 1 and lines[0].strip() == "Graph execution error:":
    body = lines[1]  # an error inside the input pipeline: no Python stack, no Node line
  else:
    body = lines[0] if lines else ""
  return " ".join(body.split())


class CerebrasTFError(Exception):
  """Base class: a problem the user can fix. `str(e)` is the one-line message."""

  exit_code = 2
  # Raised in a model_fn that multi_replica's strategy runs through autograph, it would come
  # out as autograph's StagingError with a multi-line "in user code" message; this attribute
  # tells autograph to let it through as it is (TF's own UnliftableError does the same).
  ag_pass_through = True

  def __str__(self):
    # User text (a path, a flag value) may hold newlines; the message must stay one line.
    return super().__str__().replace("\r", "\\r").replace("\n", "\\n")


class ParamsError(CerebrasTFError, ValueError):
  """A params YAML file or override is malformed, unknown, mistyped or out of range."""


class ConfigError(CerebrasTFError, ValueError):
  """A RunConfig / CSConfig / flag value is malformed (e.g. `cs_ip`)."""


class CompileError(CerebrasTFError):
  """The model cannot be compiled for the engine (unsupported op, bad shapes)."""


class UnsupportedOpError(CompileError):
  """An op in the model_fn has no engine kernel."""


class FitError(CompileError):
  """The model does not fit the engine in the chosen execution strategy."""


class ModelFnError(CerebrasTFError):
  """The user's model_fn raised while building an eval or predict graph (names its line)."""


_BUILTIN_KINDS = (KeyError, IndexError, ValueError, TypeError, AttributeError)


def _one_line(error) -> str:
  # KeyError's own __str__ would quote the message.
  return Exception.__str__(error).replace("\r", "\\r").replace("\n", "\\n")


@functools.lru_cache(maxsize=None)
def _both(ours: type, builtin: type) -> type:
  return type(ours.__name__, (ours, builtin), {"__module__": ours.__module__,
                                               "__qualname__": ours.__qualname__,
                                               "__str__": _one_line})


def keeping_kind(ours: type, original: BaseException, message: str,
                 kind: Optional[type] = None) -> CerebrasTFError:
  """`ours(message)` that is also the builtin kind of `original` (ValueError, KeyError, ...),
  or `kind` when given: code written for tf.estimator that catches what the model_fn (or
  tf.estimator) raised still catches it, and the CLI still prints it as one of ours. Same
  class name as `ours`."""
  kind = kind or next((k for k in _BUILTIN_KINDS if isinstance(original, k)), None)
  return (_both(ours, kind) if kind else ours)(message)


class DataError(CerebrasTFError):
  """A data file is missing, unreadable or corrupt."""


class TrainingError(CerebrasTFError):
  """Training cannot continue (NaN/Inf loss, ...)."""


class NonFiniteLossError(TrainingError):
  """The loss became NaN or Inf at `step` (the estimator turns it into the final message)."""

  def __init__(self, loss: float, step: int):
    super().__init__(f"loss is {loss} at step {step}")
    self.loss, self.step = loss, step


class Terminated(KeyboardInterrupt):
  """A run stopped by SIGTERM (a scheduler's or `kill`'s polite stop) at a step boundary; a
  KeyboardInterrupt, so what cleans up after Ctrl-C cleans up after it too."""


def raise_terminated(signum, frame) -> None:
  """A SIGTERM handler: stops what runs as Ctrl-C would (cleanup and the one error line),
  where SIGTERM's default action ended the process without a word. Training's
  GracefulInterrupt takes it over as the default, to stop at a step boundary instead."""
  del signum, frame
  raise Terminated("terminated (SIGTERM)")
