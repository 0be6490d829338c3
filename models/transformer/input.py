"""tf.data input for English->Spanish translation: tensorflow-text WordPiece, length buckets.

Data contract (scripts/prepare_data.py): `<data_dir>/en_es/{train,dev,test}.tfrecord` with
bytes features `en` and `es`. Or your own pairs through `file_pattern`: TFRecords with those
features, or tab-separated text, source<TAB>target a line (the format of most parallel-corpus
downloads; further columns, such as an attribution, are ignored; lines without a tab are
skipped, and a file whose first lines have none is refused). Or modelzoo's
`src_data_dir` / `tgt_data_dir`: globs of source and target text files, one sentence a line,
line-aligned (both naming one file of pairs reads its two columns); `src_vocab_file` /
`tgt_vocab_file` are the shared vocabulary (the same tokens). The shared vocabulary is learned
from the training data (train_input's files) on first use and cached
(models/transformer/vocab.py).

Params (`train_input` / `eval_input`): data_dir, split (train / test by default), file_pattern,
vocab_file (null: the cached learned vocabulary), vocab_size (target size when learning it),
batch_size, max_source_length, max_target_length, bucket_boundaries, shuffle, shuffle_buffer,
shuffle_seed, repeat, num_parallel_calls.

Shapes are static: every batch is [B, S] / [B, T] with S = max_source_length and
T = max_target_length, because the engine compiles one static graph. Length bucketing groups
pairs of similar length into a batch, so a batch's padding is small and, with variable tensor
shape (VTS), the engine only spends time on its real tokens, which the masks and lengths below
tell it. Pairs longer than the limits are truncated (the target keeps its [END]).

Output (features, labels):
  source_ids, source_padding_mask           [B, S] int32   (mask 1 = real token)
  source_lengths                            [B]    int32
  target_input_ids, target_padding_mask     [B, T] int32   ([START] y)
  target_lengths                            [B]    int32
  source_text, target_text                  [B]    string  (eval / predict only: BLEU)
  labels = target_output_ids                [B, T] int32   (y [END], 0-padded)
"""

import os
from typing import Any, Mapping

import tensorflow as tf
import tensorflow_text as tft

from cerebras_tf.errors import DataError
from cerebras_models import fields
from cerebras_models.data import acquire, formats
from cerebras_models.transformer import vocab as vocab_lib
from cerebras_tf.core import batching

ModeKeys = tf.estimator.ModeKeys
AUTOTUNE = tf.data.AUTOTUNE
graph_fn = tf.autograph.experimental.do_not_convert
SUBDIR = "en_es"
DEFAULT_VOCAB_SIZE = 8000


def _section(params, mode):
  if mode == ModeKeys.TRAIN:
    return params["train_input"]
  return params.get("eval_input") or params["train_input"]


def _flag(section, key, default):
  value = section.get(key)
  return default if value is None else bool(value)


def vocab_file(params: Mapping[str, Any]) -> str:
  """The vocabulary file: `train_input.vocab_file`, else the one learned from the training
  data (train_input.file_pattern's files, or the prepared corpus) and cached."""
  section = params["train_input"]
  given = section.get("vocab_file") or _shared_vocab(section)
  if given:
    if not tf.io.gfile.exists(given):
      raise DataError(f"train_input.vocab_file {given} does not exist: set it "
                      f"to the vocabulary the model was trained with, or leave it unset to "
                      f"learn one from the training data")
    return given
  size = int(section.get("vocab_size") or DEFAULT_VOCAB_SIZE)
  files, kind = _files(section, True, "train_input")
  if kind.kind in (formats.TEXT, ALIGNED) or kind.compression:
    return vocab_lib.ensure_vocab(
        files[0] + files[1] if kind.kind == ALIGNED else files, size, strings=lambda: _pairs(files, kind).flat_map(
            lambda en, es: tf.data.Dataset.from_tensor_slices(tf.stack([en, es]))))
  return vocab_lib.ensure_vocab(files, size)


def _shared_vocab(section):
  """modelzoo's src_vocab_file / tgt_vocab_file as the one shared vocabulary (or None): two
  files must hold the same tokens."""
  src, tgt = section.get("src_vocab_file"), section.get("tgt_vocab_file")
  if src and tgt and src != tgt:
    for path in (src, tgt):
      if not tf.io.gfile.exists(path):
        raise DataError(f"train_input vocabulary {path} does not exist: point src_vocab_file "
                        f"and tgt_vocab_file at the vocabulary (or leave both unset to learn one)")
    if formats.vocab_tokens(src) != formats.vocab_tokens(tgt):
      raise DataError(f"train_input.src_vocab_file {src} and tgt_vocab_file {tgt} hold "
                      f"different tokens: the Transformer here shares one vocabulary between "
                      f"source and target (one embedding table); give one vocabulary")
  return src or tgt


ALIGNED = "aligned"  # modelzoo's src_data_dir / tgt_data_dir: two line-aligned text globs


