"""GPT backbone: parameter count by formula, rotary relativity, causality, and it learns."""

import contextlib

import numpy as np
import pytest
import tensorflow as tf

from cerebras_models.gpt import modeling
from cerebras_models.gpt.model import model_fn
from cerebras_tf.runtime import precision
from dtype_probe import call_dtypes

tf1 = tf.compat.v1


def _count_params(config, batch=2, seq=8):
  with tf.Graph().as_default():
    ids = tf1.placeholder(tf.int32, [batch, seq])
    modeling.gpt_model(ids, tf.ones_like(ids), config, training=False)
    return sum(int(np.prod(v.shape)) for v in tf1.trainable_variables())


@pytest.mark.parametrize("kw", [
    {},  # GPT-2 style: learned positions, sequential, tied head
    {"position_embedding_type": "rotary", "rotary_dim": 8, "parallel_attention": True,
     "share_embedding_weights": False},  # GPT-J style
    {"position_embedding_type": "rotary", "rotary_dim": 8, "share_embedding_weights": False,
     "norm_type": "rmsnorm", "encoder_nonlinearity": "swiglu", "num_kv_groups": 2,
     "use_ffn_bias": False, "use_projection_bias_in_attention": False,
     "use_ffn_bias_in_attention": False, "use_bias_in_output": False},  # LLaMA style
])
def test_parameter_count_matches_formula(kw):
  config = modeling.GPTConfig(vocab_size=97, hidden_size=32, num_hidden_layers=3, num_heads=4,
                              filter_size=64, max_position_embeddings=16, **kw)
  assert _count_params(config) == modeling.num_parameters(config)


def test_gptj_6b_formula_is_six_billion():
  # GPT-J 6B: 28 layers, d 4096, ffn 16384, vocab 50400, untied head: 6.05e9 parameters
  # (EleutherAI reports 6,053,381,344).
  config = modeling.GPTConfig(vocab_size=50400, hidden_size=4096, num_hidden_layers=28,
                              num_heads=16, filter_size=16384, max_position_embeddings=2048,
                              position_embedding_type="rotary", parallel_attention=True,
                              share_embedding_weights=False)
  assert modeling.num_parameters(config) == pytest.approx(6_053_381_344, rel=2e-3)


def test_rotary_scores_depend_only_on_relative_position():
  """q.k after rotary is a function of (i - j): shift both positions and the score stays."""
  rng = np.random.RandomState(0)
  q = np.tile(rng.randn(1, 1, 1, 8).astype(np.float32), [1, 6, 1, 1])
  k = np.tile(rng.randn(1, 1, 1, 8).astype(np.float32), [1, 6, 1, 1])
  rq = modeling.rotary(tf.constant(q), 8).numpy()[0, :, 0]
  rk = modeling.rotary(tf.constant(k), 8).numpy()[0, :, 0]
  s = rq @ rk.T
  assert s[1, 3] == pytest.approx(s[2, 4], abs=1e-5)
  assert s[0, 2] == pytest.approx(s[3, 5], abs=1e-5)
  assert abs(s[0, 1] - s[0, 3]) > 1e-3  # and it does depend on the offset


def test_causal_future_tokens_do_not_change_past_logits():
  config = modeling.GPTConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_heads=2,
                              filter_size=32, max_position_embeddings=8)
  with tf.Graph().as_default():
    ids = tf1.placeholder(tf.int32, [1, 8])
    logits = modeling.gpt_model(ids, tf.ones_like(ids), config, training=False)
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      a = sess.run(logits, {ids: [[1, 2, 3, 4, 5, 6, 7, 8]]})
      b = sess.run(logits, {ids: [[1, 2, 3, 4, 9, 9, 9, 9]]})
  np.testing.assert_allclose(a[0, :4], b[0, :4], atol=1e-6)
  assert np.abs(a[0, 4:] - b[0, 4:]).max() > 1e-4


