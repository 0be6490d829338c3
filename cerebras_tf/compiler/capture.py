"""Capture: trace the user's model_fn into a clean tf.Graph fed by placeholders.

The input_fn is called once in a throw-away graph only to learn its element spec (shapes and
dtypes); the model_fn is then traced in a fresh graph whose inputs are placeholders of those
shapes, with the batch dimension fixed. The captured graph therefore holds the model, its loss,
its gradients and its optimizer, and nothing of the input pipeline.
"""

import contextlib
import dataclasses
import hashlib
import os
import re
import socket
import threading
import time
import traceback
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple

import numpy as np
import tensorflow as tf

from cerebras_tf.compiler import tokens
from cerebras_tf.errors import CerebrasTFError, CompileError, keeping_kind


@dataclasses.dataclass
class CapturedGraph:
  """A traced TRAIN graph.

  Attributes:
    graph: the tf.Graph with the model, gradients and train op.
    loss: the scalar loss tensor of the EstimatorSpec.
    train_op: the spec's train op (None outside TRAIN).
    inputs: placeholder name -> placeholder tensor (features and labels).
    batch_size: the fixed batch dimension of the placeholders.
    optimizers: class names of the tf1 optimizers whose apply_gradients the model_fn called.
    data_files: 'path size mtime_ns' of the files the input_fn's dataset reads (data_files).
  """

  graph: tf.Graph
  loss: tf.Tensor
  train_op: Optional[tf.Operation]
  inputs: Dict[str, tf.Tensor]
  batch_size: int
  optimizers: Tuple[str, ...] = ()
  data_files: Tuple[str, ...] = ()
  built_input: Optional["BuiltInput"] = None


@dataclasses.dataclass(frozen=True)
class BuiltInput:
  """The input_fn's pipeline as the capture built it (its graph, what it returned, the graph
  seed it was built under), which `measure_input_rate` can time without building it again:
  building a tf-text pipeline (BERT's masking) takes seconds. `fingerprint` names the
  pipeline: its graph's ops and functions, the files it reads and the seed."""

  graph: tf.Graph
  result: Any
  seed: Optional[int]
  fingerprint: str


def _spec_of(value):
  """A TensorSpec of one returned value: a tensor's own; a Python or NumPy value's as
  tf.estimator's model_fn gets it (converted); None (no labels) stays None."""
  if value is None:
    return None
  if not (hasattr(value, "shape") and hasattr(value, "dtype")) or isinstance(value, np.ndarray):
    value = tf.convert_to_tensor(value)
  return tf.TensorSpec(value.shape, value.dtype)


def element_spec(input_result):
  """(features_spec, labels_spec) of what an input_fn returned.

  Raises:
    ValueError (a CompileError too): a tuple or list other than (features, labels), with
      tf.estimator's own words.
  """
  if isinstance(input_result, tf.data.Dataset):
    spec = input_result.element_spec
  elif isinstance(input_result, (tuple, list)):
    if len(input_result) != 2:
      raise keeping_kind(CompileError, ValueError(), (
          f"input_fn should return (features, labels) as a len 2 tuple, got a "
          f"{type(input_result).__name__} of {len(input_result)}"))
    spec = tf.nest.map_structure(_spec_of, tuple(input_result))
  else:
    spec = tf.nest.map_structure(_spec_of, input_result)
  if isinstance(spec, tuple) and len(spec) == 2:
    return spec[0], spec[1]
  if isinstance(spec, tuple) and len(spec) == 3:
    # Keras' (x, y, sample_weight): tf.estimator would hand the model_fn all three as features.
    raise CompileError("the input_fn's dataset yields 3-tuples (Keras' x, y, sample_weight?); an "
                       "Estimator takes (features, labels): put the weights in the features "
                       "dict (features['weight']) and apply them in the model_fn's loss")
  return spec, None


def _placeholders(spec, batch_size: int, prefix: str, inputs: Dict[str, tf.Tensor]):
  def make(path, s):
    if isinstance(s, (tf.SparseTensorSpec, tf.RaggedTensorSpec)):
      raise CompileError(_not_dense_message("/".join([prefix] + [str(p) for p in path]), s))
    shape = s.shape.as_list()
    if shape and shape[0] is None:
      shape[0] = batch_size
    if any(d is None for d in shape):
      raise CompileError(
          f"input feature '{'/'.join([prefix] + [str(p) for p in path])}' has shape {s.shape}: the engine "
          f"needs static shapes; pad to a fixed length in the input_fn (padded_batch(batch, "
          f"padded_shapes=...) with a length, not None; the reference models' "
          f"max_sequence_length); with csconfig.vts and a padding mask or length feature, "
          f"the padding costs no compute")
    name = "/".join([prefix] + [str(p) for p in path]) if path else prefix
    ph = tf.compat.v1.placeholder(s.dtype, shape, name=name.replace("/", "_"))
    inputs[name] = ph
    return ph
  return _map_with_path(make, spec)


