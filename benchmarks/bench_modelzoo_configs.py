"""Cerebras modelzoo's TensorFlow params files, compiled as written.

Collects every distinct `*.yaml` under a `tf/` folder in the whole history of a fetched
Cerebras/modelzoo repository (a bare git dir or a checkout; deduplicated by content), and
compiles each through the path of `scripts/run.py --params FILE --compile_only` (cli.load then
runner.run), in --jobs worker processes. Only the data paths are changed: each input section's
`data_dir` and `vocab_file` point at this machine's prepared data (CEREBRAS_TF_DATA_DIR:
bert_pretrain, vocab), since modelzoo's point at its own cluster; a UNet file's `dataset_path`
(DAGM 2007, Severstal: no segmentation set here) gets `synthetic: true` beside it. A file is
never edited otherwise: its family comes from what it holds (no model.name is added).

Prints the counts, one row per file (file, family inferred, result or the one-line refusal;
the predicted samples/s on the rows that compile) and the host CPU.

Speed (what a file checks is the same either way): `--jobs 2` (the default) compiles in two
worker processes of this script, each one TensorFlow process for its share of the files (the
versions of one path together, so a version whose params equal another's is not compiled
twice); on a shared machine two processes also get twice the CPU share. A compile's wafer.png
is not drawn (`--wafer_png` draws it): the bench reads no picture. BERT's NER, SQuAD, BertSum
and TAPE files read synthetic input (`synthetic: true`): their data sets are not in the cache.

    nice python benchmarks/bench_modelzoo_configs.py --modelzoo_src /path/to/modelzoo.git
    ... --only gpt2 --limit 5     # a subset first
"""

import argparse
import collections
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import time

from common import ROOT, machine, print_table, quiet_tf  # noqa: F401

import yaml  # noqa: E402

from cerebras_tf import cli, runner
from cerebras_tf.modelzoo import tf_files  # noqa: E402
from cerebras_tf.engine import report  # noqa: E402
from cerebras_tf.errors import CerebrasTFError  # noqa: E402

TF_YAML = re.compile(r"(^|/)tf/.*\.ya?ml$")
SYNTHETIC_TASKS = ("token_classification", "question_answering", "extractive_summarization",
                   "regression")


def git(src: str, *args: str) -> str:
  return subprocess.run(["git", "--git-dir", _git_dir(src), *args], check=True,
                        capture_output=True, text=True).stdout


def _git_dir(src: str) -> str:
  dot_git = os.path.join(src, ".git")
  return dot_git if os.path.isdir(dot_git) else src


def collect(src: str):
  """[(path, blob, commit)]: each distinct TF yaml (by content) with the first commit (newest
  first) and path that hold it."""
  seen, out = set(), []
  for commit in git(src, "rev-list", "--all").split():
    for line in git(src, "ls-tree", "-r", commit).splitlines():
      meta, path = line.split("\t", 1)
      blob = meta.split()[2]
      if TF_YAML.search(path) and blob not in seen:
        seen.add(blob)
        out.append((path, blob, commit))
  return sorted(out)


def extract(src: str, commit: str, root: str) -> str:
  """The commit's TF yaml files under root/<commit>/ (a fine-tuning file names its
  pretraining file by a relative pretrain_params_path)."""
  where = os.path.join(root, commit[:12])
  if not os.path.isdir(where):
    for line in git(src, "ls-tree", "-r", commit).splitlines():
      meta, path = line.split("\t", 1)
      if TF_YAML.search(path):
        os.makedirs(os.path.join(where, os.path.dirname(path)), exist_ok=True)
        with open(os.path.join(where, path), "w", encoding="utf-8") as f:
          f.write(git(src, "cat-file", "-p", meta.split()[2]))
  return where


