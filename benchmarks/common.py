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


# The CPU features that decide TensorFlow's fast paths: oneDNN is on by default in TF 2.15 only
# with AVX-512; bfloat16 matmuls need avx512_bf16 or AMX.
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16")


def cpu() -> dict:
  """{'model': ..., 'flags': [the CPU_FLAGS this CPU has]} from /proc/cpuinfo (else platform)."""
  model, flags = platform.processor() or platform.machine(), set()
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as fh:
      for line in fh:
        key, _, value = line.partition(":")
        if key.strip() == "model name":
          model = value.strip()
        elif key.strip() == "flags":
          flags = set(value.split())
          break
  except OSError:
    pass
  return {"model": model, "flags": [f for f in CPU_FLAGS if f in flags]}


def has_bf16() -> bool:
  return any(f in cpu()["flags"] for f in ("avx512_bf16", "amx_bf16"))


def machine() -> str:
  c = cpu()
  return (f"{c['model']} ({', '.join(c['flags']) or 'no AVX2'}), {os.cpu_count()} cores, "
          f"{platform.node()}, Python {platform.python_version()}")


def numpy_matmul_flops_per_sec(n=2048, reps=10):
  """numpy's (OpenBLAS) fp32 n^3 matmul FLOP/s (best of 3 timings of `reps`)."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(0)
  a = rng.standard_normal((n, n), dtype=np.float32)
  b = rng.standard_normal((n, n), dtype=np.float32)
  a @ b  # pylint: disable=pointless-statement
  best = float("inf")
  for _ in range(3):
    t0 = time.perf_counter()
    for _ in range(reps):
      a @ b  # pylint: disable=pointless-statement
    best = min(best, time.perf_counter() - t0)
  return reps * 2.0 * n ** 3 / best


def blas_kernel() -> str:
  """The kernel OpenBLAS runs for numpy here (threadpoolctl), '' when it cannot say."""
  try:
    import threadpoolctl  # pylint: disable=import-outside-toplevel
  except ImportError:
    return ""
  return ",".join(str(i.get("architecture")) for i in threadpoolctl.threadpool_info()
                  if i.get("internal_api") == "openblas")


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
