"""validate_only names every op the engine cannot run, each with its file:line, on one line."""

import pytest
import tensorflow as tf

from cerebras_tf.compiler import capture, lower
from cerebras_tf.errors import CompileError, UnsupportedOpError
from source_marks import line_of


def _model_fn(features, labels):
  x = features["x"]
  x = x + tf.numpy_function(lambda v: v, [x], tf.float32, stateful=False)  # MARK-pyfunc
  # After a layer: string ops on the features alone run on the host (host_preprocessing).
  x = tf.keras.layers.Dense(3)(tf.reshape(x, [4, 3]))
  x = x + tf.cast(tf.strings.length(tf.strings.as_string(x)), tf.float32)  # MARK-strings
  x = x + tf.cast(tf.strings.length(tf.strings.as_string(x * 2.0)), tf.float32)  # MARK-strings2
  logits = tf.keras.layers.Dense(2)(x)
  loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(labels, logits, True))
  train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
  return tf.estimator.EstimatorSpec("train", loss=loss, train_op=train_op)


def _step(loss):
  return tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)


def _captured(model_fn):
  def input_fn():
    return tf.data.Dataset.from_tensors(({"x": tf.zeros([4, 3])}, tf.zeros([4], tf.int32)))
  return capture.capture(input_fn, model_fn, 4)


def test_every_unsupported_op_is_named_with_its_line():
  with pytest.raises(UnsupportedOpError) as err:
    lower.validate(_captured(_model_fn))
  msg = str(err.value)
  assert "\n" not in msg
  # Three sites: the numpy_function (PyFunc) and two AsString lines; the same type on two
  # lines is two entries, each with its line.
  for mark in ("pyfunc", "strings", "strings2"):
    line = line_of(__file__, f"MARK-{mark}")
    assert f"test_validate.py:{line}" in msg, (mark, msg)
  assert "of type PyFuncStateless" in msg and "of type AsString" in msg
  assert "more unsupported" not in msg
  # The add after the numpy_function has no static shape: named too, at the same line.
  types = [t for _, t, _, _ in err.value.ops]
  assert types == ["PyFuncStateless", "AddV2", "AsString", "StringLength", "AsString",
                   "StringLength"]
  assert all(where for _, _, where, _ in err.value.ops)


def test_a_single_unsupported_op_keeps_the_one_op_message():
  def model_fn(features, labels):
    x = tf.numpy_function(lambda v: v, [features["x"]], tf.float32, stateful=False)
    x = tf.reshape(x, [4, 3])
    loss = tf.reduce_mean(tf.keras.layers.Dense(1)(x)) + 0 * tf.reduce_sum(tf.cast(labels, tf.float32))
    return tf.estimator.EstimatorSpec("train", loss=loss, train_op=_step(loss))
  with pytest.raises(UnsupportedOpError, match=r"unsupported op '.*' of type PyFuncStateless: it runs "
                                               r"Python on the host; move it into the input_fn"):
    lower.validate(_captured(model_fn))


def test_a_partitioned_variable_says_to_drop_the_partitioner():
  """get_variable(partitioner=...) makes its lookup DynamicPartition + ParallelDynamicStitch;
  the advice "move them into the input_fn" was wrong for those: the fix is in the model."""
  def model_fn(features, labels):
    table = tf.compat.v1.get_variable(
        "table", [100, 3], partitioner=tf.compat.v1.fixed_size_partitioner(2))
    ids = tf.cast(features["x"] * 10, tf.int32)
    rows = tf.nn.embedding_lookup(table, ids)  # MARK-partitioned
    loss = tf.reduce_mean(rows)
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    return tf.estimator.EstimatorSpec("train", loss=loss, train_op=train_op)
  with pytest.raises(UnsupportedOpError) as err:
    lower.validate(_captured(model_fn))
  line = line_of(__file__, "MARK-partitioned")
  assert (f"test_validate.py:{line}: 'embedding_lookup/DynamicPartition' of type "
          f"DynamicPartition") in str(err.value)
  assert "create the variable without a partitioner" in str(err.value)