def test_a_batch_of_unknown_size_gives_the_same_logits_per_row():
  """Eval and predict keep their last, partial batch (they dropped it: predict returned 1,504
  of 1,533 records), so the model takes a batch dimension known only at run time."""
  config = modeling.GPTConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_heads=2,
                              filter_size=32, max_position_embeddings=8)
  rows = np.array([[1, 2, 3, 4, 5, 6, 7, 8], [8, 7, 6, 5, 4, 3, 2, 1], [3, 3, 3, 3, 0, 0, 0, 0]])
  with tf.Graph().as_default():
    ids = tf1.placeholder(tf.int32, [None, 8])
    logits = modeling.gpt_model(ids, tf.ones_like(ids), config, training=False)
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      three = sess.run(logits, {ids: rows})
      one = sess.run(logits, {ids: rows[2:]})
  assert three.shape == (3, 8, 50)
  np.testing.assert_allclose(three[2:], one, atol=1e-5)


def test_learns_a_repeating_sequence():
  params = {"model": {"vocab_size": 16, "hidden_size": 32, "num_hidden_layers": 1, "num_heads": 2,
                      "filter_size": 64, "max_position_embeddings": 8},
            "optimizer": {"optimizer_type": "adam", "learning_rate": 0.01},
            "runconfig": {"max_steps": 60}}
  seq = np.tile(np.arange(9) % 5, [4, 1]).astype(np.int32)
  with tf.Graph().as_default():
    features = {"token_ids": tf.constant(seq[:, :-1]), "padding_mask": tf.ones([4, 8], tf.int32)}
    spec = model_fn(features, tf.constant(seq[:, 1:]), tf.estimator.ModeKeys.TRAIN, params)
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      first = sess.run(spec.loss)
      for _ in range(60):
        _, last = sess.run([spec.train_op, spec.loss])
  assert first > 2.0 and last < 0.2  # ln 16 = 2.77 at start; a memorized cycle near 0


def test_loss_scaling_divides_by_tokens_or_by_the_batch():
  """modelzoo's model.loss_scaling. By hand: xent [[1, 2], [3, 4]] with the last position
  padded sums to 1 + 2 + 3 = 6 over 3 real tokens (2.0) or over a batch of 2 (3.0)."""
  from cerebras_models.gpt.model import lm_loss  # pylint: disable=import-outside-toplevel
  xent = tf.constant([[1.0, 2.0], [3.0, 4.0]])
  weights = tf.constant([[1, 1], [1, 0]])
  assert abs(float(lm_loss(xent, weights)) - 2.0) < 1e-5
  assert abs(float(lm_loss(xent, weights, "batch_size")) - 3.0) < 1e-5


def test_your_own_text_files_through_file_pattern(tmp_path):
  """A user's corpus had to sit at <data_dir>/bert_pretrain/train.txt. `file_pattern` reads
  it where it is: 'the cat sat' repeated tokenizes to the vocab ids of those words, in order."""
  import os  # pylint: disable=import-outside-toplevel
  from cerebras_tf.errors import DataError  # pylint: disable=import-outside-toplevel
  from cerebras_models.gpt import input as input_lib  # pylint: disable=import-outside-toplevel
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__)))))
  vocab = os.path.join(root, "data_cache", "vocab", "bert_uncased_vocab.txt")
  if not os.path.exists(vocab):
    pytest.skip("no prepared vocab (python scripts/prepare_data.py)")
  (tmp_path / "part1.txt").write_text("the cat sat\n" * 40)
  params = {"train_input": {"file_pattern": str(tmp_path / "part*.txt"), "vocab_file": vocab,
                            "max_sequence_length": 5, "batch_size": 2, "shuffle_buffer": 1},
            "model": {"vocab_size": 30522}, "runconfig": {"tf_random_seed": 1}}
  ids = {line.rstrip("\n"): i for i, line in enumerate(open(vocab, encoding="utf-8"))}
  words = [ids["the"], ids["cat"], ids["sat"]]
  features, labels = next(iter(input_lib.input_fn(params)))
  for row, next_ids in zip(features["token_ids"].numpy(), labels.numpy()):
    start = words.index(row[0])
    expected = [words[(start + k) % 3] for k in range(6)]
    assert list(row) == expected[:5] and list(next_ids) == expected[1:]
  # do_lower: false keeps case, which the uncased vocab does not have ("The" is [UNK]).
  (tmp_path / "part1.txt").write_text("The cat sat\n" * 40)
  cased = {**params, "train_input": {**params["train_input"], "do_lower": False}}
  for section, first in ((params, ids["the"]), (cased, ids["[UNK]"])):
    tokens = next(iter(input_lib.input_fn(section)))[0]["token_ids"].numpy()
    assert first in tokens and ids["cat"] in tokens
    assert (ids["the"] if first == ids["[UNK]"] else ids["[UNK]"]) not in tokens
  params["train_input"]["file_pattern"] = str(tmp_path / "nothing*.txt")
  with pytest.raises(DataError, match="file_pattern .* matches no file"):
    input_lib.input_fn(params)