def _aligned(section, section_name: str):
  """(src files, tgt files) of modelzoo's src_data_dir / tgt_data_dir globs, sorted."""
  out = []
  for key in ("src_data_dir", "tgt_data_dir"):
    files = sorted(tf.io.gfile.glob(section[key]))
    if not files:
      raise DataError(f"{section_name}.{key} {section[key]} matches no file: point it at the "
                      f"text files, one sentence a line")
    out.append(files)
  return out


def _files(section, training, section_name: str):
  """(files, formats.FileKind of TFRecords or text): the section's pairs, sorted (every host
  shards the same list). modelzoo's src_data_dir / tgt_data_dir: (the two lists of line-aligned
  text files, FileKind ALIGNED), unless both name the same files (of pairs)."""
  if section.get("src_data_dir") and section.get("tgt_data_dir"):
    src, tgt = _aligned(section, section_name)
    if src != tgt:
      return (src, tgt), formats.FileKind(ALIGNED, "line-aligned source and target text")
    section = dict(section, file_pattern=section["src_data_dir"])
  if section.get("file_pattern"):
    files = sorted(tf.io.gfile.glob(section["file_pattern"]))
    kind = formats.probe_files(files, f"{section_name}.file_pattern ({section['file_pattern']})")
    if kind.kind == formats.TEXT:
      _check_tsv(files)
    elif kind.kind != formats.TFRECORD:
      raise DataError(f"{files[0]} is {kind.what}: the Transformer reads TFRecords (en, es) or "
                      f"tab-separated text (source<TAB>target a line); convert it to one of them")
    return files, kind
  split = section.get("split") or ("train" if training else "test")
  dirs = section["data_dir"] if isinstance(section["data_dir"], list) else [section["data_dir"]]
  if len(dirs) > 1:
    raise DataError(f"{section_name}.data_dir: the Transformer reads one data_dir ("
                    f"<data_dir>/{SUBDIR}/); give one, or several files in file_pattern")
  path = os.path.join(dirs[0], SUBDIR, split + ".tfrecord")
  if not tf.io.gfile.exists(path):
    raise FileNotFoundError(f"no data at {path}: run `{acquire.PREPARE} --datasets en_es`")
  return [path], formats.FileKind(formats.TFRECORD, "TFRecords")


def _check_tsv(files):
  """Refuses text whose first lines are not source<TAB>target (a CSV, one language a line)."""
  for path in files:
    for number, cells in formats.tsv_head(path):
      if len(cells) < 2:
        raise DataError(f"{path}:{number} has no tab: the Transformer reads tab-separated "
                        f"pairs, source<TAB>target a line (or TFRecords with en and es); "
                        f"write the pairs that way")


def _pairs(files, kind: formats.FileKind) -> tf.data.Dataset:
  """(en, es) string pairs of TFRecords or tab-separated lines (or of two line-aligned lists
  of text files), in file order."""
  if kind.kind == ALIGNED:
    src, tgt = files
    return tf.data.Dataset.zip((tf.data.TextLineDataset(src), tf.data.TextLineDataset(tgt))).map(
        lambda a, b: (tf.strings.strip(a), tf.strings.strip(b)), num_parallel_calls=AUTOTUNE,
        deterministic=True)
  if kind.kind == formats.TEXT:
    fields = tf.data.TextLineDataset(files).map(lambda line: tf.strings.split(line, "\t"),
                                                 num_parallel_calls=AUTOTUNE, deterministic=True)
    fields = fields.filter(lambda f: tf.size(f) >= 2)
    return fields.map(lambda f: (tf.strings.strip(f[0]), tf.strings.strip(f[1])),
                      num_parallel_calls=AUTOTUNE, deterministic=True)
  spec = {"en": tf.io.FixedLenFeature([], tf.string), "es": tf.io.FixedLenFeature([], tf.string)}
  return tf.data.TFRecordDataset(files, compression_type=kind.compression).map(
      lambda r: tuple(tf.io.parse_single_example(r, spec)[k] for k in ("en", "es")),
      num_parallel_calls=AUTOTUNE, deterministic=True)


def encode_source(tokenizer, texts, max_len: int):
  """[B] strings -> ragged [B, (<= max_len)] int64 source ids (no start/end tokens)."""
  return source_ids(tokenizer.tokenize(texts), max_len)


def source_ids(ids, max_len: int):
  """ragged [B, (t)] token ids -> ragged [B, (<= max_len)] source ids.

  A ragged slice keeps what tft.WaterfallTrimmer(max_len) keeps of one segment, each row's
  first max_len: 17 graph nodes where the trimmer's are 477, built in 9 ms instead of 0.35 s
  (issue 42), and the pipeline runs them for every example.
  """
  return ids[:, :max_len]


def target_ids(ids, max_len: int):
  """ragged [B, (t)] token ids -> (decoder input [START] y, decoder output y [END]), ragged,
  <= max_len."""
  y = ids[:, :max_len - 1]  # as source_ids
  start = tf.fill([y.nrows(), 1], tf.constant(vocab_lib.START_ID, tf.int64))
  end = tf.fill([y.nrows(), 1], tf.constant(vocab_lib.END_ID, tf.int64))
  return tf.concat([start, y], axis=1), tf.concat([y, end], axis=1)


