"""The TFRecord files this process's input_fns chose to read (no TensorFlow import: the command
line reads it to name the file of a "corrupted record at N", which TensorFlow does not)."""

from typing import Iterable, List, Set, Tuple

_TFRECORDS: Set[Tuple[str, str]] = set()


def note_tfrecords(paths: Iterable[str], compression: str = "") -> None:
  """Remembers TFRecord files an input reads, with their compression ("" or "GZIP")."""
  _TFRECORDS.update((str(p), compression or "") for p in paths)


def tfrecords() -> List[Tuple[str, str]]:
  """(path, compression) of every TFRecord file noted, sorted."""
  return sorted(_TFRECORDS)


def forget() -> None:
  _TFRECORDS.clear()