def test_feature_columns_after_a_variable_are_told_to_go_dense_in_the_input_fn():
  """The classic Estimator input: tf.feature_column's input_layer builds sparse lookups
  (Where, SparseToDense, hash tables). On the features they run on the host
  (tests/compiler/test_host_preprocessing.py); on a value a variable made they cannot, and
  the advice names feature columns and the fix."""
  cols = [tf.feature_column.indicator_column(
      tf.feature_column.categorical_column_with_identity("c", 5))]

  def model_fn(features, labels):
    shift = tf.compat.v1.get_variable("shift", [], tf.int64, tf.compat.v1.zeros_initializer())
    h = tf.compat.v1.feature_column.input_layer({"c": features["c"] + shift}, cols)  # MARK-fc
    loss = tf.reduce_mean(tf.compat.v1.layers.dense(h, 1))
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    return tf.estimator.EstimatorSpec("train", loss=loss, train_op=train_op)

  def input_fn():
    return tf.data.Dataset.from_tensors(({"c": tf.zeros([4], tf.int64)}, tf.zeros([4])))
  with pytest.raises(UnsupportedOpError) as err:
    lower.validate(capture.capture(input_fn, model_fn, 4))
  msg = str(err.value)
  assert f"test_validate.py:{line_of(__file__, 'MARK-fc')}: 'input_layer/" in msg
  assert msg.endswith("these come from feature columns (tf.feature_column), whose lookups are "
                      "sparse: turn the features into dense tensors in the input_fn "
                      "(dataset.map with tf.lookup ids, one-hot, bucketize) and give the "
                      "model_fn those"), msg


def test_a_dynamic_shape_made_from_the_features_is_not_host_preprocessing():
  """A boolean_mask of the features depends on no variable, but the host running it would
  still hand a Dense a batch of as many rows as the data brings: the Where is refused by
  name and line, not the MatMul after it. A string op on the features alone, static in
  shape, is the host's (x + len(str(x)))."""
  def model_fn(features, labels, kind):
    x = features["x"]
    if kind == "dynamic":
      x = tf.reshape(tf.boolean_mask(x, x > 0), [-1, 1])  # MARK-mask
    else:
      x = x + tf.cast(tf.strings.length(tf.strings.as_string(x)), tf.float32)
    loss = tf.reduce_mean(tf.keras.layers.Dense(2)(x)) + 0 * tf.reduce_sum(
        tf.cast(labels, tf.float32))
    return tf.estimator.EstimatorSpec("train", loss=loss, train_op=_step(loss))

  captured = _captured(lambda f, l: model_fn(f, l, "dynamic"))
  assert not any(op.type == "Where" for op in lower.host_preprocessing(
      lower.forward_ops(captured)))
  with pytest.raises(UnsupportedOpError) as err:
    lower.validate(captured)
  assert f"test_validate.py:{line_of(__file__, 'MARK-mask')}: " in str(err.value)
  assert "Where" in [t for _, t, _, _ in err.value.ops]
  captured = _captured(lambda f, l: model_fn(f, l, "strings"))
  host = lower.host_preprocessing(lower.forward_ops(captured))
  assert {"AsString", "StringLength"} <= {op.type for op in host}
  lower.validate(captured)


def test_a_sparse_or_ragged_feature_is_told_the_line_that_makes_it_dense():
  """A VarLenFeature of token ids parses to a SparseTensor (tf.RaggedTensor.from_sparse makes it
  ragged): variable length, which the engine cannot compile. Both used to get the padded_batch
  advice, which does not apply to them; the message now names the kind and the one line that
  fixes it, and that line compiles."""
  def model_fn(features, labels):
    emb = tf.compat.v1.get_variable("emb", [100, 8])
    ids = features["ids"]
    if isinstance(ids, tf.SparseTensor):
      h = tf.nn.embedding_lookup_sparse(emb, ids, None, combiner="mean")
    else:
      h = tf.reduce_mean(tf.nn.embedding_lookup(emb, ids), 1)
    logits = tf.keras.layers.Dense(2)(h)
    loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(labels, logits, True))
    return tf.estimator.EstimatorSpec("train", loss=loss, train_op=_step(loss))

  def input_fn(make):
    def fn():
      ids = tf.ragged.constant([[1, 2], [3], [4, 5, 6], [7], [8, 9], [1]], tf.int64)
      ds = tf.data.Dataset.from_tensor_slices((ids, tf.constant([0, 1, 0, 1, 0, 1])))
      return ds.batch(4, drop_remainder=True).map(lambda x, y: ({"ids": make(x)}, y))
    return fn

  with pytest.raises(CompileError, match=r"^input feature 'features/ids' is a SparseTensor "
                     r"\[None, None\] \(what a VarLenFeature parses to\): the engine takes "
                     r"dense tensors of a static shape; make it dense in the input_fn, e.g. "
                     r"tf.RaggedTensor.from_sparse\(x\).to_tensor\(shape=\[None, L\]\)"):
    capture.capture(input_fn(lambda x: x.to_sparse()), model_fn, 4)
  with pytest.raises(CompileError, match=r"^input feature 'features/ids' is a RaggedTensor "
                     r"\[4, None\]: .* e.g. x.to_tensor\(shape=\[None, L\]\) \(pads with 0"):
    capture.capture(input_fn(lambda x: x), model_fn, 4)
  # A sparse feature of static shape (a multi-hot of known width) needs no length.
  with pytest.raises(CompileError, match=r"is a SparseTensor \[4, 5\]: .* e.g. "
                     r"tf.sparse.to_dense\(x\)$"):
    capture.capture(input_fn(lambda x: tf.sparse.reset_shape(x.to_sparse(), [4, 5])),
                    model_fn, 4)
  captured = capture.capture(input_fn(
      lambda x: tf.RaggedTensor.from_sparse(x.to_sparse()).to_tensor(shape=[None, 3])),
      model_fn, 4)
  assert captured.inputs["features/ids"].shape.as_list() == [4, 3]