def _not_dense_message(name: str, spec) -> str:
  """Why a SparseTensor or RaggedTensor input cannot be compiled, and the input_fn line that
  makes it a dense tensor of static shape."""
  shape = spec.shape.as_list()
  if isinstance(spec, tf.SparseTensorSpec):
    if None in shape[1:]:
      what = f"a SparseTensor {shape} (what a VarLenFeature parses to)"
      fix = "tf.RaggedTensor.from_sparse(x).to_tensor(shape=[None, L])"
    else:
      what, fix = f"a SparseTensor {shape}", "tf.sparse.to_dense(x)"
  else:
    what = f"a RaggedTensor {shape}"
    fix = "x.to_tensor(shape=[None, L])"
  pad = "" if fix == "tf.sparse.to_dense(x)" else (
      " (pads with 0 and cuts at L; mask the padding where the model_fn averages or attends)")
  return (f"input feature '{name}' is {what}: the engine takes dense tensors of a static "
          f"shape; make it dense in the input_fn, e.g. {fix}{pad}")


def _map_with_path(fn, structure, path=()):
  if structure is None:
    return None
  if isinstance(structure, dict):
    return {k: _map_with_path(fn, v, path + (k,)) for k, v in structure.items()}
  if isinstance(structure, (tuple, list)):
    return type(structure)(_map_with_path(fn, v, path + (i,)) for i, v in enumerate(structure))
  return fn(path, structure)


def _named_shapes(features_spec, labels_spec) -> List[Tuple[str, List[Optional[int]]]]:
  out = []
  for prefix, spec in (("features", features_spec), ("labels", labels_spec)):
    _map_with_path(lambda path, s, p=prefix: out.append(
        ("/".join([p] + [str(x) for x in path]), s.shape.as_list())), spec)
  return out


def unbatched(features_spec, labels_spec) -> str:
  """'' for an input whose elements are batches; else why they are not, naming the shapes (a
  component of rank 0, a dataset not yet batched, or static leading dimensions that
  disagree). tf.estimator takes both; the engine then takes one element as one sample."""
  shapes = _named_shapes(features_spec, labels_spec)
  if not shapes:
    return "the input_fn returns no tensor"
  listed = ", ".join(f"{n}{d}" for n, d in shapes)
  leading = {d[0] for _, d in shapes if d and d[0] is not None}
  if any(d == [] for _, d in shapes):
    return f"the input_fn's elements are not batches ({listed})"
  if len(leading) > 1:
    return f"the input_fn's tensors disagree on the batch dimension ({listed})"
  return ""


def pipeline_batch(dataset) -> Optional[int]:
  """The static `batch()` argument of a dataset's outermost batching (batch, padded_batch),
  or None: a dataset batched without drop_remainder has no static batch dimension, and its
  batch is still that number (all but the last, partial, batch)."""
  if not isinstance(dataset, tf.data.Dataset):
    return None
  seen, todo = set(), [dataset]
  while todo:
    ds = todo.pop(0)
    if id(ds) in seen:
      continue
    seen.add(id(ds))
    size = getattr(ds, "_batch_size", None)
    if size is not None:
      value = tf.get_static_value(size)
      return int(value) if value is not None and int(value) > 0 else None
    todo.extend(ds._inputs())  # pylint: disable=protected-access  # the dataset's inputs
    if isinstance(getattr(ds, "_dataset", None), tf.data.Dataset):
      todo.append(ds._dataset)  # pylint: disable=protected-access  # a V1 adapter's own
  return None


def input_signature(captured: "CapturedGraph") -> str:
  """The input the model was traced on, batch included ('features/x: float32[32, 8]; ...'),
  and the files it reads ('data: 2 file(s) 3f1c...', their names, sizes and times): what a
  saved input-pipeline position is only valid for. Another file under the same shapes would
  otherwise be read from the old file's offset, after the old file's shuffle buffer."""
  shapes = "; ".join(f"{name}: {t.dtype.name}{t.shape.as_list()}"
                     for name, t in sorted(captured.inputs.items()))
  if not captured.data_files:
    return shapes
  digest = hashlib.sha256("\n".join(captured.data_files).encode()).hexdigest()[:12]
  return f"{shapes}; data: {len(captured.data_files)} file(s) {digest}"


