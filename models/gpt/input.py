"""GPT input: windows of S+1 WordPiece tokens from the real pretraining text, the user's
tokenized records, or synthetic.

Text: `<data_dir>/bert_pretrain/{train,eval}.txt` (written by scripts/prepare_data.py) or the
user's own text files (`file_pattern`, one passage per line),
tokenized with tensorflow-text's BertTokenizer over the BERT uncased vocab, concatenated and
cut into windows; inputs are window[:-1], labels window[1:].
Records: `file_pattern` files in Cerebras modelzoo's GPT-2 TFRecord format (input_ids,
input_mask, labels: [S] int64 each; input_mask 1 on real tokens), read as written: the ids
are the user's tokenizer's, so no vocab is read; model.vocab_size must cover them.
HDF5: `file_pattern` files in modelzoo's HDF5 layout (`data`: [examples, 3, S] of
input_ids, attention_mask, labels; `models/data/hdf5.py`), read the same way.
The first bytes of the first file say which. `synthetic: true` gives random tokens of the
same shapes (for compile-only runs of models far too big to train here).
"""

import os

import tensorflow as tf
import tensorflow_text as tft

from cerebras_tf.modelzoo import tf_files
from cerebras_tf.errors import DataError
from cerebras_tf.core import batching
from cerebras_models import fields
from cerebras_models.data import acquire, formats, hdf5

ModeKeys = tf.estimator.ModeKeys


def _section(params, mode):
  return params["train_input" if mode == ModeKeys.TRAIN else "eval_input"]


UNK = "[UNK]"
# Cerebras modelzoo's GPT-2 TFRecords: every feature holds max_sequence_length int64s.
RECORD_FEATURES = ("input_ids", "input_mask", "labels")
# Modelzoo's GPT HDF5 names the mask attention_mask (1 on the tokens the loss counts).
HDF5_FEATURES = ("input_ids", "attention_mask", "labels")


def _data_files(section, split: str, section_name: str):
  """The files to train on and what they hold (formats.FileKind): `file_pattern` (the
  user's own text, records or HDF5), else modelzoo's `<data_dir>/*.h5`, else the prepared
  corpus `<data_dir>/bert_pretrain/<split>.txt`."""
  pattern = section.get("file_pattern")
  if pattern:
    found = sorted(tf.io.gfile.glob(pattern))
    kind = formats.probe_files(found, f"{section_name}.file_pattern ({pattern})")
    if kind.kind not in (formats.TEXT, formats.TFRECORD, formats.HDF5):
      raise DataError(f"{found[0]} is {kind.what}: GPT reads text files (one passage per "
                      f"line), modelzoo GPT-2 TFRecords ({', '.join(RECORD_FEATURES)}) or "
                      f"modelzoo HDF5; convert it to one of them")
    return found, kind
  dirs = tf_files.data_dirs(section.get("data_dir"))  # modelzoo reads a list of several
  data_dir = dirs[0] if dirs else ""
  # A modelzoo data_dir: its preprocessing's HDF5 shards, or GptTfRecordsProcessor's records.
  for pattern, want in (("*.h5", formats.HDF5), ("*.tfrecord*", formats.TFRECORD)):
    shards = sorted(f for d in dirs for f in tf.io.gfile.glob(os.path.join(d, pattern)))
    if shards:
      kind = formats.probe_files(shards, f"{section_name}.data_dir ({', '.join(dirs)})")
      if kind.kind != want:
        raise DataError(f"{shards[0]} is {kind.what}, not what its name says; rename it or "
                        f"set {section_name}.file_pattern")
      return shards, kind
  path = os.path.join(data_dir, "bert_pretrain", f"{split}.txt")
  if not tf.io.gfile.exists(path):
    where = (f"{section_name}.data_dir {data_dir} does not exist" if data_dir and
             not tf.io.gfile.isdir(data_dir) else f"no GPT data in {section_name}.data_dir "
             f"{data_dir or '(unset)'}: no modelzoo HDF5 shards (*.h5), no bert_pretrain/"
             f"{split}.txt")
    raise DataError(f"{where}; point data_dir at your *.h5 shards or set file_pattern (text "
                    f"or TFRecords), run `{acquire.PREPARE} --datasets vocab,bert_pretrain` "
                    f"for the reference corpus, or set {section_name}.synthetic: true to "
                    f"compile and time the model without data")
  return [path], formats.FileKind(formats.TEXT, "text")


def _check_wordpiece_vocab(path: str) -> int:
  """Rows of a WordPiece vocab (one token a line, with [UNK]); refuses other vocabularies,
  which the tokenizer would read without a word of complaint and map every word to one id."""
  tokens = formats.vocab_tokens(path)
  if UNK not in tokens:
    what = ("a JSON file (a GPT-2 BPE vocab.json?)" if tokens and tokens[0].lstrip()[:1] == "{"
            else "not a WordPiece vocab")
    raise DataError(f"vocab file {path} has no {UNK} token: it is {what}; GPT's text input "
                    f"tokenizes with WordPiece (one token a line, {UNK} among them). For a BPE "
                    f"vocabulary, tokenize with it and give modelzoo GPT-2 TFRecords "
                    f"(input_ids, input_mask, labels) as file_pattern")
  return len(tokens)


