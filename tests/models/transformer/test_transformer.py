"""Transformer (encoder-decoder) tests on tiny synthetic data: cached decoding, beam search,
input masks, BLEU statistics, the configs, and a SavedModel that translates raw text."""

import contextlib
import os
import random

import numpy as np
import pytest
import tensorflow as tf

from cerebras_tf import params as params_lib
from cerebras_tf.errors import DataError
from cerebras_tf.runtime import precision
import cerebras_models.transformer  # noqa: F401  registers the model
from cerebras_models.transformer import decoding
from cerebras_models.transformer import input as input_lib
from cerebras_models.transformer import model as model_lib
from cerebras_models.transformer import modeling
from cerebras_models.transformer import vocab as vocab_lib
from dtype_probe import call_dtypes

tf1 = tf.compat.v1
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))))

EN = ["the", "cat", "dog", "sees", "a", "bird", "and", "big", "small", "house"]
ES = {"the": "el", "cat": "gato", "dog": "perro", "sees": "ve", "a": "un", "bird": "pájaro",
      "and": "y", "big": "grande", "small": "pequeño", "house": "casa"}


def _pairs(n, seed=0):
  rng = random.Random(seed)
  out = []
  for _ in range(n):
    words = [rng.choice(EN) for _ in range(rng.randint(2, 7))]
    out.append((" ".join(words).capitalize() + ".", " ".join(ES[w] for w in words).capitalize()
                + "."))
  return out


def _write(path, pairs):
  with tf.io.TFRecordWriter(path) as w:
    for en, es in pairs:
      ex = tf.train.Example(features=tf.train.Features(feature={
          "en": tf.train.Feature(bytes_list=tf.train.BytesList(value=[en.encode()])),
          "es": tf.train.Feature(bytes_list=tf.train.BytesList(value=[es.encode()]))}))
      w.write(ex.SerializeToString())


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp("data")
  os.makedirs(root / "en_es")
  _write(str(root / "en_es" / "train.tfrecord"), _pairs(200, 0))
  _write(str(root / "en_es" / "test.tfrecord"), _pairs(12, 1))
  return str(root)


def _params(data_dir, model_dir="model", **model):
  text = f"""
train_input: {{data_dir: {data_dir}, vocab_size: 80, batch_size: 8, max_source_length: 12,
               max_target_length: 12, bucket_boundaries: [4, 8], shuffle_buffer: 100}}
eval_input: {{data_dir: {data_dir}, vocab_size: 80, batch_size: 4, max_source_length: 12,
              max_target_length: 12}}
model: {{name: transformer, hidden_size: 16, num_hidden_layers: 1, num_heads: 2,
         filter_size: 32, beam_width: 2, eval_beam_width: 1, dropout_rate: 0.0,
         attention_dropout_rate: 0.0}}
optimizer: {{optimizer_type: adam, learning_rate: 0.01}}
runconfig: {{max_steps: 2, model_dir: {model_dir}, tf_random_seed: 1, use_cs: false,
             save_checkpoints_steps: 2, log_step_count_steps: 1}}
"""
  p = params_lib.parse_params(text, "/tmp/transformer_test.yaml")
  p["model"].update(model)
  return p


def _tiny_config(**kw):
  args = dict(vocab_size=20, hidden_size=16, num_encoder_layers=2, num_decoder_layers=2,
              num_heads=2, filter_size=24, dropout_rate=0.0, attention_dropout_rate=0.0,
              initializer_range=0.2)
  args.update(kw)
  return modeling.TransformerConfig(**args)


@pytest.mark.parametrize("pre_norm,positions,tied", [(False, "fixed", True),
                                                     (True, "learned", False)])
