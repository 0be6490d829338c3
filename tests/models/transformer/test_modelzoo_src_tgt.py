"""modelzoo's Transformer input keys: sources and targets in separate line-aligned files
(`src_data_dir` / `tgt_data_dir`, globs), their vocabularies (`src_vocab_file` /
`tgt_vocab_file`, one shared here), and its attention keys."""

import numpy as np
import pytest
import tensorflow as tf

from cerebras_tf import params as params_lib
from cerebras_tf.errors import DataError, ParamsError
import cerebras_models.transformer  # noqa: F401  registers the model
from cerebras_models.transformer import input as input_lib
from cerebras_models.transformer import modeling
from cerebras_models.transformer import vocab as vocab_lib

tf1 = tf.compat.v1

EN = ["The cat sees a bird.", "A big dog.", "The small house.", "A dog and a cat."]
ES = ["El gato ve un pájaro.", "Un perro grande.", "La casa pequeña.", "Un perro y un gato."]


def _params(tmp_path, extra=""):
  text = f"""
train_input: {{data_processor: TransformerDynamicDataProcessor,
               src_data_dir: "{tmp_path}/train.*.en", tgt_data_dir: "{tmp_path}/train.*.es",
               src_vocab_file: {tmp_path}/vocab.en, tgt_vocab_file: {tmp_path}/vocab.es,
               src_max_sequence_length: 12, tgt_max_sequence_length: 12, batch_size: 4,
               shuffle: false{extra}}}
model: {{encoder_num_hidden_layers: 1, decoder_num_hidden_layers: 1, hidden_size: 16,
         num_heads: 2, filter_size: 32, attention_type: dot_product,
         use_projection_bias_in_attention: false, use_ffn_bias_in_attention: false}}
optimizer: {{optimizer_type: adam, learning_rate: 0.01}}
runconfig: {{max_steps: 2}}
"""
  return params_lib.parse_params(text, str(tmp_path / "params.yaml"))


def _files(tmp_path, es_vocab_extra=""):
  # Two shards a language, line-aligned shard by shard (modelzoo reads sorted globs).
  for shard, rows in (("0", slice(0, 2)), ("1", slice(2, 4))):
    (tmp_path / f"train.{shard}.en").write_text("\n".join(EN[rows]) + "\n")
    (tmp_path / f"train.{shard}.es").write_text("\n".join(ES[rows]) + "\n")
  words = sorted({w for line in EN + ES for w in line.replace(".", " .").split()})
  vocab = "\n".join(list(vocab_lib.RESERVED) + words) + "\n"
  (tmp_path / "vocab.en").write_text(vocab)
  (tmp_path / "vocab.es").write_text(vocab + es_vocab_extra)


def test_line_aligned_source_and_target_files(tmp_path):
  """The pairs are line i of the source files with line i of the target files, in the sorted
  globs' order; the two vocabulary files (same tokens) are the shared vocabulary."""
  _files(tmp_path)
  params = _params(tmp_path)
  inp = params["train_input"]
  assert (inp["max_source_length"], inp["max_target_length"]) == (12, 12)
  assert input_lib.vocab_file(params) == str(tmp_path / "vocab.en")
  params["eval_input"] = dict(inp)
  with tf.Graph().as_default():
    it = tf1.data.make_initializable_iterator(input_lib.input_fn(params, "eval"))
    nxt = it.get_next()
    with tf1.Session() as sess:
      sess.run([tf1.tables_initializer(), it.initializer])
      features, _ = sess.run(nxt)
  assert [t.decode() for t in features["source_text"]] == EN
  assert [t.decode() for t in features["target_text"]] == ES
  assert (features["source_ids"] > vocab_lib.UNK_ID).sum() == features["source_lengths"].sum()


def test_vocabularies_that_differ_and_a_missing_side_are_refused(tmp_path):
  _files(tmp_path, es_vocab_extra="extra\n")
  with pytest.raises(DataError, match=r"hold different tokens: the Transformer here shares one "
                                      r"vocabulary"):
    input_lib.vocab_file(_params(tmp_path))
  with pytest.raises(ParamsError, match=r"train_input.src_data_dir needs train_input."
                                        r"tgt_data_dir"):
    params_lib.parse_params(
        f"train_input: {{src_data_dir: {tmp_path}/x, batch_size: 2}}\n"
        "model: {name: transformer}\n", str(tmp_path / "p.yaml"))


def test_attention_keys_are_applied():
  """dot_product: scores unscaled; no attention biases: q/k/v/output have kernels only."""
  config = modeling.TransformerConfig.from_params(dict(
      vocab_size=20, hidden_size=8, num_hidden_layers=1, num_heads=2, filter_size=16,
      attention_type="dot_product", use_projection_bias_in_attention=False,
      use_ffn_bias_in_attention=False, dropout_rate=0.0, attention_dropout_rate=0.0))
  assert not config.scaled_attention
  with tf.Graph().as_default():
    x = tf.constant(np.random.RandomState(0).randn(1, 3, 8), tf.float32)
    with tf1.variable_scope("attn"):
      modeling.attention(x, tf.zeros([1, 1, 1, 3]), config, False)
    names = sorted(v.name for v in tf1.global_variables())
  assert names == [f"attn/{n}/kernel:0" for n in ("key", "output", "query", "value")]
