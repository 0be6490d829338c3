"""How a layer's counts become an `ir.Layer`: the record, the fold, the kind, token scaling.

Shared by `compiler/lower.py` (which counts a traced graph's ops into these records) and
`analysis/analytic.py` (which writes them from hand formulas), so a traced graph and an
analytic one are priced by the same rules. No TensorFlow here.
"""

import dataclasses
import math
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from cerebras_tf.core import ir

# Layers with no weights and less than this share of the forward FLOPs are folded into their
# predecessor: a residual add or a reshape is not worth its own region of the wafer.
FOLD_FLOPS_SHARE = 0.01
# Optimizer slots per parameter, by a (lower-case) piece of the optimizer's name, first match
# wins: TF's class and op names ("AdamOptimizer", "ResourceApplyGradientDescent", "LAMB").
OPTIMIZER_SLOTS = (("adam", 2), ("lamb", 2), ("adagrad", 1), ("momentum", 1), ("rmsprop", 2),
                   ("ftrl", 2), ("gradientdescent", 0))
# Short names (params files, analytic graphs) for optimizers whose TF names say otherwise.
OPTIMIZER_ALIASES = {"sgd": "gradientdescent"}


@dataclasses.dataclass
class LayerTally:
  """What one layer's ops add up to, for the whole captured batch (divided by it at the end).

  Attributes:
    name: the layer's name (its variable scope, or the op and line of a root-level one).
    position: where it sits in the pipeline: the graph index of its heaviest forward op
      (inf: none seen yet).
    heaviest: that op's FLOPs (-1: none seen yet).
    heaviest_dims: that op's output dims when static, else None (token_scaling reads them).
    fwd_flops, bwd_flops: forward and backward FLOPs.
    contraction_flops: the forward FLOPs of its matmuls and convolutions (loop bodies' too).
    pair_flops: the part of those that multiplies two activations (attention scores/context).
    activation_bytes: the values it hands to other layers.
    work_bytes: transient values it needs while it runs (a softmax's scores).
    io_bytes: the host input it reads.
    params: trainable parameters (not folded: a folded layer has none).
    spatial: its image ops' shapes (engine/conv.py costs them).
    batch_norm: it owns a moving mean.
  """

  name: str
  position: float = math.inf
  heaviest: float = -1.0
  heaviest_dims: Optional[Tuple[int, ...]] = None
  fwd_flops: float = 0.0
  bwd_flops: float = 0.0
  contraction_flops: float = 0.0
  pair_flops: float = 0.0
  activation_bytes: float = 0.0
  work_bytes: float = 0.0
  io_bytes: float = 0.0
  params: int = 0
  spatial: List[ir.Spatial] = dataclasses.field(default_factory=list)
  batch_norm: bool = False

  def absorb(self, other: "LayerTally") -> None:
    """Adds a folded layer's counts to this one (its image ops run in this layer's region)."""
    for f in ("fwd_flops", "bwd_flops", "contraction_flops", "pair_flops", "activation_bytes",
              "work_bytes", "io_bytes"):
      setattr(self, f, getattr(self, f) + getattr(other, f))
    self.spatial = self.spatial + other.spatial


def foldable(t: LayerTally, total_fwd_flops: float) -> bool:
  """A weightless layer with less than FOLD_FLOPS_SHARE of the forward FLOPs."""
  return not t.params and t.fwd_flops < FOLD_FLOPS_SHARE * total_fwd_flops


