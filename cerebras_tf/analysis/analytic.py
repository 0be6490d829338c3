"""Analytic LayerGraphs for model shapes, from hand formulas (no TensorFlow).

Used by tests, benchmarks, the fidelity table and calibration: they give the planners a graph
of a published model's shape without tracing it. The graphs follow what `compiler/lower.py`
produces for the reference models, so an analytic graph and a traced one price alike; the
rules both apply (the per-layer record, the fold, the kind, token scaling and pair_share,
optimizer slots) are one copy, `compiler/layer_rules.py`, and what follows is what the hand
formulas add to them:

  * one layer per variable scope (query, key, value, attention output, each norm, each FFN
    matrix...), named as the reference models name their scopes;
  * the attention core (scores, softmax, context: no weights) is its own layer, folded into
    the layer before it (the value projection) when it has less than 1% of the forward FLOPs,
    with its token-pair FLOPs kept as `pair_share` - `layer_rules.fold_small`;
  * `activation_bytes` is lower.py's rule: the values a layer hands to other layers, per
    sample (an output projection hands on x + its output, the residual sum, not the output
    itself, which nothing else reads; a layer's own intermediates - softmax
    probabilities, GELU pieces - are not kept; the loss hands on a scalar; a layer folded
    into the one before it that reads only its output - the attention core after the value
    projection, the loss after the logits - takes that output inside). Attention
    probabilities (heads x s x s) are the core's `work_bytes`, a softmax cross-entropy's
    logits the loss's: needed while it runs, not kept.

Conventions (per ONE sample; s = sequence length, h = hidden, f = ffn size, n = heads,
kv = K/V heads, d = head size, a = n * d the attention width):
  * a dense [s, x] x [x, y] costs 2*s*x*y FLOPs forward (a multiply-add counts 2);
  * backward costs 2x forward for matmuls (input gradient + weight gradient) and 1x forward
    for elementwise work (norms, softmax, activations);
  * elementwise: layer norm 8 FLOPs/element, RMSNorm 5, softmax 5, GELU 8, SiLU 5, residual
    add 1, rotary 3 per rotated element, relative-position bias add 1 per score;
  * weights, gradients and each optimizer slot are `weight_dtype_bytes` per parameter
    (fp32 master weights by default, like `lower.py`); Adam has 2 slots, momentum 1, sgd 0;
  * activations in `dtype_bytes` (fp16/bf16: 2);
  * host input (io_bytes) is int32 per token id / segment / mask, fp16 per pixel.

The shape (`Shape`) covers what published runs use: grouped K/V heads (GQA: kv_heads < heads),
an attention width other than hidden (head_dim), gated FFNs (SwiGLU / GeGLU: three matrices),
RMSNorm, rotary / learned / fixed / relative (T5 bias) / no positions, biases on or off,
GPT-J's parallel attention, tied or untied LM heads; encoders with BERT's MLM + NSP heads, MLM
only (ESM-2: no NSP, no segment embeddings), a classifier (ViT), or DiT's adaLN blocks.
"""

import contextlib
import dataclasses
from typing import List, Optional, Sequence

from cerebras_tf.compiler import layer_rules
from cerebras_tf.core import ir
from cerebras_tf.errors import ParamsError

_LN = 8.0       # FLOPs per element of a layer norm (mean, var, normalize, scale, shift)
_RMS = 5.0      # RMSNorm: square, mean, rsqrt, normalize, scale
_SOFTMAX = 5.0  # FLOPs per element of a softmax
_GELU = 8.0     # tanh-approximated GELU
_SILU = 5.0     # x * sigmoid(x)
_ROTARY = 3.0   # per rotated element: x*cos + rot(x)*sin
_INT32 = 4

_OPTIMIZERS = ("adam", "adamw", "lamb", "momentum", "sgd")  # the names the params files use
FFN_TYPES = ("gelu", "relu", "swiglu", "geglu")
NORMS = ("layernorm", "rmsnorm")
POSITIONS = ("learned", "rotary", "fixed", "relative", "alibi", "none")


