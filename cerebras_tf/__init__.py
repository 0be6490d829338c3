"""cerebras_tf: a tf.estimator-compatible framework for a simulated Cerebras wafer-scale engine.

Public API (imported lazily so that `cerebras_tf.params` and the CLI's error paths do not pay
for importing TensorFlow):

    from cerebras_tf import CerebrasEstimator, CSRunConfig, CSConfig
"""

import os
import sys

__version__ = "0.1.0"

# oneDNN kernels for TensorFlow's CPU ops. TF 2.15 turns them on by default only on CPUs with
# AVX-512 features; on the AVX2 machines we train on they made BERT-tiny's host step 1.2-1.3x
# faster (BENCHMARKS.md, bench_host_speed). TF reads the variable once, when it is imported,
# so it is set here, before any module of ours imports TensorFlow; a user's own value wins.
# Too late when TensorFlow came first: where its kernels are then not oneDNN's (an AVX2 CPU;
# runtime/onednn.py reads which run), CerebrasEstimator says so once.
ONEDNN_TOO_LATE = "tensorflow" in sys.modules and "TF_ENABLE_ONEDNN_OPTS" not in os.environ
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

_LAZY = {
    "CerebrasEstimator": "cerebras_tf.estimator",
    "CSRunConfig": "cerebras_tf.run_config",
    "CSConfig": "cerebras_tf.run_config",
    "CompileResult": "cerebras_tf.compiler.compile",
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name):
  if name in _LAZY:
    import importlib  # pylint: disable=import-outside-toplevel
    return getattr(importlib.import_module(_LAZY[name]), name)
  raise AttributeError(f"module 'cerebras_tf' has no attribute {name!r}")