def test_cached_decoder_step_matches_full_forward(pre_norm, positions, tied):
  config = _tiny_config(norm_type="pre" if pre_norm else "post",
                        position_embedding_type=positions, tie_output_projection=tied,
                        share_embedding_weights=tied)
  rng = np.random.RandomState(0)
  batch, src_len, tgt_len = 3, 5, 4
  src = rng.randint(4, 20, size=[batch, src_len]).astype(np.int32)
  src_mask = np.ones_like(src)
  src_mask[0, 3:] = 0  # padded source positions must not matter
  src[0, 3:] = 0
  tgt = rng.randint(4, 20, size=[batch, tgt_len]).astype(np.int32)
  with tf.Graph().as_default():
    out = modeling.transformer(src, src_mask, tgt, config, training=False)
    with tf1.variable_scope("transformer", reuse=True):
      cross_kv = modeling.cross_key_values(out["encoder_output"], config)
      cross_bias = modeling.padding_bias(src_mask)
      cache = modeling.init_cache(batch, tgt_len, config)
      steps = []
      for i in range(tgt_len):
        logits, cache = modeling.decode_step(tgt[:, i:i + 1], tf.constant(i), cache, cross_kv,
                                             cross_bias, config, tgt_len)
        steps.append(logits)
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      full, stepped = sess.run([out["logits"], tf.stack(steps, axis=1)])
  np.testing.assert_allclose(stepped, full, rtol=1e-4, atol=1e-4)


def _row_bias(batch, vocab, seed):
  """Per-example logit offsets, with [END] (id 3) made likely so that sequences end."""
  bias = np.random.RandomState(seed + 100).randn(batch, vocab).astype(np.float32)
  bias[:, 3] += 1.5
  return tf.constant(bias)


def _random_step_fn(vocab, seed):
  """A cache-free 'model' whose next-token logits depend on the last token and the step."""
  table = tf.constant(np.random.RandomState(seed).randn(vocab, 12, vocab).astype(np.float32) * 3)

  def step(ids, i, cache):
    logits = tf.gather(table[:, i], ids[:, 0]) + cache["bias"]
    return logits, {"bias": cache["bias"] * 1.0}

  return step


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_search_width_one_equals_greedy(seed):
  vocab, batch, max_len = 9, 5, 10
  with tf.Graph().as_default():
    step = _random_step_fn(vocab, seed)
    bias = _row_bias(batch, vocab, seed)
    greedy, g_scores = decoding.greedy_decode(step, {"bias": bias}, batch, max_len, 2, 3)
    beam, b_scores = decoding.beam_search(step, {"bias": bias}, batch, 1, max_len, 0.0, 2, 3)
    with tf1.Session() as sess:
      greedy, beam, g_scores, b_scores = sess.run([greedy, beam, g_scores, b_scores])
  assert (greedy == 3).any(), "the test wants some sequences to end"
  np.testing.assert_array_equal(beam[:, 0], greedy)
  np.testing.assert_allclose(b_scores[:, 0], g_scores, rtol=1e-5)


def test_beam_search_returns_sorted_beams():
  vocab, batch, max_len = 9, 6, 8
  with tf.Graph().as_default():
    step = _random_step_fn(vocab, 5)
    row_bias = _row_bias(batch, vocab, 5)
    bias = decoding.tile_beams(row_bias, 4)
    ids, b_scores = decoding.beam_search(step, {"bias": bias}, batch, 4, max_len, 0.0, 2, 3)
    with tf1.Session() as sess:
      ids, b_scores = sess.run([ids, b_scores])
  assert ids.shape == (batch, 4, max_len)
  assert np.all(np.diff(b_scores, axis=1) <= 1e-6)  # best first


def test_label_smoothing_matches_one_hot_formula():
  rng = np.random.RandomState(0)
  logits = rng.randn(2, 3, 7).astype(np.float32)
  labels = rng.randint(0, 7, size=[2, 3]).astype(np.int32)
  weights = np.array([[1, 1, 0], [1, 0, 0]], np.int32)
  eps = 0.1
  q = np.eye(7)[labels] * (1 - eps) + eps / 7
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  want = (-(q * logp).sum(-1) * weights).sum() / weights.sum()
  loss, _ = model_lib.smoothed_xent(tf.constant(logits), tf.constant(labels),
                                    tf.constant(weights), eps)
  np.testing.assert_allclose(loss.numpy(), want, rtol=1e-5)


