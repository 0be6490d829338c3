"""pytest plugin of bench_suite.py: each test's wall time and CPU, one JSON line per test.

Loaded with `-p suite_cpu_plugin`; SUITE_CPU_DIR names the directory each pytest process (an
xdist worker) appends its lines to. CPU is split into the process's own ("self") and that of
the processes it started and waited for ("children": getrusage counts a child once it has been
waited for; tests/warm_python.py's forked children, which are not this process's own, as their
server reports them). A module fixture's cost goes to the first test that used it. "start" (epoch
seconds) and "worker" (xdist's gw0, gw1, ...) place each test on its worker's timeline.
"""

import json
import os
import resource
import sys
import time

import pytest

_OUT = None


def _cpu():
  own = resource.getrusage(resource.RUSAGE_SELF)
  kids = resource.getrusage(resource.RUSAGE_CHILDREN)
  warm = sys.modules.get("warm_python")  # tests/warm_python.py: children its servers forked
  return (own.ru_utime + own.ru_stime,
          kids.ru_utime + kids.ru_stime + (warm.reaped_cpu if warm else 0.0))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):  # pylint: disable=unused-argument
  global _OUT  # pylint: disable=global-statement
  if _OUT is None:
    _OUT = open(os.path.join(os.environ["SUITE_CPU_DIR"], f"tests_{os.getpid()}.jsonl"), "a",
                encoding="utf-8")
  start, wall, (own, kids) = time.time(), time.monotonic(), _cpu()
  yield
  own2, kids2 = _cpu()
  _OUT.write(json.dumps({"id": item.nodeid, "wall": time.monotonic() - wall,
                         "self": own2 - own, "children": kids2 - kids, "start": start,
                         "worker": os.environ.get("PYTEST_XDIST_WORKER", "main")}) + "\n")
  _OUT.flush()
