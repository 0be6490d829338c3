"""CerebrasEstimator's single-device graph lints (compiler/lints.py): a train_op that never
advances the global step, batch-norm updates the train_op leaves out, attention scores in the
form TensorFlow runs slowly with oneDNN, matmuls in a 16-bit type the CPU emulates.
"""

import os
import sys
import threading

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import kernels  # the oneDNN kernels TF has: no public API

from cerebras_tf import CerebrasEstimator, CSConfig
from cerebras_tf import estimator as estimator_lib
from cerebras_tf.compiler import lints
from cerebras_tf.compiler import lower as lower_lib
from cerebras_tf.errors import ModelFnError
from cerebras_tf.runtime import precision
from estimator_fixtures import PARAMS, config_in, train_input_fn


def test_a_train_op_that_never_advances_the_global_step_is_refused_not_endless(tmp_path):
  """minimize(loss) without global_step: tf.estimator trains forever, since max_steps is never
  reached (the trial printed "step 1/20" for a minute, in every mode). Refused before the
  session starts; with no step limit (the input's end stops it) it trains as tf.estimator
  would (and, as there, its step-0 checkpoint is not saved again)."""
  def model_fn(features, labels, mode, params):
    logits = tf.compat.v1.layers.dense(features["x"], params["num_classes"])
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    step = tf.compat.v1.train.AdamOptimizer(1e-2).minimize(loss)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=step)
  est = CerebrasEstimator(model_fn, config=config_in(
      tmp_path, cs_config=CSConfig(execution_strategy="pipelined")), params=PARAMS)
  for use_cs in (True, False):
    with pytest.raises(ModelFnError, match=r"its train_op does not advance the global step, so "
                       r"steps/max_steps is never reached"):
      est.train(train_input_fn, max_steps=5, use_cs=use_cs)
  finite = lambda params: train_input_fn(params).take(3)  # noqa: E731
  est.train(finite, use_cs=False)  # returns at the input's end
  assert est.get_variable_value("global_step") == 0


@pytest.mark.parametrize("layer", ["v1", "keras"])
def test_batch_norm_updates_left_out_of_the_train_op_are_named(tmp_path, caplog, layer):
  """The classic TF1 slip: batch normalization's update ops not in the train_op. Its moving
  statistics stay at their initial values (moving_mean 0.0 after 30 steps on inputs near 3.5,
  in every mode), and eval and predict read them; tf.estimator says nothing. Now a warning
  names them; wired in (UPDATE_OPS, or the Keras layer's .updates), they move and nothing is
  said."""
  def input_fn(params):
    x = np.random.RandomState(0).rand(64, 4, 4, 1).astype("float32") + 3.0
    return tf.data.Dataset.from_tensor_slices(({"img": x}, np.zeros(64, np.int32))).repeat() \
        .batch(params["batch_size"], drop_remainder=True)

  def model_fn(features, labels, mode, params):
    h = tf.compat.v1.layers.conv2d(features["img"], 4, 3, padding="same")
    if layer == "v1":
      h = tf.compat.v1.layers.batch_normalization(h, training=True, name="bn")
      updates = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
    else:
      bn = tf.keras.layers.BatchNormalization(name="bn")
      h = bn(h, training=True)
      updates = bn.updates
    logits = tf.compat.v1.layers.dense(tf.compat.v1.layers.flatten(h), 2)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    with tf.control_dependencies(updates if params["wired"] else []):
      step = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
          loss, tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=step)

  for wired in (False, True):
    caplog.clear()
    est = CerebrasEstimator(model_fn, params={"batch_size": 16, "wired": wired}, config=config_in(
        tmp_path / str(wired), cs_config=CSConfig(execution_strategy="pipelined")))
    est.train(input_fn, max_steps=5, use_cs=True)
    moved = float(np.abs(est.get_variable_value("bn/moving_mean")).sum())
    said = "bn/moving_mean (and 1 more) is written by ops the train_op does not run" in caplog.text
    assert (moved > 0, said) == (wired, not wired), (moved, caplog.text[-2000:])


