"""Lower: a captured tf.Graph -> the TF-free LayerGraph IR, and validation against the kernels.

Forward ops are the ancestors of the loss; backward ops are the ones TF's autodiff created
(under `gradients*/` or `gradient_tape/`). Ops are grouped into layers by variable scope:
an op belongs to the deepest scope that owns trainable variables and contains it; ops that sit
above such scopes (e.g. the attention core in `.../attention/self`, which owns no variables
itself but contains `query/`, `key/`, `value/`) form a layer of their own scope. FLOPs are
counted from static shapes (a multiply-add is 2 FLOPs), so `Einsum` and `BatchMatMul` are
counted right, which TF's own profiler does not do for Einsum.
"""

import collections
import math
import os
import re
from typing import Callable, Dict, Iterable, List, Optional, Set, Tuple

import numpy as np
import tensorflow as tf

from cerebras_tf.core import ir, source
from cerebras_tf.compiler import kernels, layer_rules
from cerebras_tf.compiler.capture import CapturedGraph, ancestors
from cerebras_tf.errors import CompileError, UnsupportedOpError

# Backward ops: tf.gradients' scope, at the top or under another (Keras's optimizers build
# "training/SGD/gradients/gradients/..."), or a GradientTape's.
_GRAD_PREFIX = re.compile(r"^(?:.*?/)?(?:(?:gradients(?:_\d+)?|gradient_tape)/)+")
_ROOT = "(root)"
_FRAMEWORK_DIRS = tuple(os.path.normpath(os.path.dirname(m.__file__)) + os.sep for m in (np, tf))


# Producers whose outputs are weights, inputs or metadata, never a layer's activations.
_NOT_ACTIVATIONS = frozenset({"Const", "ReadVariableOp", "Placeholder", "VarHandleOp", "Shape"})
# Ops that read a whole row of scores at once: their input is their layer's transient work.
_SOFTMAX = frozenset({"Softmax", "LogSoftmax", "SparseSoftmaxCrossEntropyWithLogits",
                      "SoftmaxCrossEntropyWithLogits"})
# Ops whose output is their input's value in another dtype, shape or layout.
_SAME_VALUE = frozenset({"Cast", "Identity", "IdentityN", "Snapshot", "StopGradient",
                         "PreventGradient", "EnsureShape", "Reshape", "Squeeze", "ExpandDims",
                         "Transpose"})


def _value_of(t: tf.Tensor) -> tf.Tensor:
  """The tensor whose value `t` is: `t` followed back through casts, reshapes, transposes
  and identities (IdentityN's output i is its input i)."""
  while t.op.type in _SAME_VALUE and t.op.inputs:
    t = t.op.inputs[t.value_index if t.op.type == "IdentityN" else 0]
  return t


def _scope(name: str) -> str:
  return name.rsplit("/", 1)[0] if "/" in name else ""


def _forward_name(grad_op_name: str) -> str:
  """Name of the forward op a gradient op was made for (approximately)."""
  rest = _GRAD_PREFIX.sub("", grad_op_name)
  parts = rest.split("/")
  for i, p in enumerate(parts):
    if p.endswith("_grad"):
      return "/".join(parts[:i] + [p[:-5]])
  return "/".join(parts[:-1]) or rest


def _prefixes(scope: str) -> Iterable[str]:
  parts = scope.split("/") if scope else []
  for i in range(len(parts), 0, -1):
    yield "/".join(parts[:i])


def _static_size(shape: tf.TensorShape) -> Optional[int]:
  if shape.rank is None or not shape.is_fully_defined():
    return None
  return int(np.prod(shape.as_list(), dtype=np.int64))


def _einsum_flops(op) -> float:
  eq = op.get_attr("equation").decode()
  lhs, _, _ = eq.partition("->")
  terms = lhs.split(",")
  sizes: Dict[str, int] = {}
  for term, t in zip(terms, op.inputs):
    dims = t.shape.as_list()
    if "..." in term:
      n_ell = len(dims) - (len(term) - 3)
      term = term.replace("...", "".join(chr(0x100 + i) for i in range(n_ell)))
    for label, d in zip(term, dims):
      if d is not None:
        sizes[label] = max(sizes.get(label, 1), d)
  total = float(np.prod(list(sizes.values()), dtype=np.float64))
  return 2.0 * total if len(terms) > 1 else total


def _size(t) -> int:
  return _static_size(t.shape) or 0


def _ksize(op) -> float:
  """Window elements of a pooling op (its ksize attr, batch and channel entries are 1)."""
  return float(np.prod(op.get_attr("ksize")))


# A @tf.function called from a model_fn (graph mode) is one op running the function's graph.
_CALLS = ("PartitionedCall", "StatefulPartitionedCall")


def _function_graph(op, attr: str):
  """The FuncGraph of a While op's `body` or `cond` or a call's `f`, or None."""
  try:
    return op.graph._get_function(op.get_attr(attr).name).graph  # pylint: disable=protected-access
  except (AttributeError, ValueError, KeyError):
    return None


def _loop_body(op):
  """The graph a loop runs each iteration, or a call once."""
  return _function_graph(op, "f" if op.type in _CALLS else "body")


def _static_int(t) -> Optional[int]:
  """A scalar int tensor's value when it is known before running: a constant, a dimension of
  a static shape (`tf.shape(x)[i]`, how Keras's RNN counts time steps), or the final counter
  of a loop with a static trip count (a gradient loop runs as often as its forward loop)."""
  value = tf.get_static_value(t)
  if value is not None and np.ndim(value) == 0:
    return int(value)
  op = t.op
  if op.type == "StridedSlice" and op.get_attr("shrink_axis_mask") == 1:
    begin = tf.get_static_value(op.inputs[1])
    vec = tf.get_static_value(op.inputs[0])
    if vec is None and op.inputs[0].op.type == "Shape":
      vec = op.inputs[0].op.inputs[0].shape.as_list()
    if begin is not None and len(begin) == 1 and vec is not None and np.ndim(vec) == 1:
      d = vec[int(begin[0])]
      return None if d is None else int(d)
  if op.type in ("While", "StatelessWhile") and t.value_index == 0:
    return trip_count(op)  # output 0 is the loop counter's final value
  return None