def test_the_hosts_training_loss_and_gradients_are_the_logits_forms(monkeypatch):
  """Training on the host takes the label-smoothed loss from the tied output layer directly
  (model.host_training_loss: losses.dense_sparse_softmax_xent on the real target tokens, no
  [B*T, V] gradient tensor); EVAL and the engine's trace keep logits -> smoothed_xent. Both
  forms on one batch with padded targets, one graph, the same weights: the same loss and
  gradients. (The dense form is taken where oneDNN is on; said on here.)"""
  from cerebras_models import losses  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(losses, "onednn_active", lambda: True)
  rng = np.random.RandomState(0)
  src, tgt, labels = (rng.randint(4, 20, [3, 6]), rng.randint(4, 20, [3, 5]),
                      rng.randint(0, 20, [3, 5]))
  weights = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0]], np.int32)
  with tf.Graph().as_default():
    tf1.set_random_seed(3)
    config = _tiny_config()
    out = modeling.transformer(tf.constant(src), tf.ones([3, 6], tf.int32), tf.constant(tgt),
                               config, training=True)
    got = model_lib.host_training_loss(out["decoder_output"], tf.constant(labels), weights,
                                       config, 0.1)
    want, _ = model_lib.smoothed_xent(out["logits"], tf.constant(labels), weights, 0.1)
    variables = tf1.trainable_variables()
    grads = [tf.convert_to_tensor(g) for g in  # IndexedSlices (the table's rows) made dense
             tf.gradients(got, variables) + tf.gradients(want, variables)]
    wide = [t.name for op in tf1.get_default_graph().get_operations()
            if op.name.startswith("gradients/transformer/weighted_rows") for t in op.outputs
            if t.shape.as_list() == [None, config.vocab_size]]  # [rows, V]
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      a, b, g = sess.run((got, want, grads))
  assert wide == [], wide
  np.testing.assert_allclose(a, b, rtol=1e-5)
  n = len(variables)
  for x, y, v in zip(g[:n], g[n:], variables):
    np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6, err_msg=v.name)


def test_bleu_statistics_sum_to_sacrebleu_corpus_score():
  import sacrebleu  # pylint: disable=import-outside-toplevel
  hyps = ["Y dijo Jehová á Moisés.", "el gato ve un perro", "nada"]
  refs = ["Y habló Jehová á Moisés, diciendo:", "el gato ve un pájaro", "todo"]
  stats = model_lib.bleu_stats(tf.constant(hyps[:2]), tf.constant(refs[:2])).numpy()
  stats += model_lib.bleu_stats(tf.constant(hyps[2:]), tf.constant(refs[2:])).numpy()
  assert model_lib.bleu_from_stats(stats) == pytest.approx(
      sacrebleu.corpus_bleu(hyps, [refs]).score, abs=1e-9)


def test_vocab_cached_by_checksum_and_size(data_dir):
  train = os.path.join(data_dir, "en_es", "train.tfrecord")
  path = vocab_lib.ensure_vocab(train, 80)
  assert path == vocab_lib.cache_path(train, 80) and os.path.exists(path)
  assert vocab_lib.cache_path(train, 90) != path
  mtime = os.path.getmtime(path)
  assert vocab_lib.ensure_vocab(train, 80) == path and os.path.getmtime(path) == mtime
  tokens = vocab_lib.read_vocab(path)
  assert tokens[:4] == list(vocab_lib.RESERVED)
  assert any("á" in t for t in tokens) and any(t[:1].isupper() for t in tokens)  # kept
  tok = vocab_lib.Tokenizer(tokens)
  ids = tok.tokenize(tf.constant(["El perro ve un pájaro grande."])).to_tensor()
  ids = tf.concat([ids, [[vocab_lib.END_ID, 7]]], axis=1)  # text after [END] is dropped
  assert tok.detokenize(ids).numpy()[0].decode() == "El perro ve un pájaro grande."


def test_vocab_builds_inside_an_estimator_graph(data_dir, tmp_path):
  """A fresh checkout has no cached vocabulary: the compiler's capture calls the input_fn,
  and so builds it, inside a tf.Graph, where tf.data cannot be iterated in Python."""
  train = os.path.join(data_dir, "en_es", "train.tfrecord")
  with tf.Graph().as_default():
    assert not tf.executing_eagerly()
    path = vocab_lib.ensure_vocab(train, 70, cache_dir=str(tmp_path))
  assert os.path.dirname(path) == str(tmp_path)
  assert vocab_lib.read_vocab(path)[:4] == list(vocab_lib.RESERVED)


