"""Shared test setup: quiet TensorFlow, repo root on sys.path, the `slow` marker, the data."""

import atexit
import gc
import os
import signal
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)
SHARED = os.path.join(os.path.dirname(ROOT), "shared")


def collect_once_at_exit() -> None:
  """At a test process's exit: one garbage collection, then the rest frozen.

  Python's shutdown otherwise frees TensorFlow's and Keras's ~280,000 import-time objects
  module by module: 0.5-0.7 s of CPU at the end of every test process (the pytest workers and
  tests/warm_python.py's children). Frozen objects in reference cycles are left to the OS, so a
  file that only module teardown would have flushed stays unflushed here, which Python's docs
  do not promise either: the tests are stricter than a user's interpreter, never looser.
  """
  gc.collect()
  gc.freeze()


atexit.register(collect_once_at_exit)


def as_from_a_shell() -> None:
  """`preexec_fn` for a child that a test sends Ctrl-C: SIGINT back to its default action.

  A shell without job control starts a background job (`python3 dev.py test &`) with SIGINT
  ignored, and an ignored disposition survives exec: the child's Python then installs no
  KeyboardInterrupt handler, GracefulInterrupt (rightly) leaves an ignored signal alone, and
  the Ctrl-C tests waited on a run that never stopped (which kept a core busy until killed).
  """
  signal.signal(signal.SIGINT, signal.SIG_DFL)


def group_members(pgid: int) -> list:
  """The live (not zombie) processes of process group `pgid`, from /proc: what a test that
  stopped a run checks is empty."""
  out = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
      continue
    if int(fields[2]) == pgid and fields[0] != "Z":
      out.append(int(pid))
  return out


def pytest_configure(config):
  config.addinivalue_line("markers", "slow: takes more than a few seconds (still runs in CI)")


def pytest_sessionstart(session):
  """Prepares the real datasets once, before any test runs (14 s on a fresh clone, 2 cores).

  Tests read data_cache from several files; with pytest-xdist the files run in no fixed order,
  so no test may rely on another having fetched the data. Only the controller (or a plain,
  non-xdist run) prepares it; the workers start after. A child process keeps TensorFlow out
  of the controller. A failure (no network) is printed and the tests that need the data fail
  with their own message.
  """
  if hasattr(session.config, "workerinput"):
    return
  rc = subprocess.call([sys.executable, os.path.join(ROOT, "scripts", "prepare_data.py")],
                       cwd=ROOT)
  if rc:
    print(f"conftest: scripts/prepare_data.py exited {rc}; tests that read data_cache will fail",
          file=sys.stderr)


# Files of a few long tests (wall s on the AVX2 host, 2026-11-30): run first. pytest-xdist's
# worksteal gives each worker a contiguous share of the collection and an idle one steals the
# tail of another's: test_wheel.py, last in file order, always started last, and the suite
# ended on it alone (one core idle for its 28 s; bench_suite.py's worker timeline).
RUN_FIRST = ("tests/test_reference_models_modes.py",  # 70 s, one process for its 4 runs
             "tests/test_wheel.py")                   # 28 s


def pytest_collection_modifyitems(session, config, items):  # pylint: disable=unused-argument
  first = {path: rank for rank, path in enumerate(RUN_FIRST)}
  items.sort(key=lambda item: first.get(item.nodeid.split("::")[0], len(first)))