def _dense_loss(features, labels):
  logits = tf.keras.layers.Dense(2)(features["x"])
  return tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(labels, logits, True))


def test_a_tpu_cross_shard_optimizer_is_named_on_the_gradient_path():
  """A model_fn written for TPUEstimator wraps its optimizer in CrossShardOptimizer. Its
  CrossReplicaSum ops sit on the gradients, off the forward path validate used to check, so
  the compile passed and training failed at session start with TF's "No OpKernel was
  registered to support Op 'CrossReplicaSum'"."""
  def model_fn(features, labels):
    loss = _dense_loss(features, labels)
    opt = tf.compat.v1.tpu.CrossShardOptimizer(tf.compat.v1.train.AdamOptimizer(0.1))
    train_op = opt.minimize(loss, tf.compat.v1.train.get_global_step())  # MARK-cross-shard
    return tf.estimator.EstimatorSpec("train", loss=loss, train_op=train_op)
  with pytest.raises(UnsupportedOpError) as err:
    lower.validate(_captured(model_fn))
  msg = str(err.value)
  assert {t for _, t, _, _ in err.value.ops} == {"CrossReplicaSum"}, msg
  assert f"test_validate.py:{line_of(__file__, 'MARK-cross-shard')}" in msg
  assert msg.endswith("use the optimizer without tf.compat.v1.tpu.CrossShardOptimizer"), msg