def test_processes_that_start_together_learn_the_vocab_once(tmp_path, monkeypatch):
  """Workers started together on fresh data each learned the vocabulary (92 s of a core for
  en_es; three pytest workers on a fresh clone spent 186 s in one test). The learner now holds
  an flock beside the file, and the others wait and read it. Threads stand in for processes:
  an flock taken through two opens conflicts within one process too."""
  import threading  # pylint: disable=import-outside-toplevel
  import time  # pylint: disable=import-outside-toplevel
  train = tmp_path / "train.tfrecord"
  train.write_bytes(b"records")
  built = []

  def slow_build(*_):
    built.append(1)
    time.sleep(0.5)  # long enough for the others to reach the lock
    return list(vocab_lib.RESERVED) + ["hola"]

  monkeypatch.setattr(vocab_lib, "build_vocab", slow_build)
  got = []
  threads = [threading.Thread(target=lambda: got.append(vocab_lib.ensure_vocab(str(train), 5)))
             for _ in range(3)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert len(built) == 1, built
  assert len(got) == 3 and len(set(got)) == 1, got
  assert vocab_lib.read_vocab(got[0])[-1] == "hola"


def test_the_vocab_is_the_same_learned_from_strings_one_by_one_or_batched():
  """build_vocab batches a dataset of single strings (the word counting is per element, in
  Python); the counts, so the vocabulary, must be what the unbatched strings give."""
  from tensorflow_text.tools.wordpiece_vocab import bert_vocab_from_dataset as bert_vocab  # pylint: disable=import-outside-toplevel
  rng = random.Random(0)
  words = ["perro", "gato", "casa", "Jehová", "dijo", "árbol", "the", "house", "said", "dog"]
  texts = [" ".join(rng.choice(words) + rng.choice(["", "s", "es", "."]) for _ in range(12))
           for _ in range(2500)]  # more than one batch of 1,024
  ours = vocab_lib.build_vocab(tf.data.Dataset.from_tensor_slices(texts), 60)
  theirs = bert_vocab.bert_vocab_from_dataset(
      tf.data.Dataset.from_tensor_slices(texts), vocab_size=60,
      reserved_tokens=list(vocab_lib.RESERVED), bert_tokenizer_params=vocab_lib.TOKENIZER_PARAMS,
      learn_params={})
  assert ours == theirs and len(ours) > len(vocab_lib.RESERVED) + 20


def test_the_learner_counts_its_first_pass_once_and_learns_the_librarys_vocab():
  """_Learner is tensorflow-text's `learn` with the threshold-independent first pass of each
  threshold counted once: the vocabulary must be the library's, token for token, over a
  search of several thresholds (Zipf-distributed words, so the counts spread widely; at 200
  tokens the search goes down to 266, then up: 15016, 7524, ..., 266, 383, 441)."""
  vocab_size = 200
  from tensorflow_text.tools.wordpiece_vocab import wordpiece_tokenizer_learner_lib as learner  # pylint: disable=import-outside-toplevel
  rng = random.Random(vocab_size)
  letters = "abcdeéfghilmnoñprstuv"
  stems = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(150)]
  counts = {}
  for rank, stem in enumerate(stems, 1):
    for suffix in ("", "s", "ado", "mente"):
      counts[stem + suffix] = counts.get(stem + suffix, 0) + max(1, 30000 // (rank * len(suffix + "x")))
  theirs = learner.learn(dict(counts), vocab_size, list(vocab_lib.RESERVED))
  ours = vocab_lib._Learner(learner, list(counts.items()), vocab_size, list(vocab_lib.RESERVED))
  first_passes = []
  count = ours._subtoken_counts
  ours._subtoken_counts = lambda tokens: (first_passes.append(tokens is None), count(tokens))[1]
  thresholds = []
  learn_with_thresh = ours.learn_with_thresh
  ours.learn_with_thresh = lambda t: (thresholds.append(t), learn_with_thresh(t))[1]
  assert ours.learn() == theirs
  assert len(thresholds) >= 6 and thresholds[-1] > thresholds[-2], thresholds  # down, then up
  # 4 passes a threshold, the first counted for the first threshold only.
  assert first_passes == [True] + [False] * (3 * len(thresholds))


@pytest.mark.parametrize("joiner", ["##", ""])
def test_the_splitter_splits_where_the_librarys_get_split_indices_does(joiner):
  """_Splitter skips substrings longer than any token; the split points, and the words that
  cannot be split (None), must be the library's for every word."""
  from tensorflow_text.tools.wordpiece_vocab import wordpiece_tokenizer_learner_lib as learner  # pylint: disable=import-outside-toplevel
  rng = random.Random(7)
  pieces = ["".join(rng.choice("abcdé") for _ in range(rng.randint(1, 6))) for _ in range(60)]
  tokens = {p: 1 for p in pieces[:40]}
  tokens.update({joiner + p: 1 for p in pieces[20:]})
  words = ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 4))) for _ in range(400)]
  words += ["zz", "az", "a"]  # no piece for z: None
  splitter = vocab_lib._Splitter(tokens, joiner)
  got = [splitter.split_indices(w) for w in words]
  assert got == [learner.get_split_indices(w, tokens, bool(joiner), joiner) for w in words]
  assert None in got and sum(g is not None and len(g) > 1 for g in got) > 100


