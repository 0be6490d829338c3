"""Analytic LayerGraphs for transformer shapes, from hand formulas (no TensorFlow).

Used by tests, benchmarks and calibration: they give the planners a BERT- or GPT-shaped graph
without tracing a model. The layer granularity follows what `lower.py` produces for the
reference BERT (one layer per variable scope), so a 24-layer BERT-Large has about 150 layers.

Conventions (all per ONE sample; s = sequence length, h = hidden, f = ffn size):
  * a dense layer [s, a] x [a, b] costs 2*s*a*b FLOPs forward (a multiply-add counts 2);
  * backward costs 2x forward for matmuls (input gradient + weight gradient) and 1x forward
    for elementwise work (norms, softmax, activations);
  * elementwise costs: layer norm 8 FLOPs/element, softmax 5, GELU 8, residual add 1;
  * weights, gradients and each optimizer slot are `weight_dtype_bytes` per parameter
    (fp32 master weights by default, like `lower.py`); Adam has 2 slots, momentum 1, sgd 0;
  * activations kept for backward are the layer's output tensors in `dtype_bytes` (fp16);
  * host input (io_bytes) is int32 token ids, segment ids and mask for s positions, plus the
    masked-LM positions, ids and weights for `max_predictions` positions.
"""

from typing import List, Optional

from cerebras_tf.core import ir
from cerebras_tf.errors import ParamsError

_LN = 8.0      # FLOPs per element of a layer norm (mean, var, normalize, scale, shift)
_SOFTMAX = 5.0  # FLOPs per element of a softmax
_GELU = 8.0    # FLOPs per element of a tanh-approximated GELU
_INT32 = 4

_OPT_SLOTS = {"adam": 2, "adamw": 2, "lamb": 2, "momentum": 1, "sgd": 0}


def _layer(name, kind, mm_flops, ew_flops, params, acts, weight_dtype_bytes, slots,
           dtype_bytes, io_bytes=0.0, token_scaling=None):
  """One Layer from matmul FLOPs, elementwise FLOPs, params and activation elements.

  token_scaling defaults from the name: attention scores are "quadratic" in the real tokens,
  the pooler / NSP / masked-LM heads and their loss work on a fixed number of positions
  ("none"), everything else is position-wise ("linear").
  """
  if token_scaling is None:
    token_scaling = ("quadratic" if "/scores" in name or name.endswith("scores") else
                     "none" if name.startswith("cls/") or name.endswith("/pooler") else "linear")
  return ir.Layer(
      name=name, kind=kind,
      fwd_flops=float(mm_flops + ew_flops),
      bwd_flops=float(2.0 * mm_flops + ew_flops),
      num_params=int(params),
      weight_bytes=int(params * weight_dtype_bytes),
      grad_bytes=int(params * weight_dtype_bytes),
      optimizer_bytes=int(params * weight_dtype_bytes * slots),
      activation_bytes=float(acts * dtype_bytes),
      io_bytes=float(io_bytes), token_scaling=token_scaling)