def family_of(path: str) -> str:
  try:
    with open(path, encoding="utf-8") as f:
      raw = yaml.safe_load(f)
  except yaml.YAMLError:
    return "?"
  if isinstance(raw, list) and raw and isinstance(raw[0], dict):
    raw = raw[0]
  if isinstance(raw, dict) and isinstance(raw.get("model"), dict) and raw["model"].get("name"):
    return str(raw["model"]["name"])
  family = tf_files.infer_family(raw) if isinstance(raw, dict) else None
  return family.name if family else "?"


def data_overrides(path: str, data_dir: str):
  """Each input section's data_dir / vocab_file, where the file sets one, pointed at ours."""
  with open(path, encoding="utf-8") as f:
    raw = yaml.safe_load(f)
  out = []
  if not isinstance(raw, dict):
    return out
  vocab = os.path.join(data_dir, "vocab", "bert_uncased_vocab.txt")
  family = tf_files.infer_family(raw)
  # BERT's NER, SQuAD, BertSum and TAPE tasks: their data sets are not in the data cache.
  synthetic = bool(family and family.task in SYNTHETIC_TASKS)
  for section in ("train_input", "eval_input", "predict_input"):
    keys = raw.get(section) if isinstance(raw.get(section), dict) else {}
    if synthetic and keys:
      out.append(f"{section}.synthetic=true")
    if "data_dir" in keys:
      out.append(f"{section}.data_dir={data_dir}")
    if "vocab_file" in keys:
      out.append(f"{section}.vocab_file={vocab}")
    if "dataset_path" in keys:  # UNet's DAGM / Severstal: not here, synthetic images instead
      out.append(f"{section}.synthetic=true")
    # modelzoo's Transformer: source and target files; ours are one file of en/es pairs
    # (named as both), with the vocabulary learned from it (cached).
    pairs = os.path.join(data_dir, "en_es", ("train" if section == "train_input" else "test")
                         + ".tfrecord")
    out += [f"{section}.{k}={pairs}" for k in ("src_data_dir", "tgt_data_dir") if k in keys]
    out += [f"{section}.{k}=null" for k in ("src_vocab_file", "tgt_vocab_file") if k in keys]
  return out


def _no_picture(path, *args, **kwargs):
  """report.draw_wafer's stand-in: an empty wafer.png (the compile cache lists the file; the
  bench reads no picture, and drawing one is about a fifth of a compile)."""
  del args, kwargs
  open(path, "wb").close()


def _untimed_input(model_fn, params, opts):
  """run.py's estimator, but --compile_only's timing of the host input (seconds of reading
  our stand-in data, not the config) is left out: it says nothing of the file."""
  est = runner.make_estimator(model_fn, params, opts)
  est.time_input = lambda *args, **kwargs: None
  return est


_SEEN: dict = {}  # the validated params of a file compiled already -> its result


def _key(params: dict) -> str:
  """The params without this run's own directories: two files (two versions, say, that differ
  in comments only) with the same key compile the same graph."""
  plain = {s: dict(v) if isinstance(v, dict) else v for s, v in params.items()}
  plain["runconfig"].pop("model_dir", None)
  plain["csconfig"].pop("compile_dir", None)
  return json.dumps(plain, sort_keys=True, default=str)


def compile_one(path: str, data_dir: str, work: str, no_compile: bool = False):
  """(status, text, samples/s or None); status ok / refused / crashed (/ not run)."""
  model_dir = tempfile.mkdtemp(dir=work)
  # One compile_dir for all: files whose graphs are the same (versions that differ in a
  # learning rate, say) share its cache of plans, as run.py's users of one compile_dir do.
  argv = ["run.py", "--params", path, "--compile_only", "--model_dir", model_dir,
          "--compile_dir", os.path.join(work, "cs_compile")]
  for ov in data_overrides(path, data_dir):
    argv += ["--params_override", ov]
  try:
    params, opts = cli.load(argv)
    key = _key(params)
    if no_compile:
      return "not run", "params valid; compile not run (--no_compile)", None
    if key in _SEEN:
      status, text, rate, first = _SEEN[key]
      return status, f"{text} (its params equal {first}'s)", rate
    result = _compile(params, opts)
    _SEEN[key] = (*result, os.path.basename(path))
    return result
  except CerebrasTFError as e:
    return "refused", " ".join(str(e).split()), None


