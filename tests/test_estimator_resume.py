"""CerebrasEstimator resuming: the input pipeline's position saved with the model, other data
under the same shapes, a dataset that runs out, relative model_dir and warm-start paths, and a
Saver of the model_fn's own checked before anything is written.
"""

import glob
import logging
import os
import re
import shutil
import time
import warnings

import numpy as np
import pytest
import tensorflow as tf

from cerebras_tf import CerebrasEstimator, CSConfig, CSRunConfig
from cerebras_tf.errors import ConfigError
from cerebras_models.mlp.model import model_fn
from estimator_fixtures import PARAMS, config_in, eval_input_fn, train_input_fn


def test_an_input_fn_that_returns_tensors_trains_and_resumes(tmp_path, caplog):
  """Estimator input_fns may return (features, labels) tensors instead of a Dataset. The
  pipelined run checkpoints the input position, and TF's hook for it failed on such an
  input_fn with "No variables to save" (no iterator); it now stands down and says so."""
  def tensors(params):
    x = tf.random.uniform([params["batch_size"], PARAMS["input_dim"]], seed=1)
    return {"x": x}, tf.cast(x[:, 0] * PARAMS["num_classes"], tf.int32)
  caplog.set_level(logging.INFO, logger="tensorflow")
  cfg = config_in(tmp_path, cs_config=CSConfig(execution_strategy="pipelined"))
  est = CerebrasEstimator(model_fn, config=cfg, params=PARAMS)
  est.train(tensors, max_steps=3, use_cs=True)
  assert est.get_variable_value("global_step") == 3
  assert "its position is not checkpointed" in caplog.text
  est = CerebrasEstimator(model_fn, config=cfg, params=PARAMS)
  est.train(tensors, max_steps=5, use_cs=True)  # resumes at 3
  assert est.get_variable_value("global_step") == 5
  assert not os.path.exists(os.path.join(cfg.model_dir, "checkpoint_input"))


def _records_input_fn(params):
  """The MLP's (x, label) from the TFRecord file params['data'], shuffled and repeated."""
  spec = {"x": tf.io.FixedLenFeature([32], tf.float32), "y": tf.io.FixedLenFeature([], tf.int64)}
  ds = tf.data.TFRecordDataset(params["data"]).shuffle(64, seed=1).repeat()
  ds = ds.map(lambda r: tf.io.parse_single_example(r, spec))
  return ds.map(lambda e: ({"x": e["x"]}, tf.cast(e["y"], tf.int32))).batch(
      params["batch_size"], drop_remainder=True)