def transformer_encoder_graph(num_layers: int, hidden: int, heads: int, ffn: int, seq: int,
                              vocab: int, batch: int, dtype_bytes: int = 2,
                              weight_dtype_bytes: int = 4, optimizer: str = "adam",
                              max_predictions: Optional[int] = None,
                              max_position: int = 512, type_vocab: int = 2,
                              name: str = "bert") -> ir.LayerGraph:
  """A BERT-style encoder with MLM + NSP heads, as the reference BERT lowers.

  Per encoder block (s, h, f, heads = n):
    attention/self/qkv       3 dense h->h: 6*s*h*h FLOPs; 3*h*h + 3*h params; acts 3*s*h
    attention/self/scores    Q.K^T 2*s*s*h, softmax 5*n*s*s, P.V 2*s*s*h; acts 2*n*s*s + s*h
    attention/output/dense   dense h->h: 2*s*h*h; h*h + h params; acts s*h
    attention/output/LayerNorm residual + LN: 9*s*h; 2*h params; acts s*h
    intermediate             dense h->f + GELU: 2*s*h*f + 8*s*f; h*f + f params; acts 2*s*f
    output                   dense f->h + residual + LN: 2*s*f*h + 9*s*h; f*h + 3*h; acts 2*s*h
  Embeddings: (vocab + max_position + type_vocab)*h + 2*h params; 3 adds + LN per element.
  MLM head on `max_predictions` positions P (default 20 per 128 tokens, as BERT pre-training):
    transform dense h->h + GELU + LN; output projection tied to the word embeddings
    (2*P*h*vocab FLOPs, vocab bias params), softmax cross-entropy over the vocabulary.
  NSP head: pooler dense h->h on the first token + 2-way classifier.

  Args:
    num_layers, hidden, heads, ffn, seq, vocab: the transformer shape.
    batch: captured batch size (per-sample values do not depend on it).
    dtype_bytes: activation bytes per element (2 = fp16).
    weight_dtype_bytes: bytes per weight / gradient / optimizer slot element (4 = fp32).
    optimizer: "adam" (2 slots), "momentum" (1) or "sgd" (0).
    max_predictions: masked positions per sample; default round(seq * 20 / 128).
    max_position, type_vocab: embedding table sizes.
    name: model name and scope prefix.
  """
  s, h, f, n = seq, hidden, ffn, heads
  slots = _OPT_SLOTS[optimizer]
  p = max_predictions if max_predictions is not None else max(1, round(seq * 20 / 128))
  mk = lambda *a, **k: _layer(*a, weight_dtype_bytes=weight_dtype_bytes, slots=slots,
                               dtype_bytes=dtype_bytes, **k)
  io = 3 * s * _INT32 + 3 * p * _INT32 + _INT32  # ids, segments, mask; MLM pos/ids/w; NSP
  layers: List[ir.Layer] = [
      mk(f"{name}/embeddings", "matmul", 0, (3 + _LN) * s * h,
         (vocab + max_position + type_vocab) * h + 2 * h, 2 * s * h, io_bytes=io)]
  for i in range(num_layers):
    pre = f"{name}/encoder/layer_{i}"
    layers += [
        mk(f"{pre}/attention/self/qkv", "matmul", 6 * s * h * h, 0, 3 * h * h + 3 * h, 3 * s * h),
        mk(f"{pre}/attention/self/scores", "matmul", 4 * s * s * h, _SOFTMAX * n * s * s, 0,
           2 * n * s * s + s * h),
        mk(f"{pre}/attention/output/dense", "matmul", 2 * s * h * h, 0, h * h + h, s * h),
        mk(f"{pre}/attention/output/LayerNorm", "elementwise", 0, (1 + _LN) * s * h, 2 * h,
           s * h),
        mk(f"{pre}/intermediate", "matmul", 2 * s * h * f, _GELU * s * f, h * f + f, 2 * s * f),
        mk(f"{pre}/output", "matmul", 2 * s * f * h, (1 + _LN) * s * h, f * h + 3 * h, 2 * s * h),
    ]
  layers += [
      mk(f"{name}/pooler", "matmul", 2 * h * h, 2 * h, h * h + h, h),
      mk(f"cls/predictions/transform", "matmul", 2 * p * h * h, (_GELU + _LN) * p * h,
         h * h + 3 * h, 2 * p * h),
      mk(f"cls/predictions/output", "matmul", 2 * p * h * vocab, 0, vocab, p * vocab),
      mk(f"cls/seq_relationship", "matmul", 2 * h * 2, 0, 2 * h + 2, 2),
      mk(f"loss", "loss", 0, (_SOFTMAX + 2) * (p * vocab + 2), 0, p * vocab,
         token_scaling="none"),
  ]
  return ir.LayerGraph(name=name, layers=tuple(layers), captured_batch_size=batch,
                       dtype_bytes=dtype_bytes, optimizer=optimizer, seq_len=seq)


