"""tf.data input pipeline for BERT with tensorflow-text (tokenize, pack, mask on the fly).

Data contract (written by scripts/prepare_data.py):
  <data_dir>/bert_pretrain/{train,eval}.tfrecord        text_a, text_b (bytes),
                                                        next_sentence_label (int64)
  or, for pretraining, files in google-research/bert's pre-masked format (what its
  create_pretraining_data.py writes: input_ids, input_mask, segment_ids [S],
  masked_lm_positions, masked_lm_ids [P] int64, masked_lm_weights [P] float,
  next_sentence_labels [1]), read as written: the masks were drawn when they were written.
  The first record of the first file says which.
  or, for pretraining, a data_dir in Cerebras modelzoo's BERT CSV layout (meta.dat and CSV
  files: create_csv.py's WordPiece tokens, masked here; create_csv_static_masking.py's
  masked ids, read as written; data/modelzoo_csv.py)
  <data_dir>/rotten_tomatoes/{train,dev,test}.tfrecord  sentence (bytes), label (int64)
  or, for classification, tab-separated text as GLUE ships it: sentence<TAB>label or
  sentence1<TAB>sentence2<TAB>label a line, or a header naming the columns (glue.py)
  <data_dir>/vocab/bert_uncased_vocab.txt               WordPiece vocab, one token a line

Params section (`train_input` / `eval_input`, keys of cerebras_tf.params plus BERT's own):
data_dir, vocab_file (default: the path above), do_lower, batch_size (per replica: the
runtime divides the global batch before calling input_fn), max_sequence_length,
max_predictions_per_seq, masked_lm_prob (0.15), shuffle, shuffle_buffer, shuffle_seed
(default runconfig.tf_random_seed), repeat, num_parallel_calls; split (default train, or
eval / dev), file_pattern (overrides data_dir + split), num_shards and shard_index (used
when the runtime passes no input_context).

Masks are drawn inside the dataset, so every epoch sees fresh masks. The masking map runs
sequentially on whole batches: its random ops are stateful, and running them in parallel
would make the draws depend on thread timing. With a graph seed (RunConfig tf_random_seed)
the pipeline is deterministic.

Output: (features, labels)
  pretraining:    token_ids, segment_ids, padding_mask [B, S] int32; masked_lm_positions,
                  masked_lm_ids [B, P] int32; masked_lm_weights [B, P] float32;
                  next_sentence_label [B] int32.  labels = next_sentence_label.
  classification: token_ids, segment_ids, padding_mask [B, S] int32; label [B] int32.
                  labels = label.
"""

import os
import warnings
from typing import Any, Dict, List, Mapping, Optional, Tuple

import tensorflow as tf
import tensorflow_text as tft

from cerebras_tf.modelzoo import tf_files
from cerebras_tf.errors import DataError
from cerebras_tf.core import batching
from cerebras_models import fields
from cerebras_models.bert import glue
from cerebras_models.data import acquire, formats, modelzoo_csv

ModeKeys = tf.estimator.ModeKeys

CLS, SEP, MASK, PAD, UNK = "[CLS]", "[SEP]", "[MASK]", "[PAD]", "[UNK]"
VOCAB_RELPATH = os.path.join("vocab", "bert_uncased_vocab.txt")
AUTOTUNE = tf.data.AUTOTUNE
# The map functions are plain graph code; autograph would spend seconds rewriting tf-text.
graph_fn = tf.autograph.experimental.do_not_convert


def read_vocab(vocab_file: str) -> Dict[str, int]:
  """token -> id for a one-token-per-line vocab file."""
  if tf.io.gfile.isdir(vocab_file):
    raise DataError(f"cannot read vocab file {vocab_file}: it is a directory; set vocab_file "
                    "to the vocab .txt in the params file")
  return {token: i for i, token in enumerate(formats.vocab_tokens(vocab_file))}


def special_ids(vocab: Mapping[str, int], vocab_file: str = "the vocab") -> Dict[str, int]:
  missing = [t for t in (CLS, SEP, MASK, PAD, UNK) if t not in vocab]
  if missing:
    raise DataError(f"vocab file {vocab_file} lacks the special tokens {' '.join(missing)}; "
                    "BERT needs [CLS] [SEP] [MASK] [PAD] [UNK] (use a BERT WordPiece vocab)")
  return {t: vocab[t] for t in (CLS, SEP, MASK, PAD, UNK)}