@dataclasses.dataclass(frozen=True)
class Shape:
  """A transformer stack's shape.

  Attributes:
    layers, hidden, heads, ffn, seq, vocab: the usual.
    kv_heads: K/V heads (grouped-query attention); None = heads.
    head_dim: size of each head; None = hidden / heads. heads * head_dim is the attention
      width, which may differ from hidden (T5-11B: 128 heads x 128 = 16384 on hidden 1024).
    ffn_type: "gelu" | "relu" (two matrices) or "swiglu" | "geglu" (gated: three).
    norm: "layernorm" | "rmsnorm".
    position: "learned" (a table of max_position x hidden), "rotary" (rotary_dim per head),
      "fixed" (sinusoidal), "relative" (T5: buckets x heads bias added to every score),
      "alibi", "none".
    rotary_dim: rotated features per head (None: the whole head).
    relative_buckets: T5's relative-attention buckets.
    max_position: rows of a learned position table (None: seq).
    bias: dense layers have biases (LLaMA and T5 do not).
    parallel_attention: GPT-J: attention and FFN both read one norm of x, one residual sum.
    tied_embeddings: the output projection reuses the word embeddings.
    pre_norm: norm before each sub-layer (GPT, LLaMA, ViT) or after the residual (BERT).
    final_norm: a norm after the last block (pre-norm stacks).
  """

  layers: int
  hidden: int
  heads: int
  ffn: int
  seq: int
  vocab: int = 0
  kv_heads: Optional[int] = None
  head_dim: Optional[int] = None
  ffn_type: str = "gelu"
  norm: str = "layernorm"
  position: str = "learned"
  rotary_dim: Optional[int] = None
  relative_buckets: int = 32
  max_position: Optional[int] = None
  bias: bool = True
  parallel_attention: bool = False
  tied_embeddings: bool = False
  pre_norm: bool = True
  final_norm: bool = True

  def __post_init__(self):
    for k in ("layers", "hidden", "heads", "ffn", "seq"):
      v = getattr(self, k)
      if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ParamsError(f"shape: {k} must be a positive integer, got {v!r}")
    if self.ffn_type not in FFN_TYPES:
      raise ParamsError(f"shape: ffn_type {self.ffn_type!r} is not one of {', '.join(FFN_TYPES)}")
    if self.norm not in NORMS:
      raise ParamsError(f"shape: norm {self.norm!r} is not one of {', '.join(NORMS)}")
    if self.position not in POSITIONS:
      raise ParamsError(f"shape: position {self.position!r} is not one of "
                        f"{', '.join(POSITIONS)}")
    if self.heads % self.n_kv:
      raise ParamsError(f"shape: heads {self.heads} is not a multiple of kv_heads {self.n_kv}")
    if self.head_dim is None and self.hidden % self.heads:
      raise ParamsError(f"shape: hidden {self.hidden} is not a multiple of heads {self.heads}; "
                        f"give head_dim")

  @property
  def n_kv(self) -> int:
    return self.kv_heads or self.heads

  @property
  def d(self) -> int:
    return self.head_dim or self.hidden // self.heads

  @property
  def width(self) -> int:
    """Attention width: heads x head size."""
    return self.heads * self.d

  @property
  def gated(self) -> bool:
    return self.ffn_type in ("swiglu", "geglu")


@dataclasses.dataclass
class _Row:
  """One layer as the hand formulas state it, per sample. mm: matmul FLOPs (weights x
  activations and token-pair), ew: elementwise FLOPs; pair: the token-pair share of mm
  (activation x activation); acts/work: elements; io: bytes; scaling: its token_scaling when
  the formulas know it, else None (the shared rule decides). reads_previous: the previous
  layer's output goes to this layer alone (the value projection's to the attention core, the
  logits to the loss), so when this layer folds into it that output is no longer handed on."""

  name: str
  mm: float = 0.0
  ew: float = 0.0
  params: int = 0
  acts: float = 0.0
  io: float = 0.0
  pair: float = 0.0
  work: float = 0.0
  scaling: Optional[str] = None
  reads_previous: bool = False

  def tally(self, dtype_bytes: int) -> layer_rules.LayerTally:
    """The row as lower.py's record of one sample: backward 2x the matmuls + 1x the rest."""
    return layer_rules.LayerTally(
        self.name, fwd_flops=self.mm + self.ew, bwd_flops=2.0 * self.mm + self.ew,
        contraction_flops=self.mm, pair_flops=self.pair,
        activation_bytes=self.acts * dtype_bytes, work_bytes=self.work * dtype_bytes,
        io_bytes=self.io, params=self.params)


class _Builder:
  """Collects layers as lower.py would see them, then folds and finalizes them by lower.py's
  rules (compiler/layer_rules.py)."""

  def __init__(self, dtype_bytes, weight_dtype_bytes, optimizer):
    self.dt, self.wdt = dtype_bytes, weight_dtype_bytes
    found = layer_rules.optimizer_slots([optimizer])
    if found is None:
      raise ParamsError(f"optimizer {optimizer!r}: no known slot count; use one of "
                        f"{', '.join(sorted(_OPTIMIZERS))}")
    self.slots = found[1]
    self.rows: List[_Row] = []

  def add(self, name, mm=0.0, ew=0.0, params=0, acts=0.0, io=0.0, pair=0.0, work=0.0,
          scaling=None, reads_previous=False):
    """Appends a `_Row` (its fields, per sample)."""
    self.rows.append(_Row(name, float(mm), float(ew), int(params), float(acts), float(io),
                          float(pair), float(work), scaling, reads_previous))

  def graph(self, name, batch, optimizer, seq) -> ir.LayerGraph:
    tallies = [r.tally(self.dt) for r in self.rows]
    scaling = {r.name: r.scaling for r in self.rows}
    takes_previous = {r.name for r in self.rows if r.reads_previous}

    def before_fold(into, folded):  # what `into` handed `folded` is now inside one layer
      if folded.name in takes_previous:
        into.activation_bytes = 0.0

    kept, _ = layer_rules.fold_small(tallies, sum(t.fwd_flops for t in tallies) or 1.0,
                                     before_fold)
    layers = []
    for t in kept:
      how = scaling[t.name] or layer_rules.token_scaling(t.fwd_flops, t.pair_flops, None, 1, ())
      if how == "linear" and (t.name.startswith("cls/") or t.name.endswith("/pooler")):
        how = "none"  # BERT's heads work on 20 gathered positions or the first token
      layers.append(layer_rules.to_layer(t, 1, self.wdt, self.slots, how))
    return ir.LayerGraph(name=name, layers=tuple(layers), captured_batch_size=batch,
                         dtype_bytes=self.dt, optimizer=optimizer, seq_len=seq)


