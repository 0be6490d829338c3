"""What the tests/test_estimator_*.py files share: the reference MLP's params, a run config in a
test's tmp_path, and its train and eval input_fns."""

import os

import tensorflow as tf

from cerebras_tf import CSRunConfig
from cerebras_models.mlp.model import input_fn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PARAMS = {"batch_size": 16, "input_dim": 32, "num_classes": 4, "hidden_sizes": [64, 64],
          "learning_rate": 1e-2, "num_examples": 512}


def config_in(tmp_path, **kw):
  """A CSRunConfig whose model_dir is `tmp_path`/model (seeded, checkpoints every 20 steps)."""
  return CSRunConfig(model_dir=str(tmp_path / "model"), tf_random_seed=7,
                     save_checkpoints_steps=20, log_step_count_steps=10, **kw)


def train_input_fn(params):
  return input_fn(params, tf.estimator.ModeKeys.TRAIN)


def eval_input_fn(params):
  return input_fn(params, tf.estimator.ModeKeys.EVAL)