_MAX_NAMES = 100_000  # string elements looked at as possible file names


def probe_session(graph: tf.Graph) -> tf.compat.v1.Session:
  """A session for the compile's looks at the input (its files, its rate, its lengths).

  TFG off, as in the sessions training starts (runtime/strategies.quick_session_config): its
  MLIR round trip ran over the pipeline's graph and each of its tf.data functions at the first
  run: 26 of its 28 passes and 180 of Grappler's 1,130-1,280 ms in a 3-step BERT-tiny
  `scripts/run.py` (meta_optimizer's VLOG, AVX2 host; the run's CPU, about 12 s, moved less
  than its spread). Nothing else of the caller's config applies: a probe trains nothing."""
  config = tf.compat.v1.ConfigProto()
  config.graph_options.rewrite_options.disable_tfg_optimizer = True
  return tf.compat.v1.Session(graph=graph, config=config)


def data_files(dataset, graph: tf.Graph) -> Tuple[str, ...]:
  """'path size mtime_ns' of each existing file whose name the dataset's sources hold
  (TFRecordDataset, TextLineDataset and the like, or a from_tensor_slices list of files that
  an interleave opens), sorted. Read from the dataset objects: the file names are tensors in
  `graph`, evaluated here. () for an input_fn that returned tensors."""
  if not isinstance(dataset, tf.data.Dataset):
    return ()
  tensors, seen, todo = [], set(), [dataset]
  while todo:
    ds = todo.pop()
    if id(ds) in seen:
      continue
    seen.add(id(ds))
    for attr in ("_filenames", "_tensors", "_impl"):
      for value in tf.nest.flatten(getattr(ds, attr, None)):
        if isinstance(value, tf.data.Dataset):
          todo.append(value)
        elif isinstance(value, tf.Tensor) and value.dtype == tf.string and \
            value.graph is graph and value.shape.num_elements() != 0:
          tensors.append(value)
    todo.extend(ds._inputs())  # pylint: disable=protected-access  # the dataset's inputs
  if not tensors:
    return ()
  try:
    with probe_session(graph) as sess:
      values = sess.run(tensors)
  except tf.errors.OpError:  # names fed at run time (a placeholder): no data part to compare
    return ()
  names = {v.decode("utf-8", "replace") for arr in values
           for v in np.asarray(arr).reshape(-1)[:_MAX_NAMES] if 0 < len(v) < 4096}
  out = []
  for name in sorted(names):
    if "\n" in name or not os.path.isfile(name):
      continue
    stat = os.stat(name)
    out.append(f"{os.path.abspath(name)} {stat.st_size} {stat.st_mtime_ns}")
  return tuple(out)


def batch_size_of(spec, default: int) -> int:
  """The static batch dimension of an element spec, or `default` when it is unknown."""
  for s in tf.nest.flatten(spec):
    if s is None:
      continue  # no labels
    dims = s.shape.as_list()
    if dims and dims[0] is not None:
      return int(dims[0])
  return int(default)


def input_fingerprint(graph: tf.Graph, files: Sequence[str], seed: Optional[int]) -> str:
  """A digest of an input pipeline: its graph (ops, attributes, the dataset functions), the
  'path size mtime' of the files it reads, and the graph seed. The same digest is the same
  pipeline on the same data, also when built again in this process: TensorFlow numbers the
  dataset functions' names per process ('__inference_Dataset_map_encode_1912'), so the names
  lose their number and the functions are taken in sorted order; lookup tables' shared names
  lose their per-table uuid ('hash_table_d0a0906e-...': the table's contents are its
  initializer's, in the graph), and every file a string constant names (a vocabulary) adds
  its size and time. A rebuilt pipeline with a Python function in it (numbered py_func
  tokens) still differs: that costs a fresh timing. A constant's raw tensor bytes (a NumPy
  array the input_fn sliced) enter as their sha256, not as text: MLP's 1 MB of features took
  0.27 s to print and scan at every compile, where the digest takes milliseconds."""
  gd = graph.as_graph_def()
  for node in [*gd.node, *(n for f in gd.library.function for n in f.node_def)]:
    if "value" in node.attr and len(node.attr["value"].tensor.tensor_content) > _RAW_AS_DIGEST:
      tensor = node.attr["value"].tensor
      tensor.tensor_content = hashlib.sha256(tensor.tensor_content).digest()
  names = sorted((f.signature.name for f in gd.library.function), key=len, reverse=True)
  numbered = re.compile("|".join(map(re.escape, names))) if names else None

  def text(message) -> str:
    out = _UUID.sub("<uuid>", str(message))
    return numbered.sub(lambda m: _NUMBER.sub("", m.group(0)), out) if numbered else out

  parts = sorted(text(f) for f in gd.library.function)
  gd.library.ClearField("function")
  parts.append(text(gd))
  named = set()
  for part in parts:
    named.update(m for m in _STRING.findall(part) if len(m) < 4096 and os.path.isfile(m))
  named_files = [f"{n} {os.stat(n).st_size} {os.stat(n).st_mtime_ns}" for n in sorted(named)]
  h = hashlib.sha256("\n".join(parts + named_files + [repr((tuple(files), seed))]).encode())
  return h.hexdigest()