def _compile(params, opts):
  try:
    summary = runner.run(params, opts, estimator_factory=_untimed_input)
  except CerebrasTFError as e:
    return "refused", " ".join(str(e).split()), None
  except Exception as e:  # pylint: disable=broad-except
    message = cli._user_facing_tf_error(e, None)  # pylint: disable=protected-access
    if message:
      return "refused", " ".join(message.split()), None
    return "crashed", f"{type(e).__name__}: {' '.join(str(e).split())[:200]}", None
  perf = getattr(summary.get("compile"), "performance", None)
  rate = getattr(perf, "samples_per_sec", None)
  plan = getattr(summary.get("compile"), "plan", None)
  what = f"compiles ({plan.execution_strategy} on {plan.engine})" if plan else "compiles"
  return "ok", what, rate


def run_files(files, args, work):
  """[{index, row, status, family, rate}] for `files` [(index, path, blob, commit)], compiled
  in this process, one after the other (a row printed to stderr as each is done)."""
  out = []
  for index, path, blob, commit in files:
    local = os.path.join(extract(args.modelzoo_src, commit, work), path)
    family = family_of(local)
    t = time.perf_counter()
    status, text, rate = compile_one(local, args.data_dir, work, args.no_compile)
    sps = f"{rate:,.0f}" if rate and re.search(r"bert_large|gpt2", path) else ""
    text = text.replace(os.path.dirname(local) + "/", "")  # the file's own name is the row's
    row = (f"{path} @{blob[:7]}", family, status, text[:240].replace("|", "/"), sps,
           f"{time.perf_counter() - t:.1f}")
    out.append({"index": index, "row": row, "status": status, "family": family})
    print(f"[{index + 1}/{args.total}] {status:8s} {path}: {text[:160]}"
          + (f" [{rate:,.0f} samples/s]" if rate else ""), file=sys.stderr, flush=True)
    if args.rows_out:  # the rows so far, for a run cut short
      with open(args.rows_out, "a", encoding="utf-8") as f:
        f.write("| " + " | ".join(str(c) for c in row) + " |\n")
  return out


def shares(files, jobs: int):
  """`files` split over `jobs` workers: the versions of one path together (they often have
  equal params: one compile, the others the params cache), the most versions first, each to
  the least loaded worker."""
  groups = collections.defaultdict(list)
  for f in files:
    groups[f[1]].append(f)
  out = [[] for _ in range(jobs)]
  for group in sorted(groups.values(), key=len, reverse=True):
    min(out, key=len).extend(group)
  return [sorted(share) for share in out if share]


