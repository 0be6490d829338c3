"""cerebras_tf: a tf.estimator-compatible framework for a simulated Cerebras wafer-scale engine.

Public API (imported lazily so that `cerebras_tf.params` and the CLI's error paths do not pay
for importing TensorFlow):

    from cerebras_tf import CerebrasEstimator, CSRunConfig, CSConfig
"""

__version__ = "0.1.0"

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
