"""VTS token counts: how much of each padded sequence is real, measured from the input data.

With variable tensor shape (csconfig.vts) the engine spends time only on a batch's real
tokens, so the performance model needs
    token_fraction    = sum(len)   / sum(L)      (position-wise layers scale by this)
    token_sq_fraction = sum(len^2) / sum(L^2)    (token-pair work: attention scores, context)
over the training data, where len is a sequence's real length and L the COMPILED static length
(the placeholder's shape, e.g. max_source_length), not the length a batch was padded to.

Where the lengths come from, in order (`find_length_sources`):
  1. padding masks: [B, L] features named `*mask` (padding_mask, input_mask, attention_mask,
     source_padding_mask...) whose L is the length of a [B, L] integer (token) feature;
     a sequence's length is its count of non-zero mask entries;
  2. length features: [B] integer features named `*length(s)` / `*len(s)`, for streams that
     have no mask; L is that of the [B, L] feature with the same name prefix (source_lengths
     -> source_ids), else the compiled sequence length;
  3. token ids: [B, L] integer features named `*ids` (not segment/type/position ids) at the
     compiled sequence length, counting ids != 0 (pad id 0).
Several sources (an encoder-decoder's source and target) are pooled into one pair of
fractions: real tokens over padded positions of all streams together. See `pool`.

Everything here is numpy except `measure`, which imports TensorFlow when called.
"""

import dataclasses
import re
from typing import Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

MASK, LENGTHS, IDS = "mask", "lengths", "ids"
# Default sample. Sequence lengths vary by about half their mean (en-es: sd 0.45 x mean), so
# 5,000 sequences pin token_fraction to about 0.6% (one standard error) in a few seconds; 20,000
# (0.3%) took 23 s on the 2 shared cores, most of a small model's compile.
MAX_SEQUENCES = 5_000
MAX_BATCHES = 1_000

_MASK_RE = re.compile(r"mask$", re.I)
_MASK_SUFFIX = re.compile(r"_?(padding_|input_|attention_|pad_)?mask$", re.I)
_LEN_RE = re.compile(r"(^|_)(seq(uence)?_?)?(lengths?|lens?)$", re.I)
_IDS_RE = re.compile(r"ids$", re.I)
_NOT_TOKEN_IDS = re.compile(r"(segment|type|position|pos)_?ids$", re.I)
_IDS_SUFFIX = re.compile(r"_?(input_|token_)?ids$", re.I)

LOOKED_FOR = ("a [batch, length] padding-mask feature named *mask, a [batch] integer feature "
              "named *length(s)/*len(s), or [batch, length] integer token ids named *ids "
              "(pad id 0)")


@dataclasses.dataclass(frozen=True)
class LengthSource:
  """One input feature the compiler reads sequence lengths from."""

  feature: str   # captured input name, e.g. "features/source_padding_mask"
  kind: str      # MASK | LENGTHS | IDS
  seq_len: int   # the compiled static length L the lengths are relative to


@dataclasses.dataclass(frozen=True)
class TokenStats:
  """Running sums for one length source."""

  sequences: int = 0
  real_tokens: int = 0
  padded_tokens: int = 0
  real_sq: int = 0
  padded_sq: int = 0

  @property
  def token_fraction(self) -> float:
    return self.real_tokens / self.padded_tokens if self.padded_tokens else 1.0

  @property
  def token_sq_fraction(self) -> float:
    return self.real_sq / self.padded_sq if self.padded_sq else 1.0

  def __add__(self, other: "TokenStats") -> "TokenStats":
    return TokenStats(*(a + b for a, b in zip(dataclasses.astuple(self),
                                              dataclasses.astuple(other))))


# --- pure functions -------------------------------------------------------------------------

def lengths_from_mask(mask) -> np.ndarray:
  """[B, l] mask (1/True = real token) -> [B] lengths: the non-zero entries of each row."""
  mask = np.asarray(mask)
  return np.count_nonzero(mask.reshape(mask.shape[0], -1), axis=1).astype(np.int64)


def lengths_from_ids(ids, pad_id: int = 0) -> np.ndarray:
  """[B, l] token ids -> [B] lengths: the ids that are not `pad_id`."""
  ids = np.asarray(ids)
  return np.count_nonzero(ids.reshape(ids.shape[0], -1) != pad_id, axis=1).astype(np.int64)


def lengths_of(source: LengthSource, value) -> np.ndarray:
  """The [B] lengths a batch's value of `source` says."""
  if source.kind == MASK:
    return lengths_from_mask(value)
  if source.kind == IDS:
    return lengths_from_ids(value)
  return np.asarray(value, dtype=np.int64).reshape(-1)