def run_workers(files, args):
  """run_files in `args.jobs` processes of this script (each one TensorFlow process for its
  share); their results, merged."""
  work = tempfile.mkdtemp(prefix="bench_modelzoo_jobs_")
  procs = []
  for k, share in enumerate(shares(files, args.jobs)):
    todo, done = os.path.join(work, f"todo{k}.json"), os.path.join(work, f"done{k}.json")
    with open(todo, "w", encoding="utf-8") as f:
      json.dump(share, f)
    argv = [sys.executable, os.path.abspath(__file__), "--modelzoo_src", args.modelzoo_src,
            "--data_dir", args.data_dir, "--worker", todo, done, "--total", str(args.total)]
    argv += ["--rows_out", args.rows_out] if args.rows_out else []
    argv += ["--no_compile"] if args.no_compile else []
    argv += ["--wafer_png"] if args.wafer_png else []
    procs.append((subprocess.Popen(argv), done, share))
  out = []
  for proc, done, share in procs:
    if proc.wait() != 0 or not os.path.exists(done):
      raise SystemExit(f"a worker (files {share[0][0] + 1}.. of its share) exited with "
                       f"{proc.returncode}; its rows are in --rows_out if given")
    with open(done, encoding="utf-8") as f:
      out.extend(json.load(f))
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--modelzoo_src", default=os.environ.get("MODELZOO_SRC"),
                      help="a fetched Cerebras/modelzoo repository (bare git dir or checkout); "
                           "default: $MODELZOO_SRC (how run_all.py passes it)")
  parser.add_argument("--data_dir", default=os.environ.get("CEREBRAS_TF_DATA_DIR",
                                                           os.path.join(ROOT, "data_cache")))
  parser.add_argument("--only", default="", help="only files whose path contains this (or "
                      "one of these, comma-separated)")
  parser.add_argument("--limit", type=int, default=0, help="at most this many files")
  parser.add_argument("--rows_out", default="", help="also append each row to this file "
                      "as it is measured")
  parser.add_argument("--start", type=int, default=1, help="begin at this file (1-based, in "
                      "the listing's order): resumes a run cut short")
  parser.add_argument("--no_compile", action="store_true", help="load and validate each file "
                      "(run.py's refusals, no TensorFlow) but compile none: a file that "
                      "would compile is 'not run'")
  parser.add_argument("--jobs", type=int, default=2, help="worker processes, each one "
                      "TensorFlow process compiling its share of the files (1: all in this "
                      "process)")
  parser.add_argument("--wafer_png", action="store_true", help="also draw each compile's "
                      "wafer.png (a picture the bench never reads; about a fifth of a "
                      "compile's time)")
  parser.add_argument("--worker", nargs=2, metavar=("TODO", "DONE"), help=argparse.SUPPRESS)
  parser.add_argument("--total", type=int, default=0, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if not args.modelzoo_src:
    parser.error("--modelzoo_src (or MODELZOO_SRC) is required: a Cerebras/modelzoo git "
                 "repository, e.g. the `fetch` of github:Cerebras/modelzoo")
  quiet_tf()
  logging.getLogger("cerebras_tf").setLevel(logging.ERROR)
  if not args.wafer_png:
    report.draw_wafer = _no_picture
  if args.worker:
    with open(args.worker[0], encoding="utf-8") as f:
      share = [tuple(x) for x in json.load(f)]
    results = run_files(share, args, tempfile.mkdtemp(prefix="bench_modelzoo_"))
    with open(args.worker[1], "w", encoding="utf-8") as f:
      json.dump(results, f)
    return
  files = [f for f in collect(args.modelzoo_src)
           if any(part in f[0] for part in args.only.split(","))]
  files = files[max(args.start, 1) - 1:]
  if args.limit:
    files = files[:args.limit]
  files = [(i, *f) for i, f in enumerate(files)]
  args.total = len(files)
  t0 = time.perf_counter()
  if args.jobs > 1 and len(files) > 1:
    results = run_workers(files, args)
  else:
    results = run_files(files, args, tempfile.mkdtemp(prefix="bench_modelzoo_"))
  results.sort(key=lambda r: r["index"])
  counts = collections.Counter(r["status"] for r in results)
  families = collections.Counter((r["family"], r["status"]) for r in results)
  rows = [tuple(r["row"]) for r in results]
  total = len(files)
  not_run = f", {counts['not run']} not compiled (--no_compile)" if counts["not run"] else ""
  print_table(f"modelzoo TF configs as written: {counts['ok']} of {total} compile "
              f"({counts['ok'] / max(total, 1):.0%}), {counts['refused']} refused with one line, "
              f"{counts['crashed']} crashed{not_run}; {time.perf_counter() - t0:.0f} s "
              f"({max(args.jobs, 1)} process(es)); host CPU {machine()}",
              ["file @blob", "family (inferred)", "result", "one line", "predicted samples/s",
               "s"], rows)
  print_table("by family", ["family", "compile", "refused", "crashed"],
              [(f, families[(f, 'ok')], families[(f, 'refused')], families[(f, 'crashed')])
               for f in sorted({f for f, _ in families})])


if __name__ == "__main__":
  main()
