"""`cerebras.tf.cs_estimator`: the import path of the Cerebras R1.x TensorFlow stack.

Scripts written for it (`from cerebras.tf.cs_estimator import CerebrasEstimator`) run here
unchanged. `cerebras` is a namespace package (this directory has no `__init__.py`, nor does
`cerebras/`), so a real Cerebras install beside this one keeps its own modules.
"""

from cerebras_tf.estimator import CerebrasEstimator

__all__ = ["CerebrasEstimator"]