@pytest.mark.parametrize("vocab_size", [40, 120])
def test_the_learners_suffix_counts_give_the_librarys_vocab_where_substrings_overlap(
    vocab_size):
  """_Learner counts each start's rest of the word where the library counts all its prefixes
  and then takes longer tokens' counts from them (the class docstring's argument): on words of
  a 3-letter alphabet, where nearly every substring is a prefix of many others, the
  vocabulary must still be the library's, token for token."""
  from tensorflow_text.tools.wordpiece_vocab import wordpiece_tokenizer_learner_lib as learner  # pylint: disable=import-outside-toplevel
  rng = random.Random(vocab_size)
  counts = {}
  for _ in range(3000):
    word = "".join(rng.choice("abc") for _ in range(rng.randint(1, 12)))
    counts[word] = counts.get(word, 0) + rng.randint(1, 40)
  theirs = learner.learn(dict(counts), vocab_size, list(vocab_lib.RESERVED))
  ours = vocab_lib._Learner(learner, list(counts.items()), vocab_size, list(vocab_lib.RESERVED))
  assert ours.learn() == theirs and len(theirs) > len(vocab_lib.RESERVED) + 6


def test_a_read_only_data_dir_caches_the_vocab_in_the_user_cache(tmp_path, monkeypatch):
  """A shared, read-only dataset: learning the vocabulary failed with "permission denied ...
  choose a writable runconfig.model_dir", which was not the directory at fault. It is now
  kept under ~/.cache/cerebras_tf/vocab, and found there on the next run."""
  import shutil  # pylint: disable=import-outside-toplevel
  import subprocess  # pylint: disable=import-outside-toplevel
  src, ro = tmp_path / "src", tmp_path / "ro"
  src.mkdir()
  ro.mkdir()
  (src / "train.tfrecord").write_bytes(b"records")
  if subprocess.run(["mount", "--bind", str(src), str(ro)], check=False,
                    capture_output=True).returncode:
    pytest.skip("cannot bind-mount here (needs root)")
  try:
    subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], check=True)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    built = []
    monkeypatch.setattr(vocab_lib, "build_vocab",
                        lambda *a: built.append(1) or list(vocab_lib.RESERVED) + ["hola"])
    train = str(ro / "train.tfrecord")
    path = vocab_lib.ensure_vocab(train, 5)
    assert os.path.dirname(path) == vocab_lib.user_cache_dir()
    assert vocab_lib.read_vocab(path)[-1] == "hola"
    assert vocab_lib.ensure_vocab(train, 5) == path and len(built) == 1  # found, not rebuilt
  finally:
    subprocess.run(["umount", "-l", str(ro)], check=False)
    shutil.rmtree(tmp_path / "home", ignore_errors=True)


def test_input_masks_lengths_and_static_shapes(data_dir):
  params = _params(data_dir)
  with tf.Graph().as_default():
    ds = input_lib.input_fn(params, "train")
    features, labels = tf1.data.make_initializable_iterator(ds).get_next()
    assert features["source_ids"].shape.as_list() == [8, 12]
    assert labels.shape.as_list() == [8, 12]
    it = tf1.data.make_initializable_iterator(ds)
    nxt = it.get_next()
    with tf1.Session() as sess:
      sess.run([tf1.tables_initializer(), it.initializer])
      f, l = sess.run(nxt)
  np.testing.assert_array_equal(f["source_padding_mask"], f["source_ids"] != 0)
  np.testing.assert_array_equal(f["source_lengths"], f["source_padding_mask"].sum(1))
  np.testing.assert_array_equal(f["target_lengths"], f["target_padding_mask"].sum(1))
  assert (f["target_input_ids"][:, 0] == vocab_lib.START_ID).all()
  rows = np.arange(8)
  assert (l[rows, f["target_lengths"] - 1] == vocab_lib.END_ID).all()
  # Decoder output = decoder input shifted left by one.
  np.testing.assert_array_equal(l[:, :-1] * (f["target_input_ids"][:, 1:] != 0),
                                f["target_input_ids"][:, 1:])


