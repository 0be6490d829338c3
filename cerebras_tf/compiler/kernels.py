"""The engine's kernel table: which TF op types the simulated engine can run, and at what cost.

Pure data. `lower.py` consults it for every op on the path from the inputs to the loss; an op
type missing here fails validation with its name, type and the user's source line. On the
gradient and update path only `never_on_engine` types fail (host Python, printing, strings,
TPU collectives); the optimizer's own ops there are costed by its model, not this table.
Each op type has a category (how the planner sees it), a FLOP form (how `lower.op_flops` counts it from
static shapes) and the layers it implements; `docs/kernels.md` is generated from this table
(`scripts/kernel_doc.py`), and a test keeps the two equal.

Categories:
  matmul      dense contractions
  conv        convolutions (and their transposes)
  window      pooling: one pass over each output's window
  norm        batch/layer normalization
  elementwise one pass over the output (activations, adds, softmax pieces)
  reduction   one pass over the input (sum, mean, max: global pooling, losses)
  gather      memory movement with no arithmetic (embedding lookups, slicing, concat, resize)
  loop        a While loop (Keras LSTM/GRU): its body's cost times its static trip count;
              a tf.function call: its body's cost once
  free        metadata or no-ops on the engine (reshape, identity, shape, constants)

Memory: every kernel but the free ones reads its inputs and writes its outputs once
(`lower.op_bytes`: (sum n(inputs) + sum n(outputs)) x element size); a loop moves its body's
bytes once per iteration.
"""

import dataclasses
from typing import Dict, Tuple

MATMUL = "matmul"
CONV = "conv"
WINDOW = "window"
NORM = "norm"
ELEMENTWISE = "elementwise"
REDUCTION = "reduction"
GATHER = "gather"
LOOP = "loop"
FREE = "free"
CATEGORIES = (MATMUL, CONV, WINDOW, NORM, ELEMENTWISE, REDUCTION, GATHER, LOOP, FREE)

# FLOP forms: name -> the formula `lower.op_flops` implements for it. n(t) is a tensor's
# element count; dy is an op's incoming gradient; a multiply-add counts 2.
FORMS: Dict[str, str] = {
    "zero": "0",
    "out": "k x n(out)",
    "in": "n(in)",
    "matmul": "2 x n(out) x K (K: the contracted dimension)",
    "einsum": "2 x product of every index size (1 x for one operand)",
    "conv": "2 x n(out) x prod(filter[:-1]) (kh x kw x cin; 3D: kd x kh x kw x cin)",
    "conv_grad": "2 x n(dy) x prod(filter[:-1])",
    "depthwise": "2 x n(out) x kh x kw",
    "depthwise_grad": "2 x n(dy) x kh x kw",
    "window": "k x n(out) x prod(ksize)",
    "window_grad": "k x n(dy) x prod(ksize)",
    "norm": "k x n(x)",
    "logits": "k x n(logits)",
    "loop": "trip count x sum(body ops' FLOPs) (a call: 1 x)",
}
MEMORY_FORM = "(sum n(inputs) + sum n(outputs)) x element size"
LOOP_MEMORY_FORM = "trip count x sum(body ops' bytes)"


@dataclasses.dataclass(frozen=True)
class Kernel:
  """How the engine runs one TF op type.

  Attributes:
    category: one of CATEGORIES.
    form: key of FORMS: how FLOPs are counted.
    k: the per-element factor of the forms that have one ("out", "window", "norm").
    layers: the layers (Keras or tf) that emit the op, for docs/kernels.md.
    why: the arithmetic behind k, when k is not 1.
  """

  category: str
  form: str
  k: float = 1.0
  layers: str = ""
  why: str = ""

  def flops_formula(self) -> str:
    f = FORMS[self.form]
    if f.startswith("k x "):
      f = ("" if self.k == 1 else f"{self.k:g} x ") + f[4:]
    return f

  def memory_formula(self) -> str:
    if self.category == FREE:
      return "0"
    return LOOP_MEMORY_FORM if self.category == LOOP else MEMORY_FORM


