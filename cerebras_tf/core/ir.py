"""The layer-graph IR: what the compiler knows about a model, free of TensorFlow.

`lower.py` turns a captured tf.Graph into a `LayerGraph`; planners and the performance model
read only this. All per-sample quantities are for ONE training sample (the captured batch size
is divided out), so a planner can price any batch size.
"""

import dataclasses
import functools
import hashlib
import json
from typing import Optional, Tuple


@dataclasses.dataclass(frozen=True)
class OpSite:
  """One TF op inside a layer, with where the user wrote it."""

  name: str          # tf op name, e.g. "bert/encoder/layer_0/attention/self/query/MatMul"
  type: str          # tf op type, e.g. "MatMul"
  source: str = ""   # "path/to/model.py:123" of the user frame that created it, if known


@dataclasses.dataclass(frozen=True)
class Spatial:
  """The spatial shape of one image op in a layer (per sample, NHWC), for CNN costs.

  Attributes:
    op: "conv", "depthwise", "maxpool", "avgpool" or "batchnorm".
    in_h, in_w: input height and width; out_h, out_w: output height and width.
    c_in, c_out: input and output channels (equal for depthwise, pooling and batch norm).
    k_h, k_w: kernel (window) height and width (1 for batch norm).
    stride_h, stride_w: strides.
    padding: "SAME" or "VALID".
  """

  op: str
  in_h: int
  in_w: int
  out_h: int
  out_w: int
  c_in: int
  c_out: int
  k_h: int = 1
  k_w: int = 1
  stride_h: int = 1
  stride_w: int = 1
  padding: str = "SAME"


@dataclasses.dataclass(frozen=True)
class Layer:
  """A group of ops under one variable/name scope, in program (topological) order.

  Attributes:
    name: scope that identifies the layer, e.g. "bert/encoder/layer_3/attention".
    kind: coarse category for the planner: "matmul" (dense, attention, embedding lookups as
      gathers count here too), "elementwise" (norms, activations), "loss", "other".
    fwd_flops: forward FLOPs per sample (a multiply-add counts 2).
    bwd_flops: backward FLOPs per sample (about 2x forward for matmuls).
    num_params: trainable scalars owned by the layer.
    weight_bytes: bytes of the layer's trainable weights (params * dtype size).
    grad_bytes: bytes of the gradients of those weights.
    optimizer_bytes: bytes of optimizer state for those weights (Adam: 2 slots).
    activation_bytes: bytes of activations per sample that must be kept from forward until
      backward (the layer's output tensors).
    io_bytes: bytes per sample that enter the model here from the host (input features);
      non-zero only for layers that consume the input_fn's features.
    ops: the layer's ops with their source locations.
    token_scaling: how the layer's work grows with the real (unpadded) tokens of a sample,
      for variable tensor shape (VTS): "linear" (position-wise: dense, norms, embeddings),
      "quadratic" (token-pair work: attention scores and context), "none" (per-sequence:
      pooler, classifier, the loss over a fixed number of predictions).
    pair_share: share of the forward FLOPs that is token-pair work (activation x activation
      matmuls: attention scores and context), which grows with the square of the real
      tokens; the rest of a "linear" layer grows linearly. A dense layer that absorbed a small
      attention core is mixed: VTS scales it by (1 - q) token_fraction + q token_sq_fraction.
      0 with token_scaling "quadratic" means the whole layer is token-pair work.
    work_bytes: bytes per sample the layer needs only while it runs, beyond what it hands on
      (attention's probabilities, heads x s x s): not kept for backward, but the largest
      layer's working set of one micro-batch must fit the wafer in weight streaming. 0: not
      known (the performance model then estimates it for token-pair layers).
    spatial: the layer's image ops with their shapes (convolutions, pooling, batch norm), for
      the engine's CNN costs (tiling, halo exchange, norm reductions: engine/conv.py); empty
      for layers without them.
    batch_norm: the layer normalizes with statistics over its replica's samples (a batch
      norm on any rank: a dense feature's as well as an image's, which `spatial` also costs).
  """

  name: str
  kind: str
  fwd_flops: float
  bwd_flops: float
  num_params: int
  weight_bytes: int
  grad_bytes: int
  optimizer_bytes: int
  activation_bytes: float
  io_bytes: float = 0.0
  ops: Tuple[OpSite, ...] = ()
  token_scaling: str = "linear"
  pair_share: float = 0.0
  work_bytes: float = 0.0
  spatial: Tuple[Spatial, ...] = ()
  batch_norm: bool = False

  @property
  def flops(self) -> float:
    """Forward + backward FLOPs per sample."""
    return self.fwd_flops + self.bwd_flops

  @property
  def state_bytes(self) -> int:
    """Bytes that live for the whole run: weights, gradients and optimizer state."""
    return self.weight_bytes + self.grad_bytes + self.optimizer_bytes

  @property
  def has_batch_norm(self) -> bool:
    """Whether the layer normalizes with its replica's batch statistics (flagged by the
    lowering, or a batch-norm image op)."""
    return self.batch_norm or any(s.op == "batchnorm" for s in self.spatial)

  def to_dict(self) -> dict:
    d = dataclasses.asdict(self)
    d["ops"] = [dataclasses.asdict(o) for o in self.ops]
    if not self.batch_norm:  # fingerprints of graphs without one stay as they were
      del d["batch_norm"]
    return d

  @classmethod
  def from_dict(cls, d: dict) -> "Layer":
    d = dict(d)
    d["ops"] = tuple(OpSite(**o) for o in d.get("ops", ()))
    d["spatial"] = tuple(Spatial(**s) for s in d.get("spatial", ()))
    return cls(**d)