def test_the_gradient_path_passes_what_the_optimizer_does_and_refuses_a_print():
  """Clipping an embedding's and a layer's gradients is the optimizer's business (no
  refusal); a tf.print of the gradient norm cannot run on the engine, as in the forward path,
  and the advice is a hook, not the input_fn."""
  def model_fn(features, labels, print_norm):
    table = tf.compat.v1.get_variable("table", [10, 3])
    ids = tf.cast(features["x"][:, 0], tf.int32)
    loss = _dense_loss({"x": features["x"] + tf.nn.embedding_lookup(table, ids)}, labels)
    opt = tf.compat.v1.train.AdamOptimizer(0.1)
    grads, variables = zip(*opt.compute_gradients(loss))
    clipped, norm = tf.clip_by_global_norm(grads, 1.0)
    deps = [tf.print("grad norm", norm)] if print_norm else []  # MARK-print-norm
    with tf.control_dependencies(deps):
      train_op = opt.apply_gradients(zip(clipped, variables),
                                     tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec("train", loss=loss, train_op=train_op)
  lower.validate(_captured(lambda f, l: model_fn(f, l, print_norm=False)))
  with pytest.raises(UnsupportedOpError, match=(
      rf"test_validate.py:{line_of(__file__, 'MARK-print-norm')}: 'PrintV2' of type PrintV2 "
      r"\(it prints on the host\); take them out of the training step \(.*LoggingTensorHook")):
    lower.validate(_captured(lambda f, l: model_fn(f, l, print_norm=True)))


def test_a_float64_input_is_one_line_naming_it():
  """numpy arrays are float64: an input_fn built from them trained in float64 on the host
  while the plan costed 16- and 32-bit numbers, which is all the engine has."""
  def input_fn():
    return tf.data.Dataset.from_tensors(({"x": tf.zeros([4, 3], tf.float64)},
                                         tf.zeros([4], tf.int64)))

  def model_fn(features, labels):
    loss = tf.reduce_mean(tf.keras.layers.Dense(2, dtype="float64")(features["x"]))
    return tf.estimator.EstimatorSpec("train", loss=loss, train_op=_step(loss))
  with pytest.raises(CompileError, match=r"^input features/x is float64 \(numpy's default\); .* "
                                         r"cast it in the input_fn"):
    lower.validate(capture.capture(input_fn, model_fn, 4))


def test_float64_math_inside_the_model_is_named_with_its_line():
  def model_fn(features, labels):
    x = tf.cast(features["x"], tf.float64) * 2.0  # MARK-float64
    loss = _dense_loss({"x": tf.cast(x, tf.float32)}, labels)
    return tf.estimator.EstimatorSpec("train", loss=loss, train_op=_step(loss))
  with pytest.raises(UnsupportedOpError) as err:
    lower.validate(_captured(model_fn))
  assert {t for _, t, _, _ in err.value.ops} == {"Cast", "Mul"}
  assert all(where.endswith(f":{line_of(__file__, 'MARK-float64')}")
             for _, _, where, _ in err.value.ops)
  assert "computes in float64" in str(err.value)


def test_a_long_list_names_five_places_and_writes_them_all(tmp_path):
  """A model with unsupported ops on many lines gave one line of thousands of characters;
  past five places the line names the file that lists every op with its line."""
  def model_fn(features, labels):
    x = tf.keras.layers.Dense(3)(features["x"])  # on the engine: so are the string ops after it
    as_number = lambda t: tf.cast(tf.strings.length(tf.strings.as_string(t)), tf.float32)  # noqa: E731
    x = x + as_number(x + 1.0)
    x = x + as_number(x + 2.0)
    x = x + as_number(x + 3.0)
    x = x + tf.strings.to_number(tf.strings.as_string(x))
    x = x + tf.strings.to_number(tf.strings.as_string(x * 2.0))
    x = x + tf.strings.to_number(tf.strings.as_string(x * 3.0))
    loss = _dense_loss({"x": x}, labels)
    return tf.estimator.EstimatorSpec("train", loss=loss, train_op=_step(loss))
  listing = str(tmp_path / "unsupported_ops.tsv")
  with pytest.raises(UnsupportedOpError) as err:
    lower.validate(_captured(model_fn), listing=listing)
  with open(listing) as fh:
    rows = [line.rstrip("\n").split("\t") for line in fh]
  assert len(rows) == len(err.value.ops) and all(len(r) == 4 for r in rows)
  msg = str(err.value)
  groups = {(t, w) for _, t, w, _ in err.value.ops}
  assert len(groups) > lower.MAX_PLACES, groups
  assert f"{len(groups) - lower.MAX_PLACES} more place(s), every op listed in {listing}" in msg
  assert msg.count(" of type ") == lower.MAX_PLACES


def test_a_trace_failure_gets_the_hint_that_fits_it():
  """Every failure while tracing said "check the batch size and the input shapes", also a
  per-example loss vector (the fix is a reduce_mean) and a model's own refusal (the fix is in
  its message)."""
  def vector_loss(features, labels):
    logits = tf.keras.layers.Dense(2)(features["x"])
    loss = tf.keras.losses.sparse_categorical_crossentropy(labels, logits, True)  # [B]
    return tf.estimator.EstimatorSpec("train", loss=loss, train_op=_step(loss))

  def refuses(features, labels):
    raise ValueError("model.vocab_file is not set")  # MARK-refuses

  def bad_reshape(features, labels):
    return tf.reshape(features["x"], [5, 3])

  with pytest.raises(CompileError, match=r"Loss must be scalar.*; reduce the per-example losses "
                                         r"to one number \(tf.reduce_mean\) for the spec$"):
    _captured(vector_loss)
  with pytest.raises(CompileError) as err:
    _captured(refuses)
  line = line_of(__file__, "MARK-refuses")
  assert str(err.value) == (f"tests/compiler/test_validate.py:{line}: model_fn failed while "
                            "being traced for the engine at batch 4: model.vocab_file is not set")
  with pytest.raises(CompileError, match=r"check the batch size and the input shapes "
                                         r"\(features/x\[4, 3\], labels\[4\]\)$"):
    _captured(bad_reshape)


def test_a_keras_style_sample_weight_triple_is_named():
  """(x, y, sample_weight) from a Keras habit: tf.estimator hands all three to the model_fn
  as features, and the trace failed on a Dense layer given three inputs."""
  def input_fn():
    return tf.data.Dataset.from_tensors((tf.zeros([4, 3]), tf.zeros([4], tf.int32),
                                         tf.ones([4])))
  with pytest.raises(CompileError, match=r"yields 3-tuples \(Keras' x, y, sample_weight\?\); "
                                         r"an Estimator takes \(features, labels\)"):
    capture.capture(input_fn, lambda features, labels: None, 4)


def test_a_padded_batch_without_a_length_is_told_how_to_fix_it():
  """padded_batch(batch) pads each batch to its own longest sequence: shape (4, None), which
  the engine cannot compile. The message names the feature and the fix; the fix compiles."""
  def model_fn(features, labels):
    emb = tf.keras.layers.Embedding(100, 8)(features)
    logits = tf.keras.layers.Dense(2)(tf.reduce_mean(emb, 1))
    loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(labels, logits, True))
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    return tf.estimator.EstimatorSpec("train", loss=loss, train_op=train_op)

  def input_fn(padded_shapes=None):
    def fn():
      lengths = tf.data.Dataset.from_tensor_slices(tf.constant([3, 5, 2, 7, 4, 6, 1, 8]))
      ds = lengths.map(lambda n: (tf.ones([n], tf.int32), n % 2))
      return ds.padded_batch(4, padded_shapes=padded_shapes, drop_remainder=True)
    return fn

  with pytest.raises(CompileError, match=r"input feature 'features' has shape \(4, None\): the "
                     r"engine needs static shapes; pad to a fixed length in the input_fn "
                     r"\(padded_batch\(batch, padded_shapes=...\) with a length, not None"):
    capture.capture(input_fn(), model_fn, 4)
  captured = capture.capture(input_fn(padded_shapes=([12], [])), model_fn, 4)
  assert captured.inputs["features"].shape.as_list() == [4, 12]


