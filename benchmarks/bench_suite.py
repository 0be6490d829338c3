"""Where the test suite's time goes: `python3 dev.py test` (the README's test command) with each
test's CPU recorded and every Python process it starts counted.

On a 2-core host the suite is CPU-bound (issue 42: the cores 97% busy), so a test's wall time
says little (another worker's load stretches it) and the figure a cut has to move is CPU. Per
test: wall time, the pytest worker's own CPU and that of the processes it started and waited
for (benchmarks/suite_cpu_plugin.py). Per run: the whole command's CPU, every Python process of
the project's venv that started (a `.pth` probe, installed for the run and removed after), how
many of those that exited imported TensorFlow, and what one `import tensorflow` costs on this
host: the floor every test that starts a fresh process pays.

    python benchmarks/bench_suite.py                      # the whole suite, as dev.py runs it
    python benchmarks/bench_suite.py tests/test_cli.py    # a part: pytest with dev.py's flags
    python benchmarks/bench_suite.py --json tests.json    # also every test's record, as JSON
"""

import collections
import glob
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time

from common import ROOT, machine, median, print_table

import dev  # noqa: E402  pylint: disable=wrong-import-position  (ROOT/dev.py: the test command)

HERE = os.path.dirname(os.path.abspath(__file__))
VENV_PY = os.path.join(ROOT, ".venv", "bin", "python")
PROBE = "_cerebras_tf_suite_probe"
# Logs a line when a venv Python starts and one when it exits (its own CPU, whether it
# imported TensorFlow); inert unless SUITE_CPU_DIR is set. A killed process writes no end line.
PROBE_SOURCE = '''import atexit, os, sys
_DIR = os.environ.get("SUITE_CPU_DIR")
def _line(text):
  with open(os.path.join(_DIR, "procs.log"), "a", encoding="utf-8") as fh:
    fh.write(text + "\\n")
def _end():
  t = os.times()
  _line(f"end {os.getpid()} {t.user + t.system:.2f} {int('tensorflow' in sys.modules)} "
        f"{' '.join(sys.argv[:2])[:160]}")
if _DIR:
  _line(f"start {os.getpid()}")
  atexit.register(_end)
'''
GOALS = "<= 10 min on an AVX2 host, <= 8 min on an AVX-512 one"


def venv_site_packages() -> str:
  return subprocess.check_output(
      [VENV_PY, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
      text=True).strip()


def tf_import_cpu(runs: int = 3) -> float:
  """Median CPU seconds of `import tensorflow` (and cerebras_tf, which sets oneDNN) in a fresh
  venv process."""
  code = "import os, cerebras_tf, tensorflow; t = os.times(); print(t.user + t.system)"
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  return median([float(subprocess.check_output([VENV_PY, "-c", code], cwd=ROOT, env=env,
                                               text=True).split()[-1]) for _ in range(runs)])


def summary(out: str) -> dict:
  """{'passed': n, 'failed': n, ..., 'seconds': s} from pytest's last line."""
  last = [line for line in out.splitlines() if re.search(r" in [\d.]+s", line)][-1:]
  counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|xfailed|xpassed|error)",
                                              " ".join(last))}
  seconds = re.search(r" in ([\d.]+)s", last[0]) if last else None
  counts["seconds"] = float(seconds.group(1)) if seconds else float("nan")
  return counts


def run_suite(log_dir: str, paths) -> tuple:
  """(the output, wall seconds, CPU seconds of everything it waited for) of `dev.py test`, or
  with `paths`, of pytest on them with dev.py's flags (dev.py always runs all of tests/)."""
  env = dict(dev.child_env(), SUITE_CPU_DIR=log_dir,
             PYTHONPATH=os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p))
  before = resource.getrusage(resource.RUSAGE_CHILDREN)
  t0 = time.monotonic()
  plugin = ["-p", "suite_cpu_plugin", "-rfE"]  # -rfE: the failures' names in the summary
  cmd = (dev.pytest_command(plugin, paths) if paths else
         [sys.executable, "dev.py", "test", *plugin])
  proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
  wall = time.monotonic() - t0
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
  return proc.stdout + proc.stderr, wall, cpu


def why_failed(out: str, limit: int = 60) -> list:
  """Each failed test's header and its `E` lines from pytest's failure section: a flaky
  failure in a fresh clone cannot be rerun to see them (the summary line alone named one,
  2026-12-01, and 14 reruns passed)."""
  lines, inside = [], False
  for line in out.splitlines():
    if re.match(r"^=+ (FAILURES|ERRORS) =+$", line):
      inside = True
    elif inside and re.match(r"^=+ .* =+$", line):
      inside = False
    elif inside and (re.match(r"^_{3,} .+ _{3,}$", line) or line.startswith("E ")):
      lines.append(line)
  return lines[:limit] + (["(more E lines left out)"] if len(lines) > limit else [])


def print_workers(tests) -> None:
  """Each xdist worker's timeline: when its first test started and its last ended, relative to
  the first test of all, and how long it sat with no test while another still ran one (the
  tail a long test that starts late leaves the other cores)."""
  by_worker = collections.defaultdict(list)
  for t in tests:
    by_worker[t["worker"]].append(t)
  t0 = min(t["start"] for t in tests)
  end = max(t["start"] + t["wall"] for t in tests)
  rows = []
  for worker, its in sorted(by_worker.items()):
    its.sort(key=lambda t: t["start"])
    last = its[-1]
    rows.append((worker, len(its), f"{its[0]['start'] - t0:.0f}",
                 f"{last['start'] + last['wall'] - t0:.0f}", f"{end - last['start'] - last['wall']:.0f}",
                 f"{last['id']} ({last['wall']:.0f} s)"))
  print_table(f"Each pytest worker's tests on the clock (s after the first test started; "
              f"the last ended at {end - t0:.0f} s)",
              ["worker", "tests", "first start", "last end", "idle until the last end",
               "its last test"], rows)