def _modelzoo_records(path, rows, options=None):
  """Cerebras modelzoo GPT-2 TFRecords: input_ids, input_mask, labels ([S] int64 each)."""
  with tf.io.TFRecordWriter(str(path), options=options) as w:
    for ids, mask, labels in rows:
      feature = {k: tf.train.Feature(int64_list=tf.train.Int64List(value=list(map(int, v))))
                 for k, v in (("input_ids", ids), ("input_mask", mask), ("labels", labels))}
      w.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


@pytest.mark.parametrize("options", [None, "GZIP"])
def test_tokenized_records_in_modelzoo_format_are_read_as_written(tmp_path, options):
  """Records from modelzoo's GPT-2 data preparation were read as text lines: TFRecord bytes
  went through the WordPiece tokenizer and trained as [UNK]s and noise, silently. They are
  read as written (no vocab: the ids are the user's tokenizer's), padding masked; records of
  another length are refused with the key to set."""
  from cerebras_tf.errors import DataError  # pylint: disable=import-outside-toplevel
  from cerebras_models.gpt import input as input_lib  # pylint: disable=import-outside-toplevel
  full = ([5, 6, 7, 8], [1, 1, 1, 1], [6, 7, 8, 9])
  padded = ([11, 12, 0, 0], [1, 1, 0, 0], [12, 13, 0, 0])
  _modelzoo_records(tmp_path / "owt_0.tfrecords", [full, padded, full], options)
  params = {"train_input": {"file_pattern": str(tmp_path / "owt_*.tfrecords"),
                            "max_sequence_length": 4, "batch_size": 2, "repeat": False},
            "eval_input": {"file_pattern": str(tmp_path / "owt_*.tfrecords"),
                           "max_sequence_length": 4, "batch_size": 2},
            "model": {"vocab_size": 50257}, "runconfig": {"tf_random_seed": 1}}
  batches = list(input_lib.input_fn(params, tf.estimator.ModeKeys.EVAL))
  features, labels = batches[0]
  assert [len(b[1]) for b in batches] == [2, 1]  # the third record in a last, partial batch
  assert features["token_ids"].numpy().tolist() == [full[0], padded[0]]
  assert features["padding_mask"].numpy().tolist() == [full[1], padded[1]]
  assert labels.numpy().tolist() == [full[2], padded[2]]
  assert features["token_ids"].dtype == labels.dtype == tf.int32
  params["train_input"]["max_sequence_length"] = 8
  with pytest.raises(DataError, match=r"owt_0.tfrecords holds GPT records of 4 tokens but "
                                      r"train_input.max_sequence_length is 8: set it to 4"):
    input_lib.input_fn(params)