def fold_small(tallies: Sequence[LayerTally], total_fwd_flops: float,
               before_fold: Optional[Callable[[LayerTally, LayerTally], None]] = None
               ) -> Tuple[List[LayerTally], Dict[str, str]]:
  """Folds `foldable` layers into the layer before them (the first one into the next).

  Takes the tallies in pipeline order and the forward FLOPs of all of them; returns (the
  tallies kept, in order, with the folded ones' counts added; {folded name: name it went
  into}). `before_fold(into, folded)` runs before each fold. A small model's attention core
  (scores, softmax, context: no weights) usually folds into its value projection; its
  token-pair FLOPs go with it, so VTS still sees them.
  """
  out: List[LayerTally] = []
  merged: Dict[str, str] = {}

  def fold(src: LayerTally, dst: LayerTally) -> None:
    if before_fold is not None:
      before_fold(dst, src)
    merged[src.name] = dst.name
    dst.absorb(src)

  for t in tallies:
    if out and foldable(t, total_fwd_flops):
      fold(t, out[-1])
      continue
    out.append(t)
  # A tiny weightless first layer (e.g. input casts) folds into its successor instead.
  if len(out) > 1 and foldable(out[0], total_fwd_flops):
    fold(out.pop(0), out[0])
  return out, merged


def final_name(name: str, merged: Dict[str, str]) -> str:
  """The layer `name` ended up in after fold_small (itself when it was kept)."""
  while name in merged:
    name = merged[name]
  return name


def layer_kind(name: str, fwd_flops: float, contraction_flops: float) -> str:
  """"loss" by name, "matmul" when contractions are at least half the forward FLOPs,
  "elementwise" when it computes anything else, "other" when it computes nothing."""
  if "loss" in name.lower() or "crossentropy" in name.lower():
    return "loss"
  if fwd_flops and contraction_flops >= 0.5 * fwd_flops:
    return "matmul"
  return "elementwise" if fwd_flops else "other"


def token_scaling(fwd_flops: float, pair_flops: float, dims: Optional[Sequence[int]],
                  batch: int, lengths: Sequence[int]) -> str:
  """"quadratic" (mostly token-pair FLOPs), "none" (works on fixed positions) or "linear".

  `dims`: the static output dims of the layer's heaviest op (None: unknown). "none" when they
  span no token stream: neither [batch * L, ...] (a flattened dense layer) nor
  [batch, ..., L, ...] / [batch, L] for any L in `lengths` (e.g. [B * 20, H] gathered
  masked-LM positions, [B, 2] NSP logits). Unknown dims, and [B, H] with H equal to a length,
  count as "linear".
  """
  if fwd_flops and pair_flops > 0.5 * fwd_flops:
    return "quadratic"
  if not fwd_flops or not lengths or not dims:
    return "linear"
  inner = dims[1:-1] if len(dims) > 2 else dims[1:]  # the last of 3+ dims is features
  spans = any(dims[0] == batch * l or (dims[0] == batch and l in inner) for l in lengths)
  return "linear" if spans else "none"


def optimizer_slots(names: Sequence[str]) -> Optional[Tuple[str, int]]:
  """(optimizer name, slots per parameter) of the first OPTIMIZER_SLOTS entry found in any of
  `names` (case-insensitive; OPTIMIZER_ALIASES read as what they stand for), or None."""
  names = [OPTIMIZER_ALIASES.get(n.lower(), n).lower() for n in names]
  for piece, slots in OPTIMIZER_SLOTS:
    if any(piece in n for n in names):
      return piece, slots
  return None


def to_layer(t: LayerTally, batch: int, weight_dtype_bytes: int, slots: int,
             scaling: str) -> ir.Layer:
  """The tally of a whole batch as an ir.Layer per sample: weights, gradients and each of the
  optimizer's `slots` take `weight_dtype_bytes` per parameter; `scaling` is its
  token_scaling. pair_share is the token-pair share of the forward FLOPs."""
  p = int(t.params)
  wb = p * weight_dtype_bytes
  return ir.Layer(
      name=t.name, kind=layer_kind(t.name, t.fwd_flops, t.contraction_flops),
      fwd_flops=t.fwd_flops / batch, bwd_flops=t.bwd_flops / batch, num_params=p,
      weight_bytes=wb, grad_bytes=wb, optimizer_bytes=wb * slots,
      activation_bytes=t.activation_bytes / batch, io_bytes=t.io_bytes / batch,
      token_scaling=scaling,
      pair_share=min(1.0, t.pair_flops / t.fwd_flops) if t.fwd_flops else 0.0,
      work_bytes=t.work_bytes / batch, spatial=tuple(t.spatial), batch_norm=t.batch_norm)
