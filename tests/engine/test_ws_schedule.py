"""The weight-streaming step prices each candidate micro-batch from per-layer terms built once
per `perf.ws_cost` call (the calibration fit calls it thousands of times). Its numbers must be
the ones of the straightforward per-candidate computation it replaced, kept here as the slow
reference (`_reference_layer`, `_reference_totals`), bit for bit, and a one-layer step is
checked by hand.
"""

import dataclasses
import math

import pytest

from cerebras_tf.analysis import analytic
from cerebras_tf.core import ir, plans
from cerebras_tf.engine import conv, perf, spec


def _reference_layer(l, graph, engine, options, m, recompute, vts=True):
  """One layer's WSLayerCost for micro-batches of m, computed from scratch (the former
  perf._ws_layer)."""
  rate = engine.usable_cores * engine.flops_per_core_per_s * engine.weight_streaming_efficiency
  sp = options.sparsity
  train = perf.training(options)
  fs, _ = perf.vts_scale(l, options, vts)
  g = perf.gemm_fraction(l, graph)
  keep = g * (1.0 - sp) + (1.0 - g)
  redo = l.fwd_flops if (recompute and perf.block_of(l.name) is not None) else 0.0
  flops = (perf.layer_flops(l, options) + redo) * fs * keep
  passes = perf.WS_PASSES if train else 1
  ps = passes * math.sqrt(l.num_params) * engine.sparsity_partial_sum_cycles if g >= 0.5 else 0.0
  flop_s = m * flops / rate
  cnn = conv.layer_cost(l, engine.usable_cores, engine, graph.dtype_bytes, train)
  compute = flop_s + ps / engine.clock_hz + (m * cnn.time_extra_s if cnn else 0.0)
  bw = engine.memoryx_bandwidth_bytes_per_s
  stream_in = (2.0 if train else 1.0) * l.num_params * perf.ws_streamed_bytes_per_param(
      graph, sp) / bw
  grad = (l.grad_bytes * ((1.0 - sp) if sp > 0 else 1.0) / bw) if train else 0.0
  return perf.WSLayerCost(l.name, compute, stream_in, 0.0, grad, "", flop_s=flop_s)


def _reference_totals(graph, engine, options, b, m, recompute):
  """(layers with their bound, layer-loop seconds, seconds by bound) of k = ceil(b / m) equal
  micro-batches: every micro-batch but the last pays max(compute, stream-in, stream-out), the
  last adds the gradients' stream-out."""
  k = math.ceil(b / m)
  m_eff = b / k
  by = {"compute": 0.0, "stream-in": 0.0, "stream-out": 0.0}
  total, out = 0.0, []
  for l in graph.layers:
    c = _reference_layer(l, graph, engine, options, m_eff, recompute)
    mid = max(c.compute_s, c.stream_in_s, c.stream_out_s)
    last = max(c.compute_s, c.stream_in_s, c.stream_out_s + c.grad_out_s)
    bound = ("compute" if c.compute_s >= max(c.stream_in_s, c.stream_out_s + c.grad_out_s)
             else "stream-in" if c.stream_in_s >= c.stream_out_s + c.grad_out_s
             else "stream-out")
    for count, terms in ((k - 1, (c.compute_s, c.stream_in_s, c.stream_out_s)),
                         (1, (c.compute_s, c.stream_in_s, c.stream_out_s + c.grad_out_s))):
      by[("compute", "stream-in", "stream-out")[terms.index(max(terms))]] += count * max(terms)
    total += (k - 1) * mid + last
    out.append(dataclasses.replace(c, bound=bound))
  return tuple(out), total, by


def _cnn_graph():
  """Six 3x3 convs of 8 channels on 16x16, each with a batch norm (image-op costs apply)."""
  layers = []
  for i in range(6):
    bn = ir.Spatial("batchnorm", 16, 16, 16, 16, 8, 8)
    cv = ir.Spatial("conv", 16, 16, 16, 16, 1 if i == 0 else 8, 8, 3, 3)
    layers.append(ir.Layer(f"cnn/block_{i}/conv", "elementwise", 2.0e5, 4.0e5, 80, 320, 640,
                           1280, 8192.0, spatial=(cv, bn)))
  return ir.LayerGraph("cnn", tuple(layers), 64)