def check_vocab_size(vocab: Mapping[str, int], vocab_file: str, params) -> None:
  """The vocab file and model.vocab_size must agree: a larger vocab yields ids past the
  embedding table, a smaller one trains rows no token can reach."""
  size = (params.get("model") or {}).get("vocab_size")
  if size is not None and len(vocab) != int(size):
    raise DataError(f"vocab file {vocab_file} has {len(vocab)} tokens but model.vocab_size is "
                    f"{size}; set model.vocab_size: {len(vocab)} or use the vocab the model "
                    "was built for")


def make_tokenizer(vocab_file: str, unk_id: int, lower_case: bool = True) -> tft.BertTokenizer:
  """Lower-casing WordPiece tokenizer. Build it inside input_fn (the Estimator's graph)."""
  init = tf.lookup.TextFileInitializer(
      vocab_file, tf.string, tf.lookup.TextFileIndex.WHOLE_LINE,
      tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER)
  table = tf.lookup.StaticHashTable(init, default_value=unk_id)
  return tft.BertTokenizer(table, token_out_type=tf.int64, lower_case=lower_case,
                            unknown_token=UNK)


def tokenize(tokenizer, texts):
  """[B] strings -> ragged [B, (tokens)] int64 wordpiece ids."""
  return tokenizer.tokenize(texts).merge_dims(-2, -1)


def tokenize_pair(tokenizer, a, b):
  """[B] strings a and b -> their ragged [B, (tokens)] ids, from one tokenizer call.

  The tokenizer's graph is built once rather than twice: 0.19 s instead of 0.32 s of each
  input build's CPU (issue 42); each string is tokenized alone either way.
  """
  both = tokenize(tokenizer, tf.concat([a, b], 0))
  n = tf.shape(a, out_type=tf.int64)[0]
  return both[:n], both[n:]


def pack_pair(a, b, max_seq_length: int, cls_id: int, sep_id: int):
  """[CLS] a [SEP] b [SEP], trimmed round-robin to max_seq_length.

  Args:
    a, b: ragged [B, (tokens)] int64.
  Returns:
    (ids, segment_ids), ragged [B, (<= max_seq_length)] int64.
  """
  lengths = [tf.cast(x.row_lengths(), tf.int64) for x in (a, b)]  # either may be int32-split
  keep_a, keep_b = round_robin_lengths(*lengths, max_seq_length - 3)
  return tft.combine_segments([first_n(a, keep_a), first_n(b, keep_b)],
                              start_of_sequence_id=cls_id, end_of_segment_id=sep_id)


def pack_single(a, max_seq_length: int, cls_id: int, sep_id: int):
  """[CLS] a [SEP], trimmed to max_seq_length.  ragged [B, (t)] -> (ids, segment_ids).

  A ragged slice keeps what tft.WaterfallTrimmer keeps of one segment: 17 graph nodes where
  the trimmer's are 477 (0.35 s of each input build's CPU, issue 42).
  """
  return tft.combine_segments([a[:, :max_seq_length - 2]], start_of_sequence_id=cls_id,
                              end_of_segment_id=sep_id)


