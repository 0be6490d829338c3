"""Conformance: tensorflow/estimator's own tests with CerebrasEstimator in place of Estimator.

Runs test files of a tensorflow/estimator checkout (v2.15.0, fetched by whoever runs this; not a
dependency, nothing of it is copied into this repository) three ways, one pytest process at a
time: with the plain tf.estimator.Estimator; with Estimator/RunConfig swapped for
CerebrasEstimator(use_cs=False)/CSRunConfig; and with CerebrasEstimator(use_cs=True). The
tests' assertions are untouched (conformance_plugin.py rebinds the names they use). Prints the
pass counts per file and variant, and every test that passes plainly but not swapped, with its
error; "crashes" counts failures raised inside cerebras_tf by an error that is not one of its
own (a refusal names its reason; a crash is a bug).

    git clone -b v2.15.0 --depth 1 https://github.com/tensorflow/estimator /tmp/estimator
    python benchmarks/bench_estimator_conformance.py --estimator_src /tmp/estimator
    # or only some:  --files run_config_test.py --variants plain,use_cs=True

--estimator_src may also be a directory holding the test files themselves; it defaults to
$TF_ESTIMATOR_SRC (so benchmarks/run_all.py can run this), and --results_dir to
$CONFORMANCE_RESULTS_DIR.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

from common import ROOT, machine, print_table

HERE = os.path.dirname(os.path.abspath(__file__))
FILES = ("estimator_test.py", "run_config_test.py", "model_fn_test.py", "keras_test.py")
VARIANTS = ("plain", "use_cs=False", "use_cs=True")
_IN_CHECKOUT = os.path.join("tensorflow_estimator", "python", "estimator")


def _source(estimator_src: str, name: str) -> str:
  for path in (os.path.join(estimator_src, _IN_CHECKOUT, name), os.path.join(estimator_src, name)):
    if os.path.exists(path):
      return path
  raise SystemExit(f"--estimator_src {estimator_src}: no {name} there nor under {_IN_CHECKOUT}; "
                   f"give a tensorflow/estimator checkout at v2.15.0")


def run_one(test_file: str, variant: str, results_dir: str, timeout: int) -> dict:
  """Outcomes {test id: [outcome, error type, where, message]} of one file under one variant.

  The file is copied alone into a fresh directory, so pytest imports it as a top-level module
  (in a checkout it would put the checkout's tensorflow_estimator, which has no generated API,
  ahead of the installed one)."""
  work = tempfile.mkdtemp(prefix="conformance_")
  shutil.copy(test_file, work)
  with open(os.path.join(work, "pytest.ini"), "w", encoding="utf-8") as fh:
    fh.write("[pytest]\n")
  out = os.path.join(results_dir, f"{os.path.basename(test_file)}.{variant}.json")
  env = dict(os.environ, CONFORMANCE_VARIANT=variant, CONFORMANCE_RESULTS=out,
             TF_CPP_MIN_LOG_LEVEL="2",
             PYTHONPATH=os.pathsep.join([HERE, ROOT, os.environ.get("PYTHONPATH", "")]))
  cmd = ["nice", sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
         "conformance_plugin", os.path.basename(test_file)]
  try:
    subprocess.run(cmd, cwd=work, env=env, timeout=timeout, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=False)
  except subprocess.TimeoutExpired:
    print(f"{os.path.basename(test_file)} {variant}: timed out after {timeout}s", flush=True)
  finally:
    shutil.rmtree(work, ignore_errors=True)
  if not os.path.exists(out):
    return {}
  with open(out, encoding="utf-8") as fh:
    return json.load(fh)


def cpu_model() -> str:
  """The host CPU's model name (Linux), or ''."""
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as fh:
      return next((l.split(":", 1)[1].strip() for l in fh if l.startswith("model name")), "")
  except OSError:
    return ""


def _passed(outcomes: dict) -> set:
  return {t for t, o in outcomes.items() if o[0] == "passed"}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--estimator_src", default=os.environ.get("TF_ESTIMATOR_SRC"),
                      help="a tensorflow/estimator checkout at v2.15.0 (or the test files)")
  parser.add_argument("--files", default=",".join(FILES))
  parser.add_argument("--variants", default=",".join(VARIANTS))
  parser.add_argument("--results_dir", default=os.environ.get("CONFORMANCE_RESULTS_DIR"),
                      help="keep each run's outcomes here; runs already there are reused")
  parser.add_argument("--timeout", type=int, default=3600, help="seconds per file and variant")
  args = parser.parse_args()
  if not args.estimator_src:
    raise SystemExit("no --estimator_src (nor $TF_ESTIMATOR_SRC): git clone -b v2.15.0 --depth 1 "
                     "https://github.com/tensorflow/estimator DIR, and pass DIR")
  files = [f for f in args.files.split(",") if f]
  variants = [v for v in args.variants.split(",") if v]
  results_dir = args.results_dir or tempfile.mkdtemp(prefix="conformance_results_")
  os.makedirs(results_dir, exist_ok=True)

  outcomes, reused = {}, []
  for name in files:
    path = _source(args.estimator_src, name)
    for variant in variants:
      kept = os.path.join(results_dir, f"{name}.{variant}.json")
      if args.results_dir and os.path.exists(kept):
        with open(kept, encoding="utf-8") as fh:
          outcomes[name, variant] = json.load(fh)
        reused.append(f"{name} {variant}")
      else:
        outcomes[name, variant] = run_one(path, variant, results_dir, args.timeout)
      print(f"ran {name} {variant}: {len(_passed(outcomes[name, variant]))} passed of "
            f"{len(outcomes[name, variant])}", flush=True)

  host = f"{machine()}, CPU {cpu_model() or 'unknown'}"
  rows, differing = [], []
  totals = {v: [0, 0] for v in variants}
  for name in files:
    plain = _passed(outcomes.get((name, "plain"), {}))
    row = [name, len(plain)]
    for variant in variants:
      if variant == "plain":
        continue
      got = outcomes.get((name, variant), {})
      lost = sorted(plain - _passed(got))
      crashes = sum(1 for t in lost if got.get(t, ["", "", ""])[2] == "framework")
      totals[variant][0] += len(plain) - len(lost)
      totals[variant][1] += len(plain)
      row += [len(plain) - len(lost), len(lost), crashes]
      differing += [(variant, name, t, got.get(t, ["missing", "", "", ""])) for t in lost]
    rows.append(row)
  header = ["test file", "pass plain"]
  for variant in variants:
    if variant != "plain":
      header += [f"pass {variant}", f"fail {variant}", f"crashes {variant}"]
  print_table(f"tensorflow/estimator v2.15.0 tests, passing with the plain Estimator: with "
              f"CerebrasEstimator ({host}; tests from {args.estimator_src})", header, rows)
  if reused:
    print(f"\nOutcomes read from {results_dir}, where this script's earlier pytest runs wrote "
          f"them: {len(reused)} of {len(files) * len(variants)} runs.\n")
  for variant, (ok, of) in totals.items():
    if of:
      print(f"{variant}: {ok} of {of} ({100.0 * ok / of:.1f}%) of the plain Estimator's passes")
  if differing:
    print("\n### Tests that pass with the plain Estimator and not with CerebrasEstimator\n")
    for variant, name, test, (outcome, kind, where, message) in differing:
      detail = f"{kind} ({where}): {message}" if kind else outcome
      print(f"- {variant} {name}::{test.split('::', 1)[-1]}: {detail}")


if __name__ == "__main__":
  main()
