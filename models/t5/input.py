"""tf.data input for T5: plain text lines -> WordPiece ids -> T5's span corruption.

Data: the `*.txt` files of `data_dir` (modelzoo's T5 reads `data_dir/*.txt`, one document a
line), else the prepared pretraining text (`<data_dir>/bert_pretrain/train.txt`, `eval.txt`
for eval: World English Bible, Jane Austen and Wikipedia lines; `python
scripts/prepare_data.py --datasets bert_pretrain`). Real text, not synthetic.

Tokens: tensorflow-text's WordPiece with `vocab_file` (null: `<data_dir>/vocab/
bert_uncased_vocab.txt`); modelzoo uses T5's SentencePiece model, which nothing here can
fetch. The model's vocabulary is the file's `vocab_size` tokens plus `extra_ids` sentinels
(modelzoo: train_input.vocab_size = vocab + extra_ids): sentinel j is id V - 1 - j.

Objective (T5's, as modelzoo's T5DynamicDataProcessor): each block of 512 lines is tokenized
as one stream and cut into chunks of `raw` tokens (models/t5/__init__.py raw_length: the chunk
whose corrupted form fills max_source_length). In each chunk 15% of the tokens, in spans of mean length 3 (their
count and the spans' are fixed by the chunk length; where they fall is random), are noise:
  encoder input   the chunk with each noise span replaced by its sentinel, then [SEP] (end)
  decoder target  each noise span after its sentinel, then [SEP]
  decoder input   [PAD] (T5's start id 0) then the target without its last token
Randomness is stateless per chunk (seed: shuffle_seed, else runconfig.tf_random_seed, else 0;
and the chunk's index), so two runs see the same examples (and an epoch the same corruption as
the one before, in another order).

Output (features, labels), shapes static:
  encoder_input_ids, encoder_mask     [B, S] int32  (mask 1 = real token), S max_source_length
  decoder_input_ids, decoder_mask     [B, T] int32  T max_target_length
  labels = decoder target ids         [B, T] int32  (0 where decoder_mask is 0)
"""

import os
from typing import Tuple

import tensorflow as tf

from cerebras_tf.core import batching
from cerebras_tf.errors import DataError
from cerebras_models import fields
from cerebras_models.bert.input import make_tokenizer, read_vocab
from cerebras_models.data import acquire
from cerebras_models.t5 import corruption, raw_length

ModeKeys = tf.estimator.ModeKeys
AUTOTUNE = tf.data.AUTOTUNE
graph_fn = tf.autograph.experimental.do_not_convert
END_TOKEN, PAD_TOKEN, UNK_TOKEN = "[SEP]", "[PAD]", "[UNK]"
LINES_PER_BLOCK = 512


def _section(params, mode):
  if mode == ModeKeys.TRAIN:
    return params["train_input"]
  return params.get("eval_input") or params["train_input"]


def _first_dir(section) -> str:
  dirs = section.get("data_dir")
  dirs = dirs if isinstance(dirs, list) else [dirs]
  if not dirs or not dirs[0]:
    raise DataError("train_input.data_dir is not set: give the directory of the text (*.txt) "
                    "or the prepared data (scripts/prepare_data.py --datasets bert_pretrain)")
  return dirs[0]


def vocab_file(section) -> str:
  """The section's vocab_file, else the prepared BERT uncased vocabulary under data_dir."""
  path = section.get("vocab_file") or os.path.join(_first_dir(section), "vocab",
                                                   "bert_uncased_vocab.txt")
  if not tf.io.gfile.exists(path):
    raise DataError(f"vocab_file {path} does not exist: set vocab_file to a WordPiece "
                    f"vocabulary, or run `{acquire.PREPARE} --datasets bert_pretrain`")
  return path


