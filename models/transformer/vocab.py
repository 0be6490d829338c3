"""Shared source+target WordPiece vocabulary: built once from the training data, cached.

The vocabulary is tensorflow-text's WordPiece learner's (`bert_vocab_from_dataset`, token for
token; `build_vocab`) over both sides of the training pairs (one vocabulary, so source and
target can share an embedding table). It is cached beside the training data as
`vocab/wordpiece_<sha256 of the training files>[:16]_v<size>.txt` (`<data_dir>/en_es/vocab/`
for the prepared corpus; under ~/.cache/cerebras_tf/vocab when that directory is read-only);
new training data or another size gives another file, so a stale vocabulary is never reused.

Tokenization keeps case and accents (`lower_case=False`): BLEU is case-sensitive and Spanish
accents carry meaning. Ids 0-3 are the reserved tokens below; [PAD] is 0 so padding masks are
`ids != 0`.
"""

import contextlib
import fcntl
import functools
import hashlib
import inspect
import os
import re
import threading
from typing import Callable, Dict, List, Optional, Sequence, Union

import tensorflow as tf
import tensorflow_text as tft

from cerebras_tf.errors import DataError
from cerebras_models.data import formats

PAD, UNK, START, END = "[PAD]", "[UNK]", "[START]", "[END]"
RESERVED = (PAD, UNK, START, END)
PAD_ID, UNK_ID, START_ID, END_ID = 0, 1, 2, 3
# Keep case and accents; split punctuation (the BERT basic tokenizer does that).
TOKENIZER_PARAMS = dict(lower_case=False)

graph_fn = tf.autograph.experimental.do_not_convert


Files = Union[str, Sequence[str]]


def files_sha256(paths: Files) -> str:
  """sha256 of the files' contents, in order (one file: that file's sha256)."""
  paths = [paths] if isinstance(paths, str) else list(paths)
  if len(paths) == 1:
    return _file_sha256(paths[0], *_stamp(paths[0]))
  h = hashlib.sha256()
  for path in paths:
    h.update(bytes.fromhex(_file_sha256(path, *_stamp(path))))
  return h.hexdigest()


def _stamp(path: str):
  stat = tf.io.gfile.stat(path)
  return stat.length, stat.mtime_nsec