CASES = [
    ("bert_base", lambda: analytic.bert_base(seq=128, batch=256), 256, {}, (256, 64, 7)),
    ("gpt3_xl sparse", lambda: analytic.gpt3_xl(seq=2048, batch=64), 64, {"sparsity": 0.5},
     (64, 5)),
    ("gpt3_xl eval", lambda: analytic.gpt3_xl(seq=2048, batch=64), 64, {"phase": "eval"},
     (64, 3)),
    ("bert_base vts", lambda: analytic.bert_base(seq=128, batch=256), 256,
     {"vts": True, "token_fraction": 0.6, "token_sq_fraction": 0.4}, (32,)),
    ("cnn", _cnn_graph, 64, {}, (64, 4)),
]


@pytest.mark.parametrize("name,build,batch,kw,micro", CASES, ids=[c[0] for c in CASES])
def test_the_step_is_the_per_candidate_computation(name, build, batch, kw, micro):
  del name
  graph, cs2 = build(), spec.load_engine("cs2")
  opts = plans.PlanOptions(batch_size=batch, execution_strategy="weight_streaming", **kw)
  for m in micro:
    cost = perf.ws_cost(graph, cs2, opts, micro_batch=m)
    layers, total, by = _reference_totals(graph, cs2, opts, batch, m, cost.recompute_fraction > 0)
    assert cost.layers == layers  # exact: the same floats, not approximately
    got = dict(cost.time_by_bound)
    if "io" not in got:
      for k, v in by.items():
        assert got[k] == v, (m, k)
      spill = got.get("activation spill", 0.0)
      assert cost.compute_step_s == total + cost.latency_s + cost.overhead_s + spill


def test_one_dense_layer_by_hand():
  # One dense layer of P = 1,048,576 weights (1024 x 1024), no sequence: 2P forward and 4P
  # backward FLOPs a sample, so all of them are GEMM work (6 P / flops = 1). A batch of 8 in
  # micro-batches of 4 (k = 2). With R = usable cores x FLOP/s per core x WS efficiency:
  #   compute = 4 x 6P / R + 3 passes x sqrt(P) = 1024 x partial-sum cycles / clock
  #   stream-in = 2 passes x P x 2 bytes (fp16) / MemoryX bandwidth
  #   gradients (last micro-batch) = 4P bytes (fp32 grads) / MemoryX bandwidth
  #   layer loop = (k - 1) x max(compute, stream-in) + max(compute, stream-in, gradients)
  P = 1024 * 1024
  layer = ir.Layer("dense", "matmul", 2.0 * P, 4.0 * P, P, 2 * P, 4 * P, 8 * P, 4096.0)
  graph = ir.LayerGraph("one", (layer,), 8)
  e = spec.load_engine("cs2")
  cost = perf.ws_cost(graph, e, plans.PlanOptions(batch_size=8, execution_strategy=
                                                  "weight_streaming"), micro_batch=4)
  rate = e.usable_cores * e.flops_per_core_per_s * e.weight_streaming_efficiency
  compute = 4 * 6.0 * P / rate + 3 * 1024 * e.sparsity_partial_sum_cycles / e.clock_hz
  stream_in = 2 * P * 2 / e.memoryx_bandwidth_bytes_per_s
  grads = 4 * P / e.memoryx_bandwidth_bytes_per_s
  assert cost.num_micro == 2 and cost.micro_batch == 4
  (c,) = cost.layers
  assert c.compute_s == pytest.approx(compute, rel=1e-12)
  assert c.stream_in_s == pytest.approx(stream_in, rel=1e-12)
  assert c.grad_out_s == pytest.approx(grads, rel=1e-12)
  loop = max(compute, stream_in) + max(compute, stream_in, grads)
  assert cost.compute_step_s - cost.latency_s - cost.overhead_s == pytest.approx(loop, rel=1e-9)