def _norm(b, name, sh, q, extra_acts=0.0):
  """A norm over q positions of width h."""
  per = _RMS if sh.norm == "rmsnorm" else _LN
  b.add(name, ew=per * q * sh.hidden, params=(1 if sh.norm == "rmsnorm" else 2) * sh.hidden,
        acts=q * sh.hidden + extra_acts)


def _attention(b, pre, sh, q, kv_len=None, cross=False, self_scope="attention",
               core_name=None, out_name="output", residual=True, bias_table=False):
  """q/k/v projections, the core (scores, softmax, context) and the output projection.

  q query positions attend to kv_len key positions (self-attention: kv_len = q).
  """
  h, n, kv, d = sh.hidden, sh.heads, sh.n_kv, sh.d
  a, akv = n * d, kv * d
  t = kv_len or q
  bias = sh.bias
  b.add(f"{pre}/{self_scope}/query", mm=2 * q * h * a, params=h * a + (a if bias else 0),
        acts=q * a)
  b.add(f"{pre}/{self_scope}/key", mm=2 * t * h * akv, params=h * akv + (akv if bias else 0),
        acts=t * akv)
  b.add(f"{pre}/{self_scope}/value", mm=2 * t * h * akv, params=h * akv + (akv if bias else 0),
        acts=t * akv)
  pair = 4.0 * q * t * a                 # Q.K^T and P.V (each query head reads its K/V group)
  ew = _SOFTMAX * n * q * t
  if sh.position == "rotary" and not cross:
    r = sh.rotary_dim or d
    ew += _ROTARY * (q * n + t * kv) * r
  if sh.position in ("relative", "alibi"):
    ew += n * q * t                      # the bias added to every score
  b.add(core_name or f"{pre}/{self_scope}", mm=pair, ew=ew,
        params=(sh.relative_buckets * n if bias_table else 0), acts=q * a, pair=pair,
        work=n * q * t, scaling=None, reads_previous=True)
  b.add(f"{pre}/{self_scope}/{out_name}" if out_name else f"{pre}/{self_scope}_output",
        mm=2 * q * a * h, ew=q * h if residual else 0, params=a * h + (h if bias else 0),
        acts=q * h)  # x + its output: the sum, not the output, is handed on


def _ffn(b, pre, sh, q, up="mlp/fc_in", down="mlp/fc_out", residual=True):
  h, f = sh.hidden, sh.ffn
  bias = sh.bias
  if sh.gated:  # act(gate) in the gate projection's layer, times up in the up projection's
    act = _SILU if sh.ffn_type == "swiglu" else _GELU
    b.add(f"{pre}/{up.rsplit('/', 1)[0]}/fc_gate", mm=2 * q * h * f, ew=act * q * f,
          params=h * f + (f if bias else 0), acts=q * f)
    b.add(f"{pre}/{up}", mm=2 * q * h * f, ew=q * f, params=h * f + (f if bias else 0),
          acts=q * f)
  else:
    act = _GELU if sh.ffn_type == "gelu" else 1.0
    b.add(f"{pre}/{up}", mm=2 * q * h * f, ew=act * q * f, params=h * f + (f if bias else 0),
          acts=q * f)
  b.add(f"{pre}/{down}", mm=2 * q * f * h, ew=q * h if residual else 0,
        params=f * h + (h if bias else 0), acts=q * h)


def _block(b, pre, sh, q, bias_table=False):
  """One pre-norm (GPT/LLaMA/ViT/ESM) or post-norm (BERT) encoder or decoder-only block."""
  h = sh.hidden
  if sh.pre_norm:
    _norm(b, f"{pre}/ln_1", sh, q)
    _attention(b, pre, sh, q, bias_table=bias_table, residual=not sh.parallel_attention)
    if not sh.parallel_attention:
      _norm(b, f"{pre}/ln_2", sh, q)
    _ffn(b, pre, sh, q)
    if sh.parallel_attention:  # x + attn(ln(x)) + mlp(ln(x)): one three-way sum
      b.rows[-1].ew += q * h
  else:  # BERT: attention/self/..., attention/output/{dense,LayerNorm}, intermediate, output
    _attention(b, pre, sh, q, self_scope="attention/self", core_name=f"{pre}/attention/self",
               out_name=None, bias_table=bias_table)
    b.rows[-1].name = f"{pre}/attention/output/dense"
    _norm(b, f"{pre}/attention/output/LayerNorm", sh, q)
    _ffn(b, pre, sh, q, up="intermediate/dense", down="output/dense")
    _norm(b, f"{pre}/output/LayerNorm", sh, q)


@contextlib.contextmanager
def _normed(b, sh, scope: str, q: int):
  """A seq2seq sub-layer with its norm: `<scope>/norm` before it (pre-norm, T5) or
  `<scope>/LayerNorm` after the residual (post-norm, Vaswani)."""
  if sh.pre_norm:
    _norm(b, f"{scope}/norm", sh, q)
  yield
  if not sh.pre_norm:
    _norm(b, f"{scope}/LayerNorm", sh, q)


def _embeddings(b, name, sh, q, segments=False, positions_table=True, io=0.0):
  h = sh.hidden
  params = sh.vocab * h
  ew = q * h
  if sh.position == "learned" and positions_table:
    params += (sh.max_position or sh.seq) * h
    ew += q * h
  if segments:
    params += 2 * h
    ew += q * h
  acts = q * h
  if not sh.pre_norm:  # BERT: LayerNorm on the embeddings
    params += 2 * h
    ew += _LN * q * h
  b.add(f"{name}/embeddings", ew=ew, params=params, acts=acts, io=io)


