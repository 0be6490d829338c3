"""The input pipeline timed on this host against what the simulated systems consume.

Published runs the input set the pace of are the simulator's largest misses (ViT-Base on raw
ImageNet JPEGs: 776 samples/s on a CS-3 the wafer model puts near 20,000; validation/
published.yaml, flagged input-bound). The wafer cannot see a pipeline, so training times the
user's input_fn alone first and says whether it could keep the systems fed.
"""

import logging
import os
import re
import time
import types

import numpy as np
import pytest
import tensorflow as tf

from cerebras_tf import CerebrasEstimator, CSConfig, CSRunConfig
from cerebras_tf.compiler import capture
from cerebras_tf.core import plans
from cerebras_tf.engine import report
from cerebras_models.mlp.model import input_fn as mlp_input_fn, model_fn as mlp_model_fn

PARAMS = {"batch_size": 16, "input_dim": 32, "num_classes": 4, "hidden_sizes": [64, 64],
          "learning_rate": 1e-2, "num_examples": 512}
SLEEP_S = 0.02


def _slow(params):
  """The MLP's input, each batch held SLEEP_S in Python (a decode, a tokenizer, a disk)."""
  def wait(x):
    time.sleep(SLEEP_S)
    return x
  def hold(f, l):
    x = tf.numpy_function(wait, [f["x"]], tf.float32)
    x.set_shape(f["x"].shape)
    return {"x": x}, l
  return mlp_input_fn(params, tf.estimator.ModeKeys.TRAIN).map(hold)


def test_rate_is_samples_over_time_after_warm_up():
  # 16 samples a batch, each batch at least 20 ms: at most 800 samples/s, whatever the host.
  # (A lower bound would time the machine, not the code: a loose one only.)
  rate = capture.measure_input_rate(lambda: _slow(PARAMS), max_batches=10, max_seconds=5.0)
  assert rate.batches == 10 and rate.samples == 160
  assert 0.1 * 800 < rate.samples_per_sec <= 800 * 1.02


def test_time_budget_stops_a_slow_pipeline():
  rate = capture.measure_input_rate(lambda: _slow(PARAMS), max_batches=1000, max_seconds=0.1)
  # The loop stops at the first batch past 0.1 s: 0.1 / 0.02 = 5 batches, give or take one.
  assert 4 <= rate.batches <= 7 and rate.seconds < 0.5


def test_a_very_slow_pipeline_costs_two_batches():
  # Each batch at least 0.3 s, a 0.1 s budget: one warm-up batch (past the budget, so the
  # second is skipped) and one timed batch; the run pays for two batches, not three.
  pulled = []
  def wait(x):
    pulled.append(1)
    time.sleep(0.3)
    return x
  def slow(f, l):
    x = tf.numpy_function(wait, [f["x"]], tf.float32)
    x.set_shape(f["x"].shape)
    return {"x": x}, l
  def pipeline():
    ds = mlp_input_fn(PARAMS, tf.estimator.ModeKeys.TRAIN).map(slow)
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False  # pulled exactly when asked
    return ds.with_options(options)
  rate = capture.measure_input_rate(pipeline, max_seconds=0.1)
  assert rate.batches == 1 and len(pulled) == 2
  assert rate.samples_per_sec <= 16 / 0.3