_RAW_AS_DIGEST = 256  # bytes of a constant's tensor_content above which its digest stands in
_NUMBER = re.compile(r"_\d+$")
_STRING = re.compile(r'\b(?:s|string_val): "([^"\\]+)"')  # a string attribute or constant
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def capture(call_input_fn: Callable[[], Any], call_model_fn: Callable[[Any, Any], Any],
            default_batch_size: int, seed: Optional[int] = None) -> CapturedGraph:
  """Traces model_fn(TRAIN) on placeholders shaped like input_fn's output.

  Args:
    call_input_fn: calls the user's input_fn (in the current default graph).
    call_model_fn: (features, labels) -> EstimatorSpec, calling the user's model_fn in TRAIN.
    default_batch_size: batch size to use when the dataset's batch dimension is None.
    seed: the graph-level seed the input is built under (as training builds it), so that the
      built pipeline (`CapturedGraph.built_input`) can be timed as it is.
  """
  with tf.Graph().as_default() as input_graph:
    if seed is not None:
      tf.compat.v1.set_random_seed(seed)
    result = call_input_fn()
    features_spec, labels_spec = element_spec(result)
    files = data_files(result, input_graph)
    in_pipeline = pipeline_batch(result)
  built = BuiltInput(input_graph, result, seed, input_fingerprint(input_graph, files, seed))
  not_batches = unbatched(features_spec, labels_spec)
  if not_batches:
    tf.compat.v1.logging.warning(
        "cerebras_tf: %s: the engine takes each step's input as one sample; batch the "
        "dataset (.batch(params['batch_size'], drop_remainder=True)) for per-sample figures",
        not_batches)
    batch = 1
  else:
    batch = batch_size_of((features_spec, labels_spec), default_batch_size or in_pipeline or 0)
  graph = tf.Graph()
  inputs: Dict[str, tf.Tensor] = {}
  with graph.as_default(), _recording_optimizers() as (optimizers, steps):
    features = _placeholders(features_spec, batch, "features", inputs)
    labels = _placeholders(labels_spec, batch, "labels", inputs)
    tf.compat.v1.train.get_or_create_global_step()
    try:
      spec = call_model_fn(features, labels)
    except CerebrasTFError:
      raise  # already one line that names what to do
    except (ValueError, TypeError, tf.errors.OpError) as e:
      # A shape the model cannot take (e.g. an int32 reshape overflowing at a huge batch).
      # The cause stays chained; the message names the user's line.
      message = " ".join(str(getattr(e, "message", e)).split())
      message = message.split(" for '{{node")[0][:300]  # TF appends the node's whole NodeDef
      if message.startswith("Loss must be scalar"):
        hint = "; reduce the per-example losses to one number (tf.reduce_mean) for the spec"
      elif _KERAS_EAGER_OPTIMIZER.search(message):
        hint = f"; {_GRAPH_OPTIMIZER}"
      elif _SHAPE_WORDS.search(message):
        hint = f"; check the batch size and the input shapes ({_shapes(inputs)})"
      else:
        hint = ""
      if not_batches:
        hint += (f"; {not_batches}: batch the dataset, e.g. .batch(params['batch_size'], "
                 f"drop_remainder=True)")
      # Still a ValueError / TypeError, as the model_fn raised it under tf.estimator.
      raise keeping_kind(CompileError, e, (
          f"{user_line(e)}model_fn failed while being traced for the engine at batch {batch}: "
          f"{message}{hint}")) from e
  if spec.loss is None:
    raise CompileError("model_fn returned no loss in TRAIN mode; the engine trains on the loss")
  _check_train_op_updates(graph, spec.train_op, steps)
  return CapturedGraph(graph=graph, loss=spec.loss, train_op=spec.train_op, inputs=inputs,
                       batch_size=batch, optimizers=tuple(optimizers), data_files=files,
                       built_input=built)


