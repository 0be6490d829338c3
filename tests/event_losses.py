"""The training loss a run wrote to its TensorBoard events, by step (for tests that compare
runs step by step), and the engine-vs-plain-Estimator run pair the family tests compare."""

import glob
import os

import tensorflow as tf

from cerebras_tf import CerebrasEstimator, CSConfig, CSRunConfig


def summary_losses(model_dir: str, tag: str = "loss") -> list:
  """The `tag` scalar of every step in model_dir's event files, in step order."""
  losses = {}
  for path in glob.glob(os.path.join(model_dir, "events.out.tfevents.*")):
    for event in tf.compat.v1.train.summary_iterator(path):
      for v in event.summary.value:
        if v.tag == tag:
          losses[event.step] = v.simple_value
  return [losses[s] for s in sorted(losses)]


def engine_and_plain_losses(model_fn, input_fn, tmp_path, steps: int, params=None):
  """(plain tf.estimator's per-step losses, CerebrasEstimator's with use_cs=True), both from
  seed 0 over `steps` steps, the engine run pipelined: the family tests' "trains on the engine
  as plain tf.estimator" comparison. Returns (want, got, the CerebrasEstimator)."""
  plain = tf.estimator.Estimator(model_fn, model_dir=str(tmp_path / "plain"), params=params,
                                 config=tf.estimator.RunConfig(tf_random_seed=0,
                                                               save_summary_steps=1))
  plain.train(input_fn, max_steps=steps)
  est = CerebrasEstimator(model_fn, params=params, config=CSRunConfig(
      model_dir=str(tmp_path / "cs"), tf_random_seed=0, save_summary_steps=1,
      cs_config=CSConfig(execution_strategy="pipelined")))
  est.train(input_fn, max_steps=steps, use_cs=True)
  return summary_losses(plain.model_dir), summary_losses(est.model_dir), est