@pytest.mark.parametrize("scores", ["matmul", "einsum"])
def test_attention_scores_in_the_slow_fused_form_are_named_with_the_users_line(
    tmp_path, caplog, monkeypatch, scores):
  """A hand-written causal attention, tf.matmul(q, k, transpose_b=True) * scale + a [1, 1, L, L]
  bias: TF 2.15 with oneDNN fuses it into one op 200x slower (the Transformer's eval spent
  most of its time there). The warning names the line; an einsum is not fused, and not named.
  oneDNN is said to be on, so the lint runs on any host."""
  monkeypatch.setattr(estimator_lib.onednn, "active", lambda: True)

  def input_fn(params):
    x = np.random.RandomState(0).rand(32, 2, 8, 4).astype("float32")
    return tf.data.Dataset.from_tensor_slices(({"x": x}, np.zeros(32, np.int32))).repeat() \
        .batch(params["batch_size"], drop_remainder=True)

  def model_fn(features, labels, mode, params):
    w = tf.compat.v1.get_variable("w", [4, 4])
    q = tf.matmul(features["x"], w)  # [B, 2, 8, 4]
    causal = tf.linalg.band_part(tf.ones([8, 8]), -1, 0)[tf.newaxis, tf.newaxis] - 1.0
    if scores == "matmul":
      s = tf.matmul(q, q, transpose_b=True) * 0.5 + causal * 1e9  # the line named
    else:
      s = tf.einsum("bnqd,bnkd->bnqk", q, q) * 0.5 + causal * 1e9
    loss = tf.reduce_mean(tf.nn.softmax(s)[..., 0]) + 0 * tf.reduce_sum(tf.cast(labels, tf.float32))
    step = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
        loss, tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=step)

  est = CerebrasEstimator(model_fn, params={"batch_size": 8}, config=config_in(
      tmp_path, cs_config=CSConfig(execution_strategy="pipelined")))
  est.train(input_fn, max_steps=1, use_cs=False)
  line = next(i for i, text in enumerate(open(__file__, encoding="utf-8"), 1)
              if "# the line named" in text)
  said = [r.getMessage() for r in caplog.records if "attention scores as" in r.getMessage()]
  if scores == "einsum":
    assert said == []
  else:
    assert len(said) == 1 and f"test_estimator_lints.py:{line}: " in said[0], said
    assert "(1 such op(s))" in said[0] and "tf.einsum" in said[0]


AVX2 = frozenset({"sse4_2", "avx", "avx2", "fma"})  # an AVX2-only host's flags: no 16-bit math
SAID = "which TensorFlow emulates on this CPU"  # the warning's words


def test_the_16_bit_types_a_cpu_emulates_follow_its_flags(monkeypatch):
  monkeypatch.delenv(precision.FORCE_ENV, raising=False)
  assert precision.emulated_dtypes(AVX2) == {"float16", "bfloat16"}
  assert precision.emulated_dtypes(AVX2 | {"avx512f", "avx512_bf16"}) == {"float16"}
  # float16 math in the CPU does not help: TensorFlow 2.15 has no oneDNN float16 product
  # (next test), and its float16 MatMul ran at 1.0 GFLOP/s on a Xeon with avx512_fp16.
  assert precision.emulated_dtypes(AVX2 | {"avx512_fp16", "amx_bf16", "amx_fp16"}) == \
      {"float16"}
  monkeypatch.setenv(precision.FORCE_ENV, "1")  # bf16 asked for by hand: not said to be slow
  assert precision.emulated_dtypes(AVX2) == {"float16"}