# Keras optimizers of TF 2.11+ (and the legacy ones' minimize) compute gradients with a tape,
# which a model_fn's graph-mode Tensor loss cannot give them.
_KERAS_EAGER_OPTIMIZER = re.compile(r"`tape` is required when a `Tensor` loss is passed|"
                                    r"No gradients provided for any variable: \(\[")
_GRAPH_OPTIMIZER = ("in a model_fn (a TF1 graph) use tf.compat.v1.train.AdamOptimizer(lr)."
                    "minimize(loss, global_step=tf.compat.v1.train.get_global_step()) (or "
                    "another tf.compat.v1.train optimizer), or tf.keras.optimizers.legacy."
                    "Adam(lr).get_updates(loss, variables) grouped into the train_op")

# Ops that read a variable without writing it; any other op taking its handle may write it.
READS = frozenset({"ReadVariableOp", "ResourceGather", "ResourceGatherNd",
                    "VarIsInitializedOp", "VariableShape", "Identity", "IsVariableInitialized"})


def handle_names(variable) -> Set[str]:
  """The tensor and op names through which ops write `variable` (each copy of a distributed
  one): a resource variable's handle, a ref variable's op."""
  names = set()
  for copy in getattr(variable, "values", None) or (variable,):
    names.update((getattr(copy, "handle", copy).name, copy.op.name))
  return names


def writes(op, handles: Set[str]) -> bool:
  """Whether `op` may write a variable named in `handles` (it takes one and is not a read)."""
  return op.type not in READS and any(t.name in handles or t.op.name in handles
                                      for t in op.inputs)


def ancestors(train_op) -> Iterator[tf.Operation]:
  """The ops running `train_op` runs (its inputs and control dependencies, transitively), each
  once, lazily: a search can stop at the first it wants."""
  seen, todo = set(), [getattr(train_op, "op", train_op)]
  while todo:
    op = todo.pop()
    if op in seen:
      continue
    seen.add(op)
    yield op
    todo.extend(t.op for t in op.inputs)
    todo.extend(op.control_inputs)


# Ops that run a function body (tf.cond, tf.while_loop, a tf.function call in TF2 form): the
# walk does not look inside, so one on the path may write anything (gradient accumulation
# applies its update in a cond).
FUNCTION_CALLS = frozenset({"If", "StatelessIf", "While", "StatelessWhile", "Case",
                            "StatelessCase", "PartitionedCall", "StatefulPartitionedCall"})


def writes_reached(train_op, variables, stand_ins=frozenset()) -> bool:
  """Whether running `train_op` may run a write to one of `variables`, or one of the
  `stand_ins` ops."""
  handles = set().union(*(handle_names(v) for v in variables))
  return any(op in stand_ins or op.type in FUNCTION_CALLS or writes(op, handles)
             for op in ancestors(train_op))


_GRADIENTS = re.compile(r"(^|/)gradients(_\d+)?/")


def _check_train_op_updates(graph: tf.Graph, train_op, steps) -> None:
  """Refuses a train_op from which no trainable variable's update can be reached: the model
  would train without learning. A Keras optimizer of TF 2.11+ used in a graph returns its step
  counter, and its updates run only if something depends on them (a tf.function would add
  those dependencies; a model_fn's graph does not)."""
  trainable = graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)
  if train_op is None or not trainable or writes_reached(train_op, trainable, steps):
    return
  if not any(_GRADIENTS.search(op.name) for op in graph.get_operations()):
    # No gradient taken at all: a train_op that updates only non-trainables (a counter) is
    # what the model_fn meant, and tf.estimator trains it.
    tf.compat.v1.logging.warning(
        "cerebras_tf: the train_op updates none of the model's %d trainable variables and "
        "takes no gradient: training does not change them", len(trainable))
    return
  raise CompileError(
      f"the train_op updates none of the model's {len(trainable)} trainable variables, so "
      f"training would not change the model (the optimizer's updates are not in it: a Keras "
      f"optimizer of TF 2.11+ applied in a graph returns only its step counter); "
      f"{_GRAPH_OPTIMIZER}")


# An error about shapes, where the batch size and the input shapes are the place to look; a
# model's own refusal ("... is not supported") gets no such hint.
_SHAPE_WORDS = re.compile(r"shape|dimension|rank|reshape|broadcast|incompatible|size", re.I)