def transformer_decoder_graph(num_layers: int, hidden: int, heads: int, ffn: int, seq: int,
                              vocab: int, batch: int, dtype_bytes: int = 2,
                              weight_dtype_bytes: int = 4, optimizer: str = "adam",
                              tied_embeddings: bool = False, learned_positions: bool = True,
                              name: str = "gpt") -> ir.LayerGraph:
  """A GPT-style decoder-only LM (pre-LN blocks), loss on every position.

  Per block (s, h, f, heads = n); causal attention is costed as dense (the engine does not skip
  the masked half):
    ln_1             LN: 8*s*h; 2*h params; acts s*h
    attn/qkv         3 dense h->h: 6*s*h*h; 3*h*h + 3*h params; acts 3*s*h
    attn/scores      Q.K^T + P.V 4*s*s*h, softmax 5*n*s*s; acts 2*n*s*s + s*h
    attn/out         dense h->h + residual: 2*s*h*h + s*h; h*h + h; acts s*h
    ln_2             LN: 8*s*h; 2*h; acts s*h
    mlp/fc_in        dense h->f + GELU: 2*s*h*f + 8*s*f; h*f + f; acts 2*s*f
    mlp/fc_out       dense f->h + residual: 2*s*f*h + s*h; f*h + h; acts s*h
  Embedding: vocab*h (+ seq*h learned positions). Head: final LN, LM projection h->vocab on all
  s positions (untied: vocab*h + vocab params, as GPT-J), softmax cross-entropy.

  Args: as `transformer_encoder_graph`; `tied_embeddings` reuses the embedding for the head.
  """
  s, h, f, n = seq, hidden, ffn, heads
  slots = _OPT_SLOTS[optimizer]
  mk = lambda *a, **k: _layer(*a, weight_dtype_bytes=weight_dtype_bytes, slots=slots,
                               dtype_bytes=dtype_bytes, **k)
  emb_params = vocab * h + (s * h if learned_positions else 0)
  layers: List[ir.Layer] = [
      mk(f"{name}/embeddings", "matmul", 0, s * h, emb_params, s * h, io_bytes=2 * s * _INT32)]
  for i in range(num_layers):
    pre = f"{name}/h_{i}"
    layers += [
        mk(f"{pre}/ln_1", "elementwise", 0, _LN * s * h, 2 * h, s * h),
        mk(f"{pre}/attn/qkv", "matmul", 6 * s * h * h, 0, 3 * h * h + 3 * h, 3 * s * h),
        mk(f"{pre}/attn/scores", "matmul", 4 * s * s * h, _SOFTMAX * n * s * s, 0,
           2 * n * s * s + s * h),
        mk(f"{pre}/attn/out", "matmul", 2 * s * h * h, s * h, h * h + h, s * h),
        mk(f"{pre}/ln_2", "elementwise", 0, _LN * s * h, 2 * h, s * h),
        mk(f"{pre}/mlp/fc_in", "matmul", 2 * s * h * f, _GELU * s * f, h * f + f, 2 * s * f),
        mk(f"{pre}/mlp/fc_out", "matmul", 2 * s * f * h, s * h, f * h + h, s * h),
    ]
  head_params = vocab + (0 if tied_embeddings else vocab * h)
  layers += [
      mk(f"{name}/ln_f", "elementwise", 0, _LN * s * h, 2 * h, s * h),
      mk(f"{name}/lm_head", "matmul", 2 * s * h * vocab, 0, head_params, s * vocab),
      mk("loss", "loss", 0, (_SOFTMAX + 2) * s * vocab, 0, s * vocab),
  ]
  return ir.LayerGraph(name=name, layers=tuple(layers), captured_batch_size=batch,
                       dtype_bytes=dtype_bytes, optimizer=optimizer, seq_len=seq)


# Named shapes used by tests, benchmarks and the calibration points.

def bert_large(seq: int = 128, batch: int = 1024, **kw) -> ir.LayerGraph:
  """BERT-Large (Devlin et al. 2018): 24 x 1024, 16 heads, ffn 4096, vocab 30522; ~335M params."""
  return transformer_encoder_graph(24, 1024, 16, 4096, seq, 30522, batch,
                                   name=kw.pop("name", "bert_large"), **kw)


def bert_base(seq: int = 128, batch: int = 256, **kw) -> ir.LayerGraph:
  """BERT-Base: 12 x 768, 12 heads, ffn 3072, vocab 30522; ~110M params."""
  return transformer_encoder_graph(12, 768, 12, 3072, seq, 30522, batch,
                                   name=kw.pop("name", "bert_base"), **kw)