def test_float16_is_emulated_because_tensorflows_onednn_products_take_no_float16():
  """precision.ONEDNN_FLOAT16_PRODUCTS against TF's kernel registry: the oneDNN kernels the
  graph rewrite swaps a product for. A TensorFlow with a float16 one fails here, and the
  constant (and the warning it silences) wants measuring again."""
  ops = ("_MklMatMul", "_MklFusedMatMul", "_MklBatchMatMulV2", "_MklEinsum",
         "_MklNativeConv2D", "_MklNativeFusedConv2D")
  dtypes = {op: {tf.dtypes.as_dtype(t).name for k in kernels.get_registered_kernels_for_op(op)
                 .kernel if k.device_type == "CPU" for c in k.constraint
                 for t in c.allowed_values.list.type} for op in ops}
  assert all("float32" in d and "bfloat16" in d for d in dtypes.values()), dtypes
  assert precision.ONEDNN_FLOAT16_PRODUCTS == any("float16" in d for d in dtypes.values())


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_products_in_a_16_bit_type_this_cpu_emulates_are_named_with_the_users_line(
    tmp_path, caplog, monkeypatch, dtype):
  """A model_fn that casts to float16 (or a Keras mixed_float16 policy brought from a GPU)
  trains here with TensorFlow's emulated float16 matmuls: 1 GFLOP/s against 142 in float32 on
  an AVX2 EPYC, a Keras MLP 58-65x slower, and nothing said. The warning names the line and the
  fix, once per process and graph (training in either mode builds the same; evaluation and
  prediction have the forward product alone); float32 says nothing. The host is an AVX2 one."""
  monkeypatch.setattr(precision, "cpu_flags", lambda path=None: AVX2)
  monkeypatch.delenv(precision.FORCE_ENV, raising=False)
  monkeypatch.setattr(lints, "_SAID_EMULATED", set())

  def model_fn(features, labels, mode, params):
    w = tf.compat.v1.get_variable("w", [params["input_dim"], params["num_classes"]])
    x, w16 = tf.cast(features["x"], dtype), tf.cast(w, dtype)
    logits = tf.cast(tf.matmul(x, w16), tf.float32)  # the product named
    if mode == tf.estimator.ModeKeys.PREDICT:
      return tf.estimator.EstimatorSpec(mode, predictions={"logits": logits})
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    if mode == tf.estimator.ModeKeys.EVAL:
      return tf.estimator.EstimatorSpec(mode, loss=loss)
    step = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
        loss, tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=step)

  est = CerebrasEstimator(model_fn, params=PARAMS, config=config_in(
      tmp_path, cs_config=CSConfig(execution_strategy="pipelined")))
  line = next(i for i, text in enumerate(open(__file__, encoding="utf-8"), 1)
              if "# the product named" in text)
  said_by = {}
  for call in ("train use_cs=True", "train use_cs=False", "evaluate", "predict"):
    caplog.clear()
    if call.startswith("train"):
      est.train(train_input_fn, max_steps=2 if "True" in call else 4, use_cs="True" in call)
    elif call == "evaluate":
      est.evaluate(lambda params: train_input_fn(params).take(2))
    else:
      next(est.predict(lambda params: train_input_fn(params).take(1)))
    said_by[call] = [r.getMessage() for r in caplog.records if SAID in r.getMessage()]
  if dtype == "float32":
    assert not any(said_by.values()), said_by
    return
  # Training: the forward product and its gradient's two (MatMul's gradient builds x's too),
  # the same graph in both modes, so said once; evaluation and prediction: the forward one.
  (training,), (evaluation,) = said_by["train use_cs=True"], said_by["evaluate"]
  assert f"test_estimator_lints.py:{line} (op MatMul): 3 matmul/convolution op(s) compute in " \
      f"{dtype}, {SAID}" in training
  assert "set_global_policy('float32')" in training
  # The cost quoted is the emulated dtype's own: float16's products, bfloat16's BERT-tiny.
  assert ("a ResNet-style CNN ~175x" in training) == (dtype == "float16"), training
  assert ("BERT-tiny 0.73x float32's speed on an AVX2 host" in training) == \
      (dtype == "bfloat16"), training
  assert f"test_estimator_lints.py:{line} (op MatMul): 1 matmul/convolution op(s) compute in " \
      f"{dtype}" in evaluation
  assert said_by["train use_cs=False"] == [] and said_by["predict"] == [], said_by


@pytest.mark.parametrize("flags,policy", [
    (AVX2, "float32"),
    (AVX2 | {"avx512f", "avx512_fp16", "avx512_bf16", "amx_bf16"}, "mixed_bfloat16")])