def stats_from_lengths(lengths, seq_len: int) -> TokenStats:
  """Sums for sequences of real `lengths` in a compiled length `seq_len` (clipped to [0, L])."""
  if seq_len <= 0:
    raise ValueError(f"seq_len must be positive, got {seq_len}")
  n = np.clip(np.asarray(lengths, dtype=np.int64).reshape(-1), 0, seq_len)
  return TokenStats(sequences=int(n.size), real_tokens=int(n.sum()),
                    padded_tokens=int(n.size) * seq_len, real_sq=int((n * n).sum()),
                    padded_sq=int(n.size) * seq_len * seq_len)


def token_fractions(lengths, seq_len: int) -> Tuple[float, float]:
  """(token_fraction, token_sq_fraction) = (sum len / (N L), sum len^2 / (N L^2))."""
  s = stats_from_lengths(lengths, seq_len)
  return s.token_fraction, s.token_sq_fraction


def pool(stats: Iterable[TokenStats]) -> TokenStats:
  """One TokenStats for several streams: real tokens over padded positions of them all.

  An encoder-decoder's encoder layers really see the source lengths and its decoder layers the
  target lengths (cross-attention both). The IR gives every layer one fraction, and with tied
  embeddings one layer serves both streams, so the compiler pools them: each layer is costed
  at the average over all padded positions. The note in the report lists each stream's own
  fraction so the spread is visible.
  """
  total = TokenStats()
  for s in stats:
    total = total + s
  return total


# --- finding the sources (pure: names, shapes, dtypes) ----------------------------------------

def _leaf(name: str) -> str:
  return name.rsplit("/", 1)[-1]


def _is_int(dtype: str) -> bool:
  return dtype.startswith(("int", "uint"))


def find_length_sources(inputs: Mapping[str, Tuple[Sequence[Optional[int]], str]],
                        seq_len: int) -> List[LengthSource]:
  """Where the lengths come from (see the module docstring); [] when nowhere.

  Args:
    inputs: captured input name ("features/...", "labels") -> (static shape, dtype name).
    seq_len: the compiled sequence length (the longest [B, L] integer feature).
  """
  feats = {n: (list(s), d) for n, (s, d) in inputs.items() if n.startswith("features")}
  token_lens = {s[1] for s, d in feats.values() if len(s) == 2 and _is_int(d) and s[1]}
  masks = [LengthSource(n, MASK, int(s[1])) for n, (s, d) in sorted(feats.items())
           if len(s) == 2 and s[1] and _MASK_RE.search(_leaf(n)) and d != "string"
           and (not token_lens or s[1] in token_lens)]
  streams = {_MASK_SUFFIX.sub("", _leaf(m.feature)) for m in masks}
  out = list(masks)
  for n, (s, d) in sorted(feats.items()):
    if len(s) != 1 or not _is_int(d) or not _LEN_RE.search(_leaf(n)):
      continue
    stream = _LEN_RE.sub("", _leaf(n))
    if stream in streams:
      continue  # a mask already says it
    paired = [s2[1] for n2, (s2, d2) in feats.items() if len(s2) == 2 and _is_int(d2)
              and s2[1] and stream and _leaf(n2).startswith(stream)]
    length = max(paired) if paired else seq_len
    if length > 0:
      out.append(LengthSource(n, LENGTHS, int(length)))
      streams.add(stream)
  if out or seq_len <= 0:
    return out
  return [LengthSource(n, IDS, int(s[1])) for n, (s, d) in sorted(feats.items())
          if len(s) == 2 and _is_int(d) and s[1] == seq_len and _IDS_RE.search(_leaf(n))
          and not _NOT_TOKEN_IDS.search(_leaf(n))]


def describe(sources: Sequence[LengthSource], stats: Sequence[TokenStats]) -> str:
  """One line for the report: which features, how many sequences, each stream's fraction."""
  parts = []
  for src, st in zip(sources, stats):
    name = src.feature.replace("features/", "features['", 1) + "']" \
        if src.feature.startswith("features/") else src.feature
    how = {MASK: "mask", LENGTHS: "lengths", IDS: "ids != 0"}[src.kind]
    parts.append(f"{name} ({how}, L={src.seq_len}: token_fraction {st.token_fraction:.3f})")
  n = max((st.sequences for st in stats), default=0)
  return f"lengths from {', '.join(parts)} over {n:,} training sequences"


# --- reading the data (TensorFlow) ------------------------------------------------------------