def pad(ragged, length: int):
  """ragged [B, (t)] -> (ids [B, length] int32, mask [B, length] int32, lengths [B] int32)."""
  ids, mask = tft.pad_model_inputs(ragged, max_seq_length=length)
  ids, mask = tf.cast(ids, tf.int32), tf.cast(mask, tf.int32)
  ids.set_shape([None, length])
  mask.set_shape([None, length])
  return ids, mask, tf.reduce_sum(mask, axis=1)


def input_fn(params, mode=ModeKeys.TRAIN, input_context=None):
  """Estimator input_fn; see the module docstring for params and outputs."""
  training = mode == ModeKeys.TRAIN
  section = _section(params, mode)
  runconfig = params.get("runconfig") or {}
  seed = section.get("shuffle_seed")
  seed = runconfig.get("tf_random_seed") if seed is None else seed
  batch_size = batching.input_batch_size(params, section)
  src_len = int(section.get("max_source_length") or 64)
  tgt_len = int(section.get("max_target_length") or 64)
  parallel = fields.parallel_calls(section)
  tokenizer = vocab_lib.Tokenizer(vocab_lib.read_vocab(vocab_file(params)))
  with_text = not training

  @graph_fn
  def encode(en, es):  # one example: bucketing needs per-example lengths
    # One tokenizer call for both sides: its graph (about 450 nodes) is built once.
    both = tokenizer.tokenize(tf.stack([en, es]))
    src = source_ids(both[:1], src_len)
    tgt_in, tgt_out = target_ids(both[1:], tgt_len)
    out = {"source_ids": tf.cast(src.flat_values, tf.int32),
           "target_input_ids": tf.cast(tgt_in.flat_values, tf.int32),
           "target_output_ids": tf.cast(tgt_out.flat_values, tf.int32)}
    if with_text:
      out.update(source_text=en, target_text=es)
    return out

  @graph_fn
  def finish(batch):
    if training:  # drop_remainder: a static batch dimension for the compiler
      for t in batch.values():
        t.set_shape([batch_size] + t.shape.as_list()[1:])
    src_ids = batch["source_ids"]
    src_mask = tf.cast(tf.not_equal(src_ids, vocab_lib.PAD_ID), tf.int32)
    tgt_in = batch["target_input_ids"]
    tgt_mask = tf.cast(tf.not_equal(tgt_in, vocab_lib.PAD_ID), tf.int32)
    features = {"source_ids": src_ids, "source_padding_mask": src_mask,
                "source_lengths": tf.reduce_sum(src_mask, 1),
                "target_input_ids": tgt_in, "target_padding_mask": tgt_mask,
                "target_lengths": tf.reduce_sum(tgt_mask, 1)}
    if with_text:
      features.update(source_text=batch["source_text"], target_text=batch["target_text"])
    return features, batch["target_output_ids"]

  ds = _pairs(*_files(section, training, "train_input" if training else "eval_input"))
  if input_context is not None and input_context.num_input_pipelines > 1:
    ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
  if _flag(section, "shuffle", training):
    ds = ds.shuffle(int(section.get("shuffle_buffer") or 10000), seed=seed)
  if _flag(section, "repeat", training):
    ds = ds.repeat()
  ds = ds.map(encode, num_parallel_calls=parallel, deterministic=True)

  padded_shapes = {"source_ids": [src_len], "target_input_ids": [tgt_len],
                   "target_output_ids": [tgt_len]}
  if with_text:
    padded_shapes.update(source_text=[], target_text=[])
  boundaries = list(section.get("bucket_boundaries") or [])
  if training and boundaries:
    # Similar lengths share a batch; every batch is still padded to the static shape.
    boundaries = [b for b in sorted(boundaries) if b < max(src_len, tgt_len)]
    ds = ds.bucket_by_sequence_length(
        lambda ex: tf.maximum(tf.shape(ex["source_ids"])[0], tf.shape(ex["target_input_ids"])[0]),
        bucket_boundaries=[b + 1 for b in boundaries],
        bucket_batch_sizes=[batch_size] * (len(boundaries) + 1),
        padded_shapes=padded_shapes, drop_remainder=True)
  else:
    ds = ds.padded_batch(batch_size, padded_shapes=padded_shapes, drop_remainder=training)
  ds = ds.map(finish, num_parallel_calls=parallel, deterministic=True)
  return ds.prefetch(fields.prefetch_batches(section))


def serving_features(tokenizer, texts, max_source_length: int):
  """Raw English strings [B] -> the source features the model needs (SavedModel serving)."""
  ids, mask, lengths = pad(encode_source(tokenizer, texts, max_source_length), max_source_length)
  return {"source_ids": ids, "source_padding_mask": mask, "source_lengths": lengths}
