"""The training loss a run wrote to its TensorBoard events, by step (for tests that compare
runs step by step)."""

import glob
import os

import tensorflow as tf


def summary_losses(model_dir: str, tag: str = "loss") -> list:
  """The `tag` scalar of every step in model_dir's event files, in step order."""
  losses = {}
  for path in glob.glob(os.path.join(model_dir, "events.out.tfevents.*")):
    for event in tf.compat.v1.train.summary_iterator(path):
      for v in event.summary.value:
        if v.tag == tag:
          losses[event.step] = v.simple_value
  return [losses[s] for s in sorted(losses)]
