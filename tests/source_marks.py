"""Finds the line of a marker comment in a test file: tests assert error messages that name
the user's source line without hard-coding line numbers."""


def line_of(path: str, marker: str) -> int:
  """The 1-based number of the first line of `path` holding `marker` (a comment)."""
  with open(path) as fh:
    for i, line in enumerate(fh, 1):
      if marker in line and "line_of(" not in line:
        return i
  raise AssertionError(f"no line with {marker!r} in {path}")