def user_line(error: BaseException) -> str:
  """`file:line: ` of the innermost frame of the error in the user's code, else ''. Code that
  autograph converted (a model_fn under a distribution strategy) runs as generated files;
  its error carries the frames of the source it came from."""
  here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  ours = tuple(os.path.join(here, d) for d in ("compiler", "estimator.py", "input_pipeline.py",
                                               "model_fn_wrapper.py", "runtime"))
  frames = [(f.filename, f.lineno) for f in traceback.extract_tb(error.__traceback__)]
  metadata = getattr(error, "ag_error_metadata", None)
  if metadata is not None:  # innermost first
    frames += [(f.filename, f.lineno) for f in reversed(metadata.translated_stack)]
  frames = [(name, line) for name, line in frames
            if "site-packages" not in name and not name.startswith(ours)
            and not name.startswith("<") and "__autograph_generated_file" not in name]
  if not frames:
    return ""
  name, line = frames[-1]
  path = os.path.relpath(name)
  return f"{name if path.startswith('..') else path}:{line}: "


def _shapes(inputs: Dict[str, tf.Tensor]) -> str:
  return ", ".join(f"{n}{t.shape.as_list()}" for n, t in sorted(inputs.items()))


# A capture stands in for tf1 optimizers' apply_gradients (below). The stand-in is installed
# on the class while any thread captures, and acts for the capturing thread only: another
# thread building its real training graph meanwhile gets the real updates. (Patching and
# restoring per capture raced: two threads capturing at once left the stand-in installed for
# good, and every later training graph of the process updated no weight.)
_ORIGINAL_APPLY = tf.compat.v1.train.Optimizer.apply_gradients
_recorders = threading.local()
_patch_lock = threading.Lock()
_patch_users = 0


def _apply_or_stand_in(self, grads_and_vars, global_step=None, name=None):
  recorder = getattr(_recorders, "current", None)
  if recorder is None:
    return _ORIGINAL_APPLY(self, grads_and_vars, global_step=global_step, name=name)
  seen, steps = recorder
  seen.append(type(self).__name__)
  # The step still depends on the gradients it was given, so what a wrapper did to them
  # (clipping, a TPU cross-replica sum) stays on the path lower.validate checks.
  grads = [g.values if isinstance(g, tf.IndexedSlices) else g
           for g, _ in grads_and_vars if g is not None]
  with tf.control_dependencies(grads):
    step = (tf.compat.v1.assign_add(global_step, 1).op if global_step is not None
            else tf.no_op())
  steps.add(step)  # stands for the updates it leaves out
  return step


@contextlib.contextmanager
def _recording_optimizers():
  """Traces optimizers without their update ops, recording which optimizers were used.

  The compiler reads the loss, the gradients (backward FLOPs) and the variables; the update
  ops (per-variable slot reads and assigns, half of BERT-Large's trace time) it never reads:
  optimizer state is priced from the optimizer's slot count. Gradients are still traced.
  Yields (optimizer class names, the stand-in step ops).
  """
  global _patch_users
  recorder = ([], set())
  with _patch_lock:
    if _patch_users == 0:
      tf.compat.v1.train.Optimizer.apply_gradients = _apply_or_stand_in
    _patch_users += 1
  _recorders.current = recorder
  try:
    yield recorder
  finally:
    _recorders.current = None
    with _patch_lock:
      _patch_users -= 1
      if _patch_users == 0:
        tf.compat.v1.train.Optimizer.apply_gradients = _ORIGINAL_APPLY


@contextlib.contextmanager
def _input_session(call_input_fn: Callable[[], object], seed: Optional[int],
                   built: Optional[BuiltInput] = None):
  """(session, features, labels) over one call of the input_fn in a fresh graph (or over the
  pipeline `built` holds, built under the same seed): a Dataset's iterator initialized,
  tables and local variables too, and queue runners started for the tensors an old-style
  input_fn (numpy_input_fn) returns."""
  with (built.graph if built is not None else tf.Graph()).as_default() as graph:
    if built is not None:
      result = built.result
    else:
      if seed is not None:
        tf.compat.v1.set_random_seed(seed)
      result = call_input_fn()
    init = []
    if isinstance(result, tf.data.Dataset):
      it = tf.compat.v1.data.make_initializable_iterator(result)
      result, init = it.get_next(), [it.initializer]
    if isinstance(result, (tuple, list)) and len(result) == 2:
      features, labels = result
    else:
      features, labels = result, None
    with probe_session(graph) as sess:
      sess.run([tf.compat.v1.tables_initializer(),
                tf.compat.v1.local_variables_initializer()])
      sess.run(init)
      coord = tf.compat.v1.train.Coordinator()
      threads = (tf.compat.v1.train.start_queue_runners(sess, coord=coord)
                 if graph.get_collection(tf.compat.v1.GraphKeys.QUEUE_RUNNERS) else [])
      try:
        yield sess, features, labels
      finally:
        coord.request_stop()
        coord.join(threads, stop_grace_period_secs=5, ignore_live_threads=True)