@functools.lru_cache(maxsize=256)
def _file_sha256(path: str, length: int, mtime_nsec: int) -> str:
  """Hashed once per (file, size, time): the input_fn and model_fn of each train and eval
  call ask, and a user's corpus may be gigabytes."""
  del length, mtime_nsec  # the cache key: a rewritten file is hashed again
  h = hashlib.sha256()
  with tf.io.gfile.GFile(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      h.update(chunk)
  return h.hexdigest()


def cache_path(train_files: Files, vocab_size: int, cache_dir: Optional[str] = None) -> str:
  """Where the vocabulary for (the training files' contents, vocab_size) lives."""
  first = train_files if isinstance(train_files, str) else train_files[0]
  cache_dir = cache_dir or os.path.join(os.path.dirname(os.path.abspath(first)), "vocab")
  return os.path.join(cache_dir, "wordpiece_%s_v%d.txt" % (files_sha256(train_files)[:16],
                                                           vocab_size))


def record_strings(train_files: Files, keys: Sequence[str] = ("en", "es")) -> tf.data.Dataset:
  """The `keys` string features of TFRecords, one string per element."""
  spec = {k: tf.io.FixedLenFeature([], tf.string) for k in keys}
  ds = tf.data.TFRecordDataset(train_files).batch(1024)
  ds = ds.map(lambda s: tf.io.parse_example(s, spec))
  return ds.flat_map(lambda ex: tf.data.Dataset.from_tensor_slices(
      tf.concat([ex[k] for k in keys], 0)))


def build_vocab(strings: tf.data.Dataset, vocab_size: int) -> List[str]:
  """Learns a WordPiece vocabulary of about `vocab_size` tokens from a dataset of strings:
  tensorflow-text's `bert_vocab_from_dataset` (its tokenizer, word counts and learner
  functions), the same vocabulary token for token, with its binary search's
  threshold-independent first pass counted once (`_Learner`)."""
  # pylint: disable=import-outside-toplevel
  from tensorflow_text.python.ops import bert_tokenizer
  from tensorflow_text.tools.wordpiece_vocab import wordpiece_tokenizer_learner_lib as learner
  if strings.element_spec.shape.rank == 0:
    # The builder counts words one dataset element at a time in Python; a batch per element
    # gives the same counts (so the same vocabulary) in a tenth of the time (en_es: 15 s ->
    # 1.5 s), as tensorflow-text's guide batches it.
    strings = strings.batch(1024)
  tokenizer = bert_tokenizer.BasicTokenizer(**TOKENIZER_PARAMS)
  word_counts = learner.count_words(strings.map(tokenizer.tokenize))
  return _Learner(learner, list(word_counts.items()), vocab_size, list(RESERVED)).learn()


class _Learner:
  """tensorflow-text's `wordpiece_tokenizer_learner_lib.learn` at its default parameters, the
  same vocabulary token for token, with each pass counted in time linear in the words.

  The library binary-searches the count threshold (en_es at 8,000 tokens: 17 thresholds) and
  at each one makes `num_iterations` passes over every word. A pass counts, from each start a
  word's current tokenization allows, every prefix of the rest of the word, then walks the
  counts longest first and takes each token's count from all its shorter prefixes. What is
  left of a substring's count is exactly the (weighted) number of starts whose rest of the
  word *is* that substring: its count c(s) is the starts whose rest begins with s, and by
  induction from the longest, each longer extension t of s is left with e(t), the starts
  whose rest is t; c(s) minus all of those is e(s). So a pass here counts the rest of the
  word once per start (what `_subtoken_counts` returns), not all its prefixes; the tokens
  kept at a threshold (count >= threshold, threshold >= 1) and their counts are the
  library's. The order the library met them in does not matter: its final vocabulary sorts
  by count, then by token, and its splitting only asks whether a token is in the set.
  The first pass does not depend on the threshold and is counted once for the whole search.
  en_es at 8,000 tokens: 55 s of CPU with the library's pass (its first counted once), 13 s
  with this one, 10.6 s with its splits bounded by the longest token (`_Splitter`; 12.9 s
  before it, the Intel host), the same file; tests compare the result with the library's `learn`.
  """

  def __init__(self, lib, word_counts, vocab_size: int, reserved_tokens: List[str]):
    self.lib = lib
    defaults = {k: v.default for k, v in inspect.signature(lib.learn).parameters.items()
                if v.default is not inspect.Parameter.empty}
    self.params = lib.Params(
        defaults["upper_thresh"], defaults["lower_thresh"], defaults["num_iterations"],
        defaults["max_input_tokens"], defaults["max_token_length"],
        defaults["max_unique_chars"], vocab_size, defaults["slack_ratio"],
        defaults["include_joiner_token"], defaults["joiner"], reserved_tokens)
    p = self.params
    self.upper, self.lower = lib.get_search_threshs(word_counts, p.upper_thresh, p.lower_thresh)
    all_counts = lib.get_input_words(word_counts, p.reserved_tokens, p.max_token_length)
    allowed = lib.get_allowed_chars(all_counts, p.max_unique_chars)
    self.words = lib.filter_input_words(all_counts, allowed, p.max_input_tokens)
    self.chars = lib.extract_char_tokens(self.words)
    self.first_pass = None  # {token: count} of the first iteration

  def learn(self) -> List[str]:
    """The library's learn_binary_search, as a loop."""
    p, lower, upper = self.params, self.lower, self.upper
    slack = max(p.slack_ratio * p.vocab_size, 0)
    while True:
      thresh = (upper + lower) // 2
      vocab = self.learn_with_thresh(thresh)
      size = len(vocab)
      if (size <= p.vocab_size and p.vocab_size - size <= slack) or lower >= upper \
          or thresh <= 1:
        return vocab
      if size > p.vocab_size:
        lower = thresh + 1
      else:
        upper = thresh - 1

  def learn_with_thresh(self, thresh: int) -> List[str]:
    """The library's learn_with_thresh."""
    lib, p, chars = self.lib, self.params, self.chars
    tokens = lib.ensure_all_tokens_exist(chars, {}, p.include_joiner_token, p.joiner)
    for iteration in range(p.num_iterations):
      if iteration == 0:
        if self.first_pass is None:
          self.first_pass = self._subtoken_counts(None)
        counts = self.first_pass
      else:
        counts = self._subtoken_counts(tokens)
      tokens = lib.ensure_all_tokens_exist(
          chars, {token: count for token, count in counts.items() if count >= thresh},
          p.include_joiner_token, p.joiner)
    return lib.generate_final_vocabulary(p.reserved_tokens, chars, tokens)

  def _subtoken_counts(self, tokens) -> Dict[str, int]:
    """One pass: {the rest of a word from a start: its count}, the starts being the split
    points `tokens` allow (every position without `tokens`), the rest after the first start
    with the joiner in front: the counts the library's pass leaves (class docstring)."""
    p = self.params
    joiner = p.joiner if p.include_joiner_token else ""
    if tokens is not None:
      splitter = _Splitter(tokens, joiner)
    counts: Dict[str, int] = {}
    for word, count in self.words:
      if tokens is None:
        starts = range(len(word))
      else:
        splits = splitter.split_indices(word)
        if not splits:
          continue
        starts = [0] + splits[:-1]
      for start in starts:
        rest = joiner + word[start:] if start and joiner else word[start:]
        counts[rest] = counts.get(rest, 0) + count
    return counts


class _Splitter:
  """tensorflow-text's learner `get_split_indices(word, tokens, joiner != "", joiner)`, the same
  split points, without trying substrings longer than any token: the library tries every end
  from the word's last character down (each a new string, the joiner prepended after the first
  start), which was 2/3 of the learner's time (en_es: 2.2M words split over 51 passes)."""

  def __init__(self, tokens, joiner: str):
    self.heads = set(tokens)  # what a word's first piece may be
    # What a later piece may be, without the joiner in front.
    self.tails = ({t[len(joiner):] for t in tokens if t.startswith(joiner)} if joiner
                  else self.heads)
    self.max_head = max(map(len, self.heads), default=0)
    self.max_tail = max(map(len, self.tails), default=0)

  def split_indices(self, word: str) -> Optional[List[int]]:
    """The end of each piece of `word` (greedy longest match), or None if a part of it
    matches no token."""
    indices, start, n = [], 0, len(word)
    pieces, longest = self.heads, self.max_head
    while start < n:
      end = min(n, start + longest)
      while end > start and word[start:end] not in pieces:
        end -= 1
      if end == start:
        return None
      indices.append(end)
      start = end
      pieces, longest = self.tails, self.max_tail
    return indices


def _eagerly(fn, *args):
  """fn(*args), executed eagerly: the builder iterates a tf.data.Dataset in Python, which a
  graph (an Estimator's input_fn runs inside one) forbids, and tf.init_scope does not leave a
  plain tf.Graph. A new thread starts eager in TF 2, so it runs there when this one is not."""
  if tf.executing_eagerly():
    return fn(*args)
  out = {}

  def target():
    try:
      out["value"] = fn(*args)
    except BaseException as e:  # pylint: disable=broad-except  # re-raised in the caller
      out["error"] = e

  thread = threading.Thread(target=target, name="build_vocab")
  thread.start()
  thread.join()
  if "error" in out:
    raise out["error"]
  return out["value"]


def user_cache_dir() -> str:
  """Where a vocabulary goes when the data directory is read-only (a shared dataset)."""
  return os.path.join(os.path.expanduser("~"), ".cache", "cerebras_tf", "vocab")


def ensure_vocab(train_files: Files, vocab_size: int, cache_dir: Optional[str] = None,
                 strings: Optional[Callable[[], tf.data.Dataset]] = None) -> str:
  """Path of the cached vocabulary for these training files and size, building it if absent.

  `strings` makes the dataset of texts to learn from (default: both sides of en/es
  TFRecords). Cached beside the data; when that directory is read-only, in `user_cache_dir()`
  (the same file name: it is keyed by the training files' contents)."""
  path = cache_path(train_files, vocab_size, cache_dir)
  fallback = os.path.join(user_cache_dir(), os.path.basename(path))
  for found in (path, fallback):
    if tf.io.gfile.exists(found):
      return found
  with _one_learner(path, fallback):
    for found in (path, fallback):  # learned by the process this one waited for
      if tf.io.gfile.exists(found):
        return found
    return _learn(train_files, vocab_size, path, fallback, strings)


@contextlib.contextmanager
def _one_learner(path: str, fallback: str):
  """Holds an flock beside `path` (beside `fallback` when path's directory is read-only or
  remote) while the vocabulary is learned, so processes that start together on fresh data
  (the workers of a multi-worker run, a test suite's workers) learn it once, not each: the
  learning took a minute of one core (en_es at 8,000 tokens: 65 s; 13 s since each pass counts
  linearly, `_Learner`)."""
  for where in (path, fallback):
    if "://" in where:
      continue
    try:
      os.makedirs(os.path.dirname(where), exist_ok=True)
      fh = open(where + ".lock", "a")  # pylint: disable=consider-using-with
    except OSError:  # read-only: try the next place
      continue
    with fh:
      try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        tf.compat.v1.logging.info("cerebras_tf: another process is learning the vocabulary %s; "
                                  "waiting for it", path)
        fcntl.flock(fh, fcntl.LOCK_EX)
      yield
      return
  yield  # nowhere local to lock: learn unserialized (the write is atomic either way)


def _learn(train_files: Files, vocab_size: int, path: str, fallback: str,
           strings: Optional[Callable[[], tf.data.Dataset]]) -> str:
  tf.compat.v1.logging.info("cerebras_tf: learning a %d-token WordPiece vocabulary from %s "
                            "(once: it is cached as %s)", vocab_size,
                            train_files if isinstance(train_files, str)
                            else ", ".join(train_files), path)
  make = strings or (lambda: record_strings(train_files))
  tokens = _eagerly(lambda: build_vocab(make(), vocab_size))
  try:
    _write(path, tokens)
  except tf.errors.PermissionDeniedError:
    tf.compat.v1.logging.info("cerebras_tf: %s is read-only: the learned vocabulary goes to %s",
                              os.path.dirname(path), fallback)
    path = fallback
    _write(path, tokens)
  return path


def _write(path: str, tokens: Sequence[str]) -> None:
  tf.io.gfile.makedirs(os.path.dirname(path))
  tmp = "%s.tmp%d" % (path, os.getpid())
  with tf.io.gfile.GFile(tmp, "w") as f:
    f.write("".join(t + "\n" for t in tokens))
  tf.io.gfile.rename(tmp, path, overwrite=True)  # atomic: concurrent builders cannot tear it


def read_vocab(path: str) -> List[str]:
  tokens = formats.vocab_tokens(path)
  if tuple(tokens[:len(RESERVED)]) != RESERVED:
    raise DataError(f"vocab file {path} starts with {' '.join(tokens[:len(RESERVED)])}, not "
                    f"{' '.join(RESERVED)}: the Transformer's ids 0-3 are padding, unknown, "
                    f"decoder start and end; leave train_input.vocab_file unset (a vocabulary "
                    f"is learned from your training data and cached) or put those four first")
  return tokens


class Tokenizer:
  """In-graph WordPiece tokenize / detokenize over a vocabulary held as graph constants.

  The vocabulary is a constant in the graph (not an asset file), so an exported SavedModel
  is self-contained. Build it inside the graph that uses it (input_fn, model_fn).
  """

  def __init__(self, tokens: Sequence[str]):
    self.tokens = list(tokens)
    self.vocab_size = len(self.tokens)
    keys = tf.constant(self.tokens)
    table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(keys, tf.range(self.vocab_size, dtype=tf.int64)),
        default_value=UNK_ID)
    self._id_to_token = keys
    self._tokenizer = tft.BertTokenizer(table, token_out_type=tf.int64, unknown_token=UNK,
                                        **TOKENIZER_PARAMS)

  def tokenize(self, texts):
    """[B] strings -> ragged [B, (t)] int64 ids."""
    return self._tokenizer.tokenize(texts).merge_dims(-2, -1)

  def detokenize(self, ids):
    """[B, T] int ids (stops at the first [END]; [PAD]/[START] dropped) -> [B] strings."""
    ids = tf.cast(ids, tf.int64)
    # Everything from the first [END] on is dropped.
    alive = tf.math.cumprod(tf.cast(tf.not_equal(ids, END_ID), tf.int64), axis=-1)
    keep = tf.logical_and(tf.cast(alive, tf.bool), ids > END_ID)
    ragged = tf.ragged.boolean_mask(ids, keep)
    words = tf.gather(self._id_to_token, ragged)
    text = tf.strings.reduce_join(words, axis=-1, separator=" ")
    return detokenize_text(text)


def detokenize_text(text):
  """Joins '##' pieces and undoes punctuation splitting (tensor or python strings)."""
  rules = ((r" ##", ""), (r" ([.,;:!?)\]»])", r"\1"), (r"([¿¡(\[«]) ", r"\1"))
  if isinstance(text, str):
    for pattern, repl in rules:
      text = re.sub(pattern, repl, text)
    return text.strip()
  for pattern, repl in rules:
    text = tf.strings.regex_replace(text, pattern, repl)
  return tf.strings.strip(text)
