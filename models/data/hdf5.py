"""Cerebras modelzoo's HDF5 datasets, read with h5py.

Modelzoo's data preprocessing writes `*.h5` files, each holding one integer dataset `data` of
shape [examples, features, max_sequence_length] (`HDF5IterableDataset`); the features are
named, in order, by the directory's `data_params.json` ("features") or default to input_ids,
attention_mask, labels. A file is checked here before training reads it, so a wrong layout is
one line that names the file, not a shape error at step 0.
"""

import json
import os
from typing import Dict, NamedTuple, Sequence, Tuple

import h5py
import numpy as np
import tensorflow as tf

from cerebras_tf.errors import DataError

DATASET = "data"
DEFAULT_FEATURES = ("input_ids", "attention_mask", "labels")
_CHUNK = 1024  # rows per h5py read: one slice copy, not one per example


class Layout(NamedTuple):
  """examples: rows of `data` in each file; features: the names of its axis 1; seq: its
  axis 2; dtype: numpy dtype name."""
  examples: Tuple[int, ...]
  features: Tuple[str, ...]
  seq: int
  dtype: str


def _features(path: str) -> Tuple[str, ...]:
  """Feature names as modelzoo reads them: `data_params.json` beside the file, else the
  GPT default."""
  params = os.path.join(os.path.dirname(path), "data_params.json")
  if not os.path.exists(params):
    return DEFAULT_FEATURES
  try:
    with open(params, encoding="utf-8") as f:
      names = json.load(f).get("features")
  except (OSError, ValueError, AttributeError) as e:
    raise DataError(f"{params} is not a modelzoo data_params.json ({e}); fix or remove it"
                    ) from e
  if names is None:
    return DEFAULT_FEATURES
  if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
    raise DataError(f"{params}: 'features' must be a list of names, got {names!r}")
  return tuple(names)


def _file_layout(path: str) -> Layout:
  if "://" in path:
    raise DataError(f"{path}: HDF5 is read from local disk only (h5py); copy it locally or "
                    f"convert it to TFRecords")
  try:
    with h5py.File(path, "r") as f:
      if DATASET not in f:
        found = ", ".join(sorted(f.keys())) or "nothing"
        raise DataError(f"HDF5 file {path} holds {found}, not modelzoo's '{DATASET}' dataset "
                        f"[examples, features, max_sequence_length]; write it with modelzoo's "
                        f"data preprocessing, or give TFRecords")
      data = f[DATASET]
      shape, dtype = tuple(data.shape), data.dtype
  except OSError as e:  # h5py's reason, e.g. "Unable to ... open file (truncated file...)"
    raise DataError(f"cannot read HDF5 file {path} ({e}): it is damaged or was cut short; "
                    f"write it again") from e
  if len(shape) != 3 or not np.issubdtype(dtype, np.integer):
    raise DataError(f"HDF5 file {path}: '{DATASET}' is {dtype} of shape {list(shape)}, not "
                    f"integer token ids of shape [examples, features, max_sequence_length]")
  features = _features(path)
  if len(features) != shape[1]:
    raise DataError(f"HDF5 file {path}: '{DATASET}' has {shape[1]} features per example but "
                    f"{len(features)} are named ({', '.join(features)}; data_params.json or "
                    f"modelzoo's default); fix data_params.json 'features'")
  return Layout((shape[0],), features, shape[2], dtype.name)


def layout(files: Sequence[str]) -> Layout:
  """The one layout of `files`; refuses files that differ."""
  first = _file_layout(files[0])
  examples = list(first.examples)
  for path in files[1:]:
    other = _file_layout(path)
    if other[1:] != first[1:]:
      raise DataError(f"HDF5 files differ: {files[0]} holds {first.features} x {first.seq} "
                      f"({first.dtype}), {path} {other.features} x {other.seq} "
                      f"({other.dtype}); narrow the pattern to one preprocessing run")
    examples += other.examples
  return first._replace(examples=tuple(examples))


def _read(path: bytes, start, count) -> np.ndarray:
  with h5py.File(path.decode("utf-8"), "r") as f:
    return f[DATASET][start:start + count].astype(np.int32)


def dataset(files: Sequence[str], shape: Layout) -> tf.data.Dataset:
  """Rows of `data`, int32 [features, seq] each, file after file.

  Built from a from_tensor_slices list of (file, first row, rows) chunks, so the pipeline's
  position is the list's and a resumed run goes on where it stopped (a from_generator source
  cannot save it), and capture.data_files digests the files as it does TFRecords."""
  chunks = [(path, start, min(_CHUNK, n - start))
            for path, n in zip(files, shape.examples) for start in range(0, n, _CHUNK)]
  paths, starts, counts = (list(c) for c in zip(*chunks)) if chunks else ([], [], [])
  width = (len(shape.features), shape.seq)

  def read(path, start, count):
    rows = tf.numpy_function(_read, [path, start, count], tf.int32, stateful=False)
    return tf.ensure_shape(rows, (None,) + width)
  return (tf.data.Dataset.from_tensor_slices(
      (tf.constant(paths, tf.string), tf.constant(starts, tf.int64),
       tf.constant(counts, tf.int64)))
          .map(read).unbatch())


def columns(row: tf.Tensor, shape: Layout) -> Dict[str, tf.Tensor]:
  """A row [features, seq] (or a batch of them) -> feature name -> [..., seq]."""
  return {name: row[..., i, :] for i, name in enumerate(shape.features)}