def vocabulary(section) -> Tuple[int, dict]:
  """(model vocabulary size V = words + extra_ids, {end, pad, unk} ids)."""
  path = vocab_file(section)
  vocab = read_vocab(path)
  words = int(section.get("vocab_size") or len(vocab))
  missing = [t for t in (END_TOKEN, PAD_TOKEN, UNK_TOKEN) if t not in vocab]
  if missing:
    raise DataError(f"vocab file {path} lacks {' '.join(missing)}: the T5 input here reads a "
                    f"BERT WordPiece vocabulary ([PAD] 0 is the decoder's start)")
  ids = {"end": vocab[END_TOKEN], "pad": vocab[PAD_TOKEN], "unk": vocab[UNK_TOKEN]}
  if max(ids.values()) >= words:
    raise DataError(f"vocab_size {words} leaves out the special tokens of {path}: set it to "
                    f"{len(vocab)} (or leave it null)")
  return words + int(section.get("extra_ids") or 0), ids


def text_files(section, training: bool):
  """The text files to read: data_dir's *.txt (each dir of a list), else the prepared split."""
  dirs = section.get("data_dir")
  dirs = dirs if isinstance(dirs, list) else [_first_dir(section)]
  files = sorted(f for d in dirs for f in tf.io.gfile.glob(os.path.join(d, "*.txt")))
  if files:
    return files
  path = os.path.join(dirs[0], "bert_pretrain", ("train" if training else "eval") + ".txt")
  if not tf.io.gfile.exists(path):
    raise DataError(f"no text in {dirs[0]} (no *.txt, no bert_pretrain/): point data_dir at "
                    f"text files, one document a line, or run `{acquire.PREPARE} --datasets "
                    f"bert_pretrain`")
  return [path]


def random_segmentation(num_items: int, num_segments: int, seed):
  """num_items split into num_segments random positive lengths (static counts).

  -> [num_segments] int32 summing to num_items."""
  # Mark num_segments - 1 of the num_items - 1 gaps between items as cuts, at random.
  order = tf.argsort(tf.random.stateless_uniform([num_items - 1], seed))
  cuts = tf.cast(order < num_segments - 1, tf.int32)
  segment = tf.concat([[0], tf.cumsum(cuts)], axis=0)                  # [num_items]
  return tf.math.unsorted_segment_sum(tf.ones([num_items], tf.int32), segment, num_segments)


def noise_mask(length: int, seed):
  """T5's random spans: [length] bool, noise spans and kept spans alternating, kept first.

  noise = round(0.15 * length) tokens in round(noise / 3) spans (models/t5 corruption)."""
  noise, spans = corruption(length)
  noise_lengths = random_segmentation(noise, spans, seed)
  kept_lengths = random_segmentation(length - noise, spans, seed + [0, 1])
  interleaved = tf.reshape(tf.stack([kept_lengths, noise_lengths], axis=1), [2 * spans])
  starts = tf.cumsum(interleaved, exclusive=True)[1:]                 # each span after the first
  is_start = tf.math.unsorted_segment_sum(tf.ones_like(starts), starts, length)
  return tf.equal(tf.cumsum(is_start) % 2, 1)


def replace_spans(tokens, mask, vocab_size: int):
  """Each run of `mask` tokens replaced by one sentinel (the j-th run: vocab_size - 1 - j).

  tokens: [L] int32; mask: [L] bool -> [L - masked + runs] int32."""
  previous = tf.pad(mask[:-1], [[1, 0]])
  first = tf.logical_and(mask, tf.logical_not(previous))
  sentinel = vocab_size - tf.cumsum(tf.cast(first, tf.int32))
  out = tf.where(first, sentinel, tokens)
  return tf.boolean_mask(out, tf.logical_not(tf.logical_and(mask, previous)))