def encoder_graph(sh: Shape, batch: int, head: str = "mlm_nsp", name: str = "bert",
                  max_predictions: Optional[int] = None, segments: Optional[bool] = None,
                  num_classes: int = 1000, dtype_bytes: int = 2, weight_dtype_bytes: int = 4,
                  optimizer: str = "adam") -> ir.LayerGraph:
  """An encoder stack with a head (`_encoder_rows`)."""
  return _encoder_rows(sh, head, name, max_predictions, segments, num_classes, dtype_bytes,
                       weight_dtype_bytes, optimizer).graph(name, batch, optimizer, sh.seq)


def _encoder_rows(sh: Shape, head: str, name: str, max_predictions: Optional[int],
                  segments: Optional[bool], num_classes: int, dtype_bytes: int,
                  weight_dtype_bytes: int, optimizer: str) -> _Builder:
  """The rows of an encoder stack with a head: "mlm_nsp" (BERT pre-training), "mlm" (ESM-2: no NSP, no
  segment embeddings), "classifier" (a class token: ViT) or "none".

  MLM on `max_predictions` positions P (default round(0.15 s), BERT's 20 of 128): transform
  dense h->h + GELU + norm, output projection (tied: vocab bias only), softmax cross-entropy.
  NSP: pooler dense h->h on the first token + a 2-way classifier.
  """
  s, h, v = sh.seq, sh.hidden, sh.vocab
  b = _Builder(dtype_bytes, weight_dtype_bytes, optimizer)
  seg = head == "mlm_nsp" if segments is None else segments
  p = max_predictions if max_predictions is not None else max(1, round(s * 20 / 128))
  mlm = head in ("mlm_nsp", "mlm")
  io = (2 + (1 if seg else 0)) * s * _INT32 + (3 * p * _INT32 if mlm else 0) + _INT32
  _embeddings(b, name, sh, s, segments=seg, io=io)
  for i in range(sh.layers):
    _block(b, f"{name}/encoder/layer_{i}", sh, s, bias_table=sh.position == "relative" and i == 0)
  if sh.pre_norm and sh.final_norm:
    _norm(b, f"{name}/encoder/ln_f", sh, s)
  if head == "mlm_nsp":
    b.add(f"{name}/pooler", mm=2 * h * h, ew=2 * h, params=h * h + h, acts=h)
  if mlm:
    b.add("cls/predictions/transform", mm=2 * p * h * h, ew=(_GELU + _LN) * p * h,
          params=h * h + 3 * h, acts=2 * p * h)
    b.add("cls/predictions/output", mm=2 * p * h * v, params=v + (0 if sh.tied_embeddings
                                                                 else h * v), acts=p * v)
  if head == "mlm_nsp":
    b.add("cls/seq_relationship", mm=2 * h * 2, params=2 * h + 2, acts=2)
  if head == "classifier":
    b.add(f"{name}/classifier", mm=2 * h * num_classes, params=h * num_classes + num_classes,
          acts=num_classes, scaling="none")
  if head != "none":
    n_out = (p * v if mlm else 0) + (2 if head == "mlm_nsp" else 0) + (
        num_classes if head == "classifier" else 0)
    b.add("loss", ew=(_SOFTMAX + 2) * n_out, scaling="none", work=n_out, reads_previous=True)
  return b


def decoder_graph(sh: Shape, batch: int, name: str = "gpt", dtype_bytes: int = 2,
                  weight_dtype_bytes: int = 4, optimizer: str = "adam") -> ir.LayerGraph:
  """A decoder-only LM (pre-norm blocks), loss on every position. Causal attention is costed
  dense (the engine does not skip the masked half). Head: final norm, LM projection h->vocab
  on all s positions (tied: no weights of its own), softmax cross-entropy."""
  s, h, v = sh.seq, sh.hidden, sh.vocab
  b = _Builder(dtype_bytes, weight_dtype_bytes, optimizer)
  _embeddings(b, name, sh, s, io=2 * s * _INT32)
  for i in range(sh.layers):
    _block(b, f"{name}/decoder/layer_{i}", sh, s)
  _norm(b, f"{name}/ln_f", sh, s)
  b.add(f"{name}/lm_head", mm=2 * s * h * v,
        params=0 if sh.tied_embeddings else h * v + (v if sh.bias else 0), acts=s * v)
  b.add("loss", ew=(_SOFTMAX + 2) * s * v, work=s * v, reads_previous=True)
  return b.graph(name, batch, optimizer, s)