@dataclasses.dataclass(frozen=True)
class HostPreprocessing:
  """The part of a traced graph the host runs before the engine (feature columns' lookups):
  it depends only on the input features and reads no variable.

  Attributes:
    num_ops: its op count (constants aside).
    op_types: the op types that put it there (no engine kernel), most frequent first.
    read_bytes: bytes per sample of the raw features it reads (a string counts 8).
    sent_bytes: bytes per sample of the static tensors it hands the engine.
    sparse_tensors: tensors it hands the engine whose size the data decides (sparse ids).
    features: the input placeholders it reads.
  """

  num_ops: int
  op_types: Tuple[str, ...]
  read_bytes: float
  sent_bytes: float
  sparse_tensors: int = 0
  features: Tuple[str, ...] = ()

  @classmethod
  def from_dict(cls, d: dict) -> "HostPreprocessing":
    return cls(**{**d, "op_types": tuple(d["op_types"]), "features": tuple(d["features"])})


@dataclasses.dataclass(frozen=True)
class LayerGraph:
  """A model as an ordered chain of layers (neighbours in the list are neighbours on chip).

  Attributes:
    name: model name for reports.
    layers: layers in program order.
    captured_batch_size: batch size of the traced graph (per-sample values are divided by it).
    dtype_bytes: bytes per element of the compute dtype (2 for fp16/bf16, 4 for fp32).
    optimizer: optimizer name, e.g. "adam", "sgd", "momentum".
    seq_len: sequence length when the model is a sequence model (for reports / VTS), else 0.
    input_value_bytes: mean bytes per value of what the host sends (the input_fn's dtypes:
      4 for float32 pixels, 1 for uint8 ones); 0 when not known (analytic graphs).
    host_activation_bytes: bytes per sample the host's TensorFlow keeps from the forward pass
      for the gradient (forward tensors that gradient ops read, at their traced dtypes): a
      lower bound on the host's activation memory while it trains; 0 when not known.
  """

  name: str
  layers: Tuple[Layer, ...]
  captured_batch_size: int
  dtype_bytes: int = 2
  optimizer: str = "adam"
  seq_len: int = 0
  input_value_bytes: float = 0.0
  host_activation_bytes: float = 0.0
  host_preprocessing: Optional[HostPreprocessing] = None

  @property
  def num_params(self) -> int:
    return sum(l.num_params for l in self.layers)

  @property
  def flops_per_sample(self) -> float:
    return sum(l.flops for l in self.layers)

  @property
  def state_bytes(self) -> int:
    return sum(l.state_bytes for l in self.layers)

  @property
  def batch_norm_layers(self) -> Tuple[str, ...]:
    """Layers holding a batch norm (their statistics come from a replica's samples)."""
    return tuple(self.layers[i].name for i in self.batch_norm_indices)

  @functools.cached_property
  def batch_norm_indices(self) -> Tuple[int, ...]:
    """Indices of the layers holding a batch norm (once per graph: the planners' searches ask
    for them at every candidate; the graph is immutable)."""
    return tuple(i for i, l in enumerate(self.layers) if l.has_batch_norm)

  def layer(self, name: str) -> Layer:
    for l in self.layers:
      if l.name == name:
        return l
    raise KeyError(name)

  def to_dict(self) -> dict:
    d = {
        "name": self.name,
        "captured_batch_size": self.captured_batch_size,
        "dtype_bytes": self.dtype_bytes,
        "optimizer": self.optimizer,
        "seq_len": self.seq_len,
        "layers": [l.to_dict() for l in self.layers],
    }
    # Traced graphs only: analytic fingerprints stay as they were.
    for key in ("input_value_bytes", "host_activation_bytes"):
      if getattr(self, key):
        d[key] = getattr(self, key)
    if self.host_preprocessing is not None:
      d["host_preprocessing"] = dataclasses.asdict(self.host_preprocessing)
    return d

  @classmethod
  def from_dict(cls, d: dict) -> "LayerGraph":
    d = dict(d)
    d["layers"] = tuple(Layer.from_dict(l) for l in d["layers"])
    if d.get("host_preprocessing") is not None:
      d["host_preprocessing"] = HostPreprocessing.from_dict(d["host_preprocessing"])
    return cls(**d)

  def fingerprint(self) -> str:
    """A stable hash of everything a planner reads (used as part of the compile-cache key)."""
    blob = json.dumps(self.to_dict(), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
