"""Several runs in one child process (one TensorFlow start): the child prints `=== run NAME`
before each run's output; `fenced` splits what it printed back into runs."""

import json
import os
import sys

import warm_python

# The child: scripts/run.py's main for each (name, argv), one after another, as a notebook
# would; `=== exit CODE` ends each run's output.
_CHILD = """
import json, sys
from cerebras_tf import cli
for name, argv in json.loads(sys.argv[1]):
  for stream in (sys.stdout, sys.stderr):
    print("=== run " + name, file=stream, flush=True)
  code = cli.main(["run.py"] + argv)
  for stream in (sys.stdout, sys.stderr):
    print("=== exit %d" % code, file=stream, flush=True)
"""


def run_in_one_process(runs, cwd: str, timeout: float):
  """Runs [(name, argv)] in one fresh process; returns (stdout by run, stderr by run, proc)."""
  proc = warm_python.run([sys.executable, "-u", "-c", _CHILD, json.dumps(runs)], cwd=cwd,
                         capture_output=True, text=True, timeout=timeout,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
  assert proc.returncode == 0, proc.stderr[-3000:]
  return fenced(proc.stdout), fenced(proc.stderr), proc


def fenced(text: str) -> dict:
  """{run name: its part of `text`} between the child's markers."""
  parts, name = {}, None
  for line in text.splitlines(keepends=True):
    if line.startswith("=== run "):
      name = line[len("=== run "):].strip()
      parts[name] = ""
    elif name is not None:
      parts[name] += line
  return parts