def test_data_that_ends_in_the_warm_up_is_not_timed():
  one = lambda: tf.data.Dataset.from_tensors(({"x": tf.zeros([4, 3])}, tf.zeros([4])))  # noqa: E731
  assert capture.measure_input_rate(one, warmup_batches=2) is None
  # One timed batch of 4 after one warm-up batch: counted by the leading dimension.
  two = lambda: one().repeat(2)  # noqa: E731
  rate = capture.measure_input_rate(two, warmup_batches=1)
  assert rate.batches == 1 and rate.samples == 4
  # A scalar first (a dict's keys sort "step" before "x") is not the batch: the first batched
  # tensor is; the batch the input_fn was given, when known, is taken as it is.
  scalar = lambda: tf.data.Dataset.from_tensors(  # noqa: E731
      ({"a_step": tf.constant(7), "x": tf.zeros([4, 3])}, tf.zeros([4]))).repeat(3)
  assert capture.measure_input_rate(scalar, warmup_batches=1).samples == 8
  assert capture.measure_input_rate(scalar, batch_size=5, warmup_batches=1).samples == 10
  # Nothing to fetch (an input_fn of Python values): not timed.
  assert capture.measure_input_rate(lambda: ({"x": 1.0}, 2.0)) is None


def test_an_old_style_queue_input_fn_is_timed_not_hung():
  # numpy_input_fn returns tensors fed by queue runners: without them the first run waits
  # forever.
  fn = tf.compat.v1.estimator.inputs.numpy_input_fn(
      {"x": np.zeros((64, 3), np.float32)}, np.zeros(64, np.int32), batch_size=8,
      num_epochs=None, shuffle=False)
  rate = capture.measure_input_rate(fn, max_batches=5)
  assert rate.batches == 5 and rate.samples == 40


def _plan_perf(samples_per_sec):
  # Only what the line reads of a plan and its performance.
  plan = types.SimpleNamespace(execution_strategy=plans.WEIGHT_STREAMING, engine="cs2",
                               num_csx=1)
  return plan, types.SimpleNamespace(samples_per_sec=samples_per_sec)


def test_input_line_says_how_many_such_processes_would_feed_the_systems():
  # 24,000 samples/s consumed, 1,000 delivered: 1,000 / 24,000 = 4% of the engine's rate;
  # 24 processes like this one keep up. 1,681 delivered: ceil(24,000 / 1,681) = 15.
  plan, perf = _plan_perf(24_000.0)
  line = report.input_line(1_000.0, 20, 1.28, plan, perf)
  assert "delivered 1,000 samples/s (one process, 20 batch(es) in 1.28 s" in line
  assert "1 x cs2 in weight_streaming takes 24,000" in line
  assert "pace the run at 4% of the engine's rate" in line and "from 24 processes" in line
  assert "from 15 processes" in report.input_line(1_681.0, 27, 1.03, plan, perf)
  # Faster than the systems take it: 50,000 / 24,000 = 2.1x, not the bound.
  fast = report.input_line(50_000.0, 50, 0.5, plan, perf)
  assert fast.endswith("2.1x the 24,000 samples/s 1 x cs2 in weight_streaming takes: not the bound")


def test_the_input_line_replaces_the_last_runs(tmp_path):
  path = tmp_path / "report.txt"
  path.write_text("model:            m\nbottleneck:       compute\nnote:             n\n")
  report.put_input_line(str(path), "first")
  report.put_input_line(str(path), "second")
  lines = path.read_text().splitlines()
  assert lines == ["model:            m", "bottleneck:       compute",
                   "input:            second", "note:             n"]


def _estimator(tmp_path, name):
  return CerebrasEstimator(mlp_model_fn, params=PARAMS, config=CSRunConfig(
      model_dir=str(tmp_path / name), tf_random_seed=7, log_step_count_steps=1,
      cs_config=CSConfig(execution_strategy="pipelined")))


def test_training_says_when_its_input_could_not_feed_the_wafer(tmp_path, caplog):
  # The pipelined MLP is predicted at hundreds of thousands of samples/s; a pipeline of 20 ms
  # a batch of 16 delivers at most 800.
  est = _estimator(tmp_path, "slow")
  with caplog.at_level(logging.INFO, logger="tensorflow"):
    est.train(_slow, max_steps=2, use_cs=True)
  said = [r.getMessage() for r in caplog.records if "cerebras_tf: input:" in r.getMessage()]
  assert len(said) == 1 and "so input this fast would pace the run at" in said[0]
  assert [r.levelno for r in caplog.records if "cerebras_tf: input:" in r.getMessage()] == [
      logging.WARNING]
  with open(os.path.join(est.compile_dir, "report.txt")) as fh:
    text = fh.read()
  assert text.count("\ninput:") == 1 and "processes like this one" in text
  assert est.get_variable_value("global_step") == 2


