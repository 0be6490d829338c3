"""The engine's kernel table: which TF op types the simulated engine can run, and how.

Pure data. `lower.py` consults it for every op on the path from the inputs to the loss; an op
type missing here fails validation with its name, type and the user's source line. Categories
drive FLOP counting and the planner's view of a layer:

  matmul      dense contractions (FLOPs from shapes: 2*M*K*N)
  conv        convolutions
  elementwise one pass over the output (activations, norms, adds, softmax pieces)
  reduction   one pass over the input (sum, mean, max)
  gather      memory movement with no arithmetic (embedding lookups, slicing)
  free        metadata or no-ops on the engine (reshape, identity, shape, constants)
"""

MATMUL = "matmul"
CONV = "conv"
ELEMENTWISE = "elementwise"
REDUCTION = "reduction"
GATHER = "gather"
FREE = "free"

_MATMUL = ("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum",
           "_FusedMatMul")
_CONV = ("Conv2D", "Conv1D", "Conv3D", "DepthwiseConv2dNative", "Conv2DBackpropInput",
         "Conv2DBackpropFilter")
_ELEMENTWISE = (
    "Add", "AddV2", "AddN", "BiasAdd", "Sub", "Mul", "RealDiv", "Div", "DivNoNan", "FloorDiv",
    "FloorMod", "Maximum", "Minimum", "Neg", "Abs", "Sign", "Square", "SquaredDifference",
    "Sqrt", "Rsqrt", "Pow", "Exp", "Log", "Log1p", "Reciprocal", "Tanh", "Sigmoid", "Relu",
    "Relu6", "Elu", "Selu", "LeakyRelu", "Gelu", "Erf", "Erfc", "Softplus", "Softsign",
    "Softmax", "LogSoftmax", "SoftmaxCrossEntropyWithLogits",
    "SparseSoftmaxCrossEntropyWithLogits", "Cast", "Equal", "NotEqual", "Less", "LessEqual",
    "Greater", "GreaterEqual", "LogicalAnd", "LogicalOr", "LogicalNot", "Select", "SelectV2",
    "ClipByValue", "Floor", "Ceil", "Round", "OnesLike", "ZerosLike", "Fill",
    "FusedBatchNormV3", "FusedBatchNorm", "Cos", "Sin", "IsFinite", "StopGradient",
    "PreventGradient", "Dropout", "RandomUniform", "RandomStandardNormal",
    "StatelessRandomUniformV2", "StatelessRandomGetKeyCounter", "TruncatedNormal",
    "OneHot", "ArgMax", "ArgMin", "InTopKV2", "BroadcastTo", "Tile", "CheckNumerics")
_REDUCTION = ("Sum", "Mean", "Max", "Min", "Prod", "All", "Any", "L2Loss", "Cumsum")
_GATHER = ("GatherV2", "Gather", "ResourceGather", "GatherNd", "Slice", "StridedSlice",
           "ConcatV2", "Concat", "Pack", "Unpack", "Split", "SplitV", "Transpose",
           "Pad", "PadV2", "MirrorPad", "ScatterNd", "TensorScatterUpdate",
           "UnsortedSegmentSum", "Reverse", "ReverseV2", "MatrixBandPart", "Range")
_FREE = ("Identity", "IdentityN", "Reshape", "Squeeze", "ExpandDims", "Shape", "ShapeN",
         "Size", "Rank", "Const", "Placeholder", "PlaceholderWithDefault", "NoOp",
         "ReadVariableOp", "VarHandleOp", "VariableV2", "Variable", "Enter", "Exit",
         "BroadcastGradientArgs", "Snapshot", "EnsureShape", "ZerosLike")

KERNELS = {}
for _cat, _types in ((MATMUL, _MATMUL), (CONV, _CONV), (ELEMENTWISE, _ELEMENTWISE),
                     (REDUCTION, _REDUCTION), (GATHER, _GATHER), (FREE, _FREE)):
  for _t in _types:
    KERNELS.setdefault(_t, _cat)

# Op types that are never run on the engine and why (shown in the error).
UNSUPPORTED_REASONS = {
    "PyFunc": "runs Python on the host",
    "EagerPyFunc": "runs Python on the host",
    "PyFuncStateless": "runs Python on the host",
    "Unique": "has a data-dependent output shape",
    "Where": "has a data-dependent output shape",
    "NonMaxSuppressionV3": "has a data-dependent output shape",
    "BooleanMask": "has a data-dependent output shape",
    "Print": "prints on the host",
    "PrintV2": "prints on the host",
}


def category(op_type: str):
  """The kernel category of `op_type`, or None when the engine has no kernel for it."""
  return KERNELS.get(op_type)


def unsupported_reason(op_type: str) -> str:
  if op_type in UNSUPPORTED_REASONS:
    return UNSUPPORTED_REASONS[op_type]
  if op_type.startswith("String") or op_type in ("RegexReplace", "StaticRegexReplace",
                                                 "UnicodeDecode", "AsString", "DecodeRaw"):
    return "works on strings, which the engine does not compute on"
  return "has no kernel on the engine"
