"""Records the dtypes a model's function is called with and returns: the precision tests'."""

import contextlib
from unittest import mock


@contextlib.contextmanager
def call_dtypes(module, name: str):
  """Within it, each call of `module.name` appends (its first argument's dtype name, its
  result's) to the list it yields."""
  seen, real = [], getattr(module, name)

  def probe(x, *args, **kwargs):
    y = real(x, *args, **kwargs)
    seen.append((x.dtype.name, y.dtype.name))
    return y

  with mock.patch.object(module, name, probe):
    yield seen