def seq2seq_graph(sh: Shape, batch: int, tgt_seq: Optional[int] = None,
                  decoder_layers: Optional[int] = None, name: str = "transformer",
                  dtype_bytes: int = 2, weight_dtype_bytes: int = 4,
                  optimizer: str = "adam") -> ir.LayerGraph:
  """An encoder-decoder (Vaswani post-norm with `pre_norm=False`, or T5: pre-norm RMSNorm,
  relative position bias, no biases). Encoder over s = sh.seq source positions; decoder over
  t target positions: masked self-attention (costed dense), cross-attention (queries from t,
  keys/values from the s encoder positions), FFN. One shared vocabulary; the output projection
  is tied unless `tied_embeddings` is False."""
  s, h, v = sh.seq, sh.hidden, sh.vocab
  t = tgt_seq or s
  b = _Builder(dtype_bytes, weight_dtype_bytes, optimizer)
  b.add(f"{name}/embeddings", ew=2 * (s + t) * h, params=v * h, acts=(s + t) * h,
        io=2 * (s + t) * _INT32)
  rel = sh.position == "relative"
  for i in range(sh.layers):
    pre = f"{name}/encoder/layer_{i}"
    with _normed(b, sh, f"{pre}/self_attention", s):
      _attention(b, pre, sh, s, self_scope="self_attention", bias_table=rel and i == 0)
    with _normed(b, sh, f"{pre}/ffn", s):
      _ffn(b, pre, sh, s, up="ffn/dense_1", down="ffn/dense_2")
  if sh.pre_norm and sh.final_norm:
    _norm(b, f"{name}/encoder/final_norm", sh, s)
  for i in range(decoder_layers or sh.layers):
    pre = f"{name}/decoder/layer_{i}"
    for scope, q, kv, cross in (("self_attention", t, t, False),
                                ("cross_attention", t, s, True)):
      with _normed(b, sh, f"{pre}/{scope}", q):
        _attention(b, pre, sh, q, kv_len=kv, cross=cross, self_scope=scope,
                   bias_table=rel and i == 0 and not cross)
    with _normed(b, sh, f"{pre}/ffn", t):
      _ffn(b, pre, sh, t, up="ffn/dense_1", down="ffn/dense_2")
  if sh.pre_norm and sh.final_norm:
    _norm(b, f"{name}/decoder/final_norm", sh, t)
  b.add(f"{name}/decoder/output_projection", mm=2 * t * h * v,
        params=0 if sh.tied_embeddings else h * v, acts=t * v)
  b.add("loss", ew=(_SOFTMAX + 2) * t * v, work=t * v, reads_previous=True)
  return b.graph(name, batch, optimizer, s)