def measure_tokens(call_input_fn: Callable[[], object], sources: Sequence[tokens.LengthSource],
                   max_sequences: int = tokens.MAX_SEQUENCES,
                   max_batches: int = tokens.MAX_BATCHES,
                   seed: Optional[int] = None,
                   built: Optional[BuiltInput] = None) -> List[tokens.TokenStats]:
  """Runs the input_fn for a bounded sample and sums the lengths each source says.

  Args:
    call_input_fn: calls the user's TRAIN input_fn (in the current default graph); it returns
      a tf.data.Dataset of (features, labels) or features, or such tensors.
    sources: from `find_length_sources`.
    max_sequences, max_batches: stop after this many samples or batches (or the data's end).
    seed: graph-level random seed, so a shuffled pipeline gives the same sample every time.
    built: the pipeline the capture built under `seed` (not built again), or None. A
      pipeline of the same fingerprint sampled before in this process gives that sample (a
      VTS compile samples on every call, and tf-text pipelines take seconds to sample).

  Returns:
    One TokenStats per source.
  """
  if built is not None and built.seed != seed:
    built = None
  key = ((built.fingerprint, tuple(sources), max_sequences, max_batches)
         if built is not None else None)
  if key not in _TOKENS:
    totals = _measure_tokens(call_input_fn, sources, max_sequences, max_batches, seed, built)
    if key is None:
      return totals
    while len(_TOKENS) >= _MAX_RATES:
      _TOKENS.pop(next(iter(_TOKENS)))
    _TOKENS[key] = tuple(totals)
  return list(_TOKENS[key])


_TOKENS: Dict[tuple, Tuple[tokens.TokenStats, ...]] = {}  # `measure_tokens`' samples by pipeline


def _measure_tokens(call_input_fn, sources, max_sequences, max_batches, seed,
                    built) -> List[tokens.TokenStats]:
  """`measure_tokens` without the memo."""
  totals = [tokens.TokenStats() for _ in sources]
  with _input_session(call_input_fn, seed, built) as (sess, features, labels):
    named: Dict[str, object] = {}

    def keep(prefix):
      def fn(path, t):
        named["/".join([prefix] + [str(p) for p in path]) if path else prefix] = t
      return fn

    _map_with_path(keep("features"), features)
    _map_with_path(keep("labels"), labels)
    fetch = [named[s.feature] for s in sources]
    batches = 0
    while batches < max_batches and (not totals or totals[0].sequences < max_sequences):
      try:
        values = sess.run(fetch)
      except tf.errors.OutOfRangeError:
        break
      batches += 1
      totals = [t + tokens.stats_from_lengths(tokens.lengths_of(s, v), s.seq_len)
                for t, s, v in zip(totals, sources, values)]
  return totals


class NotTimed(Exception):
  """The input_fn was not timed, and why (not an error: training goes on without it)."""


@dataclasses.dataclass(frozen=True)
class InputRate:
  """What one process running the input_fn delivered, after its warm-up batches."""

  samples: int
  batches: int
  seconds: float
  timed_before: bool = False  # the same pipeline's earlier timing in this process, reused
  timed_at: Optional[float] = None  # when an earlier process on this host timed it (epoch s)

  @property
  def samples_per_sec(self) -> float:
    return self.samples / self.seconds if self.seconds > 0 else float("inf")