def _table() -> Dict[str, Kernel]:
  t: Dict[str, Kernel] = {}

  def add(types: Tuple[str, ...], category: str, form: str, k: float = 1.0, layers: str = "",
          why: str = ""):
    for ty in types:
      t.setdefault(ty, Kernel(category, form, k, layers, why))

  add(("MatMul", "_FusedMatMul"), MATMUL, "matmul", layers="Dense, RNN cells (unrolled)")
  add(("BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"), MATMUL, "matmul",
      layers="attention scores and context; Dense on 3D input")
  add(("Einsum",), MATMUL, "einsum", layers="EinsumDense, MultiHeadAttention")
  add(("Conv2D",), CONV, "conv",
      layers="Conv2D, Conv1D (as Conv2D on [B, 1, W, C]), SeparableConv2D's pointwise step")
  add(("Conv3D",), CONV, "conv", layers="Conv3D")
  add(("Conv2DBackpropInput",), CONV, "conv_grad",
      layers="Conv2DTranspose (forward), Conv2D's input gradient")
  add(("Conv3DBackpropInputV2",), CONV, "conv_grad",
      layers="Conv3DTranspose (forward), Conv3D's input gradient")
  add(("Conv2DBackpropFilter", "Conv3DBackpropFilterV2"), CONV, "conv_grad",
      layers="convolution filter gradients")
  add(("DepthwiseConv2dNative",), CONV, "depthwise",
      layers="DepthwiseConv2D, SeparableConv2D's depthwise step")
  add(("DepthwiseConv2dNativeBackpropInput", "DepthwiseConv2dNativeBackpropFilter"), CONV,
      "depthwise_grad", layers="depthwise convolution gradients")
  add(("MaxPool", "MaxPool3D"), WINDOW, "window",
      layers="MaxPool1D/2D/3D (1D as 2D on [B, 1, W, C])", why="one compare per element")
  add(("AvgPool", "AvgPool3D"), WINDOW, "window",
      layers="AveragePooling1D/2D/3D", why="one add per element (the divide is folded)")
  add(("MaxPoolGrad", "MaxPool3DGrad", "MaxPoolGradV2"), WINDOW, "window_grad", 2.0,
      layers="max pooling gradient", why="find the max, then route dy to it")
  add(("AvgPoolGrad", "AvgPool3DGrad"), WINDOW, "window_grad",
      layers="average pooling gradient", why="spread dy / window over the window")
  add(("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3"), NORM, "norm", 8.0,
      layers="BatchNormalization (fused), LayerNormalization (TF 2.15 Keras emits it)",
      why="training: mean 1, variance 3, normalize 2, scale and shift 2; inference "
          "(is_training false) folds to x * a + b: 2")
  add(("FusedBatchNormGrad", "FusedBatchNormGradV2", "FusedBatchNormGradV3"), NORM, "norm", 9.0,
      layers="batch/layer normalization gradient",
      why="dbeta 1, dgamma 2, x-hat 2, dx 4 per element")
  add(("Softmax", "LogSoftmax"), ELEMENTWISE, "out", 5.0, layers="Softmax, attention",
      why="max, subtract, exp, sum, divide (or log)")
  add(("SoftmaxCrossEntropyWithLogits", "SparseSoftmaxCrossEntropyWithLogits"), ELEMENTWISE,
      "logits", 6.0, layers="(Sparse)CategoricalCrossentropy(from_logits=True)",
      why="softmax 5, the log-likelihood and its gradient 1 per logit")
  add(("ResizeBilinear",), GATHER, "out", 8.0, layers="UpSampling2D(interpolation='bilinear')",
      why="four multiply-adds per output")
  add(("ResizeBilinearGrad",), GATHER, "out", 8.0, layers="bilinear upsampling gradient",
      why="four multiply-adds per input element")
  add(("ResizeNearestNeighbor", "ResizeNearestNeighborGrad"), GATHER, "zero",
      layers="UpSampling2D (nearest), its gradient (a window sum, counted free)")
  add(("Add", "AddV2", "AddN", "BiasAdd", "Sub", "Mul", "RealDiv", "Div", "DivNoNan"),
      ELEMENTWISE, "out", layers="residual adds (Add), bias, scaling, Multiply, Rescaling")
  add(("FloorDiv", "FloorMod", "Maximum", "Minimum", "Neg", "Abs", "Sign", "Square",
       "SquaredDifference", "Sqrt", "Rsqrt", "Pow", "Exp", "Log", "Log1p", "Reciprocal",
       "Cos", "Sin", "Floor", "Ceil", "Round", "ClipByValue", "Mod", "TruncateMod",
       "TruncateDiv", "Xlogy", "Xdivy", "Xlog1py", "Atan2", "Atan", "Tan", "Sinh", "Cosh",
       "Expm1"), ELEMENTWISE, "out",
      layers="elementwise math, unfused normalization, losses")
  add(("Tanh", "Sigmoid", "Relu", "Relu6", "Elu", "Selu", "LeakyRelu", "Gelu", "Erf", "Erfc",
       "Softplus", "Softsign", "Swish"), ELEMENTWISE, "out",
      layers="activations (swish/silu is Sigmoid x Mul)")
  add(("TanhGrad", "SigmoidGrad", "ReluGrad", "Relu6Grad", "EluGrad", "SeluGrad",
       "LeakyReluGrad", "SoftplusGrad", "SqrtGrad", "RsqrtGrad"), ELEMENTWISE,
      "out", layers="activation gradients")
  add(("BiasAddGrad",), REDUCTION, "in", layers="bias gradient (a sum of dy over the batch)")
  add(("Cast", "Equal", "NotEqual", "Less", "LessEqual", "Greater", "GreaterEqual",
       "LogicalAnd", "LogicalOr", "LogicalNot", "Select", "SelectV2", "OnesLike", "Fill",
       "IsFinite", "IsNan", "IsInf", "StopGradient", "PreventGradient", "Dropout", "RandomUniform",
       "RandomUniformInt", "RandomStandardNormal", "StatelessRandomUniformV2",
       "StatelessRandomUniformFullIntV2", "StatelessRandomGetKeyCounter",
       "StatelessRandomGetKeyCounterAlg", "TruncatedNormal", "OneHot", "ArgMax", "ArgMin",
       "InTopKV2", "BroadcastTo", "Tile", "CheckNumerics", "ZerosLike"), ELEMENTWISE, "out",
      layers="casts, masks, Dropout, comparisons")
  add(("Sum", "Mean", "Max", "Min", "Prod", "All", "Any", "L2Loss", "Cumsum", "Cumprod"), REDUCTION, "in",
      layers="GlobalAveragePooling (Mean), GlobalMaxPooling (Max), losses, unfused "
             "BatchNormalization/LayerNormalization moments")
  add(("TopKV2", "TopK"), REDUCTION, "in",
      layers="tf.math.top_k: a mixture-of-experts router's choice of experts",
      why="one pass over each row keeping the k largest")
  add(("SparseSegmentMean", "SparseSegmentSum", "SparseSegmentSqrtN"), REDUCTION, "in",
      layers="feature columns' embedding_column and linear_model: the combiner over each "
             "example's looked-up rows (ids made on the host; rows as many as the data brings, "
             "counted 0 when the compile cannot know them)")
  add(("GatherV2", "Gather", "ResourceGather", "GatherNd"), GATHER, "zero", layers="Embedding")
  add(("ResourceScatterAdd", "UnsortedSegmentSum", "ScatterNd", "TensorScatterUpdate",
       "TensorScatterAdd", "SegmentSum"), GATHER, "zero",
      layers="embedding gradients; a router's dispatch of tokens to expert slots and combine")
  add(("ConcatV2", "Concat"), GATHER, "zero", layers="Concatenate (U-Net skips)")
  add(("Slice", "StridedSlice", "StridedSliceGrad", "Pack", "Unpack", "Split", "SplitV",
       "Transpose", "Pad", "PadV2", "MirrorPad", "Reverse", "ReverseV2", "MatrixBandPart",
       "Range", "SpaceToBatchND", "BatchToSpaceND", "SpaceToDepth", "DepthToSpace"), GATHER,
      "zero", layers="slicing, ZeroPadding, Permute; dilated convs (space-to-batch)")
  add(("TensorListFromTensor", "TensorListReserve", "TensorListStack", "EmptyTensorList",
       "TensorListGetItem", "TensorListSetItem", "TensorListPushBack", "TensorListPopBack",
       "TensorListLength", "TensorListElementShape"), GATHER, "zero",
      layers="the sequence buffers of a While-form LSTM/GRU")
  add(("While", "StatelessWhile"), LOOP, "loop",
      layers="LSTM, GRU, SimpleRNN (Keras's default: a While loop over the time steps)")
  add(("PartitionedCall", "StatefulPartitionedCall"), LOOP, "loop",
      layers="a @tf.function called from the model_fn (its body, once) and its gradient")
  add(("Identity", "IdentityN", "Reshape", "Squeeze", "ExpandDims", "Shape", "ShapeN", "Size",
       "Rank", "Const", "Placeholder", "PlaceholderWithDefault", "NoOp", "ReadVariableOp",
       "VarHandleOp", "VariableV2", "Variable", "Enter", "Exit", "BroadcastGradientArgs",
       "Snapshot", "EnsureShape", "Bitcast"), FREE, "zero",
      layers="Flatten, Reshape, Input, variables")
  return t