def _modelzoo_hdf5(path, rows, features=None):
  """Cerebras modelzoo's GPT HDF5: one `data` dataset [examples, 3, S] (input_ids,
  attention_mask, labels unless data_params.json names them otherwise)."""
  import h5py  # pylint: disable=import-outside-toplevel
  import json  # pylint: disable=import-outside-toplevel
  path.parent.mkdir(exist_ok=True)
  with h5py.File(path, "w") as f:
    f.attrs["n_examples"] = len(rows)
    f.create_dataset("data", data=np.asarray(rows, np.int32), compression="gzip")
  if features:
    (path.parent / "data_params.json").write_text(json.dumps({"features": features}))


def test_modelzoo_hdf5_is_read_as_written_and_resumes_where_it_stopped(tmp_path):
  """Modelzoo's own data format (HDF5 from its preprocessing) was refused ("convert it").
  Its data_dir of *.h5 shards is read as written, in file order, with the feature order of
  data_params.json; the pipeline saves its position like TFRecords do (a from_generator
  source could not, and a resumed run would repeat batches)."""
  from cerebras_tf.errors import DataError  # pylint: disable=import-outside-toplevel
  from cerebras_models.gpt import input as input_lib  # pylint: disable=import-outside-toplevel
  def example(i):  # ids, mask, labels; every third example padded after two tokens
    ids = [10 * i + k for k in range(1, 5)]
    mask = [1, 1, 0, 0] if i % 3 == 2 else [1, 1, 1, 1]
    return ids, mask, [t * m for t, m in zip(ids[1:] + [10 * i + 5], mask)]
  _modelzoo_hdf5(tmp_path / "train" / "data-00000.h5", [example(i) for i in range(3)])
  _modelzoo_hdf5(tmp_path / "train" / "data-00001.h5", [example(i) for i in range(3, 5)])
  # A data_params.json that puts labels first: read by name, not by position.
  _modelzoo_hdf5(tmp_path / "eval" / "data-00000.h5",
                 [(l, i, m) for i, m, l in map(example, range(5))],
                 ["labels", "input_ids", "attention_mask"])
  params = {"train_input": {"data_dir": str(tmp_path / "train"), "max_sequence_length": 4,
                            "batch_size": 2, "shuffle_buffer": 1},
            "eval_input": {"data_dir": str(tmp_path / "eval"), "max_sequence_length": 4,
                           "batch_size": 2},
            "model": {"vocab_size": 100}, "runconfig": {"tf_random_seed": 1}}
  want = [example(i) for i in range(5)]
  batches = list(input_lib.input_fn(params, tf.estimator.ModeKeys.EVAL))
  assert [len(b[1]) for b in batches] == [2, 2, 1]  # all five, the last batch partial
  got = [(f["token_ids"].numpy().tolist(), f["padding_mask"].numpy().tolist(), l.numpy().tolist())
         for f, l in batches]
  assert [tuple(col[r] for col in g) for g in got for r in range(len(g[0]))] == \
      [tuple(map(list, w)) for w in want]
  # Training repeats and resumes: a checkpointed iterator goes on at the same example.
  train = input_lib.input_fn(params)
  it = iter(train)
  first = [next(it)[0]["token_ids"].numpy().tolist() for _ in range(2)]
  assert first == [[want[0][0], want[1][0]], [want[2][0], want[3][0]]]
  ckpt = tf.train.Checkpoint(it=it)
  saved = ckpt.save(str(tmp_path / "pos"))
  after = [next(it)[0]["token_ids"].numpy().tolist() for _ in range(2)]
  assert after == [[want[4][0], want[0][0]], [want[1][0], want[2][0]]]  # across the epoch
  it2 = iter(input_lib.input_fn(params))
  tf.train.Checkpoint(it=it2).restore(saved)
  assert [next(it2)[0]["token_ids"].numpy().tolist() for _ in range(2)] == after
  params["train_input"]["max_sequence_length"] = 8
  with pytest.raises(DataError, match=r"data-00000.h5 holds GPT examples of 4 tokens but "
                                      r"train_input.max_sequence_length is 8: set it to 4"):
    input_lib.input_fn(params)


