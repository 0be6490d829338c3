"""`cerebras.tf.run_config`: the import path of the Cerebras R1.x TensorFlow stack
(`from cerebras.tf.run_config import CSRunConfig`); see cs_estimator.py."""

from cerebras_tf.run_config import CSConfig, CSRunConfig

__all__ = ["CSConfig", "CSRunConfig"]