KERNELS: Dict[str, Kernel] = _table()

PARTITIONED = ("has a data-dependent output shape; TF emits it to look up a variable made with "
                "partitioner=..., a host-side sharding the engine does not need (it holds "
                "whole tables): create the variable without a partitioner")
_TPU = "is a TPU collective; the engine's replicas need none (the framework sums gradients)"
# Collectives a model_fn written for TPUEstimator emits; no CPU or engine kernel exists.
TPU_OPS = ("CrossReplicaSum", "AllToAll", "CollectivePermute")
# Op types that are never run on the engine and why (shown in the error).
UNSUPPORTED_REASONS = {
    **{op_type: _TPU for op_type in TPU_OPS},
    "PyFunc": "runs Python on the host",
    "EagerPyFunc": "runs Python on the host",
    "PyFuncStateless": "runs Python on the host",
    "Unique": "has a data-dependent output shape",
    "Where": "has a data-dependent output shape",
    "NonMaxSuppressionV3": "has a data-dependent output shape",
    "BooleanMask": "has a data-dependent output shape",
    "Print": "prints on the host",
    "PrintV2": "prints on the host",
    "CudnnRNN": "is a cuDNN-only kernel; build the LSTM/GRU without cuDNN (TF 2.15 on CPU emits "
                "a While loop, which the engine runs)",
    "CudnnRNNV3": "is a cuDNN-only kernel; build the LSTM/GRU without cuDNN",
    # A lookup into a variable made with get_variable(partitioner=...) splits the ids.
    "DynamicPartition": PARTITIONED,
    "DynamicStitch": PARTITIONED,
    "ParallelDynamicStitch": PARTITIONED,
}


def never_on_engine(op_type: str) -> bool:
  """Op types no part of a training step can run on the engine, the gradient and update path
  included: host Python, printing, strings, TPU collectives. (A data-dependent shape, such as
  the sparse-gradient dedupe's Unique, is the optimizer's to handle, not the model's.)"""
  return (op_type in TPU_OPS or op_type.startswith("String")
          or UNSUPPORTED_REASONS.get(op_type) in ("runs Python on the host", "prints on the host"))


def kernel(op_type: str):
  """The Kernel for `op_type`, or None when the engine has none."""
  return KERNELS.get(op_type)


def category(op_type: str):
  """The kernel category of `op_type`, or None when the engine has no kernel for it."""
  k = KERNELS.get(op_type)
  return k.category if k else None


def unsupported_reason(op_type: str) -> str:
  if op_type in UNSUPPORTED_REASONS:
    return UNSUPPORTED_REASONS[op_type]
  if op_type.startswith("String") or op_type in ("RegexReplace", "StaticRegexReplace",
                                                 "UnicodeDecode", "AsString", "DecodeRaw"):
    return "works on strings, which the engine does not compute on"
  return "has no kernel on the engine"