def gpt_j_6b(seq: int = 2048, batch: int = 120, **kw) -> ir.LayerGraph:
  """GPT-J 6B (EleutherAI): 28 x 4096, 16 heads, ffn 16384, vocab 50400, rotary (no learned
  positions), untied head; ~6.05B params."""
  return transformer_decoder_graph(28, 4096, 16, 16384, seq, 50400, batch,
                                   learned_positions=False, name=kw.pop("name", "gpt_j_6b"),
                                   **kw)


def gpt3_175b(seq: int = 2048, batch: int = 1536, **kw) -> ir.LayerGraph:
  """GPT-3 175B (Brown et al. 2020): 96 x 12288, 96 heads, ffn 49152, vocab 50257, tied."""
  return transformer_decoder_graph(96, 12288, 96, 49152, seq, 50257, batch,
                                   tied_embeddings=True, name=kw.pop("name", "gpt3_175b"), **kw)


def transformer_seq2seq_graph(num_layers: int, hidden: int, heads: int, ffn: int, seq: int,
                              vocab: int, batch: int, tgt_seq: Optional[int] = None,
                              dtype_bytes: int = 2, weight_dtype_bytes: int = 4,
                              optimizer: str = "adam", name: str = "transformer") -> ir.LayerGraph:
  """The encoder-decoder Transformer (Vaswani et al. 2017), post-LN, shared embeddings.

  `num_layers` encoder and `num_layers` decoder blocks; source length `seq`, target length
  `tgt_seq` (default `seq`); one vocabulary shared by source, target and the (tied) output
  projection, sinusoidal positions (no parameters). Per block, with the encoder formulas of
  `transformer_encoder_graph` (s = its length):
    encoder: self-attention (qkv, scores, out + residual/LN) and FFN (h->f, f->h + residual/LN)
    decoder: masked self-attention over t target positions (costed dense), cross-attention
      (q from t positions, k/v from the s encoder positions: 2*t*h*h + 4*s*h*h; scores
      4*t*s*h + 5*n*t*s; out 2*t*h*h), FFN.
  Embeddings: vocab*h params (shared); head: tied projection 2*t*h*vocab, softmax cross-entropy
  over the t target positions. Transformer Base (6, 512, 8, 2048, vocab ~37k) has ~63M params,
  Big (6, 1024, 16, 4096) ~213M, matching the paper's 65M / 213M.
  """
  s, h, f, n = seq, hidden, ffn, heads
  t = tgt_seq or seq
  slots = _OPT_SLOTS[optimizer]
  mk = lambda *a, **k: _layer(*a, weight_dtype_bytes=weight_dtype_bytes, slots=slots,
                               dtype_bytes=dtype_bytes, **k)
  layers: List[ir.Layer] = [
      mk(f"{name}/embeddings", "matmul", 0, 2 * (s + t) * h, vocab * h, (s + t) * h,
         io_bytes=2 * (s + t) * _INT32)]

  def ffn_layers(pre, q):
    return [mk(f"{pre}/ffn/dense_1", "matmul", 2 * q * h * f, _GELU * q * f, h * f + f, 2 * q * f),
            mk(f"{pre}/ffn/dense_2", "matmul", 2 * q * f * h, (1 + _LN) * q * h, f * h + 3 * h,
               2 * q * h)]

  def self_attention_layers(pre, q):  # q tokens attend to themselves
    return [
        mk(f"{pre}/self_attention/qkv", "matmul", 6 * q * h * h, 0, 3 * h * h + 3 * h, 3 * q * h),
        mk(f"{pre}/self_attention/scores", "matmul", 4 * q * q * h, _SOFTMAX * n * q * q, 0,
           2 * n * q * q + q * h),
        mk(f"{pre}/self_attention/output", "matmul", 2 * q * h * h, (1 + _LN) * q * h,
           h * h + 3 * h, 2 * q * h)]

  for i in range(num_layers):
    pre = f"{name}/encoder/layer_{i}"
    layers += self_attention_layers(pre, s) + ffn_layers(pre, s)
  for i in range(num_layers):
    pre = f"{name}/decoder/layer_{i}"
    layers += self_attention_layers(pre, t) + [
        mk(f"{pre}/cross_attention/qkv", "matmul", 2 * t * h * h + 4 * s * h * h, 0,
           3 * h * h + 3 * h, t * h + 2 * s * h),
        mk(f"{pre}/cross_attention/scores", "matmul", 4 * t * s * h, _SOFTMAX * n * t * s, 0,
           2 * n * t * s + t * h),
        mk(f"{pre}/cross_attention/output", "matmul", 2 * t * h * h, (1 + _LN) * t * h,
           h * h + 3 * h, 2 * t * h),
    ] + ffn_layers(pre, t)
  layers += [
      mk(f"{name}/logits", "matmul", 2 * t * h * vocab, 0, 0, t * vocab),
      mk("loss", "loss", 0, (_SOFTMAX + 2) * t * vocab, 0, t * vocab),
  ]
  return ir.LayerGraph(name=name, layers=tuple(layers), captured_batch_size=batch,
                       dtype_bytes=dtype_bytes, optimizer=optimizer, seq_len=seq)


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


