"""SavedModel serving for the BERT classifier: raw sentences in, class probabilities out.

    est.export_saved_model(export_dir, functools.partial(serving_input_receiver_fn, params))

The serving graph takes `sentences`, a tf.string [None] batch, and tokenizes inside the graph
with tensorflow-text's BertTokenizer, exactly as `input.py` does for training ([CLS] s [SEP],
trimmed and padded to max_sequence_length). The vocab file becomes a SavedModel asset (the
lookup table's TextFileInitializer registers it), so the export directory is self-contained:

    loaded = tf.saved_model.load(path)
    loaded.signatures["serving_default"](sentences=tf.constant(["a fine film"]))
    # -> {"probabilities": [1, C] float32, "predictions": [1] int32}

A classifier trained on sentence pairs (GLUE's RTE, MRPC, QQP as TSV) serves pairs: a second
input `sentences_b`, packed [CLS] a [SEP] b [SEP] as training packed them. One trained on word
labels also returns `classes`, the label words ([1] string).
"""

import os
from typing import Any, Mapping

import tensorflow as tf

from cerebras_tf.errors import ConfigError
from cerebras_models.bert import input as input_lib

SENTENCES = "sentences"
SENTENCES_B = "sentences_b"  # the pair's second text, for a classifier trained on pairs


def serving_input_receiver_fn(params: Mapping[str, Any]):
  """A ServingInputReceiver: `sentences` tf.string [None] -> classifier features."""
  task = (params.get("model") or {}).get("task") or "pretraining"
  if task != "classification":
    raise ConfigError(f"export: BERT serves raw sentences as a classifier (model.task: "
                      f"classification), this model is {task!r}; export a fine-tuned "
                      f"classifier, or drop --export_dir")
  section = params.get("eval_input") or params["train_input"]
  msl = int(section.get("max_sequence_length") or 128)
  vocab_file = section.get("vocab_file") or os.path.join(section["data_dir"],
                                                         input_lib.VOCAB_RELPATH)
  ids = input_lib.special_ids(input_lib.read_vocab(vocab_file))
  tokenizer = input_lib.make_tokenizer(vocab_file, ids[input_lib.UNK],
                                       bool(section.get("do_lower", True)))
  sentences = tf.compat.v1.placeholder(tf.string, [None], name=SENTENCES)
  receivers = {SENTENCES: sentences}
  columns, _ = input_lib.classification_text(params)
  if columns == 2:  # trained on pairs (RTE, MRPC, QQP): serve pairs
    receivers[SENTENCES_B] = tf.compat.v1.placeholder(tf.string, [None], name=SENTENCES_B)
    packed, segments = input_lib.pack_pair(
        input_lib.tokenize(tokenizer, sentences),
        input_lib.tokenize(tokenizer, receivers[SENTENCES_B]), msl, ids[input_lib.CLS],
        ids[input_lib.SEP])
  else:
    packed, segments = input_lib.pack_single(input_lib.tokenize(tokenizer, sentences), msl,
                                             ids[input_lib.CLS], ids[input_lib.SEP])
  token_ids, padding_mask = input_lib._pad(packed, msl, None)  # pylint: disable=protected-access
  segment_ids, _ = input_lib._pad(segments, msl, None)  # pylint: disable=protected-access
  features = {"token_ids": token_ids, "segment_ids": segment_ids,
              "padding_mask": padding_mask}
  return tf.estimator.export.ServingInputReceiver(features, receivers)
