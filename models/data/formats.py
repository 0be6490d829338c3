"""What a user's data file holds, told from its first bytes: TFRecords (and the length of
each feature of the first tf.train.Example), text, or another format.

The reference input_fns read several formats and pick one by looking; a file of one format
read as another trains on garbage or crashes (TFRecord framing read from text takes the
first eight characters as a record length of exabytes). So a record is believed only when
its length's checksum holds and the record fits in the file.
"""

import gzip
import struct
from typing import Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import tensorflow as tf
from google.protobuf.message import DecodeError

from cerebras_tf.errors import DataError
from cerebras_tf.runtime import input_files

TFRECORD, TEXT, HDF5, BINARY, EMPTY = "TFRecord", "text", "HDF5", "binary", "empty"
_GZIP = b"\x1f\x8b"
_HDF5 = b"\x89HDF\r\n\x1a\n"
_MAGIC = ((b"\x93NUMPY", "a NumPy .npy array"),
          (b"PK\x03\x04", "a zip archive (.npz?)"), (_GZIP, "gzip-compressed data"),
          (b"PAR1", "Parquet"), (b"ARROW1", "Arrow"))
_MAX_RECORD = 1 << 31  # a larger first record is not a record
_TEXT_SNIFF = 1 << 16
CHECKED_LINES = 1000  # lines of a text file an input checks up front (the rest as it reads)


class FileKind(NamedTuple):
  """kind: TFRECORD | TEXT | HDF5 | BINARY | EMPTY; what: a phrase for messages ("HDF5");
  lengths: feature name -> number of values in the first record (TFRecords of Examples);
  compression: TFRecordDataset's compression_type ("GZIP" for TFX's *.gz records, else "")."""
  kind: str
  what: str
  lengths: Optional[Dict[str, int]] = None
  compression: str = ""


def _crc32c(data: bytes) -> int:
  crc = 0xFFFFFFFF
  for byte in data:
    crc ^= byte
    for _ in range(8):
      crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
  return crc ^ 0xFFFFFFFF


def _masked_crc(data: bytes) -> int:
  """TFRecord's checksum of the length field (tensorflow/core/lib/hash/crc32c.h Mask)."""
  crc = _crc32c(data)
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def probe(path: str, read_example: bool = True) -> FileKind:
  """The format of the file at `path` (with `read_example`, the first Example's feature
  lengths too; without, only the first 4 KB are read: a glob may match thousands of shards).
  Raises DataError when it cannot be read."""
  sniff = _TEXT_SNIFF if read_example else 4096
  try:
    size = tf.io.gfile.stat(path).length
    with tf.io.gfile.GFile(path, "rb") as f:
      head = f.read(min(size, sniff))
      if size >= 16:
        length, crc = struct.unpack("<QI", head[:12])
        if crc == _masked_crc(head[:8]) and 12 + length + 4 <= size:
          if not read_example:
            return FileKind(TFRECORD, "TFRecords")
          f.seek(12)
          return FileKind(TFRECORD, "TFRecords", _example_lengths(f.read(length)))
  except (OSError, tf.errors.OpError) as e:
    raise DataError(f"cannot read data file {path}: {e}") from e
  if not head:
    return FileKind(EMPTY, "an empty file")
  if head.startswith(_GZIP):
    gz = _gzip_records(path, read_example)
    if gz is not None:
      return gz
  if head.startswith(_HDF5):
    return FileKind(HDF5, "HDF5")
  for magic, what in _MAGIC:
    if head.startswith(magic):
      return FileKind(BINARY, what)
  if b"\x00" in head:
    return FileKind(BINARY, "binary data")
  try:
    head.decode("utf-8")
  except UnicodeDecodeError as e:
    if e.start < len(head) - 3:  # a character cut at the sniff's end is still text
      return FileKind(BINARY, "not UTF-8 text")
  return FileKind(TEXT, "text")


def _gzip_records(path: str, read_example: bool) -> Optional[FileKind]:
  """Gzip-compressed TFRecords (TFX's ExampleGen writes them), or None for other gzip data."""
  try:
    with tf.io.gfile.GFile(path, "rb") as raw, gzip.GzipFile(fileobj=raw) as f:
      head = f.read(12)
      if len(head) < 12:
        return None
      length, crc = struct.unpack("<QI", head)
      if crc != _masked_crc(head[:8]) or length > _MAX_RECORD:
        return None
      lengths = _example_lengths(f.read(length)) if read_example else None
  except (OSError, EOFError, tf.errors.OpError):
    return None  # not gzip after all, or cut short: named as gzip data
  return FileKind(TFRECORD, "gzip-compressed TFRecords", lengths, "GZIP")


def _example_lengths(record: bytes) -> Optional[Dict[str, int]]:
  try:
    example = tf.train.Example.FromString(record)
  except DecodeError:
    return None  # TFRecords of something other than tf.train.Example
  out = {}
  for name, feature in example.features.feature.items():
    kind = feature.WhichOneof("kind")
    out[name] = len(getattr(feature, kind).value) if kind else 0
  return out


def probe_files(files: Sequence[str], key: str) -> FileKind:
  """The one format of `files` (the first file's Example lengths); `key` names the params
  entry that chose them. Refuses an empty list, empty files and a mix of formats, such as
  a README beside the records that `data/*` also matched."""
  if not files:
    raise DataError(f"{key} matches no file; fix it in the params file")
  def kind_of(k: FileKind) -> str:  # plain and gzip-compressed records do not mix either
    return k.what if k.kind == TFRECORD else k.kind

  first = probe(files[0])
  if first.kind == TFRECORD:
    input_files.note_tfrecords(files, first.compression)
  kinds: Dict[str, List[str]] = {kind_of(first): [files[0]]}
  for path in files[1:]:
    kinds.setdefault(kind_of(probe(path, read_example=False)), []).append(path)
  if EMPTY in kinds:
    raise DataError(f"data file {kinds[EMPTY][0]} is empty; remove it or narrow {key}")
  if len(kinds) > 1:
    mix = "; ".join(f"{paths[0]} is {kind}" for kind, paths in kinds.items())
    raise DataError(f"{key} matches files of different formats ({mix}); narrow the pattern "
                    f"to one format")
  return first


def tsv_head(path: str) -> Iterator[Tuple[int, List[str]]]:
  """(line number, tab-separated fields) of the non-blank lines among a text file's first
  CHECKED_LINES: what an input checks before it trusts the file's layout."""
  with tf.io.gfile.GFile(path) as f:
    for number, line in enumerate(f, 1):
      if number > CHECKED_LINES:
        return
      if line.strip():
        yield number, line.rstrip("\r\n").split("\t")


def vocab_tokens(path: str) -> List[str]:
  """The tokens of a one-token-a-line vocab file, id = line number - 1. A token listed twice is
  refused by name and line: the id table would hold two ids for one key, which TensorFlow
  reports only when the table is first used, as 155 lines of "HashTable has different value
  for same key"."""
  with tf.io.gfile.GFile(path) as f:
    text = f.read()  # one read: GFile's line iterator took 0.05 s of CPU for BERT's 30,522
  tokens = text.split("\n")
  if text.endswith("\n"):
    tokens.pop()
  first: Dict[str, int] = {}
  for line, token in enumerate(tokens, 1):
    if token in first:
      raise DataError(f"vocab file {path} lists the token {token!r} twice (lines {first[token]} "
                      f"and {line}): each token must have one id; remove the second line, or "
                      f"use the vocab the data was written with")
    first[token] = line
  return tokens