def test_a_keras_model_under_mixed_float16_is_told_it_is_emulated_and_what_to_set(
    tmp_path, caplog, monkeypatch, flags, policy):
  """The user's case: a Keras model compiled under mixed_float16, as GPU guides advise, handed
  to from_keras_model. Measured: 242 against 15,636 examples/s in float32 on an AVX2 EPYC (a
  256-512-512-16 MLP, batch 128), 254 against 26,048 on a Xeon with avx512_fp16 and AMX, where
  mixed_bfloat16 ran 32,702: there the advice is bfloat16, elsewhere float32."""
  monkeypatch.setattr(precision, "cpu_flags", lambda path=None: flags)
  monkeypatch.delenv(precision.FORCE_ENV, raising=False)
  monkeypatch.setattr(lints, "_SAID_EMULATED", set())
  tf.keras.mixed_precision.set_global_policy("mixed_float16")
  try:
    inputs = tf.keras.Input((PARAMS["input_dim"],), name="x")
    hidden = tf.keras.layers.Dense(16, activation="relu", name="hidden")(inputs)
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(PARAMS["num_classes"],
                                                         dtype="float32")(hidden))
    model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  finally:
    tf.keras.mixed_precision.set_global_policy("float32")
  est = CerebrasEstimator.from_keras_model(model, params=PARAMS, config=config_in(tmp_path))
  est.train(train_input_fn, max_steps=2)
  said = [r.getMessage() for r in caplog.records if SAID in r.getMessage()]
  # Two Dense layers' products forward, their kernels' gradients and the hidden layer's input
  # gradient: the float32 logits layer computes in float32.
  # tf.estimator clones the model: the line is the train call's, and the layer's op is named.
  assert len(said) == 1 and "test_estimator_lints.py" in said[0] and \
      "(op hidden/MatMul): " in said[0] and "compute in float16" in said[0], said
  assert f"set_global_policy('{policy}')" in said[0], said
  # The cost quoted is float16's (a CNN ~175x), and the gain only where bf16 is the advice.
  assert "a ResNet-style CNN ~175x" in said[0] and "BERT-tiny 0.73x" not in said[0], said
  assert ("computes natively (a Keras ResNet-style CNN trained 1.72x faster" in said[0]) == \
      (policy == "mixed_bfloat16"), said


def _bf16_sum_error(build, rows):
  """Largest relative error of `build` on bfloat16 values in [0.5, 1.5] against float64."""
  x = np.random.default_rng(0).uniform(0.5, 1.5, rows).astype(np.float32)
  exact = build(tf.cast(tf.cast(x, tf.bfloat16), tf.float64)).numpy()
  got = tf.cast(build(tf.cast(x, tf.bfloat16)), tf.float64).numpy()
  return float(np.max(np.abs(got - exact) / exact))