def _record_spec(path: str, lengths, seq: int, section_name: str):
  """tf.io parse spec of modelzoo GPT-2 records; refuses other features or lengths."""
  missing = [k for k in RECORD_FEATURES if k not in (lengths or {})]
  if missing:
    found = ", ".join(sorted(lengths or {})) or "none readable as tf.train.Example"
    raise DataError(f"{path} holds TFRecords with features {found}, not the modelzoo GPT-2 "
                    f"features {', '.join(RECORD_FEATURES)} ([{section_name}."
                    f"max_sequence_length] int64 each); write those, or give text files")
  wrote = lengths["input_ids"]
  seq = wrote if seq is None else seq  # null: as written
  if any(lengths[k] != seq for k in RECORD_FEATURES):
    raise DataError(f"{path} holds GPT records of {wrote} tokens but {section_name}."
                    f"max_sequence_length is {seq}: set it to {wrote}, or point "
                    f"file_pattern at records written for {seq}")
  return {k: tf.io.FixedLenFeature([seq], tf.int64) for k in RECORD_FEATURES}


def _record_dataset(files, spec, input_context, compression: str = ""):
  """Modelzoo GPT-2 records -> serialized Examples and their decoder."""
  ds = tf.data.TFRecordDataset(files, compression_type=compression)
  if input_context is not None:
    ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)

  def decode(serialized):
    ex = {k: tf.cast(v, tf.int32) for k, v in tf.io.parse_example(serialized, spec).items()}
    return {"token_ids": ex["input_ids"], "padding_mask": ex["input_mask"]}, ex["labels"]
  return ds, decode


def _tokenized(ds, decode, section, training, seed, batch):
  """Already tokenized examples (records or HDF5 rows) -> (token_ids, padding_mask), labels
  batches; `decode` maps a batch of them."""
  if training:
    ds = ds.shuffle(int(section.get("shuffle_buffer") or 1000), seed=seed)
    if section.get("repeat", True):
      ds = ds.repeat()
  ds = ds.batch(batch, drop_remainder=training)  # eval and predict see every example
  return ds.map(decode, num_parallel_calls=fields.parallel_calls(section)).prefetch(
      fields.prefetch_batches(section))


def _hdf5_dataset(files, section, section_name, seq, input_context):
  """Modelzoo HDF5 (`data`: [examples, features, S]) -> rows as the records give them."""
  shape = hdf5.layout(files)
  missing = [k for k in HDF5_FEATURES if k not in shape.features]
  if missing:
    raise DataError(f"{files[0]} holds HDF5 features {', '.join(shape.features)}, not the "
                    f"modelzoo GPT features {', '.join(HDF5_FEATURES)}; write those, or give "
                    f"text files")
  if seq is not None and shape.seq != seq:
    raise DataError(f"{files[0]} holds GPT examples of {shape.seq} tokens but {section_name}."
                    f"max_sequence_length is {seq}: set it to {shape.seq}, or point "
                    f"file_pattern at data written for {seq}")
  unused = [k for k in shape.features if k not in HDF5_FEATURES]
  if unused:  # modelzoo's VSL packing: several sequences a row, kept apart by these
    tf.compat.v1.logging.warning(
        "%s: HDF5 features %s are not read; packed sequences in one row attend to each "
        "other", files[0], ", ".join(unused))
  ds = hdf5.dataset(files, shape)
  if input_context is not None:
    ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)

  def decode(rows):
    ex = hdf5.columns(rows, shape)
    return ({"token_ids": ex["input_ids"], "padding_mask": ex["attention_mask"]},
            ex["labels"])
  return ds, decode


def input_fn(params, mode=ModeKeys.TRAIN, input_context=None):
  section = _section(params, mode)
  batch = batching.input_batch_size(params, section)
  # null: the data's own length (records and HDF5 as written), else the position table's
  seq = section.get("max_sequence_length")
  table = int(params["model"].get("max_position_embeddings") or 1024)
  vocab_size = int(params["model"]["vocab_size"])
  training = mode == ModeKeys.TRAIN
  seed = (params.get("runconfig") or {}).get("tf_random_seed")
  if section.get("synthetic"):
    seq = seq or table
    ds = tf.data.Dataset.random(seed=seed or 0).map(
        lambda s: tf.random.stateless_uniform([seq + 1], [s, 0], 0, vocab_size, tf.int32))
  else:
    split = "train" if training else "eval"
    section_name = "train_input" if training else "eval_input"
    paths, kind = _data_files(section, split, section_name)
    if kind.kind == formats.TFRECORD:
      spec = _record_spec(paths[0], kind.lengths, seq, section_name)
      seq = spec["input_ids"].shape[0]
      ds, decode = _record_dataset(paths, spec, input_context, kind.compression)
      return _tokenized(ds, decode, section, training, seed, batch)
    if kind.kind == formats.HDF5:
      ds, decode = _hdf5_dataset(paths, section, section_name, seq, input_context)
      return _tokenized(ds, decode, section, training, seed, batch)
    seq = seq or table
    first = (tf_files.data_dirs(section.get("data_dir")) or [""])[0]
    vocab = section.get("vocab_file") or os.path.join(first, "vocab", "bert_uncased_vocab.txt")
    if not tf.io.gfile.exists(vocab):
      raise DataError(f"GPT vocab file not found: {vocab}; run `{acquire.PREPARE} "
                      f"--datasets vocab,bert_pretrain` or set train_input.vocab_file")
    vocab_rows = _check_wordpiece_vocab(vocab)
    if vocab_rows > vocab_size:
      raise DataError(f"vocab file {vocab} has {vocab_rows} tokens but model.vocab_size is "
                      f"{vocab_size}: token ids would fall outside the embedding table; set "
                      f"model.vocab_size >= {vocab_rows}")
    lower = section.get("do_lower")
    tokenizer = tft.BertTokenizer(vocab, lower_case=True if lower is None else bool(lower),
                                  token_out_type=tf.int32, unknown_token=UNK)
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
  return ds.batch(batch, drop_remainder=training).prefetch(fields.prefetch_batches(section))