def test_your_own_pairs_as_tab_separated_text(tmp_path, data_dir):
  """Parallel text as most downloads have it (en<TAB>es, a third column of attribution) was
  only accepted as TFRecords. TSV pairs are read as written, the vocabulary is learned from
  them (not from the prepared corpus) and cached beside them; the same pairs as TSV and as
  TFRecords give the same batches. A file without tabs is refused by file and line."""
  pairs = _pairs(60, 3)
  tsv = tmp_path / "pairs.tsv"
  tsv.write_text("".join(f"{en}\t{es}\tCC-BY 2.0 (France) Attribution: tatoeba.org\n"
                         for en, es in pairs[:30]) + "\n"
                 + "".join(f"{en}\t{es}\n" for en, es in pairs[30:]))
  _write(str(tmp_path / "pairs.tfrecord"), pairs)
  batches = {}
  for name in ("pairs.tsv", "pairs.tfrecord"):
    params = _params(data_dir)
    for section in ("train_input", "eval_input"):
      params[section]["file_pattern"] = str(tmp_path / name)
    vocab = input_lib.vocab_file(params)
    assert os.path.dirname(vocab) == str(tmp_path / "vocab")
    with tf.Graph().as_default():
      it = tf1.data.make_initializable_iterator(input_lib.input_fn(params, "eval"))
      nxt = it.get_next()
      with tf1.Session() as sess:
        sess.run([tf1.tables_initializer(), it.initializer])
        batches[name] = [sess.run(nxt) for _ in range(15)]
  tsv_first, rec_first = batches["pairs.tsv"][0][0], batches["pairs.tfrecord"][0][0]
  assert [t.decode() for t in tsv_first["source_text"]] == [en for en, _ in pairs[:4]]
  assert [t.decode() for t in tsv_first["target_text"]] == [es for _, es in pairs[:4]]
  for (a, la), (b, lb) in zip(batches["pairs.tsv"], batches["pairs.tfrecord"]):
    np.testing.assert_array_equal(la, lb)
    np.testing.assert_array_equal(a["source_ids"], b["source_ids"])
  (tmp_path / "pairs.csv").write_text("".join(f"{en},{es}\n" for en, es in pairs))
  params = _params(data_dir)
  params["train_input"]["file_pattern"] = str(tmp_path / "pairs.csv")
  with pytest.raises(DataError, match=r"pairs.csv:1 has no tab: the Transformer reads "
                                      r"tab-separated pairs, source<TAB>target a line"):
    input_lib.input_fn(params, "train")


def test_configs_load_with_paper_sizes():
  sizes = {}
  for name in ("tiny", "base", "big"):
    p = params_lib.load_params(os.path.join(ROOT, "configs", f"params_transformer_{name}.yaml"))
    sizes[name] = modeling.TransformerConfig.from_params(dict(p["model"], vocab_size=8000))
  base, big = sizes["base"], sizes["big"]
  assert (base.hidden_size, base.filter_size, base.num_heads) == (512, 2048, 8)
  assert (base.num_encoder_layers, base.num_decoder_layers) == (6, 6)
  assert (big.hidden_size, big.filter_size, big.num_heads) == (1024, 4096, 16)
  assert not base.pre_norm and sizes["tiny"].pre_norm