def vit_graph(sh: Shape, batch: int, image: int = 224, patch: int = 16, channels: int = 3,
              num_classes: int = 1000, name: str = "vit", **kw) -> ir.LayerGraph:
  """Vision Transformer: a patch embedding (a dense p*p*c -> h per patch, = a stride-p conv),
  a class token and learned positions, a pre-norm encoder, a classifier on the class token.
  The sequence is (image / patch)^2 + 1. Host input: the image in fp16 and an int32 label."""
  tokens = (image // patch) ** 2
  sh = dataclasses.replace(sh, seq=tokens + 1, vocab=0, position="learned")
  dtype_bytes, weight_dtype_bytes = kw.get("dtype_bytes", 2), kw.get("weight_dtype_bytes", 4)
  optimizer = kw.get("optimizer", "adam")
  b = _encoder_rows(sh, "classifier", name, None, False, num_classes, dtype_bytes,
                    weight_dtype_bytes, optimizer)
  emb = b.rows[0]
  pp = patch * patch * channels
  emb.mm += 2.0 * tokens * pp * sh.hidden
  emb.params += pp * sh.hidden + sh.hidden * 2      # patch projection + bias + class token
  emb.io = image * image * channels * 2.0 + _INT32
  return b.graph(name, batch, optimizer, sh.seq)


def dit_graph(sh: Shape, batch: int, latent: int = 32, latent_channels: int = 4,
              patch: int = 2, num_classes: int = 1000, name: str = "dit",
              dtype_bytes: int = 2, weight_dtype_bytes: int = 4,
              optimizer: str = "adam") -> ir.LayerGraph:
  """Diffusion Transformer (Peebles & Xie 2022) with adaLN-Zero blocks.

  Tokens: (latent / patch)^2 patches of p*p*C values, projected to h. Conditioning: timestep
  MLP (frequency embedding 256 -> h -> h) + a class embedding table, summed into c [h]. Each
  block: adaLN modulation Linear(h -> 6h) of c (per sample, not per token: 6h^2 weights that
  do almost no work), then norm/attention/norm/MLP as a pre-norm block without norm weights.
  Final layer: adaLN (h -> 2h), linear h -> p*p*2C (mean and sigma), MSE loss on the noise.
  """
  tokens = (latent // patch) ** 2
  sh = dataclasses.replace(sh, seq=tokens, vocab=0, position="fixed")
  h = sh.hidden
  b = _Builder(dtype_bytes, weight_dtype_bytes, optimizer)
  pp = patch * patch * latent_channels
  b.add(f"{name}/x_embedder", mm=2 * tokens * pp * h, ew=tokens * h, params=pp * h + h,
        acts=tokens * h, io=(latent * latent * latent_channels * 2.0 + 2 * _INT32))
  b.add(f"{name}/t_embedder", mm=2 * (256 * h + h * h), ew=_SILU * h,
        params=256 * h + h * h + 2 * h + (num_classes + 1) * h, acts=h)
  for i in range(sh.layers):
    pre = f"{name}/blocks_{i}"
    b.add(f"{pre}/adaLN_modulation", mm=2 * h * 6 * h, ew=_SILU * h + 6 * tokens * h,
          params=6 * h * h + 6 * h, acts=6 * h)
    _norm(b, f"{pre}/norm1", sh, tokens)
    b.rows[-1].params = 0
    _attention(b, pre, sh, tokens, self_scope="attn")
    _norm(b, f"{pre}/norm2", sh, tokens)
    b.rows[-1].params = 0
    _ffn(b, pre, sh, tokens, up="mlp/fc1", down="mlp/fc2")
  out = pp * 2
  b.add(f"{name}/final_layer", mm=2 * (h * 2 * h + tokens * h * out), ew=_LN * tokens * h,
        params=2 * h * h + 2 * h + h * out + out, acts=tokens * out)
  b.add("loss", ew=3 * tokens * pp, scaling="none", reads_previous=True)
  return b.graph(name, batch, optimizer, tokens)


# ---------------------------------------------------------------------------------------------
# The earlier entry points (kept: tests, benchmarks and scripts call them).
# ---------------------------------------------------------------------------------------------

def transformer_encoder_graph(num_layers: int, hidden: int, heads: int, ffn: int, seq: int,
                              vocab: int, batch: int, dtype_bytes: int = 2,
                              weight_dtype_bytes: int = 4, optimizer: str = "adam",
                              max_predictions: Optional[int] = None,
                              max_position: int = 512, type_vocab: int = 2,
                              name: str = "bert") -> ir.LayerGraph:
  """A BERT-style post-norm encoder with MLM + NSP heads, as the reference BERT lowers
  (`encoder_graph` with learned positions, segment embeddings, GELU, LayerNorm, tied MLM)."""
  del type_vocab
  sh = Shape(num_layers, hidden, heads, ffn, seq, vocab, max_position=max(max_position, seq),
             pre_norm=False, tied_embeddings=True)
  return encoder_graph(sh, batch, head="mlm_nsp", name=name, max_predictions=max_predictions,
                       dtype_bytes=dtype_bytes, weight_dtype_bytes=weight_dtype_bytes,
                       optimizer=optimizer)


def transformer_decoder_graph(num_layers: int, hidden: int, heads: int, ffn: int, seq: int,
                              vocab: int, batch: int, dtype_bytes: int = 2,
                              weight_dtype_bytes: int = 4, optimizer: str = "adam",
                              tied_embeddings: bool = False, learned_positions: bool = True,
                              name: str = "gpt", **shape_kw) -> ir.LayerGraph:
  """A GPT-style decoder-only LM (`decoder_graph`); `shape_kw` takes any other `Shape` field
  (kv_heads, head_dim, ffn_type, norm, parallel_attention, bias...)."""
  sh = Shape(num_layers, hidden, heads, ffn, seq, vocab,
             position=shape_kw.pop("position", "learned" if learned_positions else "rotary"),
             tied_embeddings=tied_embeddings, **shape_kw)
  return decoder_graph(sh, batch, name=name, dtype_bytes=dtype_bytes,
                       weight_dtype_bytes=weight_dtype_bytes, optimizer=optimizer)


def transformer_seq2seq_graph(num_layers: int, hidden: int, heads: int, ffn: int, seq: int,
                              vocab: int, batch: int, tgt_seq: Optional[int] = None,
                              dtype_bytes: int = 2, weight_dtype_bytes: int = 4,
                              optimizer: str = "adam", name: str = "transformer",
                              **shape_kw) -> ir.LayerGraph:
  """The encoder-decoder Transformer (Vaswani et al. 2017): post-norm, sinusoidal positions,
  shared tied embeddings (`seq2seq_graph`); Transformer Base (6, 512, 8, 2048, vocab ~37k)
  has ~63M params, Big (6, 1024, 16, 4096) ~213M, matching the paper's 65M / 213M."""
  kw = dict(position="fixed", pre_norm=False, tied_embeddings=True, final_norm=False)
  kw.update(shape_kw)
  dec = kw.pop("decoder_layers", None)
  sh = Shape(num_layers, hidden, heads, ffn, seq, vocab, **kw)
  return seq2seq_graph(sh, batch, tgt_seq=tgt_seq, decoder_layers=dec, name=name,
                       dtype_bytes=dtype_bytes, weight_dtype_bytes=weight_dtype_bytes,
                       optimizer=optimizer)


def mlp_graph(sizes: Sequence[int], batch: int, dtype_bytes: int = 2,
              weight_dtype_bytes: int = 4, optimizer: str = "adam",
              name: str = "mlp") -> ir.LayerGraph:
  """A fully connected classifier: dense layers sizes[0] -> sizes[1] -> ... -> sizes[-1].

  Per dense a -> b (ReLU after every layer but the last): 2*a*b FLOPs forward (+ b for the
  ReLU); a*b + b params; keeps its b outputs. Host input: sizes[0] fp32 features and an int32
  label per sample. Loss: softmax cross-entropy over sizes[-1] classes.
  """
  b = _Builder(dtype_bytes, weight_dtype_bytes, optimizer)
  for i, (x, y) in enumerate(zip(sizes, sizes[1:])):
    last = i == len(sizes) - 2
    b.add(f"{name}/dense_{i}", mm=2 * x * y, ew=0 if last else y, params=x * y + y, acts=y,
          io=(x * 4 + _INT32) if i == 0 else 0.0)
  b.add("loss", ew=(_SOFTMAX + 2) * sizes[-1], scaling="none", work=sizes[-1],
        reads_previous=True)
  g = b.graph(name, batch, optimizer, 0)
  return g


# Named shapes used by tests, benchmarks and the calibration points.

def bert_large(seq: int = 128, batch: int = 1024, **kw) -> ir.LayerGraph:
  """BERT-Large (Devlin et al. 2018): 24 x 1024, 16 heads, ffn 4096, vocab 30522; ~335M params."""
  return transformer_encoder_graph(24, 1024, 16, 4096, seq, 30522, batch,
                                   name=kw.pop("name", "bert_large"), **kw)


def bert_base(seq: int = 128, batch: int = 256, **kw) -> ir.LayerGraph:
  """BERT-Base: 12 x 768, 12 heads, ffn 3072, vocab 30522; ~110M params."""
  return transformer_encoder_graph(12, 768, 12, 3072, seq, 30522, batch,
                                   name=kw.pop("name", "bert_base"), **kw)


def gpt_j_6b(seq: int = 2048, batch: int = 120, vocab: int = 50257, **kw) -> ir.LayerGraph:
  """GPT-J 6B (EleutherAI; modelzoo params_gptj_6B.yaml): 28 x 4096, 16 heads, ffn 16384,
  vocab 50257, rotary on 64 dims per head, attention and FFN in parallel off one LayerNorm,
  no attention biases, untied head; ~6.05B params."""
  return transformer_decoder_graph(28, 4096, 16, 16384, seq, vocab, batch,
                                   learned_positions=False, rotary_dim=64,
                                   parallel_attention=True, name=kw.pop("name", "gpt_j_6b"),
                                   **kw)


def llama_7b(seq: int = 2048, batch: int = 99, **kw) -> ir.LayerGraph:
  """LLaMA-7B / Llama-2-7B: 32 x 4096, 32 heads, SwiGLU 11008, RMSNorm, rotary, no biases,
  vocab 32000, untied head; ~6.74B params."""
  return transformer_decoder_graph(32, 4096, 32, 11008, seq, 32000, batch, ffn_type="swiglu",
                                   norm="rmsnorm", bias=False, learned_positions=False,
                                   name=kw.pop("name", "llama_7b"), **kw)


def gpt3_175b(seq: int = 2048, batch: int = 1536, **kw) -> ir.LayerGraph:
  """GPT-3 175B (Brown et al. 2020): 96 x 12288, 96 heads, ffn 49152, vocab 50257, tied."""
  return transformer_decoder_graph(96, 12288, 96, 49152, seq, 50257, batch,
                                   tied_embeddings=True, name=kw.pop("name", "gpt3_175b"), **kw)


def transformer_base(seq: int = 128, batch: int = 256, vocab: int = 37000, **kw):
  """Transformer Base (Vaswani et al. 2017): 6+6 x 512, 8 heads, ffn 2048; ~63M params with
  the paper's 37k shared BPE vocabulary (the paper quotes 65M)."""
  return transformer_seq2seq_graph(6, 512, 8, 2048, seq, vocab, batch,
                                   name=kw.pop("name", "transformer_base"), **kw)


def transformer_big(seq: int = 128, batch: int = 256, vocab: int = 37000, **kw):
  """Transformer Big: 6+6 x 1024, 16 heads, ffn 4096; ~213M params (the paper: 213M)."""
  return transformer_seq2seq_graph(6, 1024, 16, 4096, seq, vocab, batch,
                                   name=kw.pop("name", "transformer_big"), **kw)


def gpt3_xl(seq: int = 2048, batch: int = 512, **kw) -> ir.LayerGraph:
  """GPT-3 XL (Brown et al. 2020, Table 2.1): 24 x 2048, 16 heads (head 128), ffn 8192,
  vocab 50257, tied embeddings, learned positions; ~1.3B params, batch 0.5M tokens."""
  return transformer_decoder_graph(24, 2048, 16, 8192, seq, 50257, batch, tied_embeddings=True,
                                   name=kw.pop("name", "gpt3_xl"), **kw)


# ---------------------------------------------------------------------------------------------
# From a params file.
# ---------------------------------------------------------------------------------------------

# params `model` keys -> Shape fields (the first key found wins), as the reference models and
# the Cerebras modelzoo spell them.
_KEYS = {
    "kv_heads": ("num_kv_heads", "num_key_value_heads", "num_kv_groups",
                 "extra_attention_params.num_kv_groups"),
    "head_dim": ("head_dim", "attention_head_size", "d_kv"),
    "ffn_type": ("ffn_type", "nonlinearity", "encoder_nonlinearity"),
    "norm": ("norm_type", "norm"),
    "position": ("position_embedding_type", "position"),
    "rotary_dim": ("rotary_dim",),
    "max_position": ("max_position_embeddings",),
    "parallel_attention": ("parallel_attention",),
    "tied_embeddings": ("share_embedding_weights",),
    "bias": ("use_bias", "use_ffn_bias"),
}
_FFN_ALIASES = {"swiglu": "swiglu", "silu_glu": "swiglu", "geglu": "geglu", "gelu": "gelu",
                "gelu_new": "gelu", "relu": "relu", "reglu": "swiglu"}
_NORM_ALIASES = {"layernorm": "layernorm", "layer_norm": "layernorm", "rmsnorm": "rmsnorm",
                 "rms_norm": "rmsnorm"}
_POS_ALIASES = {"learned": "learned", "rotary": "rotary", "fixed": "fixed",
                "sinusoidal": "fixed", "relative": "relative", "alibi": "alibi", "none": "none"}


def shape_from_params(model: dict, seq: int, vocab: int, defaults: Optional[dict] = None) -> Shape:
  """A `Shape` from a params `model` section (see `graph_from_params` for the keys)."""
  def get(key, *alts):
    for k in (key,) + alts:
      if k in model:
        v = model[k]
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
          raise ParamsError(f"params: key 'model.{k}' must be a positive integer, got {v!r}")
        return v
    raise ParamsError(f"params: key 'model.{key}' must be a positive integer, got None")

  kw = dict(defaults or {})
  for field, keys in _KEYS.items():
    for k in keys:
      if k in model and model[k] is not None:
        kw[field] = model[k]
        break
  if "ffn_type" in kw:
    ft = str(kw["ffn_type"]).lower()
    if ft not in _FFN_ALIASES:
      raise ParamsError(f"params: key 'model.ffn_type' {kw['ffn_type']!r} is not one of "
                        f"{', '.join(sorted(_FFN_ALIASES))}")
    kw["ffn_type"] = _FFN_ALIASES[ft]
  if "norm" in kw:
    kw["norm"] = _NORM_ALIASES.get(str(kw["norm"]).lower(), kw["norm"])
  if "position" in kw:
    kw["position"] = _POS_ALIASES.get(str(kw["position"]).lower(), kw["position"])
  for k in ("parallel_attention", "tied_embeddings", "bias"):
    if k in kw:
      kw[k] = bool(kw[k])
  return Shape(get("num_hidden_layers"), get("hidden_size"),
               get("num_heads", "num_attention_heads"),
               get("filter_size", "intermediate_size"), seq, vocab, **kw)


def graph_from_params(params: dict, batch: Optional[int] = None) -> ir.LayerGraph:
  """An analytic graph from a params dict's `model` section (no TensorFlow).

  Reads hidden_size, num_hidden_layers, num_heads, filter_size, vocab_size,
  max_sequence_length and (unless `batch` is given) batch_size from `model`, falling back to
  `train_input.batch_size`; and, when present, num_kv_heads (GQA), head_dim (attention width
  heads x head_dim), ffn_type / nonlinearity (gelu, relu, swiglu, geglu), norm_type (layernorm,
  rmsnorm), position_embedding_type (learned, rotary, fixed, relative, alibi, none),
  rotary_dim, share_embedding_weights, parallel_attention, use_bias. `model.name` picks the
  family: "gpt..." / "llama..." a decoder, "bert..." an encoder with MLM/NSP heads ("esm..."
  MLM only), "transformer..." / "t5..." an encoder-decoder (T5: pre-norm RMSNorm, relative
  bias, no biases, ReLU unless told).

  Raises:
    ParamsError: a missing or non-positive key, or an unknown family (names them).
  """
  model = params.get("model") if isinstance(params, dict) else None
  if not isinstance(model, dict):
    raise ParamsError("params: missing 'model' section")
  name = str(model.get("name", "")).lower()
  # The family first: a model of the user's own has none of the shape keys asked below.
  if not name.startswith(("gpt", "llama", "bert", "esm", "transformer", "t5")):
    raise ParamsError(
        f"params: key 'model.name' {model.get('name')!r} has no analytic graph (gpt..., "
        f"llama..., bert..., esm..., transformer... or t5... have); for another model, "
        f"compile it traced: scripts/run.py --compile_only --execution_strategy "
        f"weight_streaming --num_csx N, once per N")

  def get(key, *alts):
    for k in (key,) + alts:
      if k in model:
        v = model[k]
        break
    else:
      v = None
      if key == "batch_size":
        v = (params.get("train_input") or {}).get("batch_size")
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
      raise ParamsError(f"params: key 'model.{key}' must be a positive integer, got {v!r}")
    return v

  seq, vocab = get("max_sequence_length"), get("vocab_size")
  b = batch or get("batch_size")
  if name.startswith(("gpt", "llama")):
    # The reference GPT ties its head (GPTConfig.share_embedding_weights = True); LLaMA does not.
    defaults = dict(position="learned", tied_embeddings=True)
    if name.startswith("llama"):
      defaults.update(ffn_type="swiglu", norm="rmsnorm", position="rotary", bias=False,
                      tied_embeddings=False)
    return decoder_graph(shape_from_params(model, seq, vocab, defaults), b, name=name)
  if name.startswith(("bert", "esm")):
    esm = name.startswith("esm")
    defaults = dict(pre_norm=esm, tied_embeddings=True, position="rotary" if esm else "learned")
    sh = shape_from_params(model, seq, vocab, defaults)
    return encoder_graph(sh, b, head="mlm" if esm else "mlm_nsp", name=name,
                         max_predictions=model.get("max_predictions_per_seq"))
  if name.startswith(("transformer", "t5")):
    t5 = name.startswith("t5")
    defaults = (dict(pre_norm=True, norm="rmsnorm", position="relative", bias=False,
                     ffn_type="relu", tied_embeddings=True) if t5 else
                dict(position="fixed", pre_norm=False, tied_embeddings=True, final_norm=False))
    sh = shape_from_params(model, seq, vocab, defaults)
    tgt = model.get("max_target_length") or model.get("tgt_max_sequence_length")
    return seq2seq_graph(sh, b, tgt_seq=tgt, decoder_layers=model.get("num_decoder_layers"),
                         name=name)
  raise AssertionError(name)  # the family check above admits only the families handled here