def span_corruption(tokens, seed, vocab_size: int, end_id: int):
  """A chunk [raw] int32 -> (encoder ids [raw - noise + spans + 1], decoder target
  [noise + spans + 1]), both ending with end_id; static lengths."""
  raw = int(tokens.shape[0])
  noise, spans = corruption(raw)
  mask = noise_mask(raw, seed)
  end = tf.constant([end_id], tf.int32)
  source = tf.concat([replace_spans(tokens, mask, vocab_size), end], axis=0)
  target = tf.concat([replace_spans(tokens, tf.logical_not(mask), vocab_size), end], axis=0)
  source.set_shape([raw - noise + spans + 1])
  target.set_shape([noise + spans + 1])
  return source, target


def _pad_to(x, length: int):
  """[n] int32 -> [length] (0-padded; n <= length)."""
  out = tf.pad(x, [[0, length - int(x.shape[0])]])
  out.set_shape([length])
  return out


def input_fn(params, mode=ModeKeys.TRAIN, input_context=None):
  """Estimator input_fn; see the module docstring."""
  training = mode == ModeKeys.TRAIN
  section = _section(params, mode)
  runconfig = params.get("runconfig") or {}
  seed = section.get("shuffle_seed")
  seed = runconfig.get("tf_random_seed") if seed is None else seed
  seed = int(seed or 0)
  batch_size = batching.input_batch_size(params, section)
  src_len, tgt_len = int(section["max_source_length"]), int(section["max_target_length"])
  raw, _, _, _ = raw_length(src_len)
  vocab_size, ids = vocabulary(params["train_input"])
  tokenizer = make_tokenizer(vocab_file(params["train_input"]), ids["unk"],
                             lower_case=bool(section.get("do_lower", True)))
  parallel = fields.parallel_calls(section)
  shuffle = section.get("shuffle")
  shuffle = training if shuffle is None else bool(shuffle)
  repeat = section.get("repeat")
  repeat = training if repeat is None else bool(repeat)

  @graph_fn
  def chunks(lines):  # [n] strings -> [k, raw] int32: their tokens in order, cut in chunks
    tokens = tf.cast(tokenizer.tokenize(lines).flat_values, tf.int32)
    count = tf.size(tokens) // raw  # the block's last partial chunk is dropped
    return tf.reshape(tokens[:count * raw], [count, raw])

  @graph_fn
  def example(index, chunk):
    source, target = span_corruption(chunk, tf.stack([tf.constant(seed, tf.int64), index]),
                                     vocab_size, ids["end"])
    decoder_input = tf.concat([[ids["pad"]], target[:-1]], axis=0)
    features = {"encoder_input_ids": _pad_to(source, src_len),
                "encoder_mask": _pad_to(tf.ones_like(source), src_len),
                "decoder_input_ids": _pad_to(decoder_input, tgt_len),
                "decoder_mask": _pad_to(tf.ones_like(target), tgt_len)}
    return features, _pad_to(target, tgt_len)

  files = text_files(section, training)
  ds = tf.data.Dataset.from_tensor_slices(files)
  if input_context is not None and input_context.num_input_pipelines > 1:
    ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
  ds = ds.flat_map(tf.data.TextLineDataset)
  ds = ds.filter(lambda line: tf.strings.length(tf.strings.strip(line)) > 0)
  # Blocks of lines are tokenized together and cut into chunks (a chunk spans lines, as T5's
  # packed documents); a block loses its last partial chunk only.
  ds = ds.batch(LINES_PER_BLOCK).map(chunks, num_parallel_calls=parallel, deterministic=True)
  ds = ds.unbatch().enumerate()
  ds = ds.map(example, num_parallel_calls=parallel, deterministic=True)
  # Shuffled before the repeat: a buffer larger than the data (modelzoo's files ask for up to
  # 5,000,000 examples) holds one epoch, reshuffled each epoch, and never waits on the next.
  if shuffle:
    ds = ds.shuffle(int(section.get("shuffle_buffer") or 10000), seed=seed)
  if repeat:
    ds = ds.repeat()
  ds = ds.batch(batch_size, drop_remainder=training)
  return ds.prefetch(fields.prefetch_batches(section))