def test_modelzoo_hdf5_layouts_that_are_not_gpt_data_are_named(tmp_path, caplog):
  """Shards of two preprocessing runs, a mask-less layout, and modelzoo's VSL layout."""
  from cerebras_tf.errors import DataError  # pylint: disable=import-outside-toplevel
  from cerebras_models.gpt import input as input_lib  # pylint: disable=import-outside-toplevel
  _modelzoo_hdf5(tmp_path / "mixed" / "a.h5", [[[1] * 4] * 3])
  _modelzoo_hdf5(tmp_path / "mixed" / "b.h5", [[[1] * 8] * 3])
  _modelzoo_hdf5(tmp_path / "two" / "a.h5", [[[1] * 4] * 2], ["input_ids", "labels"])
  _modelzoo_hdf5(tmp_path / "vsl" / "a.h5", [[[1] * 4] * 5] * 2,
                 ["input_ids", "attention_mask", "labels", "attention_span", "position_ids"])
  def params(d):
    return {"train_input": {"file_pattern": str(tmp_path / d / "*.h5"), "batch_size": 2,
                            "max_sequence_length": 4}, "model": {"vocab_size": 10}}
  with pytest.raises(DataError, match=r"HDF5 files differ: .*a.h5 holds .* x 4 \(int32\), "
                                      r".*b.h5 .* x 8 \(int32\); narrow the pattern"):
    input_lib.input_fn(params("mixed"))
  with pytest.raises(DataError, match=r"holds HDF5 features input_ids, labels, not the "
                                      r"modelzoo GPT features input_ids, attention_mask, labels"):
    input_lib.input_fn(params("two"))
  with caplog.at_level("WARNING"):
    features, _ = next(iter(input_lib.input_fn(params("vsl"))))
  assert features["token_ids"].shape == (2, 4)
  assert "attention_span, position_ids are not read" in caplog.text


def test_llama_7b_formula_matches_the_published_count():
  # Llama-2-7B: 32 x 4096, 32 heads, SwiGLU 11008, vocab 32000, untied, no biases, RMSNorm:
  # Hugging Face's LlamaForCausalLM reports 6,738,415,616 parameters. Per layer 4 * 4096^2
  # (q, k, v, o) + 3 * 4096 * 11008 (gate, up, down) + 2 * 4096 (two RMSNorm gains)
  # = 202,383,360; x 32 = 6,476,267,520; + 2 * 32000 * 4096 (embedding, head) + 4096 (ln_f).
  llama2 = dict(vocab_size=32000, hidden_size=4096, num_hidden_layers=32, num_heads=32,
                filter_size=11008, position_embedding_type="rotary", rotary_dim=128,
                share_embedding_weights=False, norm_type="rmsnorm",
                encoder_nonlinearity="swiglu", use_ffn_bias=False,
                use_projection_bias_in_attention=False, use_ffn_bias_in_attention=False,
                use_bias_in_output=False)
  assert modeling.num_parameters(modeling.GPTConfig(**llama2)) == 6_738_415_616
  # Llama-3-8B: 8 K/V heads of 128 (k, v are 4096 x 1024), FFN 14336, vocab 128256:
  # Hugging Face reports 8,030,261,248.
  llama3 = dict(llama2, vocab_size=128256, filter_size=14336, num_kv_groups=8)
  assert modeling.num_parameters(modeling.GPTConfig(**llama3)) == 8_030_261_248