def trip_count(op) -> Optional[int]:
  """The static trip count of a While op, or None.

  Its `maximum_iterations` input when that is a constant >= 0; else the loop's condition, a
  comparison of a loop variable `i` with a bound `n` (a loop input, or a constant of the
  condition), either way round: `i < n` / `i <= n` counting up by the body's `i + c`, or
  `i > n` / `i >= n` counting down by `i - c`, with the start of `i` and `n` static. Keras's
  LSTM/GRU loop over `tf.shape(inputs)[0]` time steps, which is static for fixed-length
  sequences.
  """
  if op.type in _CALLS:
    return 1
  if op.type not in ("While", "StatelessWhile") or len(op.inputs) < 2:
    return None
  limit = _static_int(op.inputs[1])
  limit = None if limit is None or limit < 0 else limit
  cond = _function_graph(op, "cond")
  names = [t.name for t in cond.inputs] if cond is not None else []
  compares = [o for o in cond.get_operations() if o.type in _COMPARES] \
      if cond is not None else []
  if len(compares) == 1:
    cmp = compares[0]
    left, right = cmp.inputs[0], cmp.inputs[1]
    # `n > i` is `i < n`: put the loop variable on the left.
    kind = cmp.type if left.name in names else _MIRRORED[cmp.type]
    var, bound_t = (left, right) if left.name in names else (right, left)
    if var.name in names:
      i = names.index(var.name)
      bound = (_static_int(op.inputs[names.index(bound_t.name)]) if bound_t.name in names
               else _static_int(bound_t))
      start = _static_int(op.inputs[i])
      up = kind in ("Less", "LessEqual")
      step = _loop_step(op, i, up)
      if start is not None and bound is not None:
        span = (bound - start) if up else (start - bound)
        span = max(0, span + (kind in ("LessEqual", "GreaterEqual")))
        trips = -(-span // step)
        return trips if limit is None else min(trips, limit)
  return limit


_COMPARES = ("Less", "LessEqual", "Greater", "GreaterEqual")
_MIRRORED = {"Less": "Greater", "LessEqual": "GreaterEqual", "Greater": "Less",
             "GreaterEqual": "LessEqual"}


def _loop_step(op, i: int, up: bool = True) -> int:
  """How far a loop's body moves its loop variable i each trip, towards the bound: c for
  `i + c` counting up, or for `i - c` (or `i + -c`) counting down, c > 0 static; 1 when the
  body says otherwise (Keras's RNN counters add 1)."""
  body = _loop_body(op)
  if body is None or i >= len(body.outputs) or i >= len(body.inputs):
    return 1
  out, var = body.outputs[i], body.inputs[i].name
  while out.op.type == "Identity":
    out = out.op.inputs[0]
  if out.op.type in ("Add", "AddV2", "Sub") and len(out.op.inputs) == 2:
    a, b = out.op.inputs
    sign = -1 if out.op.type == "Sub" else 1
    other = b if a.name == var else a if (b.name == var and sign == 1) else None
    c = _static_int(other) if other is not None else None
    if c is not None:
      c *= sign
      if (c > 0) == up and c != 0:
        return abs(c)
  return 1


def _loop_cost(op, per_op) -> float:
  body, trips = _loop_body(op), trip_count(op)
  if body is None or trips is None:
    return 0.0
  return float(trips) * sum(per_op(o) for o in body.get_operations())


def op_flops(op) -> float:
  """FLOPs of one op from its static shapes, by its kernel's form in kernels.py.

  0 when shapes are unknown or the op does no math. Forms (|t|: element count):
    matmul      2 |out| K                 conv        2 |out| prod(filter[:-1])
    conv_grad   2 |dy| prod(filter[:-1])  depthwise   2 |out| kh kw
    window      k |out| prod(ksize)       norm        k |x| (inference BN: 2 |x|)
    out         k |out|                   in          |in|
    loop        trips x body FLOPs
  """
  kern = kernels.kernel(op.type)
  if kern is None or kern.form == "zero" or not op.outputs:
    return 0.0
  form, k = kern.form, kern.k
  try:
    if form == "einsum":
      return _einsum_flops(op)
    if form == "matmul":
      out = _static_size(op.outputs[0].shape)
      a = op.inputs[0].shape.as_list()
      if out is None or not a:
        return 0.0
      if op.type in ("MatMul", "_FusedMatMul"):
        kk = a[0] if op.get_attr("transpose_a") else a[1]
      else:
        kk = a[-2] if op.get_attr("adj_x") else a[-1]
      return 2.0 * out * kk
    if form in ("conv", "conv_grad", "depthwise", "depthwise_grad"):
      if op.type.endswith("BackpropFilter") or op.type.endswith("BackpropFilterV2"):
        filt, out = op.outputs[0].shape.as_list(), _static_size(op.inputs[2].shape)
      elif form.endswith("_grad"):
        filt, out = op.inputs[1].shape.as_list(), _static_size(op.inputs[2].shape)
      else:
        filt, out = op.inputs[1].shape.as_list(), _static_size(op.outputs[0].shape)
        # A dilated conv runs as SpaceToBatchND -> conv -> BatchToSpaceND on padded blocks;
        # the engine computes the dilated conv itself: count the outputs kept.
        crop = [c for c in op.outputs[0].consumers() if c.type == "BatchToSpaceND"]
        if crop:
          out = _static_size(crop[0].outputs[0].shape)
      if out is None or None in filt:
        return 0.0
      per_out = float(np.prod(filt[:-2] if form.startswith("depthwise") else filt[:-1]))
      return 2.0 * out * per_out
    if form == "window":
      return k * _size(op.outputs[0]) * _ksize(op)
    if form == "window_grad":
      return k * _size(op.inputs[-1]) * _ksize(op)
    if form == "norm":
      if op.type.startswith("FusedBatchNorm") and "Grad" not in op.type and \
          not op.get_attr("is_training"):
        k = 2.0  # inference: (x - mean) * gamma / std + beta folds to x * a + b
      return k * _size(op.inputs[0])
    if form == "logits":
      return k * _size(op.inputs[0])
    if form == "in":
      return float(_size(op.inputs[0])) if op.inputs else 0.0
    if form == "loop":
      return _loop_cost(op, op_flops)
    return k * _size(op.outputs[0])
  except (ValueError, TypeError, IndexError):
    return 0.0


_SPATIAL_OPS = {"Conv2D": "conv", "DepthwiseConv2dNative": "depthwise", "MaxPool": "maxpool",
                "AvgPool": "avgpool", "FusedBatchNorm": "batchnorm",
                "FusedBatchNormV3": "batchnorm"}


def _attr(op, name, default=None):
  try:
    v = op.get_attr(name)
  except ValueError:
    return default
  return v.decode() if isinstance(v, bytes) else v


def op_spatial(op, batch: int = 0) -> Optional[ir.Spatial]:
  """The per-sample spatial shape of a forward image op (engine/conv.py costs it), or None
  (another op, unknown shapes, a dilated conv, or a norm whose leading dimension is not the
  `batch`: Keras's LayerNormalization runs FusedBatchNorm on the whole batch reshaped to
  [1, batch x positions, features, 1], a per-position norm, not an image)."""
  kind = _SPATIAL_OPS.get(op.type)
  if kind is None or not op.outputs:
    return None
  try:
    x, y = op.inputs[0].shape.as_list(), op.outputs[0].shape.as_list()
    if len(x) != 4 or len(y) != 4 or None in x[1:] or None in y[1:]:
      return None
    if kind == "batchnorm" and batch and x[0] is not None and x[0] != batch:
      return None
    nchw = _attr(op, "data_format", "NHWC") in ("NCHW", "NCDHW")
    hwc = lambda d: (d[2], d[3], d[1]) if nchw else (d[1], d[2], d[3])  # noqa: E731
    (ih, iw, ci), (oh, ow, co) = hwc(x), hwc(y)
    kh = kw = sh = sw = 1
    if kind in ("conv", "depthwise"):
      dil = _attr(op, "dilations", [1, 1, 1, 1])
      if any(d != 1 for d in dil):
        return None
      f = op.inputs[1].shape.as_list()
      kh, kw = f[0], f[1]
    elif kind in ("maxpool", "avgpool"):
      k = _attr(op, "ksize")
      kh, kw = (k[2], k[3]) if nchw else (k[1], k[2])
    if kind != "batchnorm":
      st = _attr(op, "strides")
      sh, sw = (st[2], st[3]) if nchw else (st[1], st[2])
    if None in (kh, kw):
      return None
    return ir.Spatial(kind, int(ih), int(iw), int(oh), int(ow), int(ci), int(co), int(kh),
                      int(kw), int(sh), int(sw), str(_attr(op, "padding", "SAME")))
  except (ValueError, TypeError, IndexError):
    return None


# Ops that write rows of a zeroed buffer: a router's dispatch of tokens to expert slots.
_DISPATCH = ("UnsortedSegmentSum", "ScatterNd")


def dispatch_slots(op) -> Optional[Tuple[int, float]]:
  """(slots, routed share) of a forward dispatch: a segment sum or scatter of R rows into S
  slot rows, R < S (a mixture-of-experts router giving every expert room for every token,
  or capacity above what is routed); None for any other op. The share is R / S."""
  if op.type not in _DISPATCH or not op.outputs:
    return None
  rows_in = op.inputs[0 if op.type == "UnsortedSegmentSum" else 1].shape
  rows_out = op.outputs[0].shape
  if rows_in.rank is None or rows_out.rank is None or not rows_in.rank or not rows_out.rank:
    return None
  r, slots = rows_in.as_list()[0], rows_out.as_list()[0]
  if r is None or slots is None or r >= slots:
    return None
  return slots, r / slots


def touches_slots(op, slots: int) -> bool:
  """Whether `op` works on a dispatch buffer of `slots` rows: a tensor [slots, ...] or
  [experts, capacity, ...] with experts x capacity = slots (the experts' batched matmuls,
  their activations and gradients)."""
  for t in list(op.inputs) + list(op.outputs):
    dims = t.shape.as_list() if t.shape.rank else []
    if dims and (dims[0] == slots or (len(dims) >= 3 and None not in dims[:2]
                                      and dims[0] * dims[1] == slots and dims[0] > 1)):
      return True
  return False


def _contraction_flops(op) -> float:
  """op_flops of matmuls and convolutions, 0 for the rest (a loop body's dense share)."""
  return op_flops(op) if kernels.category(op.type) in (kernels.MATMUL, kernels.CONV) else 0.0


def _bytes(tensors) -> int:
  total = 0
  for t in tensors:
    if t.dtype in (tf.variant, tf.resource, tf.string):
      continue
    total += _size(t) * t.dtype.size
  return total


def op_bytes(op) -> float:
  """Bytes one op moves: (sum |inputs| + sum |outputs|) x element size; free ops 0, a loop
  its body's bytes once per iteration."""
  cat = kernels.category(op.type)
  if cat in (None, kernels.FREE):
    return 0.0
  if cat == kernels.LOOP:
    return _loop_cost(op, op_bytes)
  try:
    return float(_bytes(op.inputs) + _bytes(op.outputs))
  except (ValueError, TypeError):
    return 0.0


def _frames_outside_tf(op, frames=None):
  """(path, line, ours) of the frames that built `op` (or of `frames`, outermost first),
  innermost first, without those of TensorFlow, numpy and the standard library; `ours`: a
  cerebras_tf frame."""
  if frames is None:
    try:
      frames = list(op.traceback)
    except Exception:  # pylint: disable=broad-except
      return
  for f in reversed(frames):
    path = os.path.normpath(f.filename)
    if "site-packages" in path or path.startswith(_FRAMEWORK_DIRS):
      continue
    if os.sep + "python3." in path and os.sep + "lib" + os.sep in path:
      continue
    yield path, f.lineno, source.is_own(path)


def user_source(op, frames=None) -> str:
  """`file:line` of the innermost frame outside TensorFlow/numpy/cerebras_tf that built `op`
  (or of `frames`: traceback.extract_stack()'s)."""
  for path, line, ours in _frames_outside_tf(op, frames):
    if not ours:
      rel = os.path.relpath(path)
      return f"{rel if not rel.startswith('..') else path}:{line}"
  return ""


def built_by_cerebras_tf(op) -> bool:
  """Whether cerebras_tf's own code (a reference model, its optimizer) called TensorFlow to
  build `op`, even from a user's model_fn."""
  return next((ours for _, _, ours in _frames_outside_tf(op)), False)


def _variable_read(op, depth: int = 3) -> Optional[str]:
  """The name of the variable `op` reads whole, possibly behind a few casts/identities/
  transposes (None when it reads none). A gather of some rows (an embedding lookup) is an
  activation, not a read of the weights: the first layer after the embeddings reads it."""
  if op.type in ("VariableV2", "VarHandleOp"):
    return op.name
  if op.type == "ReadVariableOp":
    handle = op.inputs[0].op if op.inputs else None
    return handle.name if handle is not None and handle.type in ("VarHandleOp",
                                                                 "VariableV2") else op.name
  if depth and op.type in ("Cast", "Identity", "Transpose", "Reshape") and op.inputs:
    return _variable_read(op.inputs[0].op, depth - 1)
  return None


def _reads_variable(op, depth: int = 3) -> bool:
  """True when `op` reads a whole variable (`_variable_read`)."""
  return _variable_read(op, depth) is not None


def _within(scope: str, owner: str) -> bool:
  """True when `scope` is `owner` or nested in it."""
  return scope == owner or scope.startswith(owner + "/")


def forward_ops(captured: CapturedGraph) -> List[tf.Operation]:
  """Ops on the data path from the inputs and variables to the loss, in creation order."""
  seen: Set[tf.Operation] = set()
  stack = [captured.loss.op]
  while stack:
    op = stack.pop()
    if op in seen:
      continue
    seen.add(op)
    stack.extend(t.op for t in op.inputs)
  return [op for op in captured.graph.get_operations() if op in seen]


def update_path_ops(captured: CapturedGraph, fwd: Iterable[tf.Operation]) -> List[tf.Operation]:
  """Ops the train_op runs beyond the forward path (gradients, clipping, the optimizer's
  update), in creation order."""
  if captured.train_op is None:
    return []
  seen: Set[tf.Operation] = set(fwd)
  found: Set[tf.Operation] = set()
  stack = [captured.train_op]
  while stack:
    op = stack.pop()
    if op in seen:
      continue
    seen.add(op)
    found.add(op)
    stack.extend(t.op for t in op.inputs)
    stack.extend(op.control_inputs)
  return [op for op in captured.graph.get_operations() if op in found]


def _check_op(op) -> Optional[str]:
  """Why the engine cannot run `op` (None when it can); a loop is checked through its body."""
  cat = kernels.category(op.type)
  if cat is None:
    return kernels.unsupported_reason(op.type)
  if cat not in (kernels.FREE, kernels.LOOP) and any(o.dtype == tf.float64 for o in op.outputs):
    return "computes in float64; the engine's floating-point units are 16- and 32-bit"
  if cat == kernels.LOOP:
    if trip_count(op) is None:
      return ("is a loop without a static trip count (give tf.while_loop maximum_iterations, "
              "or feed fixed-length sequences)")
    body = _loop_body(op)
    inner = sorted({o.type for o in body.get_operations()
                    if kernels.category(o.type) is None}) if body is not None else ["?"]
    if inner:
      what = "a call of a tf.function" if op.type in _CALLS else "a loop"
      return f"is {what} whose body uses op(s) with no engine kernel: {', '.join(inner)}"
    return None
  # A training batch norm's reserve-space outputs have no static shape; they stay on the op.
  outputs = op.outputs[:1] if cat == kernels.NORM else op.outputs
  if cat != kernels.FREE and op.type != "Const" and any(
      o.dtype not in (tf.variant, tf.resource) and not o.shape.is_fully_defined()
      for o in outputs):
    return f"has a dynamic output shape {op.outputs[0].shape}"
  return None


_VARIABLE_OPS = frozenset({"VarHandleOp", "VariableV2", "Variable", "ReadVariableOp"})
# Engine ops that take host-made sparse ids: their row count is the data's, not static.
_SPARSE_LOOKUPS = frozenset({"ResourceGather", "GatherV2", "Gather", "SparseSegmentMean",
                             "SparseSegmentSum", "SparseSegmentSqrtN", "Select", "SelectV2",
                             "ZerosLike", "Tile", "Mul", "Reshape", "Identity", "Cast",
                             "StridedSlice", "Pack", "Shape", "AddN", "AddV2"})


_PYTHON = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc"})


def _python_or_print(op_type: str) -> bool:
  return op_type in kernels.TPU_OPS or kernels.UNSUPPORTED_REASONS.get(op_type) in (
      "runs Python on the host", "prints on the host")


def _host_work(op) -> bool:
  """Whether `op` is preprocessing the engine has no kernel or no static shape for (strings,
  tables, hashing, bucketizing, sparse ops). Float64 math stays refused (cast in the
  input_fn), and so does a partitioned variable's lookup (the fix is in the model)."""
  why = _check_op(op)
  return why is not None and not why.startswith("computes in float64") and \
      kernels.UNSUPPORTED_REASONS.get(op.type) != kernels.PARTITIONED


def host_preprocessing(fwd: Iterable[tf.Operation]) -> Set[tf.Operation]:
  """The forward ops the host runs before the engine: the part of the graph that depends
  only on the input features and reads no variable, around the ops the engine cannot run
  there (feature columns' string lookups, hashing, bucketizing, crossing, sparse reshapes):
  such an op, the input-only ops it reads, and the input-only ops that read it. Empty for a
  graph the engine runs whole (its input-only casts and normalizations stay on the engine).
  """
  fwd = list(fwd)
  engine_only: Set[tf.Operation] = set()
  while True:
    host = _host_around(fwd, engine_only)
    # The host cannot take away a data-dependent shape: an op whose dynamic shape reaches an
    # engine op other than a lookup of sparse ids (a boolean_mask's Where feeding a Dense)
    # is not preprocessing; it stays the engine's (and is refused there, by name), and so
    # does what reads it.
    stuck = _dynamic_into_engine(fwd, host) - engine_only
    if not stuck:
      return host
    engine_only |= stuck


def _dynamic_shape(t) -> bool:
  return t.dtype not in (tf.variant, tf.resource) and not t.shape.is_fully_defined()


def _dynamic_into_engine(fwd: List[tf.Operation], host: Set[tf.Operation]
                         ) -> Set[tf.Operation]:
  """The host ops whose data-dependent shapes reach an engine op that cannot take them."""
  found: Set[tf.Operation] = set()
  if not host:
    return found
  seen: Set[tf.Operation] = set()
  stack = [op for op in fwd if op not in host and (_check_engine_op(op, host) or "").startswith(
      "has a dynamic output shape")]
  while stack:  # back along the dynamic shapes
    op = stack.pop()
    for t in op.inputs:
      if _dynamic_shape(t) and t.op not in seen:
        seen.add(t.op)
        stack.append(t.op)
        if t.op in host:
          found.add(t.op)
  return found


def _host_around(fwd: List[tf.Operation], engine_only: Set[tf.Operation]
                 ) -> Set[tf.Operation]:
  """host_preprocessing's set, with the ops of `engine_only` and what reads them kept off the
  host."""
  uses_vars: Set[tf.Operation] = set()
  for op in fwd:  # creation order: an op's inputs come before it
    if op.type in _VARIABLE_OPS or op in engine_only or any(t.op in uses_vars
                                                            for t in op.inputs):
      uses_vars.add(op)
  # Python and printing stay refused: a SavedModel cannot carry them (move them to the
  # input_fn), and a print in a training step is a hook's job.
  input_only = [op for op in fwd if op not in uses_vars and not _python_or_print(op.type)
                and not any(t.op.type in _PYTHON for t in op.inputs)]
  host = {op for op in input_only if op.type != "Placeholder" and _host_work(op)}
  if not host:
    return host
  allowed = set(input_only)
  stack = [t.op for op in host for t in op.inputs]
  while stack:  # what the host ops read
    op = stack.pop()
    if op in allowed and op not in host and op.type != "Placeholder":
      host.add(op)
      stack.extend(t.op for t in op.inputs)
  for op in input_only:  # what reads them, up to the first variable
    if op not in host and any(t.op in host for t in op.inputs):
      host.add(op)
  return host


def host_cost(host: Set[tf.Operation], engine_ops: Set[tf.Operation],
              batch: int) -> Optional[ir.HostPreprocessing]:
  """What the host's preprocessing costs per sample: its ops, the raw features it reads and
  what it hands the engine (sparse ids as many as the data brings are counted apart)."""
  if not host:
    return None
  read = {t for op in host for t in op.inputs if t.op.type == "Placeholder"}
  sent = {t for op in engine_ops for t in op.inputs if t.op in host}
  static = [t for t in sent if t.shape.is_fully_defined()]
  # The types that put it on the host (no engine kernel), most frequent first.
  types = collections.Counter(op.type for op in host if _check_op(op) is not None)
  # Those without a kernel first (string lookups, hashing, bucketizing, crossing), then those
  # with data-dependent shapes.
  order = lambda k: (kernels.category(k) is not None, -types[k], k)  # noqa: E731
  return ir.HostPreprocessing(
      num_ops=sum(op.type != "Const" for op in host),
      op_types=tuple(sorted(types, key=order)),
      read_bytes=sum(_static_bytes(t) for t in read) / batch,
      sent_bytes=sum(_static_bytes(t) for t in static) / batch,
      sparse_tensors=len(sent) - len(static), features=tuple(sorted(
          t.op.name for t in read)))


def _static_bytes(t) -> int:
  """Bytes of a tensor of static shape; a string counts 8 bytes a value (a pointer; the
  characters are the data's)."""
  return (_static_size(t.shape) or 0) * (8 if t.dtype == tf.string else t.dtype.size)


def _check_engine_op(op, host: Set[tf.Operation]) -> Optional[str]:
  """_check_op, except that a lookup of host-made sparse ids may have as many rows as the
  data brings (an embedding column's gather and segment mean)."""
  why = _check_op(op)
  if why is not None and why.startswith("has a dynamic output shape") and \
      op.type in _SPARSE_LOOKUPS and _fed_by(op, host):
    return None
  return why


def _fed_by(op, host: Set[tf.Operation], depth: int = 12) -> bool:
  """Whether a host op is among `op`'s inputs, a few ops back."""
  seen, frontier = set(), [op]
  for _ in range(depth):
    frontier = [t.op for o in frontier for t in o.inputs if t.op not in seen]
    if any(o in host for o in frontier):
      return True
    seen.update(frontier)
  return False


def unsupported_ops(fwd: Iterable[tf.Operation],
                    host: Optional[Set[tf.Operation]] = None
                    ) -> List[Tuple[tf.Operation, str, str]]:
  """(op, why, file:line) of every forward op the engine cannot run, in graph order; ops of
  `host` (host_preprocessing) run on the host and are not the engine's."""
  host = host or set()
  return [(op, why, user_source(op)) for op in fwd if op not in host
          for why in [_check_engine_op(op, host)] if why is not None]


# Op-name scopes of tf.feature_column's layers: their lookups are sparse, host-side work.
_FEATURE_COLUMN_SCOPES = ("input_layer/", "dense_features/", "linear_model/")


def _advice(bad, gradient_path: bool) -> str:
  """What to do about the unsupported ops `bad`, worded for one op or several;
  `gradient_path`: all of them are on the gradient and update path."""
  it, they = ("it", "it") if len(bad) == 1 else ("these", "them")
  if any(op.type in kernels.TPU_OPS for op, _, _ in bad):
    return "use the optimizer without tf.compat.v1.tpu.CrossShardOptimizer"
  if gradient_path:
    return (f"take {they} out of the training step (to watch a value such as the gradient "
            f"norm, fetch it with a tf.compat.v1.train.LoggingTensorHook)")
  if any(op.name.startswith(_FEATURE_COLUMN_SCOPES) for op, _, _ in bad):
    return (f"{it} {'comes' if len(bad) == 1 else 'come'} from feature columns "
            f"(tf.feature_column), whose lookups are sparse: turn the features into dense "
            f"tensors in the input_fn (dataset.map with tf.lookup ids, one-hot, bucketize) and "
            f"give the model_fn those")
  return f"move {they} into the input_fn or replace {they} with supported TF ops"


# Places (op type, source line) one error line names; the rest go to the listing file.
MAX_PLACES = 5


def unsupported_message(bad: List[Tuple[tf.Operation, str, str]],
                        gradient_path: bool = False, listing: Optional[str] = None) -> str:
  """One line naming the unsupported ops; ops of one type from one source line are counted
  together (a Keras LSTM has dozens of TensorList ops from the same line). With `listing`
  (a file that lists them all), only the first MAX_PLACES places are named."""
  if len(bad) == 1:
    op, why, where = bad[0]
    return (f"{where + ': ' if where else ''}unsupported op '{op.name}' of type {op.type}: it "
            f"{why}; {_advice(bad, gradient_path)}")
  groups: Dict[Tuple[str, str], List] = {}
  for op, why, where in bad:
    groups.setdefault((op.type, where), []).append((op, why))
  parts = []
  for (op_type, where), ops in groups.items():
    op, why = ops[0]
    more = f" and {len(ops) - 1} more of that type there" if len(ops) > 1 else ""
    parts.append(f"{where + ': ' if where else ''}'{op.name}' of type {op_type}{more} "
                 f"(it {why})")
  if listing and len(parts) > MAX_PLACES:
    parts = parts[:MAX_PLACES] + [f"{len(parts) - MAX_PLACES} more place(s), every op listed "
                                  f"in {listing}"]
  types = sorted({op.type for op, _, _ in bad})
  return (f"{len(bad)} unsupported ops of {len(types)} type(s) ({', '.join(types)}): "
          f"{'; '.join(parts)}; {_advice(bad, gradient_path)}")


def validate(captured: CapturedGraph, fwd: Optional[List[tf.Operation]] = None,
             listing: Optional[str] = None) -> None:
  """Raises UnsupportedOpError naming every op the engine cannot run, with its source line:
  any forward op without a kernel; on the gradient and update path, the op types no part of a
  step can run (kernels.never_on_engine: a TPUEstimator model_fn's CrossShardOptimizer).

  The error's `ops` attribute lists (op name, op type, file:line, reason) for each of them.
  With `listing`, a path, they are also written there, one per line, and an error line with
  more than MAX_PLACES places names the first ones and the file.
  """
  wide = sorted(n for n, t in captured.inputs.items() if t.dtype == tf.float64)
  if wide:  # one line for the cause, not one per op that inherits it
    raise CompileError(
        f"input {', '.join(wide)} is float64 (numpy's default); the engine's floating-point "
        f"units are 16- and 32-bit: cast it in the input_fn (x.astype('float32'), or "
        f"dataset.map with tf.cast)")
  fwd = forward_ops(captured) if fwd is None else fwd
  host = host_preprocessing(fwd)
  bad = unsupported_ops(fwd, host)
  # The gradient and update path is the optimizer's; only what cannot run there at all.
  on_gradients = [(op, kernels.unsupported_reason(op.type), user_source(op))
                  for op in update_path_ops(captured, fwd) if kernels.never_on_engine(op.type)
                  and op not in host]
  if bad or on_gradients:
    ops = tuple((op.name, op.type, where, why) for op, why, where in bad + on_gradients)
    if listing:
      os.makedirs(os.path.dirname(listing) or ".", exist_ok=True)
      with open(listing, "w", encoding="utf-8") as fh:
        fh.writelines(f"{where or '?'}\t{name}\t{op_type}\tit {why}\n"
                      for name, op_type, where, why in ops)
    err = UnsupportedOpError(unsupported_message(bad + on_gradients, gradient_path=not bad,
                                                 listing=listing))
    err.ops = ops
    raise err


def _slots_per_param(captured: CapturedGraph) -> Tuple[str, int]:
  """Optimizer name and slots per parameter, from the recorded optimizer or the update ops."""
  names = list(captured.optimizers) + [
      op.type for op in captured.graph.get_operations()
      if op.type.startswith(("Apply", "ResourceApply"))]
  # Unknown: assume the common, conservative case.
  return layer_rules.optimizer_slots(names) or ("adam", 2)


# Steps of `lower`, in the order it runs them:
#   LayerNamer          which layer each forward and backward op belongs to
#   routed_layers       the mixture-of-experts layers and the share of their slots filled
#   tally_forward       forward FLOPs, softmax work, image ops and pipeline position per layer
#   host_inputs / tally_inputs       the host input each layer reads first
#   count_params        trainable parameters per layer
#   backward_ops / tally_backward    backward FLOPs per layer
#   pipeline_order      the layers in pipeline order
#   layer_rules.fold_small           small weightless layers folded into their neighbour
#   handed_activations  the bytes each folded layer hands to the others
#   batch_norm_layers   the folded layers that own a moving mean
#   kept_for_backward   the forward values the host keeps for the backward pass
#   layer_rules.to_layer             each tally as an ir.Layer per sample


def canonical_scope(scope: str, known: Set[str]) -> str:
  """The scope with TF's name-scope uniquifier undone where it split a variable scope.

  Re-entering `variable_scope("cross_attention")` under the same name scope (the reference
  Transformer opens it once for the keys/values of the encoder output and again for the
  attention) puts the second block's ops under "cross_attention_1": its variables still
  live in ".../cross_attention/...", so its ops matched no variable scope and fell to
  ".../layer_i", leaving "cross_attention/query" with the weights and 0 FLOPs. A component
  "name_N" is read as "name" when the path with "name_N" is no `known` scope and the path
  with "name" is.
  """
  out: List[str] = []
  for part in scope.split("/") if scope else ():
    cand = "/".join(out + [part])
    if cand not in known:
      base = re.sub(r"_\d+$", "", part)
      if base != part and "/".join(out + [base]) in known:
        part = base
    out.append(part)
  return "/".join(out)


def tied_matmuls(fwd: Iterable[tf.Operation], known: Set[str]
                 ) -> Tuple[Set[str], Dict[tf.Operation, str]]:
  """(scopes, root ops) of the forward matmuls that read weights another scope owns.

  A matmul reading weights owned by another scope (a tied LM head multiplying by the word
  embeddings) in a name scope of its own (no `known` scope) is its own layer, not the
  container around it; its scope is returned. Weights of an enclosing scope are the layer's
  own: Keras runs a Dense kernel in "dense/Tensordot" and an EinsumDense one in
  "mha/query/einsum". Outside every scope (a Keras model_fn's
  `tf.matmul(x, emb.embeddings, transpose_b=True)`) such a matmul is named by the op and the
  line that made it, not folded into "(root)": {op: that name}.
  """
  def reads_foreign_weights(op, scope: str) -> bool:
    names = [_variable_read(t.op) for t in op.inputs]
    return any(n is not None and not _within(scope, canonical_scope(_scope(n), known))
               for n in names)

  tied: Set[str] = set()
  root_tied: Dict[tf.Operation, str] = {}
  for op in fwd:
    if kernels.category(op.type) == kernels.MATMUL:
      s = canonical_scope(_scope(op.name), known)
      if s and s not in known and reads_foreign_weights(op, s):
        tied.add(s)
      elif not s and reads_foreign_weights(op, s):
        src = user_source(op)
        root_tied[op] = f"{op.name} at {src}" if src else op.name
  return tied, root_tied


class LayerNamer:
  """Which layer each op of a captured graph belongs to (the module docstring's rule).

  Built from the graph, its engine forward ops (no host preprocessing) and its trainable
  variables. `layer_of(scope)` names a scope's layer, `op_layer(op)` a forward op's,
  `grad_layer(op)` a backward op's (the layer of the forward op it was made for).
  """

  def __init__(self, graph: tf.Graph, fwd: List[tf.Operation], trainable):
    self.graph = graph
    self.fwd_set = set(fwd)
    self.owners = {_scope(v.op.name) for v in trainable}  # scopes holding weights
    self.ancestors = {p for s in self.owners for p in list(_prefixes(s))[1:]}
    self.known = self.owners | self.ancestors
    self.tied, self.root_tied = tied_matmuls(fwd, self.known)
    self.position = {op: i for i, op in enumerate(graph.get_operations())}
    self._cache: Dict[tf.Operation, str] = {}

  def layer_of(self, scope: str) -> str:
    """The layer of ops in `scope`: its deepest enclosing scope that owns weights (or a tied
    matmul), else its deepest enclosing container, else its first component ("(root)")."""
    scope = canonical_scope(scope, self.known)
    for p in _prefixes(scope):
      if p in self.owners or p in self.tied:
        return p
    for p in _prefixes(scope):
      if p in self.ancestors:
        return p
    return scope.split("/")[0] if scope else _ROOT

  def scope_layer(self, op) -> str:
    """The layer of `op` by its scope alone (a loop goes with the weights it reads)."""
    layer = self.root_tied.get(op) or self.layer_of(_scope(op.name))
    if kernels.category(op.type) == kernels.LOOP:
      # A Keras RNN loops in "lstm/" over weights in "lstm/lstm_cell/": one layer.
      owners = {self.layer_of(_scope(t.op.name)) for t in op.inputs if _reads_variable(t.op)}
      layer = owners.pop() if len(owners) == 1 else layer
      if layer == _ROOT:  # a tf.while_loop in no scope: named by its op and line
        src = user_source(op)
        layer = f"{op.name} at {src}" if src else op.name
    return layer

  def _owns(self, layer: str) -> bool:
    return layer in self.owners or layer in self.tied

  def in_container(self, op, layer: str) -> bool:
    """An op of a scope that holds layers but is none (a block's: its residual sums, the
    casts around its norms; the model's: the final cast, the loss) that makes no product or
    softmax of its own (an attention core's are a layer) and repeats nothing (grouped K/V
    heads tiled for the query heads are the core's input, made where it reads them)."""
    return (layer in self.ancestors and not self._owns(layer)
            and kernels.category(op.type) not in (kernels.MATMUL, kernels.CONV, kernels.LOOP)
            and op.type not in _SOFTMAX and op.type not in ("Tile", "BroadcastTo")
            and not any(_reads_variable(t.op) for t in op.inputs))

  def op_layer(self, op) -> str:
    """The layer a forward op belongs to: its scope's, except that an op `in_container` goes
    with the layer that made its input - preferring a layer inside its container, the latest
    made (a residual sum with the projection whose output it adds, not with the block before
    it that made x, nor with a dropout mask), so that output is not handed across a boundary
    the engine does not have."""
    if op in self._cache:
      return self._cache[op]
    layer = self.scope_layer(op)
    inputs = [t.op for t in op.inputs if t.op in self.fwd_set and t.dtype.is_floating
              and t.op.type not in _NOT_ACTIVATIONS]  # values, not shapes or masks
    if inputs and self.in_container(op, layer):
      made = {i: self.op_layer(i) for i in inputs}  # inputs come first: a short recursion
      inside = [i for i in inputs if _within(made[i], layer)]
      owned = [i for i in inside if self._owns(made[i])]
      layer = made[max(owned or inside or inputs, key=self.position.get)]
    self._cache[op] = layer
    return layer

  def grad_layer(self, op, depth: int = 0) -> str:
    """The layer of the forward op a gradient op was made for. Ops named for no forward op
    (tf.gradients' "gradients/AddN_7", which sums the gradients of a tensor used twice, as
    by a residual connection) go with the gradient op they feed (the backward pass of the
    layer that made the tensor), else with the one that feeds them."""
    name = _forward_name(op.name)
    try:
      fwd_op = self.graph.get_operation_by_name(name)
    except KeyError:
      fwd_op = None
    if fwd_op in self.fwd_set:
      return self.op_layer(fwd_op)
    if depth < 3:
      nearby = [c for t in op.outputs[:1] for c in t.consumers()] + [t.op for t in op.inputs]
      for other in nearby:
        if other.type != "Const" and _GRAD_PREFIX.match(other.name):
          return self.grad_layer(other, depth + 1)
    return self.layer_of(_scope(name))


Routed = Dict[str, Tuple[int, float]]


def routed_layers(fwd: Iterable[tf.Operation], op_layer: Callable) -> Routed:
  """{layer: (slots, routed share)} of the layers holding a forward dispatch
  (`dispatch_slots`). Mixture of experts: the engine computes the expert slots a router
  filled, not the empty ones, so the ops on a dispatch buffer count its routed share (top_k
  of num_experts per token, capped by the capacity), forward and backward."""
  routed: Routed = {}
  for op in fwd:
    found = dispatch_slots(op)
    if found is not None:
      routed[op_layer(op)] = found
  return routed


def routed_share(op, layer: str, routed: Routed) -> float:
  """The share of `op`'s FLOPs the engine computes: its layer's routed share when it works
  on the dispatch buffer, else 1."""
  slots, share = routed.get(layer, (0, 1.0))
  return share if slots and touches_slots(op, slots) else 1.0


def _static_dims(shape: tf.TensorShape) -> Optional[Tuple[int, ...]]:
  return tuple(shape.as_list()) if shape.rank is not None and shape.is_fully_defined() else None


# Forward ops that are storage or inputs: no layer's work.
_STORAGE = ("Placeholder", "VarHandleOp", "VariableV2", "Const", "ReadVariableOp")


def tally_forward(graph: tf.Graph, namer: LayerNamer, routed: Routed, batch: int,
                  act_dtype_bytes: int) -> Dict[str, layer_rules.LayerTally]:
  """{layer: its tally} over the engine's forward ops (namer.fwd_set), layers in the order
  their first op was made: FLOPs (of the routed share on a dispatch buffer), contraction and
  token-pair FLOPs, softmax work bytes, image ops, and the position and output dims of the
  heaviest op. `batch` is the captured batch (image ops are per sample)."""
  tallies: Dict[str, layer_rules.LayerTally] = {}
  for i, op in enumerate(graph.get_operations()):
    if op not in namer.fwd_set or op.type in _STORAGE:
      continue
    layer = namer.op_layer(op)
    t = tallies.setdefault(layer, layer_rules.LayerTally(layer))
    f = op_flops(op) * routed_share(op, layer, routed)
    # A layer sits in the pipeline where its heaviest op runs (not its first reshape).
    if t.position == math.inf or f > t.heaviest:
      t.position, t.heaviest = i, f
      t.heaviest_dims = _static_dims(op.outputs[0].shape) if op.outputs else None
    t.fwd_flops += f
    # Transient work: attention probabilities, a loss's softmax over the logits (TF's fused
    # cross-entropy reads the logits; otherwise the softmax is spelled out, as under oneDNN).
    if op.type in _SOFTMAX:
      t.work_bytes += (_static_size(op.inputs[0].shape) or 0) * act_dtype_bytes
    sp = op_spatial(op, batch)
    if sp is not None:
      t.spatial.append(sp)
    if kernels.category(op.type) == kernels.LOOP:
      t.contraction_flops += _loop_cost(op, _contraction_flops)
    elif kernels.category(op.type) in (kernels.MATMUL, kernels.CONV):
      t.contraction_flops += f
      if not any(_reads_variable(t_in.op) for t_in in op.inputs):
        t.pair_flops += f  # activation x activation: attention scores / context
  return tallies


def host_inputs(graph: tf.Graph, fwd_set: Set[tf.Operation], host: Set[tf.Operation]
                ) -> Dict[tf.Tensor, tf.Operation]:
  """{input tensor: the first engine op that reads it} for the placeholders and the host
  preprocessing's outputs. Each input crosses the host links once, to its first consumer
  (every op reading it counted it: (x - mean(x)) / std(x) in the model_fn read an image 4
  times)."""
  fed: Dict[tf.Tensor, tf.Operation] = {}
  for op in graph.get_operations():
    if op not in fwd_set or op.type in _STORAGE:
      continue
    for t in op.inputs:
      if (t.op.type == "Placeholder" or t.op in host) and t not in fed:
        fed[t] = op
  return fed


def tally_inputs(inputs: Dict[tf.Tensor, tf.Operation], namer: LayerNamer,
                 tallies: Dict[str, layer_rules.LayerTally]) -> None:
  """Adds each host input's bytes (`host_inputs`) to the tally of the layer that reads it
  first."""
  for t, op in inputs.items():
    tallies[namer.op_layer(op)].io_bytes += _value_bytes([t])


def count_params(trainable, namer: LayerNamer,
                 tallies: Dict[str, layer_rules.LayerTally]) -> None:
  """Adds each trainable variable's size to its scope's layer's tally (new tallies for
  layers with no forward op, in variable order)."""
  for v in trainable:
    layer = namer.layer_of(_scope(v.op.name))
    tallies.setdefault(layer, layer_rules.LayerTally(layer)).params += _static_size(v.shape) or 0


def backward_ops(graph: tf.Graph, fwd_set: Set[tf.Operation],
                 train_op: Optional[tf.Operation] = None) -> List[tf.Operation]:
  """The ops TF's autodiff made (under `gradients*/` or `gradient_tape/`), in graph order;
  with `train_op`, those running it runs. tf.gradients also builds zeros for the outputs of
  a multi-output op that nothing differentiates (each custom gradient's IdentityN: LayerNorm's,
  GELU's), which nothing reads and TensorFlow never runs: they are no layer's work."""
  runs = set(ancestors(train_op)) if train_op is not None else None
  return [op for op in graph.get_operations()
          if op not in fwd_set and _GRAD_PREFIX.match(op.name)
          and (runs is None or op in runs)]


def tally_backward(bwd_ops: List[tf.Operation], namer: LayerNamer, routed: Routed,
                   tallies: Dict[str, layer_rules.LayerTally]) -> None:
  """Adds each backward op's FLOPs (of the routed share) to its layer's tally (`grad_layer`;
  new tallies for layers with no forward op or weights)."""
  for op in bwd_ops:
    layer = namer.grad_layer(op)
    t = tallies.setdefault(layer, layer_rules.LayerTally(layer))
    t.bwd_flops += op_flops(op) * routed_share(op, layer, routed)


def kept_for_backward(bwd_ops: List[tf.Operation], fwd_set: Set[tf.Operation]
                      ) -> Set[tf.Tensor]:
  """The forward values (numbers, not weights) the backward ops read: the host keeps them
  through the step."""
  return {t for op in bwd_ops for t in op.inputs if t.op in fwd_set
          and (t.dtype.is_floating or t.dtype.is_integer or t.dtype == tf.bool)
          and t.op.type not in ("Const", "VarHandleOp", "ReadVariableOp")}


def pipeline_order(tallies: Dict[str, layer_rules.LayerTally]
                   ) -> List[layer_rules.LayerTally]:
  """The layers with forward ops by the position of their heaviest op, then those without
  that carry weights or backward FLOPs (backward ops of unknown origin, e.g. a tape name we
  could not map), in the order they were met; layers with neither are dropped."""
  placed = sorted((t for t in tallies.values() if t.position != math.inf),
                  key=lambda t: t.position)
  return placed + [t for t in tallies.values()
                   if t.position == math.inf and (t.params or t.bwd_flops)]


def handed_activations(fwd: List[tf.Operation], fwd_set: Set[tf.Operation],
                       layer: Callable[[tf.Operation], str], act_dtype_bytes: int
                       ) -> Dict[str, int]:
  """{layer: bytes of the values it hands to other layers} for the whole batch, where
  `layer(op)` names a forward op's layer as folded.

  A pipeline stage keeps, until its backward pass, the values it hands to other stages
  (the layers as folded: a tensor passed inside one is not handed on); its own
  intermediates (GELU pieces, dropout masks, softmax) are fused or recomputed on the
  engine, so counting them would make memory depend on how finely TF spelled the math.
  For the same reason a value is counted once, at the layer that computed it, however
  often it is re-spelled on the way (mixed precision casts x to float32 before each norm
  and the norm's output back; the block's scope holding those casts is a layer of its own
  until folded, so x crossed three boundaries for one norm).
  """
  out: Dict[str, int] = collections.Counter()
  handed = set()
  for op in fwd:
    if op.type in _NOT_ACTIVATIONS:
      continue
    mine = layer(op)
    for t in op.outputs:
      if any(c in fwd_set and layer(c) != mine for c in t.consumers()):
        v = _value_of(t)
        if v.op.type in _NOT_ACTIVATIONS or v in handed:
          continue  # a weight or an input re-spelled, or a value already counted
        handed.add(v)
        out[layer(v.op)] += (_static_size(t.shape) or 0) * act_dtype_bytes
  return out


def batch_norm_layers(graph: tf.Graph, layer_of_scope: Callable[[str], str]) -> Set[str]:
  """The layers that own a moving mean: batch norms of any rank (Keras',
  tf.compat.v1.layers'); `layer_of_scope` names a scope's layer as folded."""
  with graph.as_default():
    return {layer_of_scope(_scope(v.op.name)) for v in tf.compat.v1.global_variables()
            if v.op.name.endswith("/moving_mean")}


def lower(captured: CapturedGraph, name: str, act_dtype_bytes: int = 2,
          weight_dtype_bytes: int = 4, fwd: Optional[List[tf.Operation]] = None,
          seq_len: int = 0, token_lengths: Iterable[int] = ()) -> ir.LayerGraph:
  """Groups the captured graph into layers and costs them per sample.

  Args:
    captured: the traced TRAIN graph.
    name: model name for reports.
    act_dtype_bytes: bytes per activation element on the engine (fp16: 2).
    weight_dtype_bytes: bytes per weight, gradient and optimizer-slot element (fp32 master
      copies: 4).
    fwd: forward ops if already computed.
    seq_len: sequence length for reports, 0 when not a sequence model.
    token_lengths: the static lengths of the token streams (e.g. {80} for source and target
      of 80); default (seq_len,). A layer whose heaviest op's output spans none of them works
      on a fixed number of positions (BERT's masked-LM head on 20 gathered positions, the
      pooler, NSP): its token_scaling is "none", so VTS does not shrink it.
  """
  graph, batch = captured.graph, captured.batch_size
  fwd = forward_ops(captured) if fwd is None else fwd
  host = host_preprocessing(fwd)  # runs before the engine: no layer of it
  fwd = [op for op in fwd if op not in host]
  with graph.as_default():
    trainable = tf.compat.v1.trainable_variables()
  namer = LayerNamer(graph, fwd, trainable)
  routed = routed_layers(fwd, namer.op_layer)
  tallies = tally_forward(graph, namer, routed, batch, act_dtype_bytes)
  inputs = host_inputs(graph, namer.fwd_set, host)
  tally_inputs(inputs, namer, tallies)
  count_params(trainable, namer, tallies)
  bwd = backward_ops(graph, namer.fwd_set, captured.train_op)
  tally_backward(bwd, namer, routed, tallies)
  total = sum(t.fwd_flops for t in tallies.values()) or 1.0
  kept, merged = layer_rules.fold_small(pipeline_order(tallies), total)

  def final(layer: str) -> str:
    return layer_rules.final_name(layer, merged)

  handed = handed_activations(fwd, namer.fwd_set, lambda op: final(namer.op_layer(op)),
                              act_dtype_bytes)
  norms = batch_norm_layers(graph, lambda scope: final(namer.layer_of(scope)))
  for t in kept:
    t.activation_bytes, t.batch_norm = handed.get(t.name, 0), t.name in norms
  opt_name, slots = _slots_per_param(captured)
  lengths = tuple(token_lengths) or ((seq_len,) if seq_len > 0 else ())
  layers = tuple(layer_rules.to_layer(
      t, batch, weight_dtype_bytes, slots,
      layer_rules.token_scaling(t.fwd_flops, t.pair_flops, t.heaviest_dims, batch, lengths))
                 for t in kept)
  values = sum(_static_size(t.shape) or 0 for t in inputs)
  return ir.LayerGraph(
      name=name, layers=layers, captured_batch_size=batch,
      host_preprocessing=host_cost(host, namer.fwd_set, batch),
      dtype_bytes=act_dtype_bytes, optimizer=opt_name, seq_len=seq_len,
      input_value_bytes=_value_bytes(inputs) / values if values else 0.0,
      host_activation_bytes=_value_bytes(kept_for_backward(bwd, namer.fwd_set)) / batch)


def _value_bytes(tensors: Iterable[tf.Tensor]) -> int:
  """Bytes of the tensors' static-shape values (0 for a dynamic shape)."""
  return sum((_static_size(t.shape) or 0) * t.dtype.size for t in tensors)
