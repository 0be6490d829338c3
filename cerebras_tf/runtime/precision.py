"""The host's compute dtype for `model.mixed_precision: true`: bfloat16 where the CPU has it.

The simulated engine computes in 16 bits either way (the compiler's estimate assumes it); this
decides only what TensorFlow computes in on the host. bfloat16 matmuls are fast on a CPU with
avx512_bf16 or AMX (about 1.9x fp32 on an AVX-512 EPYC, issue 42); elsewhere TensorFlow
emulates them and they are slower than fp32, so there the run trains in float32 and says so
once. `CEREBRAS_TF_FORCE_BF16=1` computes in bfloat16 on any CPU (the tests of the bf16 path
on hosts without it; slow). No TensorFlow here.
"""

import contextlib
import contextvars
import logging
import os
from typing import FrozenSet, Optional

BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo flags of a CPU with fast bf16 math
# TensorFlow 2.15's oneDNN kernels for products (_MklMatMul, _MklNativeConv2D,
# _MklBatchMatMulV2, _MklEinsum, ...) take float32 and bfloat16 only, so a float16 product runs
# Eigen's emulation on every CPU, avx512_fp16 included: 1.0 GFLOP/s against 197 in float32 on
# a Xeon with avx512_fp16 and AMX (2026-12-02). tests/test_estimator_lints.py reads TF's kernel
# registry, so a TensorFlow with such a kernel fails it here.
ONEDNN_FLOAT16_PRODUCTS = False
FORCE_ENV = "CEREBRAS_TF_FORCE_BF16"

_said = set()  # the precision lines logged in this process (each once)
# Set while the compiler traces the model_fn for the engine, which computes in 16 bits on
# any host: the trace (activation bytes, kernels) must not depend on the host's CPU.
_for_engine = contextvars.ContextVar("cerebras_tf_trace_for_engine", default=False)


@contextlib.contextmanager
def tracing_for_engine():
  """Within it, `mixed_precision: true` builds bfloat16 whatever the CPU (nothing runs)."""
  token = _for_engine.set(True)
  try:
    yield
  finally:
    _for_engine.reset(token)


def stream_dtype(compute: str) -> str:
  """The dtype a pre-norm stack (GPT, T5) keeps its residual stream in, for a model computing
  in `compute`: float32 on the host, where a bfloat16 model adds each sublayer's output to a
  float32 stream, as PyTorch autocast's type promotion does, so the stream is not rounded to 8
  bits at every layer (a 24-layer GPT's final hidden state 0.91% rms from float32's against
  1.36% with a bfloat16 stream: `benchmarks/bench_bf16.py --stream_error`; the step's speed
  unchanged); `compute` in the engine's trace, as the engine computes in 16 bits."""
  return compute if _for_engine.get() else "float32"


def in_engine_trace() -> bool:
  """Whether the model is being traced for the engine (within tracing_for_engine)."""
  return _for_engine.get()


def cpu_flags(path: str = "/proc/cpuinfo") -> FrozenSet[str]:
  """The first CPU's flags from /proc/cpuinfo; empty where there is no such file."""
  try:
    with open(path, encoding="utf-8") as fh:
      for line in fh:
        key, _, value = line.partition(":")
        if key.strip() == "flags":
          return frozenset(value.split())
  except OSError:
    pass
  return frozenset()


def has_bf16(flags: Optional[FrozenSet[str]] = None) -> bool:
  """Whether the CPU (its `flags`, else this host's) computes bfloat16 natively."""
  flags = cpu_flags() if flags is None else flags
  return any(f in flags for f in BF16_FLAGS)


def emulated_dtypes(flags: Optional[FrozenSet[str]] = None) -> FrozenSet[str]:
  """The 16-bit dtypes TensorFlow emulates on this CPU (its `flags`, else this host's), where
  a matmul or convolution in them is slower than in float32: "float16" on every CPU
  (ONEDNN_FLOAT16_PRODUCTS: a Keras MLP under mixed_float16 trained at 242 examples/s against
  15,636 in float32 on an AVX2 EPYC, 254 against 26,048 on a Xeon with avx512_fp16),
  "bfloat16" without BF16_FLAGS unless CEREBRAS_TF_FORCE_BF16 asks for it (0.73x float32 on
  BERT-tiny there)."""
  flags = cpu_flags() if flags is None else flags
  slow = set() if ONEDNN_FLOAT16_PRODUCTS else {"float16"}
  if not has_bf16(flags) and not forced():
    slow.add("bfloat16")
  return frozenset(slow)


def forced() -> bool:
  """CEREBRAS_TF_FORCE_BF16 set to a true value (1, true, yes)."""
  return os.environ.get(FORCE_ENV, "").strip().lower() in ("1", "true", "yes")


def compute_dtype(mixed_precision, flags: Optional[FrozenSet[str]] = None,
                  log=None) -> str:
  """"bfloat16" or "float32": the host compute dtype a model built with
  `model.mixed_precision = mixed_precision` uses. bfloat16 needs the flag and (a CPU with
  bf16 math or CEREBRAS_TF_FORCE_BF16). Which one the host computes in is said once per
  process (`log`; by default TensorFlow's logger, at INFO for bfloat16 and at WARNING for the
  fallback to float32 on a CPU without bf16 math); the engine's trace says nothing."""
  if not mixed_precision:
    return "float32"
  if _for_engine.get():
    return "bfloat16"
  flags = cpu_flags() if flags is None else flags
  if has_bf16(flags) or forced():
    have = [f for f in BF16_FLAGS if f in flags]
    _say_once(f"model.mixed_precision: the host computes in bfloat16 ({' and '.join(have)} in "
              f"/proc/cpuinfo): the matmuls and attention in bfloat16 on float32 weights; "
              f"model.mixed_precision: false trains in float32" if have else
              f"model.mixed_precision: {FORCE_ENV} is set, so the host computes in bfloat16, "
              f"which this CPU emulates (slower than float32)",
              log or logging.getLogger("tensorflow").info)
    return "bfloat16"
  _say_once(f"model.mixed_precision: this CPU has no bfloat16 math ({' or '.join(BF16_FLAGS)} "
            f"not in /proc/cpuinfo), where bfloat16 is slower than float32, so the model "
            f"trains in float32 here (the engine's estimate stays 16-bit); {FORCE_ENV}=1 "
            f"computes in bfloat16 anyway", log or logging.getLogger("tensorflow").warning)
  return "float32"


def _say_once(line: str, say) -> None:
  if line not in _said:
    _said.add(line)
    say(line)


def keras_policy(mixed_precision, flags: Optional[FrozenSet[str]] = None) -> str:
  """The Keras dtype policy name for compute_dtype's answer: mixed_bfloat16 or float32."""
  return "mixed_bfloat16" if compute_dtype(mixed_precision, flags) == "bfloat16" else "float32"
