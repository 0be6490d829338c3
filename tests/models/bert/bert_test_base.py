"""Shared test case and tiny fixtures for the BERT tests (keras-hub style: one base, short tests).

Nothing here needs the real data: a 40-word vocab and a few TFRecords are written to a tmp dir.
"""

import copy
import os
import sys

import numpy as np
import tensorflow as tf

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
if REPO not in sys.path:
  sys.path.insert(0, REPO)
SHARED = os.path.abspath(os.path.join(REPO, "..", "shared"))
GOOGLE_BERT_TINY = os.path.join(SHARED, "data", "google_bert_tiny")

tf1 = tf.compat.v1

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ("the a cat dog sat on mat ran to park big small red blue house tree bird flew over "
         "river good bad movie film plot was very fun dull and but it is not great awful").split()
VOCAB = SPECIAL + WORDS + ["##s", "##ed", "##ing", "."]


def write_vocab(path):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    f.write("\n".join(VOCAB) + "\n")
  return path


def _example(**feats):
  def feature(v):
    if isinstance(v, str):
      return tf.train.Feature(bytes_list=tf.train.BytesList(value=[v.encode()]))
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v)]))
  return tf.train.Example(features=tf.train.Features(
      feature={k: feature(v) for k, v in feats.items()})).SerializeToString()


SENTIMENT = {1: ["good", "great", "fun"], 0: ["bad", "awful", "dull"]}
NEUTRAL = [w for w in WORDS if w not in SENTIMENT[0] + SENTIMENT[1]]


def _sentence(rng, n, words=WORDS):
  return " ".join(rng.choice(words, size=n)).capitalize() + "."


def write_fixture_data(data_dir, num_pairs=64, num_sentences=48, seed=0):
  """Writes the prepare_data.py layout (tiny vocab, pretraining pairs, review sentences)."""
  rng = np.random.RandomState(seed)
  write_vocab(os.path.join(data_dir, "vocab", "bert_uncased_vocab.txt"))
  os.makedirs(os.path.join(data_dir, "bert_pretrain"), exist_ok=True)
  for split in ("train", "eval"):
    with tf.io.TFRecordWriter(os.path.join(data_dir, "bert_pretrain", split + ".tfrecord")) as w:
      for _ in range(num_pairs):
        w.write(_example(text_a=_sentence(rng, rng.randint(5, 30)),
                         text_b=_sentence(rng, rng.randint(5, 30)),
                         next_sentence_label=rng.randint(2)))
  os.makedirs(os.path.join(data_dir, "rotten_tomatoes"), exist_ok=True)
  for split in ("train", "dev", "test"):
    with tf.io.TFRecordWriter(os.path.join(data_dir, "rotten_tomatoes", split + ".tfrecord")) as w:
      for _ in range(num_sentences):
        label = rng.randint(2)
        # Sentiment words only in the label's polarity make the task learnable in seconds.
        a, b = rng.choice(SENTIMENT[label], size=2)
        w.write(_example(sentence="A %s movie , %s plot . %s" % (a, b, _sentence(rng, 4, NEUTRAL)),
                         label=label))
  return data_dir


def tiny_params(data_dir=None, task="pretraining", **model_overrides):
  """Nested params for a 2-layer, 32-wide BERT over the fixture vocab."""
  params = {
      "model": {"name": "bert", "task": task, "hidden_size": 32, "num_hidden_layers": 2,
                "num_heads": 2, "filter_size": 64, "vocab_size": len(VOCAB),
                "max_position_embeddings": 64, "type_vocab_size": 2, "dropout_rate": 0.0,
                "attention_dropout_rate": 0.0, "layer_norm_epsilon": 1e-12,
                "initializer_range": 0.02, "num_classes": 2},
      "optimizer": {"optimizer_type": "adamw", "learning_rate": 1e-3, "warmup_steps": 0,
                    "max_gradient_norm": 1.0, "weight_decay_rate": 0.01,
                    "grad_accum_steps": 1, "learning_rate_decay": "constant"},
      "train_input": {"data_dir": data_dir, "batch_size": 8, "max_sequence_length": 32,
                      "max_predictions_per_seq": 5, "shuffle_buffer": 64, "shuffle_seed": 1},
      "eval_input": {"data_dir": data_dir, "batch_size": 8, "max_sequence_length": 32,
                     "max_predictions_per_seq": 5},
      "runconfig": {"max_steps": 100, "tf_random_seed": 1},
  }
  params["model"].update(model_overrides)
  return params


def with_overrides(params, section, **kw):
  out = copy.deepcopy(params)
  out[section].update(kw)
  return out


class BertTestCase(tf.test.TestCase):
  """Graph-mode helpers: every test builds its own tf.Graph like the Estimator does."""

  test_session = None  # tf.test.TestCase's deprecated helper; keeps pytest from collecting it

  def make_data_dir(self):
    return write_fixture_data(os.path.join(self.get_temp_dir(), "data"))

  def take(self, input_fn, params, mode, num_batches, graph_seed=1, epochs_from=None):
    """Runs `input_fn` in a fresh graph (seeded like RunConfig does); returns numpy batches."""
    with tf.Graph().as_default():
      if graph_seed is not None:
        tf1.set_random_seed(graph_seed)
      ds = input_fn(params, mode)
      it = tf1.data.make_initializable_iterator(ds)
      nxt = it.get_next()
      with tf1.Session() as sess:
        sess.run([it.initializer, tf1.tables_initializer()])
        return [sess.run(nxt) for _ in range(num_batches)]

  def run_graph(self, build, fetches_from_build=None):
    """Builds with `build()` in a fresh graph, initializes, returns (sess-run fn, built)."""
    graph = tf.Graph()
    with graph.as_default():
      tf1.set_random_seed(1)
      built = build()
      init = [tf1.global_variables_initializer(), tf1.local_variables_initializer(),
              tf1.tables_initializer()]
    sess = tf1.Session(graph=graph)
    self.addCleanup(sess.close)
    sess.run(init)
    return sess, built


def npz_features(inputs):
  """google_bert_tiny inputs.npz -> this project's feature names."""
  return {"token_ids": inputs["input_ids"], "padding_mask": inputs["input_mask"],
          "segment_ids": inputs["token_type_ids"],
          "masked_lm_positions": inputs["masked_lm_positions"],
          "masked_lm_ids": inputs["masked_lm_ids"],
          "masked_lm_weights": inputs["masked_lm_weights"],
          "next_sentence_label": inputs["next_sentence_labels"]}
