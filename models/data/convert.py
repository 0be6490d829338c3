"""A user's own text -> the reference input_fns' TFRecords.

BERT pretraining text comes as google-research/bert's create_pretraining_data.py reads it:
one sentence per line, a blank line between documents. It becomes next-sentence pairs (half
of them true successors, half a sentence from another document), written as the prepared
corpus is (`text_a`, `text_b`, `next_sentence_label`); the BERT input_fn tokenizes and masks
them on the fly, so every epoch sees fresh masks. Whole documents are held out for eval.
Free of TensorFlow until the records are written (as acquire.py is).
"""

import glob
import os
import random
from typing import Dict, List, Sequence, Tuple

from cerebras_tf.errors import DataError
from cerebras_models.data import acquire

Document = Tuple[str, List[str]]  # (name, sentences)


def read_documents(paths: Sequence[str]) -> List[Document]:
  """Documents of the files at `paths`: runs of non-blank lines; a file ends a document."""
  docs: List[Document] = []
  for path in paths:
    sents: List[str] = []
    try:
      with open(path, encoding="utf-8") as f:
        for line in f:
          line = line.strip()
          if line:
            sents.append(line)
          elif sents:
            docs.append((f"{path}#{len(docs)}", sents))
            sents = []
    except UnicodeDecodeError as e:
      raise DataError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start}); convert it "
                      f"(iconv -t utf-8) or leave it out of the pattern") from e
    except OSError as e:
      raise DataError(f"cannot read {path}: {e}") from e
    if sents:
      docs.append((f"{path}#{len(docs)}", sents))
  return docs


def split_documents(docs: Sequence[Document], eval_fraction: float, seed: int):
  """(train, eval) with whole documents held out; eval is empty when too few documents
  would be left to pair (each split needs two: a random next sentence is from another)."""
  order = list(range(len(docs)))
  random.Random(seed).shuffle(order)
  n_eval = round(eval_fraction * len(docs))
  if n_eval:
    n_eval = max(n_eval, 2)
  if len(docs) - n_eval < 2:
    n_eval = 0
  held = set(order[:n_eval])
  return ([d for i, d in enumerate(docs) if i not in held],
          [d for i, d in enumerate(docs) if i in held])


def text_to_bert(pattern: str, out_dir: str, eval_fraction: float = 0.05, seed: int = 0,
                 progress=True) -> Dict[str, int]:
  """Writes <out_dir>/train.tfrecord (and eval.tfrecord when documents are held out) of
  next-sentence pairs from the text files matching `pattern`; returns path -> pairs."""
  paths = sorted(p for p in glob.glob(pattern) if os.path.isfile(p))
  if not paths:
    raise DataError(f"--text_to_bert {pattern} matches no file; fix the pattern")
  docs = read_documents(paths)
  if len(docs) < 2:
    raise DataError(f"{pattern} holds {len(docs)} document(s): next-sentence pairs need at "
                    f"least two (separate documents by a blank line)")
  train, held = split_documents(docs, eval_fraction, seed)
  prog = progress if isinstance(progress, acquire.Progress) else acquire.Progress(bool(progress))
  feats = {"text_a": "bytes", "text_b": "bytes", "next_sentence_label": "int64"}
  counts = {}
  for split, part in (("train", train), ("eval", held)):
    if not part:
      continue
    pairs = acquire.nsp_pairs(part, random.Random(f"{seed}-{split}"))
    if not pairs:
      raise DataError(f"the {split} documents of {pattern} have no two consecutive sentences: "
                      f"write one sentence per line")
    random.Random(f"{seed}-{split}-order").shuffle(pairs)
    counts.update(acquire.write_tfrecord(os.path.join(out_dir, f"{split}.tfrecord"), pairs,
                                         feats, prog, f"{split}.tfrecord"))
  prog.step(f"  documents: {len(train)} train, {len(held)} eval (held out whole)")
  return counts
