"""Cerebras modelzoo's BERT CSV datasets, as its data preparation writes them.

A data_dir holds `meta.dat` ("<csv file> <examples>" a line) and CSV files with a header;
each cell is a Python literal (a list of tokens or ids, an int), parsed here with
`ast.literal_eval` (modelzoo itself calls `eval`). Two layouts:

  * create_csv.py (read by BertCSVDynamicMaskDataProcessor): tokens (WordPiece strings,
    [CLS] a [SEP] b [SEP]), segment_ids, is_random_next - masked on the fly;
  * create_csv_static_masking.py (BertCSVDataProcessor): input_ids, attention_mask,
    token_type_ids [S], masked_lm_positions, masked_lm_weights, labels [P] (the masked
    tokens' ids), next_sentence_label - masked when written.

The MLM-only variants lack the NSP columns; those are read as segment 0 and label 0.
"""

import ast
import csv
import json
import os
import threading
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from cerebras_tf.errors import DataError

META = "meta.dat"
DYNAMIC = ("tokens",)
STATIC = ("input_ids", "attention_mask", "labels", "masked_lm_positions")


class CsvData(NamedTuple):
  """files and their example counts from meta.dat; columns: the first file's header;
  static: masked when written (create_csv_static_masking.py)."""
  files: Tuple[str, ...]
  counts: Tuple[int, ...]
  columns: Tuple[str, ...]
  static: bool


def find(data_dir: Optional[str], key: str) -> Optional[CsvData]:
  """The modelzoo CSV dataset in `data_dir` (None when it has no meta.dat). `key` names the
  params key in errors. Raises DataError for a meta.dat or header that cannot be read."""
  if not data_dir or "://" in str(data_dir):
    return None
  meta = os.path.join(data_dir, META)
  if not os.path.isfile(meta):
    return None
  files, counts = [], []
  with open(meta, encoding="utf-8") as f:
    for n, line in enumerate(f, 1):
      parts = line.split()
      if not parts:
        continue
      if len(parts) != 2 or not parts[1].isdigit():
        raise DataError(f"{meta}:{n}: expected '<csv file> <examples>' (modelzoo's meta.dat), "
                        f"got {line.strip()!r}")
      files.append(_located(parts[0], data_dir, meta, n))
      counts.append(int(parts[1]))
  if not files:
    raise DataError(f"{meta} lists no CSV files ({key} {data_dir})")
  columns = _header(files[0])
  static = all(c in columns for c in STATIC)
  if not static and not all(c in columns for c in DYNAMIC):
    raise DataError(f"{files[0]}: columns {', '.join(columns)} are neither modelzoo's "
                    f"create_csv.py layout (tokens, segment_ids, is_random_next) nor "
                    f"create_csv_static_masking.py's ({', '.join(STATIC)}, ...)")
  for path in files:
    if _header(path) != columns:
      raise DataError(f"{path}: its header differs from {files[0]}'s; one dataset has one "
                      f"layout")
    first = first_row(path)  # it parses, or training would fail at step 0
    if first.strip():
      parse_lines([first], columns, f"{path}:2")
  return CsvData(tuple(files), tuple(counts), columns, static)


def first_row(path: str) -> bytes:
  """The line after the header."""
  with open(path, "rb") as f:
    f.readline()
    return f.readline()


def _located(name: str, data_dir: str, meta: str, line: int) -> str:
  """meta.dat names each file as create_csv.py was given its output_dir (absolute, or
  relative to where it ran); the directory may have moved since, so the file beside
  meta.dat is taken when the named path is not there."""
  for path in (name, os.path.join(data_dir, name), os.path.join(data_dir,
                                                                os.path.basename(name))):
    if os.path.isfile(path):
      return path
  raise DataError(f"{meta}:{line} lists {name}, which is neither there nor in {data_dir}")


def _header(path: str) -> Tuple[str, ...]:
  with open(path, encoding="utf-8", newline="") as f:
    row = next(csv.reader(f), None)
  if not row:
    raise DataError(f"{path} is empty; modelzoo's CSV files start with a header")
  return tuple(row)