def main() -> int:
  paths = sys.argv[1:]
  json_out = None
  if "--json" in paths:
    at = paths.index("--json")
    if at + 1 == len(paths):
      sys.exit("bench_suite.py: --json needs a file name, e.g. --json tests.json")
    json_out = paths[at + 1]
    del paths[at:at + 2]
  dev.ensure_env()  # a fresh clone has no .venv yet; the import timing below needs it
  import_cpu = tf_import_cpu()
  site = venv_site_packages()
  log_dir = tempfile.mkdtemp(prefix="bench_suite_")
  probe_py, probe_pth = os.path.join(site, PROBE + ".py"), os.path.join(site, PROBE + ".pth")
  with open(probe_py, "w", encoding="utf-8") as fh:
    fh.write(PROBE_SOURCE)
  with open(probe_pth, "w", encoding="utf-8") as fh:
    fh.write(f"import {PROBE}\n")
  try:
    out, wall, cpu = run_suite(log_dir, paths)
  finally:
    os.remove(probe_pth)
    os.remove(probe_py)
  tests = [json.loads(line) for path in glob.glob(os.path.join(log_dir, "tests_*.jsonl"))
           for line in open(path, encoding="utf-8")]
  procs = open(os.path.join(log_dir, "procs.log"), encoding="utf-8").read().splitlines() \
      if os.path.exists(os.path.join(log_dir, "procs.log")) else []
  shutil.rmtree(log_dir, ignore_errors=True)
  if not tests:
    print(out[-3000:], file=sys.stderr)
    return 1
  if json_out:
    with open(json_out, "w", encoding="utf-8") as fh:
      json.dump(sorted(tests, key=lambda t: -(t["self"] + t["children"])), fh, indent=1)
  started = {line.split()[1] for line in procs if line.startswith("start ")}
  ended = [line.split(maxsplit=4) for line in procs if line.startswith("end ")]
  # tests/warm_python.py's children are forked from a server that started (and imported
  # TensorFlow) once: they write an end line, inherited, and no start line of their own.
  warm = [e for e in ended if e[1] not in started]
  with_tf = [e for e in ended if e[3] == "1" and e[1] in started]
  s = summary(out)
  cores = len(os.sched_getaffinity(0))
  outcome = ", ".join(f"{s[k]:,} {k}" for k in ("passed", "failed", "error", "skipped",
                                                "xfailed", "xpassed") if k in s)
  own = sum(t["self"] for t in tests)
  kids = sum(t["children"] for t in tests)
  command = (f"pytest {' '.join(paths)} with dev.py's flags" if paths else
             "`python3 dev.py test`")
  print_table(f"{command}, each test's CPU; {machine()}", ["quantity", "value", "goal"], [
      ("tests", outcome, "-"),
      ("pytest's time / the whole command's", f"{s['seconds']:,.0f} s / {wall:,.0f} s", GOALS),
      ("CPU of the whole command (user + sys, every process it waited for)",
       f"{cpu:,.0f} s: the {cores} cores {cpu / (wall * cores):.0%} busy", "-"),
      ("CPU the tests account for: the workers' own + their waited children",
       f"{own + kids:,.0f} s = {own:,.0f} + {kids:,.0f}", "-"),
      ("Python processes started (the venv's, dev.py's and pytest's included)",
       f"{len(started):,}", "-"),
      ("... of which exited normally / and had imported TensorFlow",
       f"{len(ended) - len(warm):,} / {len(with_tf):,} (killed ones write no line)", "-"),
      ("children forked warm by tests/warm_python.py that exited normally (no start-up)",
       f"{len(warm):,}", "-"),
      ("`import tensorflow` (with cerebras_tf) in a fresh process, CPU", f"{import_cpu:.1f} s",
       "-"),
      ("those imports alone: TensorFlow processes that exited x the import",
       f"{len(with_tf) * import_cpu:,.0f} s, {len(with_tf) * import_cpu / cpu:.0%} of the CPU",
       "-"),
  ])
  by_file = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])
  for t in tests:
    row = by_file[t["id"].split("::")[0]]
    row[0] += 1
    row[1] += t["self"]
    row[2] += t["children"]
    row[3] += t["wall"]
  total = own + kids
  ranked = sorted(by_file.items(), key=lambda kv: -(kv[1][1] + kv[1][2]))
  print_table("Test files by CPU (self: the pytest worker; children: the processes its tests "
              "started), the 15 largest",
              ["file", "tests", "self CPU s", "children CPU s", "share of the tests' CPU",
               "summed wall s"],
              [(f, n, f"{a:.0f}", f"{b:.0f}", f"{(a + b) / total:.1%}", f"{w:.0f}")
               for f, (n, a, b, w) in ranked[:15]])
  print_workers(tests)
  failures = [line for line in out.splitlines() if line.startswith(("FAILED ", "ERROR "))]
  if failures:
    print("\n### What failed (pytest's -rfE summary)\n")
    print("\n".join(failures))
    print("\n" + "\n".join(why_failed(out)))
  top = sorted(tests, key=lambda t: -(t["self"] + t["children"]))[:15]
  print_table("Tests by CPU, the 15 largest (a module fixture counts in the first test that "
              "used it)", ["test", "CPU s", "wall s"],
              [(t["id"], f"{t['self'] + t['children']:.1f}", f"{t['wall']:.1f}") for t in top])
  return 0 if not s.get("failed") and not s.get("error") else 1


if __name__ == "__main__":
  sys.exit(main())