def test_tensorflows_cpu_kernels_add_these_bfloat16_sums_up_in_bfloat16():
  """The premise of lints.say_bfloat16_sums, against TensorFlow's kernels: a TensorFlow that
  sums them in float32 fails here, and the lint (and its limits) want measuring again."""
  mean_outer = lambda x: tf.reduce_mean(x, 1)  # noqa: E731  [4, n, 8] -> [4, 8]
  segment_sum = lambda x: tf.math.unsorted_segment_sum(  # noqa: E731  every row id 0
      x, tf.zeros([x.shape[0]], tf.int32), 1)
  cumsum = lambda x: tf.math.cumsum(x, 0)[-1]  # noqa: E731
  assert _bf16_sum_error(mean_outer, (4, lints.BF16_MEAN_LIMIT, 8)) < 0.05
  assert _bf16_sum_error(mean_outer, (4, 2 * lints.BF16_MEAN_LIMIT, 8)) > 0.3  # 0.51 measured
  assert _bf16_sum_error(segment_sum, (lints.BF16_RUNNING_LIMIT // 2, 8)) < 0.05
  assert _bf16_sum_error(segment_sum, (2 * lints.BF16_RUNNING_LIMIT, 8)) > 0.3  # 0.51
  assert _bf16_sum_error(cumsum, (2 * lints.BF16_RUNNING_LIMIT, 8)) > 0.3
  # In float32 inside (one rounding, < 2^-8): what the lint leaves alone.
  assert _bf16_sum_error(lambda x: tf.reduce_mean(x, -1), (8, 4096)) < 2 ** -7
  assert _bf16_sum_error(lambda x: tf.reduce_sum(x, 0), (4096, 8)) < 2 ** -8


BF16_SAID = "which TensorFlow 2.15's CPU kernel adds up in bfloat16"


@pytest.mark.parametrize("kind,rows", [("mean", 4096), ("mean", 2048), ("tied_table", 1024),
                                       ("tied_table", 256), ("activation_rows", 1024),
                                       ("segments", 4096), ("unique_slots", 4096)])
def test_bfloat16_sums_tensorflow_rounds_away_are_named_with_the_users_line(
    tmp_path, caplog, monkeypatch, kind, rows):
  """A user's bfloat16 model_fn: a mean pooled over `rows` positions, or an embedding table
  cast to bfloat16 once and used twice (a lookup of `rows` ids and a tied output layer), whose
  gradient TensorFlow makes dense with a segment sum in bfloat16. Past the limits the warning
  names the line (the forward op's for a gradient) and the fix; below them, nothing. Rows
  gathered from activations (BERT's masked positions: ids that rarely repeat) say nothing; a
  segment sum is named by its rows per segment: 4,096 rows into 4 segments, not into 4,096
  unique slots (a mixture of experts' dispatch)."""
  monkeypatch.setattr(lints, "_SAID_BF16_SUMS", set())

  def model_fn(features, labels, mode):
    del labels
    h = tf.cast(features["x"], tf.bfloat16)  # [1, rows, 8]
    if kind == "mean":
      w = tf.compat.v1.get_variable("w", [8, 8])
      pooled = tf.reduce_mean(tf.matmul(h, tf.cast(w, tf.bfloat16)), 1)  # the op named
      loss = tf.reduce_sum(tf.cast(pooled, tf.float32))
    elif kind in ("segments", "unique_slots"):
      w = tf.compat.v1.get_variable("w", [8, 8])
      rows_of = tf.reshape(tf.matmul(h, tf.cast(w, tf.bfloat16)), [rows, 8])
      n = 4 if kind == "segments" else rows
      summed = tf.math.unsorted_segment_sum(rows_of, tf.range(rows) % n, n)  # the segment sum
      loss = tf.reduce_sum(tf.cast(summed, tf.float32))
    elif kind == "activation_rows":
      w = tf.compat.v1.get_variable("w", [8, 8])
      rows_of = tf.reshape(tf.matmul(h, tf.cast(w, tf.bfloat16)), [rows, 8])
      loss = tf.reduce_sum(tf.cast(tf.gather(rows_of, tf.zeros([rows], tf.int32)), tf.float32))
    else:
      table = tf.cast(tf.compat.v1.get_variable("table", [16, 8]), tf.bfloat16)
      ids = tf.zeros([rows], tf.int32)
      looked_up = tf.gather(table, ids)  # the op named
      logits = tf.matmul(looked_up, table, transpose_b=True)
      loss = tf.reduce_sum(tf.cast(logits, tf.float32))
    step = tf.compat.v1.train.GradientDescentOptimizer(1e-3).minimize(
        loss, tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=step)

  def input_fn(params):
    del params
    return tf.data.Dataset.from_tensors(({"x": tf.ones([1, rows, 8])}, 0)).repeat()

  est = CerebrasEstimator(model_fn, config=config_in(tmp_path))
  est.train(input_fn, max_steps=1)
  said = [r.getMessage() for r in caplog.records if BF16_SAID in r.getMessage()]
  if rows < (4096 if kind == "mean" else 1024) or kind in ("activation_rows", "unique_slots"):
    assert not said
    return
  mark = {"mean": "pooled =", "segments": "# the segment sum"}.get(kind, "looked_up =")
  line = next(i for i, text in enumerate(open(__file__, encoding="utf-8"), 1)
              if mark in text and ("# the op named" in text or kind == "segments"))
  assert len(said) == 1 and f"test_estimator_lints.py:{line} (op " in said[0], said
  if kind == "mean":
    assert "a mean of 4,096 bfloat16 values along an outer axis (1 such op(s))" in said[0]
    assert "compute it in float32: tf.cast(x, tf.float32) before it" in said[0]
  elif kind == "segments":
    assert "a segment sum of 1,024 bfloat16 rows into each segment (on average)" in said[0]
    assert "compute it in float32" in said[0]
  else:
    assert f"a gather of {rows:,} rows from a bfloat16 table, whose gradient" in said[0]
    assert "gather from the float32 variable and cast the rows after" in said[0]


def test_a_keras_global_average_pooling_over_a_large_map_under_mixed_bfloat16_is_named(
    tmp_path, caplog, monkeypatch):
  # GlobalAveragePooling2D is a Mean over H and W: over 64 x 64 in bfloat16, half the mean.
  monkeypatch.setattr(lints, "_SAID_BF16_SUMS", set())
  monkeypatch.setenv(precision.FORCE_ENV, "1")
  tf.keras.mixed_precision.set_global_policy("mixed_bfloat16")
  try:
    inputs = tf.keras.Input([64, 64, 3], name="x")
    pooled = tf.keras.layers.GlobalAveragePooling2D()(tf.keras.layers.Conv2D(4, 1)(inputs))
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(2, dtype="float32")(pooled))
  finally:
    tf.keras.mixed_precision.set_global_policy("float32")
  model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  est = CerebrasEstimator.from_keras_model(model, config=config_in(tmp_path))
  est.train(lambda params: tf.data.Dataset.from_tensors(
      ({"x": tf.ones([2, 64, 64, 3])}, tf.zeros([2], tf.int32))).repeat(), max_steps=1)
  said = [r.getMessage() for r in caplog.records if BF16_SAID in r.getMessage()]
  assert len(said) == 1 and "global_average_pooling2d/Mean" in said[0], said


def test_a_bfloat16_sum_built_without_a_frame_of_yours_is_named_at_the_calling_line(
    caplog, monkeypatch):
  """tf.distribute builds each replica's graph in a thread of its own, so a Keras model cloned
  there has no frame of the user's: the warning names the line that called train() instead.
  Here the op is built in a thread by code that looks like the standard library's."""
  monkeypatch.setattr(lints, "_SAID_BF16_SUMS", set())
  graph = tf.Graph()
  with graph.as_default():
    x = tf.zeros([4, 4096, 8], tf.bfloat16)
  code = compile("with graph.as_default():\n  tf.reduce_mean(x, 1)\n",
                 os.path.join(sys.prefix, "lib", "python3.11", "replica_thread.py"), "exec")
  thread = threading.Thread(target=exec, args=(code, {"graph": graph, "tf": tf, "x": x}))
  thread.start()
  thread.join()
  (mean,) = lints.bfloat16_sums(graph)
  assert lower_lib.user_source(mean) == ""  # no frame of this file
  with caplog.at_level("WARNING", logger="tensorflow"):
    lints.say_bfloat16_sums(graph)  # the call's line, named
  line = next(i for i, text in enumerate(open(__file__, encoding="utf-8"), 1)
              if text.rstrip().endswith("# the call's line, named"))
  said = [r.getMessage() for r in caplog.records if BF16_SAID in r.getMessage()]
  assert len(said) == 1 and f"test_estimator_lints.py:{line} (op Mean)" in said[0], said


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_trainable_variables_in_bfloat16_are_named_with_the_users_line(
    tmp_path, caplog, monkeypatch, dtype):
  """tf.compat.v1.layers make their variables in their input's dtype: a model_fn that casts its
  input to bfloat16 trains bfloat16 weights, whose Adam state rounds (beta2 0.999 is 1.0 in
  bfloat16; a feature-column DNN so made diverged). Named once, with the layer's line."""
  monkeypatch.setattr(lints, "_SAID_BF16_SUMS", set())
  assert float(tf.cast(0.999, tf.bfloat16)) == 1.0

  def model_fn(features, labels, mode, params):
    x = tf.cast(features["x"], dtype)
    logits = tf.cast(tf.compat.v1.layers.dense(x, params["num_classes"]), tf.float32)  # here
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    step = tf.compat.v1.train.AdamOptimizer(1e-3).minimize(
        loss, tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=step)

  est = CerebrasEstimator(model_fn, params=PARAMS, config=config_in(tmp_path))
  est.train(train_input_fn, max_steps=2)
  said = [r.getMessage() for r in caplog.records if "trainable variable(s) are" in r.getMessage()]
  if dtype == "float32":
    assert not said
    return
  line = next(i for i, text in enumerate(open(__file__, encoding="utf-8"), 1)
              if text.rstrip().endswith("# here"))
  assert len(said) == 1 and f"test_estimator_lints.py:{line} (variable dense/" in said[0], said
  assert "2 trainable variable(s) are bfloat16" in said[0]