def test_a_pipeline_that_fails_is_left_to_training_to_report(tmp_path, caplog):
  # The timing must not replace training's own error (and its messages) with another.
  def broken(params):
    def fail(x):
      raise ValueError("cannot read shard 3")
    def hold(f, l):
      x = tf.numpy_function(fail, [f["x"]], tf.float32)
      x.set_shape(f["x"].shape)
      return {"x": x}, l
    return mlp_input_fn(params, tf.estimator.ModeKeys.TRAIN).map(hold)
  est = _estimator(tmp_path, "broken")
  with caplog.at_level(logging.INFO, logger="tensorflow"):
    with pytest.raises(Exception, match="cannot read shard 3"):
      est.train(broken, max_steps=2, use_cs=True)
  assert any("cerebras_tf: input not timed:" in r.getMessage() and "cannot read shard 3" in
             r.getMessage() for r in caplog.records)


def test_a_generator_is_not_timed_since_it_may_be_one_pass(tmp_path, caplog):
  # A callable handing out one shared iterator is a one-pass source: timing it would use up
  # batches training then never sees. Training takes every one of its 6 batches (steps).
  rows = iter([np.full((16, 32), i, np.float32) for i in range(6)])
  def gen_input(params):
    del params
    ds = tf.data.Dataset.from_generator(lambda: rows, output_signature=tf.TensorSpec(
        (16, 32), tf.float32))
    return ds.map(lambda x: ({"x": x}, tf.zeros([16], tf.int32)))
  with pytest.raises(capture.NotTimed, match="from_generator"):
    capture.measure_input_rate(lambda: gen_input({}))
  est = _estimator(tmp_path, "gen")
  with caplog.at_level(logging.INFO, logger="tensorflow"):
    est.train(gen_input, max_steps=100, use_cs=True)
  assert est.get_variable_value("global_step") == 6
  assert any("input not timed: it reads Dataset.from_generator" in r.getMessage()
             for r in caplog.records)


def _fast(params):
  return mlp_input_fn(params, tf.estimator.ModeKeys.TRAIN)


def test_the_same_pipeline_is_timed_once_a_process_and_still_judged(tmp_path, caplog,
                                                                    monkeypatch):
  # Two estimators train the MLP's pipeline, built afresh each time (TensorFlow numbers its
  # dataset functions anew): one timing, the second run reuses it and says so. The line is
  # judged against each run's own plan: a rate of 1 sample/s (set below) is short of both.
  timed = []
  real = capture._measure_input_rate  # pylint: disable=protected-access
  def slow_host(*args):
    timed.append(1)
    rate = real(*args)
    return capture.InputRate(1, 1, 1.0) if rate else rate
  monkeypatch.setattr(capture, "_measure_input_rate", slow_host)
  monkeypatch.setattr(capture, "_RATES", {})
  with caplog.at_level(logging.INFO, logger="tensorflow"):
    for name in ("one", "two"):
      _estimator(tmp_path, name).train(_fast, max_steps=1, use_cs=True)
  said = [r for r in caplog.records if "cerebras_tf: input:" in r.getMessage()]
  assert len(timed) == 1 and len(said) == 2
  assert [r.levelno for r in said] == [logging.WARNING, logging.WARNING]
  assert "timed earlier in this process" not in said[0].getMessage()
  assert "(as timed earlier in this process: the same pipeline, files and seed)" in \
      said[1].getMessage()


