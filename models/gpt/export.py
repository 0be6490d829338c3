"""SavedModel serving for GPT: token ids in, the next token and its log-probabilities out.

    scripts/run.py --params configs/params_gpt_tiny.yaml --mode export --export_dir DIR

The `serving_default` signature takes `token_ids` and `padding_mask`, int32 [N, S] (S the
model's sequence length: train_input.max_sequence_length, else max_position_embeddings),
each row right-padded with the mask 1 on its real tokens, and returns `next_token` [N, S] (the
argmax after every position) and `log_probs` [N, V] (the distribution after each row's last
real token). The ids are the model's own (the WordPiece vocab it trained on, or the user's
tokenizer's for records and HDF5), so the export needs no vocabulary file.
"""

from typing import Any, Mapping

import tensorflow as tf

TOKEN_IDS, PADDING_MASK = "token_ids", "padding_mask"


def sequence_length(params: Mapping[str, Any]) -> int:
  """The static length the model was built for."""
  section = params.get("eval_input") or params.get("train_input") or {}
  model = params.get("model") or {}
  return int(section.get("max_sequence_length") or model.get("max_position_embeddings") or 1024)


def serving_input_receiver_fn(params: Mapping[str, Any]):
  """A ServingInputReceiver: token_ids and padding_mask, int32 [None, S]."""
  seq = sequence_length(params)
  ids = tf.compat.v1.placeholder(tf.int32, [None, seq], name=TOKEN_IDS)
  mask = tf.compat.v1.placeholder(tf.int32, [None, seq], name=PADDING_MASK)
  features = {TOKEN_IDS: ids, PADDING_MASK: mask}
  return tf.estimator.export.ServingInputReceiver(features, dict(features))