def test_grouped_query_attention_is_attention_with_shared_key_value_heads():
  """num_kv_groups = 1 (multi-query) gives the logits of full attention whose K/V heads are
  all copies of the one K/V head: the repeat, not another projection, makes the groups."""
  base = dict(vocab_size=31, hidden_size=16, num_hidden_layers=1, num_heads=4, filter_size=32,
              max_position_embeddings=8, position_embedding_type="rotary", rotary_dim=4,
              norm_type="rmsnorm", encoder_nonlinearity="swiglu")
  ids = np.random.RandomState(0).randint(0, 31, [2, 8]).astype(np.int32)
  with tf.Graph().as_default():
    mq = modeling.GPTConfig(num_kv_groups=1, **base)
    out = modeling.gpt_model(tf.constant(ids), tf.ones_like(ids), mq, training=False)
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      want = sess.run(out)
      values = {v.op.name: sess.run(v) for v in tf1.global_variables()}
  assert values["gpt/decoder/layer_0/attention/key/kernel"].shape == (16, 4)
  with tf.Graph().as_default():
    full = modeling.GPTConfig(**base)
    out = modeling.gpt_model(tf.constant(ids), tf.ones_like(ids), full, training=False)
    assigns = []
    for v in tf1.global_variables():
      value = values[v.op.name]
      if v.op.name.endswith(("attention/key/kernel", "attention/value/kernel",
                             "attention/key/bias", "attention/value/bias")):
        # the one K/V head, copied for each query head
        value = np.tile(value, [1, 4] if value.ndim == 2 else [4])
      assigns.append(v.assign(value))
    with tf1.Session() as sess:
      sess.run(assigns)
      got = sess.run(out)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_rms_norm_divides_by_the_root_mean_square():
  # x = [3, 4]: mean square (9 + 16) / 2 = 12.5, rms 3.5355; gains 1: [0.8485, 1.1314].
  with tf.Graph().as_default():
    y = modeling.rms_norm(tf.constant([[3.0, 4.0]]), 0.0, "n")
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      np.testing.assert_allclose(sess.run(y), [[3 / 12.5 ** 0.5, 4 / 12.5 ** 0.5]], rtol=1e-6)


