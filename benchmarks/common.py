"""Shared helpers for benchmark scripts: quiet TF, repo on sys.path, a table printer."""

import os
import platform
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)


def quiet_tf():
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
  tf.get_logger().setLevel("ERROR")
  return tf


def machine() -> str:
  return f"{platform.node()} {platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}"


def host_cpu() -> str:
  """The CPU model (from /proc/cpuinfo where there is one) and its flags that matter here."""
  model, flags = platform.processor() or platform.machine(), []
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      for line in f:
        key, _, value = line.partition(":")
        if key.strip() == "model name":
          model = value.strip()
        elif key.strip() == "flags":
          flags = [x for x in ("avx2", "avx512f", "fma") if x in value.split()]
          break
  except OSError:
    pass
  return f"{model}" + (f" ({', '.join(flags)})" if flags else "")


def print_table(title, header, rows):
  """Prints a GitHub-markdown table (also what BENCHMARKS.md collects)."""
  print(f"\n### {title}\n")
  print("| " + " | ".join(header) + " |")
  print("|" + "|".join("---" for _ in header) + "|")
  for r in rows:
    print("| " + " | ".join(str(c) for c in r) + " |")
  sys.stdout.flush()


def median(xs):
  return statistics.median(xs)


class Timer:
  def __enter__(self):
    self.t = time.perf_counter()
    return self

  def __exit__(self, *exc):
    self.seconds = time.perf_counter() - self.t
