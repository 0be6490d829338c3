"""Shared test setup: quiet TensorFlow, repo root on sys.path, the `slow` marker."""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)
SHARED = os.path.join(os.path.dirname(ROOT), "shared")


def pytest_configure(config):
  config.addinivalue_line("markers", "slow: takes more than a few seconds (still runs in CI)")