def round_robin_lengths(len_a, len_b, budget: int):
  """How many tokens of each segment tft.RoundRobinTrimmer(budget) keeps: one from a, one from
  b, in turn, until the budget or a segment runs out. Both long: a keeps ceil(budget / 2), b
  floor(budget / 2); one short: it keeps all, the other the rest. From the lengths, in a few
  ops, where the trimmer's graph took 0.15-0.5 s to build (issue 42).

  Args:
    len_a, len_b: [B] int64 segment lengths.  budget: tokens the two may keep together.
  Returns:
    ([B], [B]) int64: tokens kept of a, of b.
  """
  keep_b = tf.minimum(len_b, tf.maximum(tf.constant(budget // 2, len_b.dtype), budget - len_a))
  return tf.minimum(len_a, budget - keep_b), keep_b


def first_n(x, n):
  """ragged [B, (t)] -> ragged [B, (n)]: each row's first n[i] items (n[i] <= its length)."""
  starts = x.row_starts()
  at = tf.ragged.range(starts, starts + tf.cast(n, starts.dtype))
  return at.with_values(tf.gather(x.values, at.values))


def group_words(ids, continues):
  """ragged [B, (t)] wordpiece ids -> ragged [B, (words), (pieces)]: a piece that `continues`
  (its vocab entry starts with ##) joins the word before it; a row's first piece starts one.

  `continues`: [V] bool, indexed by id.
  """
  flat = ids.flat_values
  starts = tf.logical_not(tf.gather(continues, flat))
  row_starts = ids.row_starts()
  starts = tf.tensor_scatter_nd_update(starts, row_starts[:, tf.newaxis],
                                       tf.ones_like(row_starts, tf.bool))
  word_of_piece = tf.cumsum(tf.cast(starts, tf.int64)) - 1
  words = tf.RaggedTensor.from_value_rowids(flat, word_of_piece)
  row_of_word = tf.gather(ids.value_rowids(), tf.where(starts)[:, 0])
  return tf.RaggedTensor.from_value_rowids(words, row_of_word, nrows=ids.nrows())


def mask_tokens(ids, ids_special: Mapping[str, int], vocab_size: int,
                max_predictions_per_seq: int, masked_lm_prob: float = 0.15,
                continues=None):
  """BERT masking: pick ceil(prob * len) non-special tokens (at most P) per sequence; of
  those, 80% become [MASK], 10% a random token, 10% stay. With `continues` ([V] bool: the
  ids that continue a word), whole-word masking: words are picked, all their pieces masked
  (tensorflow-text masks over the second-to-last axis of a 3-D input).

  Args:
    ids: ragged [B, (t)] int64 packed ids.
  Returns:
    (masked_ids ragged [B, (t)], positions ragged [B, (p)], original ids ragged [B, (p)]).
  """
  if continues is not None:
    ids = group_words(ids, continues)
  selector = tft.RandomItemSelector(
      max_selections_per_batch=max_predictions_per_seq, selection_rate=masked_lm_prob,
      unselectable_ids=[ids_special[CLS], ids_special[SEP], ids_special[PAD]],
      shuffle_fn=_row_shuffle_fn())
  chooser = tft.MaskValuesChooser(vocab_size, ids_special[MASK], mask_token_rate=0.8,
                                  random_token_rate=0.1)
  return mask_language_model(ids, selector, chooser)


def mask_language_model(ids, selector, chooser):
  """tft.mask_language_model(ids, selector, chooser) along axis 1, with the library's
  selector and chooser drawing, and the gather and scatter as flat-index ops.

  The library reads and writes the picked positions with a ragged batch_gather, which
  builds about 1,300 graph nodes; BERT's masking map traced 0.4 of its input pipeline's
  1.05 s build (issue 42). A picked position's flat index is its row's start plus the
  position, so a gather and a scatter on the flat values do the same. The result equals
  the library's for the same draws (tests/models/bert/test_bert_model.py); with the demo's
  config and graph seed, 40 batches came out identical to the library's, bit for bit.

  Args:
    ids: ragged [B, (t)] int64, or [B, (words), (pieces)] for whole-word masking.
  Returns:
    (masked ids ragged [B, (t)], positions ragged [B, (p)] int64, original ids [B, (p)]).
  """
  picked = selector.get_selection_mask(ids, axis=1)
  pieces = ids.merge_dims(1, -1) if ids.ragged_rank > 1 else ids
  where = ids.with_flat_values(tf.range(tf.size(pieces.flat_values, out_type=tf.int64)))
  flat_picked = tf.ragged.boolean_mask(where, picked)
  if flat_picked.ragged_rank > 1:
    flat_picked = flat_picked.merge_dims(1, -1)
  # [N] flat indices of the picked pieces, row by row; the position is the index in its row.
  flat = flat_picked.flat_values
  positions = flat_picked.with_flat_values(
      flat - tf.gather(pieces.row_starts(), flat_picked.value_rowids()))
  originals = positions.with_flat_values(tf.gather(pieces.flat_values, flat))
  values = chooser.get_mask_values(originals)
  masked = tf.tensor_scatter_nd_update(pieces.flat_values, flat[:, tf.newaxis],
                                       tf.cast(values.flat_values, pieces.dtype))
  return pieces.with_flat_values(masked), positions, originals


def _row_shuffle_fn():
  """A shuffle for RandomItemSelector that is deterministic under a graph seed.

  The selector shuffles each row inside a parallel tf.map_fn; with the default stateful
  tf.random.shuffle, which row gets which draw depends on thread timing. Here one stateful
  draw per batch (ordered: the masking map is sequential) seeds a stateless shuffle per row;
  the row's smallest flat position, unique to the row, tells the rows apart.
  """
  batch_seed = tf.random.uniform([2], maxval=tf.int64.max, dtype=tf.int64)

  def shuffle(positions):
    flat = tf.cast(positions, tf.int64)
    row_key = tf.reduce_min(tf.concat([flat, tf.constant([tf.int64.max], tf.int64)], 0))
    seed = tf.stack([batch_seed[0], tf.bitwise.bitwise_xor(batch_seed[1], row_key)])
    return tf.random.experimental.stateless_shuffle(positions, seed)

  return shuffle


def _pad(ragged, length: int, batch: Optional[int]):
  """ragged [B, (t)] int -> (dense [B, length] int32, mask [B, length] int32)."""
  dense, mask = tft.pad_model_inputs(ragged, max_seq_length=length)
  dense, mask = tf.cast(dense, tf.int32), tf.cast(mask, tf.int32)
  dense.set_shape([batch, length])
  mask.set_shape([batch, length])
  return dense, mask


def _section(params: Mapping[str, Any], mode) -> Mapping[str, Any]:
  if mode == ModeKeys.TRAIN:
    return params["train_input"]
  return params.get("eval_input") or params["train_input"]


def _first_dir(section) -> str:
  dirs = tf_files.data_dirs(section.get("data_dir"))
  return dirs[0] if dirs else ""


def _records_in_data_dirs(section) -> List[str]:
  """The TFRecords straight in data_dir (every dir of a list), as modelzoo's BERT processors
  read them; sorted, so every host shards the same list."""
  return sorted(f for d in tf_files.data_dirs(section.get("data_dir"))
                for f in tf.io.gfile.glob(os.path.join(d, "*.tfrecord*")))


def _files(section, subdir: str, default_split: str, section_name: str, task: str):
  """The section's TFRecord files (sorted: every host shards the same list) and what the
  first holds (formats.FileKind). Refuses text and other formats with what to do."""
  if section.get("file_pattern"):
    files = sorted(tf.io.gfile.glob(section["file_pattern"]))
    key = f"{section_name}.file_pattern ({section['file_pattern']})"
  elif _records_in_data_dirs(section):  # modelzoo's BERT data_dir (or a list of several)
    files = _records_in_data_dirs(section)
    key = f"{section_name}.data_dir ({', '.join(tf_files.data_dirs(section['data_dir']))})"
  else:
    split = section.get("split") or default_split
    path = os.path.join(_first_dir(section), subdir, split + ".tfrecord")
    if not tf.io.gfile.exists(path):
      where = (f"{section_name}.data_dir {_first_dir(section)} does not exist"
               if not tf.io.gfile.isdir(_first_dir(section)) else f"no data at {path}")
      raise DataError(f"{where}: run `{acquire.PREPARE}` for the reference data, or set "
                      f"{section_name}.file_pattern to your TFRecords or text, or "
                      f"{section_name}.data_dir to modelzoo's BERT CSV (its meta.dat)")
    files, key = [path], f"{section_name}.data_dir"
  kind = formats.probe_files(files, key)
  if kind.kind == formats.TFRECORD or (kind.kind == formats.TEXT and task == "classification"):
    return files, kind
  if kind.kind == formats.TEXT:
    todo = (f"to pretrain on your own text (one sentence per line, a blank line between "
            f"documents, as google-research/bert's create_pretraining_data.py reads it), "
            f"convert it: `{acquire.PREPARE} --text_to_bert '"
            f"{section.get('file_pattern') or files[0]}' --out DIR`, then set "
            f"{section_name}.file_pattern to DIR/train.tfrecord")
  elif task == "classification":
    todo = ("write tab-separated text (sentence<TAB>label a line) or TFRecords of "
            "tf.train.Example with sentence (bytes) and label (int64)")
  else:
    todo = ("write TFRecords of text_a, text_b (bytes) and next_sentence_label (int64), or "
            "google-research/bert's pre-masked records")
  raise DataError(f"{files[0]} is {kind.what}, not TFRecords, and BERT reads TFRecords: {todo}"
                  if kind.kind == formats.TEXT else f"{files[0]} is {kind.what}: {todo}")


def _train_tsv(params) -> Optional[List[str]]:
  """train_input's files when they are tab-separated text, else None."""
  pattern = (params.get("train_input") or {}).get("file_pattern")
  found = sorted(tf.io.gfile.glob(pattern)) if pattern else []
  if found and formats.probe(found[0], read_example=False).kind == formats.TEXT:
    return found
  return None


def classification_text(params) -> Tuple[int, Optional[Tuple[str, ...]]]:
  """What the classifier was trained to read: (text columns, 1 or a pair's 2; the label words
  in class-id order, or None for integer labels), from train_input's TSV files; (1, None)
  when it trains on records. Serving and predictions use it."""
  files = _train_tsv(params)
  if files is None:
    return 1, None
  shape, _ = glue.layout(files, "train_input")
  return len(shape.text), glue.label_names(files)


def _label_names(params, files, training: bool, num_classes: int):
  """The class names of word labels, in id order, from train_input's files (so train and
  eval number them alike; eval's own files when train_input reads records); None for
  integer labels. Refuses more classes than model.num_classes."""
  own = files if training else (_train_tsv(params) or files)
  names = glue.label_names(own)
  if names is not None and len(names) > num_classes:
    raise DataError(f"{own[0]} labels its examples with {len(names)} words ("
                    f"{', '.join(names[:8])}{', ...' if len(names) > 8 else ''}) but "
                    f"model.num_classes is {num_classes}: set it to {len(names)}")
  return names


def _records(files, section, training, seed, input_context, skips=None,
             compression: str = ""):
  """Sharded, then (by default in training) shuffled and repeated serialized examples (or,
  given `skips`, the lines of text files, skipping that many at the start of each: headers);
  `compression`: "GZIP" for gzipped records."""
  if skips is not None:
    ds = tf.data.Dataset.from_tensor_slices((files, tf.constant(skips, tf.int64)))
    ds = ds.interleave(lambda f, k: tf.data.TextLineDataset(f).skip(k), cycle_length=1)
    ds = ds.filter(lambda line: tf.strings.length(tf.strings.strip(line)) > 0)
  else:
    ds = tf.data.Dataset.from_tensor_slices(files)
    ds = ds.interleave(lambda f: tf.data.TFRecordDataset(f, compression_type=compression),
                       cycle_length=1)
  if input_context is not None and input_context.num_input_pipelines > 1:
    ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
  elif int(section.get("num_shards") or 1) > 1:
    ds = ds.shard(int(section["num_shards"]), int(section.get("shard_index") or 0))
  if _flag(section, "shuffle", training):
    ds = ds.shuffle(int(section.get("shuffle_buffer") or 10000), seed=seed)
  if _flag(section, "repeat", training):
    ds = ds.repeat()
  return ds


# google-research/bert's run_pretraining.py input: feature -> (dtype, length key).
PREMASKED = {"input_ids": (tf.int64, "S"), "input_mask": (tf.int64, "S"),
             "segment_ids": (tf.int64, "S"), "masked_lm_positions": (tf.int64, "P"),
             "masked_lm_ids": (tf.int64, "P"), "masked_lm_weights": (tf.float32, "P"),
             "next_sentence_labels": (tf.int64, 1)}


def _premasked_spec(files, lengths, msl: int, max_pred: int, section_name: str):
  """The parse spec of google-bert pre-masked records, None when `files` hold another format
  (`lengths`: the first record's, formats.FileKind.lengths). Refuses (DataError) records
  written for another sequence length or prediction count."""
  if not lengths or not all(k in lengths for k in PREMASKED):
    return None
  want = {"S": msl, "P": max_pred}
  for name, (_, key) in PREMASKED.items():
    expected = want.get(key, key)
    if lengths[name] != expected:
      wrote = (f"--max_seq_length={lengths['input_ids']} "
               f"--max_predictions_per_seq={lengths['masked_lm_ids']}")
      raise DataError(
          f"{files[0]} holds google-research/bert pre-masked examples written with {wrote}, "
          f"but {section_name}.max_sequence_length is {msl} and max_predictions_per_seq is "
          f"{max_pred}: set them to {lengths['input_ids']} and {lengths['masked_lm_ids']}, or "
          f"point {section_name}.file_pattern at records written for {msl} and {max_pred}")
  return {name: tf.io.FixedLenFeature([want.get(key, key)], dtype)
          for name, (dtype, key) in PREMASKED.items()}


def _pretraining_features(token_ids, segment_ids, padding_mask, positions, masked_ids, weights,
                          nsp):
  """The pretraining (features, labels) every source gives the model."""
  return ({"token_ids": token_ids, "segment_ids": segment_ids, "padding_mask": padding_mask,
           "masked_lm_positions": positions, "masked_lm_ids": masked_ids,
           "masked_lm_weights": weights, "next_sentence_label": nsp}, nsp)


def _premasked_dataset(files, spec, section, training, seed, input_context, batch_size,
                       parallel, compression: str = ""):
  """google-bert pre-masked records -> this pipeline's pretraining (features, labels)."""
  @graph_fn
  def decode(serialized):
    ex = tf.io.parse_example(serialized, spec)
    ex = {k: tf.cast(v, tf.int32) if v.dtype == tf.int64 else v for k, v in ex.items()}
    return _pretraining_features(ex["input_ids"], ex["segment_ids"], ex["input_mask"],
                                 ex["masked_lm_positions"], ex["masked_lm_ids"],
                                 ex["masked_lm_weights"], ex["next_sentence_labels"][:, 0])

  ds = _records(files, section, training, seed, input_context, compression=compression)
  ds = ds.batch(batch_size, drop_remainder=training)
  ds = ds.map(decode, num_parallel_calls=parallel, deterministic=True)
  return ds.prefetch(fields.prefetch_batches(section))


def _flag(section, key, default):
  value = section.get(key)
  return default if value is None else bool(value)


def input_fn(params, mode=ModeKeys.TRAIN, input_context=None):
  """Estimator input_fn for `params["model"]["task"]` (pretraining or classification)."""
  training = mode == ModeKeys.TRAIN
  section = _section(params, mode)
  task = (params.get("model") or {}).get("task") or "pretraining"
  runconfig = params.get("runconfig") or {}
  seed = section.get("shuffle_seed")
  seed = runconfig.get("tf_random_seed") if seed is None else seed
  parallel = fields.parallel_calls(section)
  batch_size = batching.input_batch_size(params, section)
  msl = int(section.get("max_sequence_length") or 128)
  vocab_file = section.get("vocab_file") or os.path.join(_first_dir(section), VOCAB_RELPATH)
  section_name = "train_input" if training else "eval_input"

  zoo = None
  if task != "classification" and not section.get("file_pattern"):
    zoo = modelzoo_csv.find(_first_dir(section) or None, f"{section_name}.data_dir")
  max_pred = int(section.get("max_predictions_per_seq") or 20)
  if zoo is not None and zoo.static:
    if section.get("vocab_file") or tf.io.gfile.exists(vocab_file):
      check_vocab_size(read_vocab(vocab_file), vocab_file, params)
    return _modelzoo_static(zoo, section, section_name, training, seed, input_context,
                            batch_size, parallel, msl, max_pred)
  if task != "classification" and zoo is None:
    files, kind = _files(section, "bert_pretrain", "train" if training else "eval",
                         section_name, task)
    premasked = _premasked_spec(files, kind.lengths, msl, max_pred, section_name)
    if premasked is not None:
      # Token ids come tokenized: the vocab is only checked against the model, when given.
      if section.get("vocab_file") or tf.io.gfile.exists(vocab_file):
        check_vocab_size(read_vocab(vocab_file), vocab_file, params)
      return _premasked_dataset(files, premasked, section, training, seed, input_context,
                                batch_size, parallel, kind.compression)

  if section.get("vocab_file") and not tf.io.gfile.exists(vocab_file):
    raise DataError(f"{section_name}.vocab_file {vocab_file} does not exist: set it to the "
                    f"WordPiece vocab the data was written with (one token a line)")
  vocab = read_vocab(vocab_file)
  ids = special_ids(vocab, vocab_file)
  check_vocab_size(vocab, vocab_file, params)
  tokenizer = make_tokenizer(vocab_file, ids[UNK], _flag(section, "do_lower", True))
  static_batch = batch_size if training else None

  if task == "classification":
    files, kind = _files(section, "rotten_tomatoes", "train" if training else "dev",
                         section_name, task)
    num_classes = int((params.get("model") or {}).get("num_classes") or 2)
    skips = names = None
    if kind.kind == formats.TEXT:  # GLUE-style TSV: its columns, its label words
      shape, skips = glue.layout(files, section_name)
      names = _label_names(params, files, training, num_classes)
    spec = {"sentence": tf.io.FixedLenFeature([], tf.string),
            "label": tf.io.FixedLenFeature([], tf.int64)}

    @graph_fn
    def encode(rows):
      if skips is not None:
        texts, label = glue.parse(rows, shape, names)
      else:
        ex = tf.io.parse_example(rows, spec)
        texts, label = [ex["sentence"]], tf.cast(ex["label"], tf.int32)
      if len(texts) == 2:  # a pair: [CLS] a [SEP] b [SEP], segments 0 and 1
        packed, segments = pack_pair(*tokenize_pair(tokenizer, texts[0], texts[1]), msl,
                                     ids[CLS], ids[SEP])
      else:
        packed, segments = pack_single(tokenize(tokenizer, texts[0]), msl, ids[CLS], ids[SEP])
      token_ids, padding_mask = _pad(packed, msl, static_batch)
      segment_ids, _ = _pad(segments, msl, static_batch)
      # A label the classifier has no row for failed deep in the loss's gradient
      # ("segment_ids[31] = 65 is out of range [0, 64)").
      in_range = tf.debugging.assert_less(
          label, num_classes, message=f"a label in {section_name}'s data is outside [0, "
          f"{num_classes}): set model.num_classes to the number of classes (labels 0 to "
          f"num_classes - 1)")
      known = tf.debugging.assert_non_negative(label, message=(
          f"a label in {section_name}'s data is not one of the training data's labels "
          f"({', '.join(names)})" if names else f"a label in {section_name}'s data is "
          f"negative: classes are 0 to num_classes - 1"))
      with tf.control_dependencies([in_range, known]):
        label = tf.identity(label)
      if static_batch:
        label.set_shape([static_batch])
      return ({"token_ids": token_ids, "segment_ids": segment_ids,
               "padding_mask": padding_mask, "label": label}, label)

    ds = _records(files, section, training, seed, input_context, skips=skips,
                  compression=kind.compression)
    ds = ds.batch(batch_size, drop_remainder=training)
    ds = ds.map(encode, num_parallel_calls=parallel, deterministic=True)
    return ds.prefetch(fields.prefetch_batches(section))

  mlm_prob = float(section.get("masked_lm_prob") or 0.15)
  vocab_size = int(section.get("vocab_size") or (params.get("model") or {}).get("vocab_size")
                   or len(vocab))
  spec = {"text_a": tf.io.FixedLenFeature([], tf.string),
          "text_b": tf.io.FixedLenFeature([], tf.string),
          "next_sentence_label": tf.io.FixedLenFeature([], tf.int64)}

  @graph_fn
  def encode(serialized):  # deterministic: safe to run in parallel
    ex = tf.io.parse_example(serialized, spec)
    packed, segments = pack_pair(*tokenize_pair(tokenizer, ex["text_a"], ex["text_b"]), msl,
                                 ids[CLS], ids[SEP])
    return packed, segments, tf.cast(ex["next_sentence_label"], tf.int32)

  continues = None
  if _flag(section, "mask_whole_word", False):
    flags = [False] * (max(vocab.values()) + 1)
    for token, i in vocab.items():
      flags[i] = token.startswith("##")
    continues = tf.constant(flags)

  @graph_fn
  def mask(packed, segments, nsp):  # random: run sequentially
    masked, positions, originals = mask_tokens(packed, ids, vocab_size, max_pred, mlm_prob,
                                               continues)
    token_ids, padding_mask = _pad(masked, msl, static_batch)
    segment_ids, _ = _pad(segments, msl, static_batch)
    positions, weights = _pad(positions, max_pred, static_batch)
    originals, _ = _pad(originals, max_pred, static_batch)
    nsp.set_shape([static_batch])
    return _pretraining_features(token_ids, segment_ids, padding_mask, positions, originals,
                                 tf.cast(weights, tf.float32), nsp)

  if zoo is not None:  # modelzoo's create_csv.py: WordPiece tokens, packed and segmented
    where = f"{section_name}.data_dir {section['data_dir']}"
    lower = _flag(section, "do_lower", True)

    def rows(lines):
      return modelzoo_csv.tokens_to_ids(modelzoo_csv.parse_lines(lines, zoo.columns, where),
                                        vocab, ids[UNK], lower, msl)

    @graph_fn
    def encode_csv(lines):
      flat, segs, lengths, nsp = tf.numpy_function(
          rows, [lines], [tf.int32, tf.int32, tf.int64, tf.int32], stateful=False)
      flat.set_shape([None])
      segs.set_shape([None])
      lengths.set_shape([None])
      nsp.set_shape([None])
      return (tf.RaggedTensor.from_row_lengths(tf.cast(flat, tf.int64), lengths),
              tf.RaggedTensor.from_row_lengths(tf.cast(segs, tf.int64), lengths), nsp)

    ds = _records(list(zoo.files), section, training, seed, input_context,
                  skips=[1] * len(zoo.files))
    decode = encode_csv
  else:
    ds = _records(files, section, training, seed, input_context, compression=kind.compression)
    decode = encode
  ds = ds.batch(batch_size, drop_remainder=training)
  ds = ds.map(decode, num_parallel_calls=parallel, deterministic=True)
  with warnings.catch_warnings():
    # tf.data warns that the graph seed reaches the masking draws (the library's selector and
    # chooser take no seed); that is the design: with tf_random_seed the masks repeat.
    warnings.filterwarnings("ignore", message=r"Seed \d+ from outer graph might be getting "
                            r"used by function Dataset_map_mask", category=UserWarning)
    ds = ds.map(mask)
  return ds.prefetch(fields.prefetch_batches(section))


def _modelzoo_static(zoo, section, section_name, training, seed, input_context, batch_size,
                     parallel, msl: int, max_pred: int):
  """modelzoo's create_csv_static_masking.py CSV -> this pipeline's pretraining
  (features, labels), read as written (the masks were drawn when it was written)."""
  where = f"{section_name}.data_dir {section['data_dir']}"
  static_batch = batch_size if training else None
  first = f"{zoo.files[0]}:2"  # written for another length: said now, not at step 0
  modelzoo_csv.static_features(modelzoo_csv.parse_lines(
      [modelzoo_csv.first_row(zoo.files[0])], zoo.columns, first), msl, max_pred, first)

  def rows(lines):
    return modelzoo_csv.static_features(modelzoo_csv.parse_lines(lines, zoo.columns, where),
                                        msl, max_pred, where)

  @graph_fn
  def decode(lines):
    out = tf.numpy_function(rows, [lines], [tf.int32] * 5 + [tf.float32, tf.int32],
                            stateful=False)
    for t, n in zip(out, [msl] * 3 + [max_pred] * 3):
      t.set_shape([static_batch, n])
    out[6].set_shape([static_batch])
    token_ids, padding_mask, segment_ids, positions, masked_ids, weights, nsp = out
    return _pretraining_features(token_ids, segment_ids, padding_mask, positions, masked_ids,
                                 weights, nsp)

  ds = _records(list(zoo.files), section, training, seed, input_context,
                skips=[1] * len(zoo.files))
  ds = ds.batch(batch_size, drop_remainder=training)
  ds = ds.map(decode, num_parallel_calls=parallel, deterministic=True)
  return ds.prefetch(fields.prefetch_batches(section))