def mlp_graph(sizes, batch: int, dtype_bytes: int = 2, weight_dtype_bytes: int = 4,
              optimizer: str = "adam", name: str = "mlp") -> ir.LayerGraph:
  """A fully connected classifier: dense layers sizes[0] -> sizes[1] -> ... -> sizes[-1].

  Per dense a -> b (ReLU after every layer but the last): 2*a*b FLOPs forward (+ b for the
  ReLU); a*b + b params; keeps its b outputs. Host input: sizes[0] fp32 features and an int32
  label per sample. Loss: softmax cross-entropy over sizes[-1] classes.
  """
  slots = _OPT_SLOTS[optimizer]
  mk = lambda *a, **k: _layer(*a, weight_dtype_bytes=weight_dtype_bytes, slots=slots,
                               dtype_bytes=dtype_bytes, **k)
  layers: List[ir.Layer] = []
  for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
    last = i == len(sizes) - 2
    layers.append(mk(f"{name}/dense_{i}", "matmul", 2 * a * b, 0 if last else b, a * b + b, b,
                     io_bytes=(a * 4 + _INT32) if i == 0 else 0.0))
  layers.append(mk("loss", "loss", 0, (_SOFTMAX + 2) * sizes[-1], 0, sizes[-1],
                   token_scaling="none"))
  return ir.LayerGraph(name=name, layers=tuple(layers), captured_batch_size=batch,
                       dtype_bytes=dtype_bytes, optimizer=optimizer, seq_len=0)


def graph_from_params(params: dict, batch: Optional[int] = None) -> ir.LayerGraph:
  """An analytic graph from a params dict's `model` section (no TensorFlow).

  Reads hidden_size, num_hidden_layers, num_heads, filter_size, vocab_size,
  max_sequence_length and (unless `batch` is given) batch_size from `model`, falling back to
  `train_input.batch_size`. `model.name` picks the family: names starting with "gpt" build a
  decoder (`transformer_decoder_graph`), "bert" an encoder with MLM/NSP heads
  (`transformer_encoder_graph`), "transformer" an encoder-decoder.

  Raises:
    ParamsError: a missing or non-positive key, or an unknown family (names them).
  """
  model = params.get("model") if isinstance(params, dict) else None
  if not isinstance(model, dict):
    raise ParamsError("params: missing 'model' section")
  name = str(model.get("name", "")).lower()

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

  shape = dict(num_layers=get("num_hidden_layers"), hidden=get("hidden_size"),
               heads=get("num_heads", "num_attention_heads"),
               ffn=get("filter_size", "intermediate_size"), seq=get("max_sequence_length"),
               vocab=get("vocab_size"), batch=batch or get("batch_size"))
  if name.startswith("gpt"):
    return transformer_decoder_graph(name=name, **shape)
  if name.startswith("bert"):
    return transformer_encoder_graph(name=name, **shape)
  if name.startswith("transformer"):
    return transformer_seq2seq_graph(name=name, **shape)
  raise ParamsError(f"params: key 'model.name' {model.get('name')!r} has no analytic graph; "
                    f"use gpt..., bert... or transformer...")