def test_llama3_rope_scaling_divides_only_the_long_wavelengths():
  # Llama 3.1's scaling (factor 8, low/high freq factors 1 and 4, original context 8192):
  # wavelengths under 8192 / 4 = 2048 positions keep their frequency, those over 8192 / 1 are
  # divided by 8, and in between the two are blended by (8192 / wavelength - 1) / (4 - 1).
  base = modeling.rotary_frequencies(128, 500000.0)
  scaled = modeling.rotary_frequencies(128, 500000.0, 8.0, "llama3",
                                       {"low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 8192})
  wavelen = 2 * np.pi / base
  short, long_ = wavelen < 2048, wavelen > 8192
  assert short.any() and long_.any() and (~short & ~long_).any()
  np.testing.assert_allclose(scaled[short], base[short])
  np.testing.assert_allclose(scaled[long_], base[long_] / 8)
  mid = ~short & ~long_
  smooth = (8192 / wavelen[mid] - 1) / 3
  np.testing.assert_allclose(scaled[mid], (1 - smooth) * base[mid] / 8 + smooth * base[mid])
  np.testing.assert_allclose(modeling.rotary_frequencies(128, 10000.0, 4.0, "linear"),
                             modeling.rotary_frequencies(128, 10000.0) / 4)


def test_export_serves_token_ids_and_the_next_token_after_the_last_real_one(tmp_path):
  """GPT had no SavedModel export ("model gpt has no serving_input_receiver_fn"). It serves
  token_ids and padding_mask [N, S] and returns the next token after every position and the
  log-probabilities after each row's last REAL token: predict took them after the last
  (padded) slot. Each row's distribution peaks where next_token does at its last real
  position."""
  import glob  # pylint: disable=import-outside-toplevel
  import os  # pylint: disable=import-outside-toplevel
  from cerebras_tf import cli  # pylint: disable=import-outside-toplevel
  _modelzoo_hdf5(tmp_path / "data" / "data-0.h5",
                 [([i % 7 + 1] * 8, [1] * 8, [i % 7 + 2] * 8) for i in range(32)])
  yaml_text = (f"train_input: {{data_dir: {tmp_path / 'data'}, batch_size: 4}}\n"
               f"eval_input: {{data_dir: {tmp_path / 'data'}, batch_size: 4}}\n"
               "model: {name: gpt, vocab_size: 16, hidden_size: 16, num_hidden_layers: 1, "
               "num_heads: 2, filter_size: 32, max_position_embeddings: 8}\n"
               "optimizer: {learning_rate: 0.01}\n"
               f"runconfig: {{model_dir: {tmp_path / 'm'}, max_steps: 3, use_cs: false}}\n")
  (tmp_path / "p.yaml").write_text(yaml_text)
  assert cli.main(["run.py", "--params", str(tmp_path / "p.yaml"), "--mode", "train",
                   "--export_dir", str(tmp_path / "export")]) == 0
  (saved,) = glob.glob(str(tmp_path / "export" / "*" / "saved_model.pb"))
  fn = tf.saved_model.load(os.path.dirname(saved)).signatures["serving_default"]
  ids = np.array([[3, 4, 5, 6, 7, 1, 2, 3], [5, 5, 5, 0, 0, 0, 0, 0]], np.int32)
  mask = np.array([[1] * 8, [1, 1, 1, 0, 0, 0, 0, 0]], np.int32)
  out = fn(token_ids=tf.constant(ids), padding_mask=tf.constant(mask))
  assert out["next_token"].shape == (2, 8) and out["log_probs"].shape == (2, 16)
  probs = np.exp(out["log_probs"].numpy())
  np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-5)
  # Row 2's distribution is the one after its 3rd token: its argmax is next_token[1, 2].
  assert probs[1].argmax() == out["next_token"].numpy()[1, 2]
  assert probs[0].argmax() == out["next_token"].numpy()[0, 7]


def test_modelzoo_initializer_specs_reach_their_variables():
  # Large enough layers that a sample stddev is within 5% of its expectation.
  specs = {"layers": {"name": "truncated_normal", "mean": 0.0, "stddev": 0.02},
           "output": {"name": "normal", "mean": 0.0, "stddev": 0.001},
           "embedding": {"name": "variance_scaling", "scale": 1.0, "mode": "fan_in",
                         "distribution": "untruncated_normal"}}
  config = modeling.GPTConfig(vocab_size=4096, hidden_size=256, num_hidden_layers=1,
                              num_heads=4, filter_size=1024, max_position_embeddings=8,
                              initializer_specs=specs)
  with tf.Graph().as_default():
    ids = tf1.placeholder(tf.int32, [1, 8])
    modeling.gpt_model(ids, tf.ones_like(ids), config, training=False)
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      values = {v.name: sess.run(v) for v in tf1.trainable_variables()}
  std = lambda suffix: next(np.std(x) for n, x in values.items() if n.endswith(suffix))  # noqa
  # A normal truncated at 2 stddev has stddev 0.8796 of the untruncated one: 0.02 -> 0.0176.
  assert std("mlp/fc_in/kernel:0") == pytest.approx(0.02 * 0.8796, rel=0.05)
  assert std("mlp/fc_out/kernel:0") == pytest.approx(0.001, rel=0.05)
  assert std("attention/output/kernel:0") == pytest.approx(0.001, rel=0.05)
  # Variance scaling, fan_in of the [4096, 256] table (its first axis): sqrt(1 / 4096).
  assert std("word_embeddings:0") == pytest.approx((1 / 4096) ** 0.5, rel=0.05)


def test_modelzoo_data_dir_list_reads_every_dir(tmp_path):
  """modelzoo's GPT-NeoX file lists ten data_dirs of GptTfRecordsProcessor records: each
  dir's records are read (sorted by path), not only the first dir's."""
  from cerebras_models.gpt import input as input_lib  # pylint: disable=import-outside-toplevel
  a = ([1, 2, 3, 4], [1, 1, 1, 1], [2, 3, 4, 5])
  b = ([7, 8, 9, 10], [1, 1, 1, 1], [8, 9, 10, 11])
  for name, row in (("0", a), ("1", b)):
    (tmp_path / name).mkdir()
    _modelzoo_records(tmp_path / name / "part.tfrecords", [row])
  section = {"data_dir": [str(tmp_path / "0"), str(tmp_path / "1")], "max_sequence_length": 4,
             "batch_size": 2, "repeat": False}
  params = {"train_input": section, "eval_input": section, "model": {"vocab_size": 50257},
            "runconfig": {"tf_random_seed": 1}}
  features, _ = next(iter(input_lib.input_fn(params, tf.estimator.ModeKeys.EVAL)))
  assert features["token_ids"].numpy().tolist() == [a[0], b[0]]


def test_modelzoo_gptj_forms_count_by_formula():
  # NeoX's untied norms (one more norm a layer), a tied head with a bias (V more), no learned
  # positions: the graph's count and the formula agree.
  for kw in ({"parallel_attention": True, "use_untied_layer_norm": True,
              "position_embedding_type": "rotary", "rotary_dim": 8},
             {"use_bias_in_output": True, "use_position_embedding": False}):
    config = modeling.GPTConfig(vocab_size=97, hidden_size=32, num_hidden_layers=3,
                                num_heads=4, filter_size=64, max_position_embeddings=16, **kw)
    assert _count_params(config) == modeling.num_parameters(config)
  tied = modeling.GPTConfig(vocab_size=97, hidden_size=32, num_hidden_layers=1, num_heads=4,
                            filter_size=64, max_position_embeddings=16)
  assert modeling.num_parameters(modeling.GPTConfig(**{**tied.__dict__,
                                                       "use_bias_in_output": True})) == \
      modeling.num_parameters(tied) + 97


def test_a_training_mlp_calls_the_fused_gelu_and_other_graphs_the_plain_ops():
  """GPT's feed-forward GELU takes BERT's XLA-compiled form in a host training graph only
  (models/bert/modeling.feed_forward_activation): not in evaluation, not in the engine's trace."""
  config = modeling.GPTConfig(vocab_size=97, hidden_size=16, num_hidden_layers=1, num_heads=2,
                              filter_size=32, max_position_embeddings=8)

  def mlp_calls(training, engine=False):
    graph = tf.Graph()
    with graph.as_default():
      if engine:
        with precision.tracing_for_engine():
          modeling.mlp(tf.zeros([8, 16]), config, training)
      else:
        modeling.mlp(tf.zeros([8, 16]), config, training)
    return [op.get_attr("f").name for op in graph.get_operations() if "PartitionedCall" in op.type]

  calls = mlp_calls(training=True)
  assert len(calls) == 1 and "gelu_forward_fused" in calls[0], calls
  assert mlp_calls(training=False) == [] and mlp_calls(training=True, engine=True) == []


@pytest.mark.parametrize("parallel", [False, True])
def test_a_bfloat16_gpt_keeps_its_residual_stream_float32_on_the_host_only(parallel):
  """The sublayers compute in bfloat16 and add into a float32 stream on the host (a 24-layer
  GPT's final hidden state 0.91% rms from float32's against 1.36% with a bfloat16 stream);
  the engine's trace keeps the 16-bit stream the engine computes with, so its plans and
  activation bytes do not change; the backbone's output is bfloat16 either way."""
  config = modeling.GPTConfig(vocab_size=97, hidden_size=32, num_hidden_layers=3, num_heads=4,
                              filter_size=64, max_position_embeddings=16, dropout_rate=0.1,
                              parallel_attention=parallel, dtype="bfloat16")

  def streams(engine):
    with tf.Graph().as_default(), call_dtypes(modeling, "decoder_layer") as seen, \
        (precision.tracing_for_engine() if engine else contextlib.nullcontext()):
      ids = tf.zeros([2, 8], tf.int32)
      hidden = modeling.gpt_hidden(ids, tf.ones_like(ids), config, training=True)
      assert hidden.h.dtype == tf.bfloat16
    return seen

  assert streams(engine=False) == [("float32", "float32")] * 3
  assert streams(engine=True) == [("bfloat16", "bfloat16")] * 3
