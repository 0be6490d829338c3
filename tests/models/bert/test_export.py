"""SavedModel export of the BERT classifier: raw strings in, probabilities out."""

import glob
import os
import shutil

import numpy as np
import tensorflow as tf
import yaml

import bert_test_base as base
from cerebras_tf import cli
from cerebras_models.bert import export as export_lib
from cerebras_models.bert import input as input_lib
from cerebras_models.bert import model

TRAIN, PREDICT = tf.estimator.ModeKeys.TRAIN, tf.estimator.ModeKeys.PREDICT


class ExportTest(base.BertTestCase):

  def test_saved_model_classifies_raw_strings_with_vocab_asset(self):
    data_dir = self.make_data_dir()
    params = base.tiny_params(data_dir, task="classification")
    params["eval_input"].update(split="test")
    model_dir = os.path.join(self.get_temp_dir(), "model")
    est = tf.estimator.Estimator(model.model_fn, model_dir=model_dir, params=params,
                                 config=tf.estimator.RunConfig(tf_random_seed=1))
    est.train(lambda params: input_lib.input_fn(params, TRAIN), max_steps=5)
    expected = np.stack([p["probabilities"] for p in est.predict(
        lambda params: input_lib.input_fn(params, PREDICT))])

    # The CLI path: --mode export on a validated params file.
    yaml_params = {
        "model": {k: v for k, v in params["model"].items()},
        "train_input": {k: v for k, v in params["train_input"].items()},
        "eval_input": dict(params["eval_input"]),
        "optimizer": {"learning_rate": 1e-3},
        "runconfig": {"model_dir": model_dir, "use_cs": False},
    }
    yaml_params["eval_input"].pop("split")
    path = os.path.join(self.get_temp_dir(), "params.yaml")
    with open(path, "w") as f:
      yaml.safe_dump(yaml_params, f)
    export_base = os.path.join(self.get_temp_dir(), "export")
    self.assertEqual(cli.main(["run.py", "--params", path, "--mode", "export", "--export_dir",
                               export_base]), 0)
    (saved,) = glob.glob(os.path.join(export_base, "*", "saved_model.pb"))
    saved = os.path.dirname(saved)
    self.assertTrue(os.path.exists(os.path.join(saved, "assets", "bert_uncased_vocab.txt")))

    sentences = [s.decode() for s in _test_sentences(params)]
    shutil.rmtree(data_dir)  # the SavedModel must not need the training data or vocab path
    loaded = tf.saved_model.load(saved)  # a fresh eager TF2 load, as a server would do it
    out = loaded.signatures["serving_default"](sentences=tf.constant(sentences))
    probs, preds = out["probabilities"].numpy(), out["predictions"].numpy()
    self.assertEqual(probs.shape, (len(sentences), 2))
    self.assertAllClose(probs.sum(-1), np.ones(len(sentences)), atol=1e-5)
    self.assertAllEqual(preds, probs.argmax(-1))
    self.assertAllClose(probs, expected, atol=1e-5)  # same tokenization, same weights

  def test_a_pair_classifier_serves_pairs_and_its_label_words(self):
    """A classifier fine-tuned on GLUE-style pairs (RTE's sentence1, sentence2, word labels)
    exported a single-sentence signature: served one text, it scored inputs it was never
    trained on. It serves `sentences` and `sentences_b`, packed as training packed them,
    and returns the label words (`classes`) beside their ids."""
    data_dir = self.make_data_dir()
    rows = [("a good movie", "the plot", "entailment"), ("a dull film", "it ran", "not_entailment"),
            ("great fun", "a bird flew", "entailment"), ("bad plot", "a cat sat", "not_entailment")]
    tsv = os.path.join(self.get_temp_dir(), "rte.tsv")
    with open(tsv, "w", encoding="utf-8") as f:
      f.write("index\tsentence1\tsentence2\tlabel\n" + "".join(
          f"{i}\t{a}\t{b}\t{l}\n" for i, (a, b, l) in enumerate(rows * 4)))
    params = base.tiny_params(data_dir, task="classification")
    params["train_input"]["file_pattern"] = tsv
    params["eval_input"].update(file_pattern=tsv, batch_size=4)
    model_dir = os.path.join(self.get_temp_dir(), "pair_model")
    est = tf.estimator.Estimator(model.model_fn, model_dir=model_dir, params=params,
                                 config=tf.estimator.RunConfig(tf_random_seed=1))
    est.train(lambda params: input_lib.input_fn(params, TRAIN), max_steps=3)
    preds = list(est.predict(lambda params: input_lib.input_fn(params, PREDICT)))[:4]
    self.assertEqual([p["classes"].decode() for p in preds],
                     [["entailment", "not_entailment"][p["predictions"]] for p in preds])
    export_base = os.path.join(self.get_temp_dir(), "pair_export")
    saved = est.export_saved_model(
        export_base, lambda: export_lib.serving_input_receiver_fn(params)).decode()
    out = tf.saved_model.load(saved).signatures["serving_default"](
        sentences=tf.constant([a for a, _, _ in rows]),
        sentences_b=tf.constant([b for _, b, _ in rows]))
    self.assertAllClose(out["probabilities"].numpy(), [p["probabilities"] for p in preds],
                        atol=1e-5)
    self.assertEqual([c.decode() for c in out["classes"].numpy()],
                     [p["classes"].decode() for p in preds])

  def test_pretraining_task_is_refused(self):
    with self.assertRaisesRegex(ValueError, "classification"):
      export_lib.serving_input_receiver_fn(base.tiny_params(self.make_data_dir()))


def _test_sentences(params):
  path = os.path.join(params["eval_input"]["data_dir"], "rotten_tomatoes", "test.tfrecord")
  return [tf.train.Example.FromString(r.numpy()).features.feature["sentence"].bytes_list.value[0]
          for r in tf.data.TFRecordDataset(path)]