def _dense_loss(features, labels):
  logits = tf.keras.layers.Dense(2)(features["x"])
  return tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(labels, logits, True))


def test_a_train_op_that_updates_no_weight_is_refused():
  """A TF2 Keras optimizer (2.11+) in a model_fn: apply_gradients returns its step counter,
  and in a graph nothing makes its updates run. The trial trained 20 steps at loss 0.70 (the
  legacy optimizer reached 0.28): the model never changed. Refused now; the ways the message
  gives trace."""
  def keras_apply(features, labels):
    loss = _dense_loss(features, labels)
    variables = tf.compat.v1.trainable_variables()
    step = tf.keras.optimizers.Adam(0.1).apply_gradients(
        zip(tf.gradients(loss, variables), variables))
    return tf.estimator.EstimatorSpec("train", loss=loss, train_op=step)
  with pytest.raises(CompileError, match=r"the train_op updates none of the model's 2 trainable "
                     r"variables, so training would not change the model .*use tf.compat.v1."
                     r"train.AdamOptimizer\(lr\).minimize\(loss, global_step="):
    _captured(keras_apply)

  def legacy_get_updates(features, labels):
    loss = _dense_loss(features, labels)
    updates = tf.keras.optimizers.legacy.Adam(0.1).get_updates(
        loss, tf.compat.v1.trainable_variables())
    return tf.estimator.EstimatorSpec("train", loss=loss, train_op=tf.group(*updates))
  assert _captured(legacy_get_updates).loss is not None
  assert _captured(lambda f, l: tf.estimator.EstimatorSpec(
      "train", loss=_dense_loss(f, l), train_op=_step(_dense_loss(f, l)))).optimizers == (
          "GradientDescentOptimizer",)


def test_a_keras_optimizer_minimizing_a_tensor_is_told_the_graph_way():
  def keras_minimize(features, labels):
    loss = _dense_loss(features, labels)
    step = tf.keras.optimizers.Adam(0.1).minimize(loss, tf.compat.v1.trainable_variables())
    return tf.estimator.EstimatorSpec("train", loss=loss, train_op=step)
  with pytest.raises(CompileError, match=r"`tape` is required when a `Tensor` loss is passed.*; "
                     r"in a model_fn \(a TF1 graph\) use tf.compat.v1.train.AdamOptimizer"):
    _captured(keras_minimize)


