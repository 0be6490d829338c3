"""The README's main job, timed as a user meets it: `python3 dev.py demo` on a fresh clone.

A local `git clone` of this repository's HEAD (committed work only) gets this tree's .venv
linked in (the "venv already made" case: dev.py reinstalls nothing while setup.py and dev.py
match its stamp) and no data_cache, so the data preparation the demo does on a fresh machine is
in the time. The clock covers the whole command; the held-out masked-LM accuracy is the last
`eval:` line the command prints.

    python benchmarks/bench_demo.py [--keep]
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from common import ROOT, machine, print_table

GOAL_MINUTES, GOAL_ACCURACY = 12.0, 0.15
UNIGRAM_BASELINE = 0.065  # always the most frequent masked token (scripts/mlm_baseline.py)


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--keep", action="store_true", help="keep the clone (prints its path)")
  ap.add_argument("--quick", action="store_true", help="accepted for run_all; the demo is fixed")
  args = ap.parse_args()
  work = tempfile.mkdtemp(prefix="bench_demo_")
  clone = os.path.join(work, "cerebras_tf")
  subprocess.run(["git", "clone", "--quiet", ROOT, clone], check=True)
  os.symlink(os.path.join(ROOT, ".venv"), os.path.join(clone, ".venv"))
  # The linked venv's editable install maps cerebras_tf and cerebras_models to ROOT: the demo
  # then prepared its data in ROOT/data_cache and read the clone's, which was not there. The
  # clone first on the path (and its models/ under the package's name) makes it the clone's.
  os.symlink("models", os.path.join(clone, "cerebras_models"))
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      p for p in (clone, os.environ.get("PYTHONPATH")) if p))
  head = subprocess.run(["git", "-C", clone, "rev-parse", "--short", "HEAD"], check=True,
                        capture_output=True, text=True).stdout.strip()
  t0 = time.perf_counter()
  out = subprocess.run([sys.executable, "dev.py", "demo"], cwd=clone, env=env,
                       capture_output=True, text=True, check=False)
  minutes = (time.perf_counter() - t0) / 60
  if out.returncode:
    print(out.stdout[-2000:], out.stderr[-3000:], sep="\n", file=sys.stderr)
    print(f"bench_demo.py: the demo failed; its clone is kept in {clone}", file=sys.stderr)
    return out.returncode
  evals = re.findall(r"^eval: .*masked_lm_accuracy=([\d.]+)", out.stdout, re.M)
  steps = re.findall(r"^step (\d+)/(\d+) .*host ([\d.]+) examples/s", out.stdout, re.M)
  accuracy = float(evals[-1]) if evals else float("nan")
  rate = sorted(float(r) for _, _, r in steps)[len(steps) // 2] if steps else float("nan")
  print_table(f"`python3 dev.py demo` on a fresh clone of {head} (venv linked, data prepared "
              f"by the demo); {machine()}",
              ["quantity", "value", "goal"],
              [("wall time, whole command", f"{minutes:.1f} min", f"<= {GOAL_MINUTES:.0f} min"),
               ("held-out masked-LM accuracy (last eval)", f"{accuracy:.1%}",
                f">= {GOAL_ACCURACY:.0%}"),
               ("always predicting the most frequent masked token", f"{UNIGRAM_BASELINE:.1%}",
                "-"),
               ("training steps", steps[-1][1] if steps else "-", "-"),
               ("host examples/s (median of the progress lines)", f"{rate:.1f}", "-")])
  if args.keep:
    print(f"clone kept in {clone}")
  else:
    shutil.rmtree(work, ignore_errors=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