def test_a_changed_pipeline_or_python_code_in_it_is_timed_again(tmp_path, monkeypatch):
  timed = []
  real = capture._measure_input_rate  # pylint: disable=protected-access
  monkeypatch.setattr(capture, "_measure_input_rate", lambda *a: timed.append(1) or real(*a))
  monkeypatch.setattr(capture, "_RATES", {})
  _estimator(tmp_path, "a").train(_fast, max_steps=1, use_cs=True)
  assert len(timed) == 1
  # Another batch size: another pipeline.
  est = CerebrasEstimator(mlp_model_fn, params=dict(PARAMS, batch_size=8), config=CSRunConfig(
      model_dir=str(tmp_path / "b"), tf_random_seed=7,
      cs_config=CSConfig(execution_strategy="pipelined")))
  est.train(_fast, max_steps=1, use_cs=True)
  assert len(timed) == 2
  # Another graph seed: its random ops draw differently.
  est = CerebrasEstimator(mlp_model_fn, params=PARAMS, config=CSRunConfig(
      model_dir=str(tmp_path / "c"), tf_random_seed=8,
      cs_config=CSConfig(execution_strategy="pipelined")))
  est.train(_fast, max_steps=1, use_cs=True)
  assert len(timed) == 3
  # A pipeline running Python (tf.numpy_function) is timed on every build: the Python may
  # have changed under the same graph.
  for name in ("d", "e"):
    _estimator(tmp_path, name).train(_slow, max_steps=1, use_cs=True)
  assert len(timed) == 5


def test_a_pipeline_s_fingerprint_survives_a_rebuild_but_not_a_changed_file(tmp_path):
  # TensorFlow names each build's dataset functions and lookup tables anew; the fingerprint
  # must not see that, and must see the contents of a file the pipeline reads (a vocabulary
  # named by a constant, not a dataset source).
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("a\nb\nc\n")

  def build():
    with tf.Graph().as_default() as g:
      table = tf.lookup.StaticHashTable(tf.lookup.TextFileInitializer(
          str(vocab), tf.string, tf.lookup.TextFileIndex.WHOLE_LINE, tf.int64,
          tf.lookup.TextFileIndex.LINE_NUMBER), -1)
      tf.data.Dataset.from_tensor_slices(["a", "c", "z"]).map(table.lookup).batch(2)
    return capture.input_fingerprint(g, (), 7)

  first = build()
  assert build() == first
  vocab.write_text("a\nb\nc\nd\n")
  assert build() != first


def test_the_fingerprint_sees_one_changed_number_in_an_array_the_input_fn_slices():
  # Large constants enter the fingerprint as their digest, not as text (0.27 s a compile for
  # the MLP's 1 MB): one value changed in 8192 x 32 must still change it, and an equal array
  # in another build must not.
  features = np.random.default_rng(0).standard_normal((8192, 32)).astype(np.float32)

  def fingerprint(array):
    with tf.Graph().as_default() as g:
      tf.data.Dataset.from_tensor_slices(array).shuffle(64, seed=1).batch(8)
    return capture.input_fingerprint(g, (), 7)

  first = fingerprint(features)
  assert fingerprint(features.copy()) == first
  changed = features.copy()
  changed[4095, 17] += 1e-3
  assert fingerprint(changed) != first


def _timings(monkeypatch, rates):
  """`_measure_input_rate` giving `rates` in turn (InputRate(samples, 1 batch, 1 s)); returns
  the list of timings made. The process memo starts empty, as in a new process."""
  made = []
  def timed(*args):
    made.append(1)
    return capture.InputRate(rates[len(made) - 1], 1, 1.0)
  monkeypatch.setattr(capture, "_measure_input_rate", timed)
  monkeypatch.setattr(capture, "_RATES", {})
  return made


def _input_lines(caplog):
  return [r.getMessage() for r in caplog.records if "cerebras_tf: input:" in r.getMessage()]