@pytest.mark.slow
def test_train_predict_and_saved_model_translate_raw_text(data_dir, tmp_path):
  params = _params(data_dir, str(tmp_path / "model"))
  est = tf.estimator.Estimator(model_lib.model_fn, model_dir=params["runconfig"]["model_dir"],
                               params=params)
  est.train(lambda: input_lib.input_fn(params, "train"), max_steps=2)
  metrics = est.evaluate(lambda: input_lib.input_fn(params, "eval"))
  assert {"bleu", "token_accuracy", "cross_entropy", "loss"} <= set(metrics)
  # The copy baseline scores the eval split's English sources as Spanish translations.
  import sacrebleu  # pylint: disable=import-outside-toplevel
  test_pairs = _pairs(12, 1)
  assert metrics["bleu_copy_baseline"] == pytest.approx(sacrebleu.corpus_bleu(
      [en for en, _ in test_pairs], [[es for _, es in test_pairs]]).score, abs=1e-4)
  sentence = "The dog sees a small house."
  export = est.export_saved_model(str(tmp_path / "export"), model_lib.serving_input_receiver_fn)

  def predict_input():
    return tf.data.Dataset.from_tensors({"source_text": tf.constant([sentence])})

  want = next(est.predict(predict_input))
  loaded = tf.saved_model.load(export.decode() if isinstance(export, bytes) else export)
  out = loaded.signatures["serving_default"](source_text=tf.constant([sentence]))
  got = out["translation"].numpy()[0]
  assert isinstance(got, bytes)
  assert got == want["translation"]
  np.testing.assert_array_equal(out["output_ids"].numpy()[0], want["output_ids"])


@pytest.mark.parametrize("pre_norm", [False, True])
def test_mixed_precision_is_accepted_and_computes_in_bfloat16(data_dir, pre_norm, monkeypatch):
  """`model.mixed_precision: true` was refused for the Transformer family (issue 40). It
  computes the matmuls in bfloat16 on float32 variables; logits (and so the loss) are float32
  and within bfloat16's rounding of the float32 model's (8 bits of mantissa: ~0.4% per op).
  bfloat16 forced: a CPU without bf16 math trains float32 (tests/models/test_bf16.py)."""
  monkeypatch.setenv(precision.FORCE_ENV, "1")
  p = _params(data_dir, mixed_precision=True)
  config = modeling.TransformerConfig.from_params(p["model"])
  assert modeling.compute_dtype(config) == tf.bfloat16
  rng = np.random.RandomState(0)
  src, tgt = rng.randint(4, 20, [2, 6]), rng.randint(4, 20, [2, 5])
  logits = {}
  for dtype in ("float32", "bfloat16"):
    with tf.Graph().as_default():
      tf1.set_random_seed(3)
      cfg = _tiny_config(norm_type="pre" if pre_norm else "post", dtype=dtype)
      out = modeling.transformer(tf.constant(src), tf.ones([2, 6], tf.int32), tf.constant(tgt),
                                 cfg, training=True)
      assert out["logits"].dtype == tf.float32
      assert {v.dtype.base_dtype for v in tf1.global_variables()} == {tf.float32}
      matmuls = [op for op in tf1.get_default_graph().get_operations()
                 if op.type in ("MatMul", "BatchMatMulV2")]
      assert all(op.outputs[0].dtype == tf.as_dtype(dtype) for op in matmuls), dtype
      grads = tf.gradients(tf.reduce_sum(out["logits"]), tf1.trainable_variables())
      with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        logits[dtype], g = sess.run([out["logits"], grads])
      assert all(np.all(np.isfinite(x)) for x in g)
  scale = np.abs(logits["float32"]).max()
  assert np.abs(logits["bfloat16"] - logits["float32"]).max() < 0.05 * scale


@pytest.mark.parametrize("norm_type", ["post", "pre"])
def test_a_bfloat16_transformer_adds_its_residuals_in_float32_on_the_host_only(norm_type):
  """As GPT's and T5's: every LayerNorm takes a residual sum (post-norm) or the residual
  stream (pre-norm) that is float32 on the host and bfloat16 in the engine's trace (its plans
  unchanged); the stacks' outputs are in the compute dtype either way."""
  cfg = _tiny_config(norm_type=norm_type, dtype="bfloat16", dropout_rate=0.1)

  def norm_inputs(engine):
    with tf.Graph().as_default(), call_dtypes(modeling, "layer_norm") as seen, \
        (precision.tracing_for_engine() if engine else contextlib.nullcontext()):
      ids = tf.constant([[5, 6, 7, 0]])
      out = modeling.transformer(ids, tf.sign(ids), ids, cfg, training=True)
      assert out["encoder_output"].dtype == out["decoder_output"].dtype == tf.bfloat16
    return {x for x, _ in seen}, len(seen)

  # 2 encoder layers x 2 sublayers + 2 decoder layers x 3 (+ the two final norms of pre-norm)
  count = 10 + 2 * (norm_type == "pre")
  assert norm_inputs(engine=False) == ({"float32"}, count)
  assert norm_inputs(engine=True) == ({"bfloat16"}, count)