def test_an_update_applied_inside_a_cond_is_not_taken_for_none():
  """Gradient accumulation (optimizer.grad_accum_steps) applies its update in a tf.cond, a
  function the no-update check does not look inside: the reference BERT config with
  grad_accum_steps 2 was refused as "updates none of the model's 46 trainable variables"."""
  def accumulating(features, labels):
    loss = _dense_loss(features, labels)
    step = tf.compat.v1.train.get_global_step()
    apply = lambda: _step(loss)  # noqa: E731
    update = tf.cond(tf.equal(step % 2, 1), lambda: tf.group(apply()), tf.no_op)
    with tf.control_dependencies([update]):
      return tf.estimator.EstimatorSpec("train", loss=loss,
                                        train_op=tf.compat.v1.assign_add(step, 1))
  assert _captured(accumulating).optimizers == ("GradientDescentOptimizer",)


def test_captures_in_two_threads_leave_the_real_optimizer_in_place():
  """A capture stands in for tf1 apply_gradients. Patched and restored per capture, two
  threads whose captures overlapped (A in, B in, A out, B out) left A's stand-in installed for
  good: every later training graph of the process updated no weight (the threads trial then
  refused its own model as updating nothing). Now the stand-in acts for the capturing thread
  only, and the class gets its own method back when the last capture ends."""
  import threading  # pylint: disable=import-outside-toplevel
  original = tf.compat.v1.train.Optimizer.apply_gradients
  a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
  real_ops = []

  def real_update_types():
    with tf.Graph().as_default():
      v = tf.compat.v1.get_variable("v", [2], initializer=tf.compat.v1.ones_initializer())
      step = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_sum(v * v))
      return {op.type for op in capture.ancestors(step)}

  def a():
    with capture._recording_optimizers():  # pylint: disable=protected-access
      a_in.set()
      b_in.wait(10)
      real_ops.append(("A, capturing", real_update_types()))
    a_out.set()

  def b():
    a_in.wait(10)
    real_ops.append(("B, not yet capturing while A does", real_update_types()))
    with capture._recording_optimizers():  # pylint: disable=protected-access
      b_in.set()
      a_out.wait(10)

  threads = [threading.Thread(target=a), threading.Thread(target=b)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(20)
  assert tf.compat.v1.train.Optimizer.apply_gradients is original
  # A capturing thread's graph gets the stand-in; any other graph, the real update.
  assert {who: "ResourceApplyGradientDescent" in types for who, types in real_ops} == {
      "A, capturing": False, "B, not yet capturing while A does": True}
  assert "ResourceApplyGradientDescent" in real_update_types()


def test_the_files_an_input_reads_are_found_behind_interleaves_and_readers(tmp_path):
  """What a saved input position is valid for includes the data files (capture.data_files):
  a list an interleave opens (the BERT input), a reader given names, text lines; not the
  numbers or sentences a pipeline holds in memory, nor names of files that do not exist."""
  paths = [str(tmp_path / n) for n in ("a.tfrecord", "b.tfrecord", "c.txt")]
  for p in paths:
    with open(p, "w", encoding="utf-8") as fh:
      fh.write(p)
  a, b, c = paths

  def names(ds, graph):
    return [entry.rsplit(" ", 2)[0] for entry in capture.data_files(ds, graph)]

  with tf.Graph().as_default() as g:
    interleaved = tf.data.Dataset.from_tensor_slices([b, a]).interleave(
        tf.data.TFRecordDataset, cycle_length=1).shuffle(4).batch(2)
    assert names(interleaved, g) == [a, b]
    assert names(tf.data.TFRecordDataset([a, b]).map(lambda r: r).batch(2), g) == [a, b]
    assert names(tf.data.TFRecordDataset(a), g) == [a]
    lines = tf.data.TextLineDataset(c).filter(lambda l: tf.strings.length(l) > 0)
    assert names(tf.data.Dataset.zip((lines, tf.data.TFRecordDataset(b))), g) == [b, c]
    memory = tf.data.Dataset.from_tensor_slices((["a sentence", str(tmp_path / "gone")], [1, 2]))
    assert names(memory.batch(2), g) == []
    entry = capture.data_files(tf.data.TFRecordDataset(a), g)[0]
    assert entry.split(" ")[1] == str(len(a))  # its size in bytes, then its mtime
  assert capture.data_files((tf.zeros([2]), tf.zeros([2])), g) == ()


def test_file_names_fed_at_run_time_leave_the_data_part_out():
  # tf1 code feeds its file names through a placeholder; they cannot be read at compile time,
  # which must not stop the compile.
  with tf.Graph().as_default() as g:
    names = tf.compat.v1.placeholder(tf.string, [None])
    assert capture.data_files(tf.data.TFRecordDataset(names), g) == ()