def measure_input_rate(call_input_fn: Callable[[], object], batch_size: Optional[int] = None,
                       warmup_batches: int = 2, max_batches: int = 200,
                       max_seconds: float = 0.5,
                       seed: Optional[int] = None,
                       built: Optional[BuiltInput] = None,
                       store=None, enough: float = 0.0) -> Optional[InputRate]:
  """Times the input_fn alone on this host: every feature and label of up to `max_batches`
  batches or `max_seconds`, after `warmup_batches` untimed ones (a shuffle buffer filling, a
  vocabulary loading; only one if it alone takes `max_seconds`). A batch holds `batch_size` samples (the batch the input_fn was given,
  which the compile checked), else the first batched tensor's leading dimension. Batches a
  prefetch buffer already holds flatter the rate a little; 200 of them make that small.
  `built`: the pipeline the compile's capture built from the same input_fn under the same
  seed, timed as it is instead of calling the input_fn again (None: build it here); one
  with the fingerprint of a pipeline timed before in this process takes that timing
  (`InputRate.timed_before`). `store` (the compile cache: `get_input_rate(key)`,
  `put_input_rate(key, dict)`) keeps timings across processes, keyed by the fingerprint and
  this host: a rerun of the same command takes an earlier process's timing
  (`InputRate.timed_at`) if it delivered at least `enough` samples/s; a short one is timed
  again, so a warning never rests on a moment the host was busy.

  Returns:
    The rate, or None when the data ended before one timed batch (or holds no tensor).

  Raises:
    NotTimed: the dataset reads a Python generator, which may be a one-pass source (an
      iterator the callable hands out again): timing would take batches training never sees.
  """
  if built is not None and built.seed != seed:
    built = None  # built under another graph seed: its random ops would draw differently
  key = ((built.fingerprint, batch_size, warmup_batches, max_batches, max_seconds)
         if built is not None else None)
  if key in _RATES:
    return dataclasses.replace(_RATES[key], timed_before=True)
  stored_key = _stored_key(key) if key is not None and store is not None else None
  if stored_key is not None:
    earlier = _stored_rate(store.get_input_rate(stored_key))
    if earlier is not None and earlier.samples_per_sec >= enough:
      _remember(key, earlier)
      return earlier
  rate = _measure_input_rate(call_input_fn, batch_size, warmup_batches, max_batches,
                             max_seconds, seed, built)
  if key is not None and rate is not None:
    _remember(key, rate)
    if stored_key is not None:
      store.put_input_rate(stored_key, {"samples": rate.samples, "batches": rate.batches,
                                        "seconds": rate.seconds, "at": time.time()})
  return rate


def _remember(key, rate: InputRate) -> None:
  while len(_RATES) >= _MAX_RATES:
    _RATES.pop(next(iter(_RATES)))
  _RATES[key] = rate


def host_identity() -> str:
  """This machine as an input timing depends on it: its name, CPU model and count, and the
  TensorFlow that ran the pipeline."""
  model = ""
  try:
    with open("/proc/cpuinfo") as fh:
      model = next((l.split(":", 1)[1].strip() for l in fh if l.startswith("model name")), "")
  except OSError:  # not Linux: the name and the count still tell hosts apart
    pass
  return f"{socket.gethostname()}|{model}|{os.cpu_count()}|{tf.__version__}"


def _stored_key(key) -> str:
  return hashlib.sha256(repr((key, host_identity())).encode()).hexdigest()[:32]


def _stored_rate(entry) -> Optional[InputRate]:
  """An InputRate from a stored entry, or None for a missing or malformed one."""
  try:
    rate = InputRate(int(entry["samples"]), int(entry["batches"]), float(entry["seconds"]),
                     timed_at=float(entry["at"]))
  except (TypeError, KeyError, ValueError):
    return None
  sane = (rate.samples > 0 and rate.batches > 0 and 0 < rate.seconds < float("inf")
          and 0 <= rate.timed_at < float("inf"))
  return rate if sane else None


# Rates of built pipelines timed in this process, by fingerprint: a pipeline trained again
# (another train() call, a rerun in a notebook, each mode in turn) is not timed again, since
# this host delivers the same; each timing costs a run the pipeline's set-up, seconds for
# tf-text ones.
_RATES: Dict[tuple, InputRate] = {}
_MAX_RATES = 64


def _measure_input_rate(call_input_fn, batch_size, warmup_batches, max_batches, max_seconds,
                        seed, built) -> Optional[InputRate]:
  """`measure_input_rate` without the memo."""
  with _input_session(call_input_fn, seed, built) as (sess, features, labels):
    if any("from_generator" in f.signature.name
           for f in sess.graph.as_graph_def().library.function):
      raise NotTimed("it reads Dataset.from_generator, which may be a one-pass source that "
                     "timing would use up")
    fetch = [t for t in tf.nest.flatten((features, labels)) if isinstance(t, tf.Tensor)]
    if not fetch:
      return None
    samples = batches = 0
    seconds = 0.0
    try:
      t0 = time.perf_counter()
      for _ in range(warmup_batches):
        sess.run(fetch)
        if time.perf_counter() - t0 > max_seconds:
          break  # a slow pipeline: one warm-up batch will do, each costs the run its time
      t0 = time.perf_counter()
      while batches < max_batches and seconds < max_seconds:
        values = sess.run(fetch)
        seconds = time.perf_counter() - t0
        samples += batch_size or next((len(v) for v in values if np.ndim(v)), 1)
        batches += 1
    except tf.errors.OutOfRangeError:
      pass
  return InputRate(samples, batches, seconds) if batches else None