def test_a_rerun_takes_the_timing_an_earlier_process_kept_on_this_host(tmp_path, caplog,
                                                                       monkeypatch):
  # The same command run again (same model_dir, so the same compile cache), each run a new
  # process (the process memo emptied): one timing, kept in the cache; the rerun says when
  # it was taken. Another host sharing the directory times its own pipeline.
  made = _timings(monkeypatch, [10**7, 10**7])
  with caplog.at_level(logging.INFO, logger="tensorflow"):
    for run in (1, 2):
      monkeypatch.setattr(capture, "_RATES", {})
      _estimator(tmp_path, "same").train(_fast, max_steps=run, use_cs=True)
  said = _input_lines(caplog)
  assert len(made) == 1 and len(said) == 2
  assert "10,000,000 samples/s" in said[1] and "not the bound" in said[1]
  assert re.search(r"\(as timed on this host at \d{4}-\d\d-\d\d \d\d:\d\d UTC: the same "
                   r"pipeline, files and seed\)", said[1]) and "as timed" not in said[0]
  monkeypatch.setattr(capture, "host_identity", lambda: "another|its CPU|2|2.15.1")
  monkeypatch.setattr(capture, "_RATES", {})
  _estimator(tmp_path, "same").train(_fast, max_steps=3, use_cs=True)
  assert len(made) == 2


def test_a_kept_timing_short_of_the_plan_or_unreadable_is_taken_again(tmp_path, caplog,
                                                                       monkeypatch):
  # A warning must not rest on a moment the host was busy: a kept timing that could not feed
  # the plan is timed again; so is one whose file is broken.
  made = _timings(monkeypatch, [1, 10**7, 10**7])
  def run(steps):
    monkeypatch.setattr(capture, "_RATES", {})
    est = _estimator(tmp_path, "same")
    est.train(_fast, max_steps=steps, use_cs=True)
    return est
  with caplog.at_level(logging.INFO, logger="tensorflow"):
    run(1)  # 1 sample/s: short, kept
    run(2)  # timed again: 10^7
    est = run(3)  # taken from the cache
  assert len(made) == 2
  said = _input_lines(caplog)
  assert "1 samples/s" in said[0] and "10,000,000" in said[1] and "as timed on" in said[2]
  kept = [f for f in os.listdir(os.path.join(est.compile_dir, "cache")) if f.startswith("input-")]
  assert len(kept) == 1
  with open(os.path.join(est.compile_dir, "cache", kept[0]), "w") as fh:
    fh.write('{"samples": 3, "batch')
  run(4)
  assert len(made) == 3


def test_keeping_a_timing_where_nothing_can_be_written_costs_nothing(tmp_path):
  # The compile cache under a path that is a file (as a read-only or full disk fails):
  # nothing kept, no error, nothing left behind.
  from cerebras_tf.compiler import compile as compile_lib  # pylint: disable=import-outside-toplevel
  blocked = tmp_path / "a_file"
  blocked.write_text("")
  cache = compile_lib.CompileCache(str(blocked))
  cache.put_input_rate("k", {"samples": 1, "batches": 1, "seconds": 1.0, "at": 0.0})
  assert cache.get_input_rate("k") is None and os.listdir(tmp_path) == ["a_file"]
  ok = compile_lib.CompileCache(str(tmp_path / "ok"))
  ok.put_input_rate("k", {"samples": 1})
  assert ok.get_input_rate("k") == {"samples": 1}
  assert os.listdir(tmp_path / "ok" / "cache") == ["input-k.json"]
  # What a hand-edited or half-written entry may hold is no timing.
  for entry in ([], "x", {"samples": 5}, {"samples": 5, "batches": 1, "seconds": 0, "at": 1.0},
                {"samples": 5, "batches": 1, "seconds": 1.0, "at": float("nan")}):
    assert capture._stored_rate(entry) is None, entry  # pylint: disable=protected-access
  assert capture._stored_rate(  # pylint: disable=protected-access
      {"samples": 5, "batches": 1, "seconds": 0.5, "at": 1.0}).samples_per_sec == 10.0