def test_other_data_under_the_same_shapes_starts_the_input_afresh(tmp_path, caplog):
  """Training on a.tfrecord, then on b.tfrecord on the same model_dir (the same shapes): the
  saved position of a's pipeline (its shuffle buffer, its file offset) was restored into b's,
  silently. The input's files are now part of what the position is saved for; the same file
  again keeps it."""
  rng = np.random.default_rng(0)
  for name in ("a", "b"):
    with tf.io.TFRecordWriter(str(tmp_path / f"{name}.tfrecord")) as w:
      for _ in range(200):
        w.write(tf.train.Example(features=tf.train.Features(feature={
            "x": tf.train.Feature(float_list=tf.train.FloatList(value=rng.normal(size=32))),
            "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[rng.integers(4)]))}))
                .SerializeToString())
  caplog.set_level(logging.WARNING, logger="tensorflow")

  def train(name, steps):
    caplog.clear()
    est = CerebrasEstimator(model_fn, config=config_in(tmp_path),
                            params={**PARAMS, "data": str(tmp_path / f"{name}.tfrecord")})
    est.train(_records_input_fn, steps=steps, use_cs=True)
    return [r.getMessage() for r in caplog.records if "since its position" in r.getMessage()]

  assert train("a", 20) == []
  said = train("b", 20)
  changed = re.match(
      r"cerebras_tf: the input reads other data files since its position was saved \(1 "
      r"file\(s\) (\w{12}) -> 1 file\(s\) (\w{12})\); the input starts from its beginning",
      said[0]) if len(said) == 1 else None
  assert changed and changed.group(1) != changed.group(2), said
  assert train("b", 20) == []  # the same data: its position resumes
  with open(tmp_path / "model" / "checkpoint_input.signature", encoding="utf-8") as fh:
    assert fh.read().endswith(f"; data: 1 file(s) {changed.group(2)}")


def test_time_based_checkpoints_save_the_input_position_at_the_same_steps(tmp_path):
  """With save_checkpoints_secs, TF's input-position hook ran its own timer: the model was
  saved at 0, 1371, 2932, the input at 0, 1426, 2999, and a run killed before its last save
  resumed from step 0, the only step with both. The position is now written by the model's
  saver, at each of its steps."""
  from cerebras_tf.runtime import ckpt_files  # pylint: disable=import-outside-toplevel
  cfg = CSRunConfig(model_dir=str(tmp_path / "model"), save_checkpoints_secs=1,
                    save_checkpoints_steps=None, keep_checkpoint_max=0, log_step_count_steps=1000,
                    cs_config=CSConfig(execution_strategy="pipelined"))
  est = CerebrasEstimator(model_fn, config=cfg, params={**PARAMS, "hidden_sizes": [256, 256]})

  class Slow(tf.compat.v1.train.SessionRunHook):
    def after_run(self, run_context, run_values):
      time.sleep(0.01)  # 400 steps: 4 s or more, at least three timed saves in one call
  est.train(train_input_fn, max_steps=400, hooks=[Slow()], use_cs=True)
  model = [ckpt_files.step_of(p) for p in ckpt_files.list_checkpoints(cfg.model_dir)]
  inputs = [ckpt_files.step_of(p) for p in ckpt_files.list_checkpoints(
      cfg.model_dir, ckpt_files.INPUT_PREFIX)]
  assert model == inputs and len(model) >= 3, (model, inputs)
  # A kill before the last save: the run resumes from the save before it, not from step 0.
  assert ckpt_files.paired_step(model[:-1], inputs[:-1]) == model[-2] > 0
  # The model's checkpoints carry the meta graph; the input's do not write it again.
  files = os.listdir(cfg.model_dir)
  assert {f"model.ckpt-{step}.meta" for step in model} <= set(files)
  assert not [f for f in files if f.startswith("input.ckpt") and f.endswith(".meta")], files


def test_a_dataset_that_runs_out_says_so_and_the_next_call_takes_another_pass(tmp_path,
                                                                              caplog):
  """A dataset without .repeat(): 96 examples are 6 batches of 16. tf.estimator stops at the
  end of the input, silently. The pipelined run also saved the input's position there, so
  every later train call restored an exhausted iterator and trained nothing (global step
  stayed 6). Now the stop is one warning with the step, and the next call takes another
  pass, as the plain Estimator's would: 6 more steps."""
  def finite(params):
    x = np.random.RandomState(0).randn(96, PARAMS["input_dim"]).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    return tf.data.Dataset.from_tensor_slices(({"x": x}, y)).batch(params["batch_size"])
  cfg = config_in(tmp_path, cs_config=CSConfig(execution_strategy="pipelined"))
  est = CerebrasEstimator(model_fn, config=cfg, params=PARAMS)
  est.train(finite, max_steps=30, use_cs=True)
  assert est.get_variable_value("global_step") == 6
  assert "the input_fn's data ran out at step 6 of 30: training stopped there" in caplog.text
  caplog.clear()
  est.train(finite, max_steps=30, use_cs=True)
  assert est.get_variable_value("global_step") == 12
  assert "ran out at step 12 of 30" in caplog.text
  caplog.clear()
  est.train(finite, max_steps=12, use_cs=True)  # at max_steps already: nothing to say
  assert "ran out" not in caplog.text


def test_a_generator_dataset_trains_on_and_never_rolls_the_model_back(tmp_path, caplog):
  """Dataset.from_generator cannot save its position past step 0: the pipelined run crashed at
  its first checkpoint (UnimplementedError from SerializeIterator) with the model saved and
  the input not, and the next call paired them at step 0: "resuming both from step 0", every
  step lost. Now the run trains on and says its input restarts on resume; no rollback."""
  def gen_input(params):
    def gen():
      r = np.random.RandomState(0)
      while True:
        x = r.randn(PARAMS["input_dim"]).astype("float32")
        yield {"x": x}, np.int32(x[0] > 0)
    spec = ({"x": tf.TensorSpec([PARAMS["input_dim"]], tf.float32)},
            tf.TensorSpec([], tf.int32))
    return tf.data.Dataset.from_generator(gen, output_signature=spec).batch(params["batch_size"])
  cfg = config_in(tmp_path, cs_config=CSConfig(execution_strategy="pipelined"))
  est = CerebrasEstimator(model_fn, config=cfg.replace(save_checkpoints_steps=10), params=PARAMS)
  est.train(gen_input, max_steps=20, use_cs=True)
  assert est.get_variable_value("global_step") == 20
  assert "cannot save its position (GeneratorDataset does not support checkpointing.)" \
      in caplog.text
  caplog.clear()
  est.train(gen_input, max_steps=30, use_cs=True)
  assert est.get_variable_value("global_step") == 30
  assert "resuming both from step" not in caplog.text


def _saver_model_fn(saver_first):
  def model_fn(features, labels, mode, params):
    logits = tf.compat.v1.layers.dense(features["x"], params["num_classes"])
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    saver = tf.compat.v1.train.Saver(max_to_keep=1) if saver_first else None
    step = tf.compat.v1.train.AdamOptimizer(1e-2).minimize(
        loss, tf.compat.v1.train.get_global_step())
    scaffold = tf.compat.v1.train.Scaffold(saver=saver or tf.compat.v1.train.Saver(max_to_keep=1))
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=step, scaffold=scaffold)
  return model_fn


def test_a_scaffold_saver_made_before_minimize_is_refused_before_training(tmp_path):
  """A Saver saves the variables that exist when it is made: one made before minimize() wrote
  checkpoints without Adam's state (5 of the 15 variables in the trial), and the next train
  call was refused as "the optimizer or its settings changed" after the first had trained.
  Now refused before anything trains, with the names; made after minimize, it trains and
  resumes (max_to_keep=1 leaves one checkpoint)."""
  cfg = config_in(tmp_path, cs_config=CSConfig(execution_strategy="pipelined"))
  est = CerebrasEstimator(_saver_model_fn(saver_first=True), config=cfg, params=PARAMS)
  # By hand: it saves dense/kernel, dense/bias and global_step; Adam adds two slots for each
  # of the 2 weights and beta1_power, beta2_power: 9 in all, 6 left out.
  with pytest.raises(ConfigError, match=r"the Saver in its scaffold saves 3 of the 9 variables "
                     r"\(not 'beta1_power' and 5 more\), so a checkpoint it writes cannot resume"):
    est.train(train_input_fn, max_steps=5, use_cs=True)
  assert tf.train.latest_checkpoint(cfg.model_dir) is None
  est = CerebrasEstimator(_saver_model_fn(saver_first=False), config=cfg, params=PARAMS)
  est.train(train_input_fn, max_steps=20, use_cs=True)
  est.train(train_input_fn, max_steps=30, use_cs=True)
  assert tf.train.get_checkpoint_state(cfg.model_dir).all_model_checkpoint_paths == [
      os.path.join(cfg.model_dir, "model.ckpt-30")]


@pytest.mark.parametrize("strategy", ["pipelined", "weight_streaming"])
def test_a_relative_model_dir_resumes(tmp_path, monkeypatch, strategy):
  """`model_dir="model"`, the way a notebook writes it. TF's checkpoint state joins its
  relative entries to the model_dir already; joining them again read `model/model/...`, so
  every second run on a relative model_dir stopped with "checkpoint is corrupt". In weight
  streaming the weight servers (run from another directory) failed the first save."""
  monkeypatch.chdir(tmp_path)
  cfg = CSRunConfig(model_dir="model", save_checkpoints_steps=2,
                    cs_config=CSConfig(execution_strategy=strategy))
  CerebrasEstimator(model_fn, config=cfg, params=PARAMS).train(train_input_fn, max_steps=2,
                                                               use_cs=True)
  est = CerebrasEstimator(model_fn, config=cfg, params=PARAMS)
  est.train(train_input_fn, max_steps=4, use_cs=True)
  assert est.get_variable_value("global_step") == 4
  assert sorted(os.listdir("model")).count("model.ckpt-4.index") == 1
  assert not glob.glob("model/*.corrupt")
  monkeypatch.setenv("HOME", str(tmp_path / "home"))  # `~` is the home, not a directory "~"
  est = CerebrasEstimator(model_fn, config=cfg.replace(model_dir="~/m"), params=PARAMS)
  assert est.model_dir == str(tmp_path / "home" / "m")


def test_weight_streaming_after_the_first_runs_model_dir_was_deleted(tmp_path, monkeypatch):
  """A notebook trains in weight streaming, deletes that model_dir, changes directory and
  trains a new model. The process's weight servers are restarted in the new directory (their
  restore ops read relative paths as the client does), and they logged into the first run's
  model_dir: restarting them failed (no such file, cluster_logs/ps_0.log), and every later
  weight-streaming run of the process then said "start a new process" (the suite found it).
  Now they log under the current run's model_dir."""
  ws = CSConfig(execution_strategy="weight_streaming")
  first, second = tmp_path / "a", tmp_path / "b"
  first.mkdir()
  second.mkdir()
  monkeypatch.chdir(first)
  est = CerebrasEstimator(model_fn, config=CSRunConfig(model_dir=str(first / "m"), cs_config=ws),
                          params=PARAMS)
  est.train(train_input_fn, max_steps=1, use_cs=True)
  shutil.rmtree(first / "m")
  monkeypatch.chdir(second)
  est = CerebrasEstimator(model_fn, config=CSRunConfig(model_dir=str(second / "m"),
                                                       cs_config=ws), params=PARAMS)
  est.train(train_input_fn, max_steps=2, use_cs=True)
  assert est.get_variable_value("global_step") == 2
  assert glob.glob(str(second / "m" / "cluster_logs" / "ps_*.log"))
  assert not (first / "m").exists()  # not made again for the restarted servers' logs


@pytest.mark.parametrize("how", ["init_checkpoint", "warm_start_from", "WarmStartSettings",
                                 "keras", "model_fn_init_from_checkpoint"])
def test_relative_warm_start_paths_reach_the_weight_servers(tmp_path, monkeypatch, how):
  """In weight streaming the weight servers run the restore ops, and ran in another
  directory: a relative init_checkpoint, warm_start_from, from_keras_model's own warm start
  under a relative model_dir, or a model_fn's own google-bert-style
  init_from_checkpoint("src", ...) failed the first step with "Failed to find any matching
  files for src/model.ckpt-2" from /job:ps. They now run in the client's directory (and do
  not import from it: a module there named like ours is not picked up)."""
  monkeypatch.chdir(tmp_path)
  (tmp_path / "cerebras_tf.py").write_text("raise SystemExit('the user directory shadowed us')\n")
  ws = CSRunConfig(model_dir="dst", cs_config=CSConfig(execution_strategy="weight_streaming"))
  if how == "keras":
    model = tf.keras.Sequential([tf.keras.layers.Dense(PARAMS["num_classes"],
                                                       input_shape=(PARAMS["input_dim"],))])
    model.compile(tf.keras.optimizers.legacy.SGD(0.1),
                  tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    est = CerebrasEstimator.from_keras_model(model, config=ws, params=PARAMS)
    est.train(lambda params: train_input_fn(params).map(lambda f, l: (f["x"], l)), max_steps=1,
              use_cs=True)
    assert est.get_variable_value("global_step") == 1
    return
  CerebrasEstimator(model_fn, config=CSRunConfig(model_dir="src"), params=PARAMS).train(
      train_input_fn, max_steps=2, use_cs=True)
  def own_init_model_fn(features, labels, mode, params):
    spec = model_fn(features, labels, mode, params)
    tf.compat.v1.train.init_from_checkpoint("src", {"dense_0/": "dense_0/"})
    return spec
  kwargs = {"init_checkpoint": {"init_checkpoint": "src"},
            "warm_start_from": {"warm_start_from": "src"},
            "WarmStartSettings": {"warm_start_from": tf.estimator.WarmStartSettings("src")},
            "model_fn_init_from_checkpoint": {}}[how]
  est = CerebrasEstimator(own_init_model_fn if how == "model_fn_init_from_checkpoint"
                          else model_fn, config=ws, params=PARAMS, **kwargs)
  est.train(train_input_fn, max_steps=1, use_cs=True)
  assert est.get_variable_value("global_step") == 1


def _autotune_settings(graph):
  """`autotune.enabled` of each OptionsDataset op in `graph` (None where its options leave it
  unset)."""
  from tensorflow.core.framework import dataset_options_pb2  # pylint: disable=import-outside-toplevel
  found = []
  for op in graph.get_operations():
    if op.type == "OptionsDataset":
      options = dataset_options_pb2.Options.FromString(op.get_attr("serialized_options"))
      autotune = options.autotune_options
      found.append(autotune.enabled if autotune.HasField("enabled") else None)
  return found


class _GraphOf(tf.estimator.SessionRunHook):
  def begin(self):
    self.graph = tf.compat.v1.get_default_graph()


@pytest.mark.parametrize("use_cs, users_autotune, expected", [
    (True, None, [False]),        # position saved, or the engine's eval: no autotuning thread
    (True, True, [True]),         # the user's explicit setting stands
    (False, None, []),            # plain tf.estimator's loops: the dataset as the user built it
])
def test_a_dataset_whose_position_is_saved_or_evaluated_runs_without_the_autotune_thread(
    tmp_path, use_cs, users_autotune, expected):
  """With its position saved just before the session closed, the iterator's destruction
  waited for tf.data's autotuning thread, asleep for up to 60 s: BERT-tiny's train call of 600
  steps took 87.8 s instead of 50.9, 34.7 s of it after the last hook had run; the demo's
  second evaluation ended 3.8 s after its last batch (input_pipeline.without_autotune_model)."""
  def with_users_options(make):
    def input_fn(params):
      ds = make(params)
      if users_autotune is not None:
        options = tf.data.Options()
        options.autotune.enabled = users_autotune
        ds = ds.with_options(options)
      return ds
    return input_fn
  trained, evaluated = _GraphOf(), _GraphOf()
  cfg = config_in(tmp_path, cs_config=CSConfig(execution_strategy="pipelined"))
  est = CerebrasEstimator(model_fn, config=cfg, params=PARAMS)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    est.train(with_users_options(train_input_fn), max_steps=2, hooks=[trained], use_cs=use_cs)
  # Reading the options in the graph warned the user about serialization, once a process.
  assert not [w for w in caught if "preserve tf.data options" in str(w.message)]
  assert est.get_variable_value("global_step") == 2
  assert _autotune_settings(trained.graph) == expected
  if use_cs:
    assert glob.glob(os.path.join(cfg.model_dir, "input.ckpt-2.index"))
  est.evaluate(with_users_options(eval_input_fn), steps=1, hooks=[evaluated], use_cs=use_cs)
  assert _autotune_settings(evaluated.graph) == expected