# CPython 3.11's AST construction keeps its recursion depth in interpreter-wide state, so two
# tf.py_function threads (a parallel map) parsing at once can fail with "SystemError: AST
# constructor recursion depth mismatch" (python/cpython#106905): a CI run met it. Numbers and
# lists of them (every numeric column) are JSON and skip the AST; the rest parse one at a time.
_AST_LOCK = threading.Lock()


def _cell(row: Dict[str, str], name: str, where: str):
  text = row[name]
  try:
    return json.loads(text)
  except ValueError:
    pass  # Python's own spelling: 'quoted' tokens, tuples, True/False
  try:
    with _AST_LOCK:
      return ast.literal_eval(text)
  except (ValueError, SyntaxError) as e:
    raise DataError(f"{where}: column {name} is not a Python literal ({e})") from e


def parse_lines(lines: Sequence[bytes], columns: Sequence[str], where: str) -> List[dict]:
  """CSV lines (no header) -> one dict per line of its columns' values."""
  rows = csv.DictReader((l.decode("utf-8") for l in lines), fieldnames=list(columns))
  out = []
  for row in rows:
    if None in row or any(v is None for v in row.values()):
      raise DataError(f"{where}: a line's cells do not match the header's {len(columns)} "
                      f"columns ({', '.join(columns)})")
    out.append({k: _cell(row, k, where) for k in columns})
  return out


def tokens_to_ids(rows: Sequence[dict], vocab: Dict[str, int], unk: int, lower: bool,
                  msl: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """create_csv.py rows -> (ids, segments, row lengths, nsp): flat int32 ids and segment ids
  of all rows (each cut to `msl`), their lengths [B] and next-sentence labels [B]
  (is_random_next; 0 without the column). A token missing from the vocab is [UNK]; with
  `lower` its lowercase form is looked up first, as modelzoo lowercases with do_lower."""
  ids, segs, lengths, nsp = [], [], [], []
  for row in rows:
    tokens = list(row["tokens"])[:msl]
    for t in map(str, tokens):
      i = vocab.get(t)
      if i is None and lower:
        i = vocab.get(t.lower())
      ids.append(unk if i is None else i)
    seg = list(row.get("segment_ids") or [0] * len(tokens))[:len(tokens)]
    segs.extend(int(s) for s in seg + [0] * (len(tokens) - len(seg)))
    lengths.append(len(tokens))
    nsp.append(int(row.get("is_random_next") or 0))
  return (np.asarray(ids, np.int32), np.asarray(segs, np.int32),
          np.asarray(lengths, np.int64), np.asarray(nsp, np.int32))


def static_features(rows: Sequence[dict], msl: int, max_pred: int,
                    where: str) -> Tuple[np.ndarray, ...]:
  """create_csv_static_masking.py rows -> token_ids, padding_mask, segment_ids [B, S],
  masked_lm_positions, masked_lm_ids [B, P] int32, masked_lm_weights [B, P] float32,
  next_sentence_label [B] int32. Raises DataError for rows written for another S or P."""
  def column(name, length, dtype=np.int32, default=None):
    out = []
    for row in rows:
      v = row.get(name, default)
      v = [v] if not isinstance(v, (list, tuple)) else v
      if length and len(v) != length:
        what = "max_sequence_length" if length == msl else "max_predictions_per_seq"
        raise DataError(f"{where}: column {name} holds {len(v)} values, but {what} is "
                        f"{length}: set it to {len(v)}, or write the data for {length}")
      out.append(v)
    return np.asarray(out, dtype)
  b = len(rows)
  return (column("input_ids", msl), column("attention_mask", msl),
          column("token_type_ids", msl, default=[0] * msl),
          column("masked_lm_positions", max_pred), column("labels", max_pred),
          column("masked_lm_weights", max_pred, np.float32, [1.0] * max_pred),
          column("next_sentence_label", 0, default=0).reshape(b))
