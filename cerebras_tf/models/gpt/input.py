"""GPT input: windows of S+1 WordPiece tokens from the real pretraining text, or synthetic.

Text: `<data_dir>/bert_pretrain/{train,eval}.txt` (written by scripts/prepare_data.py) or the
user's own text files (`file_pattern`, one passage per line),
tokenized with tensorflow-text's BertTokenizer over the BERT uncased vocab, concatenated and
cut into windows; inputs are window[:-1], labels window[1:]. `synthetic: true` gives random
tokens of the same shapes (for compile-only runs of models far too big to train here).
"""

import os

import tensorflow as tf
import tensorflow_text as tft

from cerebras_tf.errors import DataError
from cerebras_tf.core import batching

ModeKeys = tf.estimator.ModeKeys


def _section(params, mode):
  return params["train_input" if mode == ModeKeys.TRAIN else "eval_input"]


def _text_files(section, split: str):
  """The text to train on: `file_pattern` (a glob of the user's own text files), else the
  prepared corpus `<data_dir>/bert_pretrain/<split>.txt`."""
  pattern = section.get("file_pattern")
  if pattern:
    found = sorted(tf.io.gfile.glob(pattern))
    if not found:
      raise DataError(f"GPT text: no file matches file_pattern {pattern}; fix the pattern in "
                      f"the params file")
    return found
  path = os.path.join(section.get("data_dir") or "", "bert_pretrain", f"{split}.txt")
  if not tf.io.gfile.exists(path):
    raise DataError(f"GPT text file not found: {path}; run `python scripts/prepare_data.py "
                    f"--datasets vocab,bert_pretrain`, or set train_input.data_dir or "
                    f"file_pattern (your own text files, one passage per line)")
  return [path]


def input_fn(params, mode=ModeKeys.TRAIN, input_context=None):
  section = _section(params, mode)
  batch = batching.input_batch_size(params, section)
  seq = int(section["max_sequence_length"])
  vocab_size = int(params["model"]["vocab_size"])
  training = mode == ModeKeys.TRAIN
  seed = (params.get("runconfig") or {}).get("tf_random_seed")
  if section.get("synthetic"):
    ds = tf.data.Dataset.random(seed=seed or 0).map(
        lambda s: tf.random.stateless_uniform([seq + 1], [s, 0], 0, vocab_size, tf.int32))
  else:
    split = "train" if training else "eval"
    vocab = section.get("vocab_file") or os.path.join(section.get("data_dir") or "", "vocab",
                                                      "bert_uncased_vocab.txt")
    paths = _text_files(section, split)
    if not tf.io.gfile.exists(vocab):
      raise DataError(f"GPT vocab file not found: {vocab}; run `python scripts/prepare_data.py "
                      f"--datasets vocab,bert_pretrain` or set train_input.vocab_file")
    with tf.io.gfile.GFile(vocab) as f:
      vocab_rows = sum(1 for _ in f)
    if vocab_rows > vocab_size:
      raise DataError(f"vocab file {vocab} has {vocab_rows} tokens but model.vocab_size is "
                      f"{vocab_size}: token ids would fall outside the embedding table; set "
                      f"model.vocab_size >= {vocab_rows}")
    tokenizer = tft.BertTokenizer(vocab, lower_case=True, token_out_type=tf.int32)
    lines = tf.data.TextLineDataset(paths).filter(lambda l: tf.strings.length(l) > 0)
    if input_context is not None:
      lines = lines.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    tokens = lines.batch(256).map(lambda l: tokenizer.tokenize(l).merge_dims(1, -1).flat_values)
    ds = tokens.unbatch().batch(seq + 1, drop_remainder=True)
    if training:
      ds = ds.shuffle(int(section.get("shuffle_buffer") or 1000), seed=seed)
  if training and section.get("repeat", True):
    ds = ds.repeat()
  ds = ds.map(lambda w: ({"token_ids": w[:-1], "padding_mask": tf.ones([seq], tf.int32)}, w[1:]))
  return ds.batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
