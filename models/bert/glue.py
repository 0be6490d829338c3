"""Tab-separated classification data as GLUE and most fine-tuning sets ship it.

A file is `text<TAB>label` or `text_a<TAB>text_b<TAB>label` a line, or has a header that names
its columns the way the GLUE tasks do (SST-2 `sentence label`, QQP `id qid1 qid2 question1
question2 is_duplicate`, RTE `index sentence1 sentence2 label`, MRPC `Quality #1 ID #2 ID
#1 String #2 String`, MNLI `... sentence1 sentence2 ... gold_label`). Labels are integer
classes, or words (RTE's `entailment`), numbered in sorted order over the training files,
which is google-research/bert's order for MNLI, RTE and QNLI. The layout is read from a
file's first lines, before training, so the wrong column never trains silently.
"""

import functools
import re
from typing import List, NamedTuple, Optional, Sequence, Tuple

import tensorflow as tf

from cerebras_tf.errors import DataError
from cerebras_models.data import formats

# Header names of the text columns (one or a pair) and of the label, most specific first.
TEXT_COLUMNS = (("sentence1", "sentence2"), ("question1", "question2"),
                ("#1 String", "#2 String"), ("premise", "hypothesis"), ("question", "sentence"),
                ("text_a", "text_b"), ("sentence",), ("text",))
LABEL_COLUMNS = ("label", "gold_label", "Quality", "is_duplicate")
_INT = re.compile(r"-?\d+")


class Layout(NamedTuple):
  """Where one file's fields are. header: line 1 names the columns (skipped);
  text: the column(s) of the sentence or pair; label: the label's column; columns: how many."""
  header: bool
  text: Tuple[int, ...]
  label: int
  columns: int


def _named(path: str, names: List[str]) -> Layout:
  label = next((names.index(n) for n in LABEL_COLUMNS if n in names), None)
  text = next((tuple(names.index(n) for n in group) for group in TEXT_COLUMNS
               if all(n in names for n in group)), None)
  if (label is None or text is None) and len(names) == 2:
    return Layout(True, (0,), 1, 2)  # "review<TAB>sentiment": text, then label
  if label is None or text is None:
    raise DataError(f"{path}:1 names columns {', '.join(names)}, and BERT classification "
                    f"cannot tell which hold the text and the label: name them sentence (or "
                    f"sentence1 and sentence2) and label")
  return Layout(True, text, label, len(names))


def _is_header(fields: List[str], following: Optional[List[str]]) -> bool:
  """Line 1 names columns when a field is a known column name, or when its last field is a
  word above integer labels ("review<TAB>sentiment" over "...<TAB>1")."""
  names = {n for group in TEXT_COLUMNS for n in group} | set(LABEL_COLUMNS)
  if any(f.strip() in names for f in fields):
    return True
  return (len(fields) >= 2 and not _INT.fullmatch(fields[-1].strip()) and
          following is not None and _INT.fullmatch(following[-1].strip()) is not None)


def file_layout(path: str, section_name: str) -> Layout:
  """The columns of one file, from its first lines; refuses a line that does not fit them,
  naming the file and line."""
  lines = list(formats.tsv_head(path))
  if not lines:
    raise DataError(f"{path} has no lines; remove it or narrow {section_name}.file_pattern")
  number, fields = lines[0]
  if number == 1 and _is_header(fields, lines[1][1] if len(lines) > 1 else None):
    found = _named(path, [f.strip() for f in fields])
    lines = lines[1:]
  elif len(fields) in (2, 3):
    found = Layout(False, tuple(range(len(fields) - 1)), len(fields) - 1, len(fields))
  elif len(fields) == 1 and "," in fields[0]:
    raise DataError(f"{path}:{number} has commas and no tab: it looks like CSV, and BERT "
                    f"classification reads tab-separated lines (sentence<TAB>label, a pair, "
                    f"or a header naming the columns); write the file with tabs")
  else:
    raise DataError(
        f"{path}:{number} is not sentence<TAB>label or sentence1<TAB>sentence2<TAB>label: "
        f"BERT classification reads tab-separated lines"
        f"{f' ({len(fields)} columns here)' if len(fields) > 1 else ''}; give the file a "
        f"header naming its columns (sentence, or sentence1 and sentence2, and label), or "
        f"fix it or {section_name}.file_pattern")
  for number, fields in lines:
    if len(fields) != found.columns:
      raise DataError(f"{path}:{number} has {len(fields)} tab-separated field(s) where the "
                      f"file's {'header' if found.header else 'first line'} has "
                      f"{found.columns}: BERT classification reads sentence<TAB>label (or a "
                      f"pair, or a header naming the columns); fix the line or "
                      f"{section_name}.file_pattern")
  return found


def layout(files: Sequence[str], section_name: str) -> Tuple[Layout, List[int]]:
  """The columns all `files` share, and the lines to skip at the start of each (its header)."""
  layouts = [file_layout(path, section_name) for path in files]
  first = layouts[0]
  for path, other in zip(files[1:], layouts[1:]):
    if other[1:] != first[1:]:
      raise DataError(f"{files[0]} and {path} have their columns in different places; "
                      f"narrow {section_name}.file_pattern to files of one layout")
  return first, [int(l.header) for l in layouts]


@functools.lru_cache(maxsize=32)
def _labels(files: Tuple[str, ...], stamps: Tuple[Tuple[int, int], ...]) -> Tuple[str, ...]:
  del stamps  # the cache key: a rewritten file is read again
  shape, skips = layout(files, "train_input")
  seen = set()
  for path, skip in zip(files, skips):
    with tf.io.gfile.GFile(path) as f:
      for number, line in enumerate(f, 1):
        if number > skip and line.strip():
          fields = line.rstrip("\r\n").split("\t")
          if len(fields) > shape.label:
            seen.add(fields[shape.label].strip())
  return tuple(sorted(seen))


def label_names(files: Sequence[str]) -> Optional[Tuple[str, ...]]:
  """The classes, in id order, when the (training) files label with words; None when their
  labels are integers (the class ids themselves)."""
  shape, _ = layout(files, "train_input")
  for _, fields in formats.tsv_head(files[0]):
    value = fields[shape.label].strip() if len(fields) > shape.label else ""
    if value and not _INT.fullmatch(value) and value not in LABEL_COLUMNS:
      stamps = tuple((s.length, s.mtime_nsec) for s in map(tf.io.gfile.stat, files))
      return _labels(tuple(files), stamps)
  return None


def parse(rows: tf.Tensor, shape: Layout, names: Optional[Sequence[str]]
          ) -> Tuple[List[tf.Tensor], tf.Tensor]:
  """[B] lines -> ([B] text per text column, [B] int32 label). A word label not among
  `names` becomes -1 (the input asserts labels are >= 0)."""
  fields = tf.strings.split(rows, "\t").to_tensor(default_value="", shape=[None, shape.columns])
  texts = [fields[:, i] for i in shape.text]
  raw = tf.strings.strip(fields[:, shape.label])
  if names is None:
    return texts, tf.strings.to_number(raw, tf.int32)
  table = tf.lookup.StaticHashTable(
      tf.lookup.KeyValueTensorInitializer(tf.constant(list(names)),
                                          tf.range(len(names), dtype=tf.int32)), -1)
  return texts, table.lookup(raw)
