"""Exports a trained Transformer as a SavedModel that translates raw English strings.

    python -m cerebras_models.transformer.export --params configs/params_transformer_tiny.yaml \
        --model_dir runs/transformer_tiny --export_dir runs/transformer_tiny/export \
        [--translate "In the beginning God created the heaven and the earth."]

The SavedModel's `serving_default` signature takes `source_text` [N] strings and returns
`translation` [N] strings, `output_ids` [N, L] and `score` [N]; tokenization (the vocabulary
is a graph constant), encoding and beam/greedy decoding all run inside the graph. Loading it needs tensorflow-text's ops registered:
`import tensorflow_text` before `tf.saved_model.load` (as for any tf-text SavedModel).
"""

import argparse
import os
import sys

import tensorflow as tf
import tensorflow_text  # noqa: F401  registers the tokenizer ops the SavedModel uses

from cerebras_tf import params as params_lib
from cerebras_models.transformer import model as model_lib


def serving_input_receiver_fn(params=None):  # pylint: disable=unused-argument
  """What `scripts/run.py --mode export` calls (with the params): raw English strings in."""
  return model_lib.serving_input_receiver_fn()


def export(params: dict, model_dir: str, export_dir: str, checkpoint_path=None) -> str:
  est = tf.estimator.Estimator(model_lib.model_fn, model_dir=model_dir, params=params)
  path = est.export_saved_model(export_dir, model_lib.serving_input_receiver_fn,
                                checkpoint_path=checkpoint_path)
  return path.decode() if isinstance(path, bytes) else path


def translate(saved_model_dir: str, sentences):
  fn = tf.saved_model.load(saved_model_dir).signatures["serving_default"]
  out = fn(source_text=tf.constant(list(sentences)))
  return [t.decode("utf-8") for t in out["translation"].numpy()]


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
  parser.add_argument("--params", required=True)
  parser.add_argument("--model_dir", default=None, help="default: runconfig.model_dir")
  parser.add_argument("--export_dir", default=None, help="default: <model_dir>/export")
  parser.add_argument("--checkpoint_path", default=None)
  parser.add_argument("--translate", action="append", default=[],
                      help="translate this sentence with the exported model (repeatable)")
  args = parser.parse_args(argv)
  params = params_lib.load_params(args.params)
  model_dir = args.model_dir or params["runconfig"]["model_dir"]
  path = export(params, model_dir, args.export_dir or os.path.join(model_dir, "export"),
                args.checkpoint_path)
  print("SavedModel:", path)
  for src, out in zip(args.translate, translate(path, args.translate)):
    print("%s\n  -> %s" % (src, out))
  return 0


if __name__ == "__main__":
  sys.exit(main())
