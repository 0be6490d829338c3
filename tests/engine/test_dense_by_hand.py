"""One dense layer, priced by hand from cerebras_tf/engine/specs/cs2.yaml, then asserted.

The layer: batch 1, x[1024] @ W[1024, 1024] (no bias), Adam. Dtype assumption for this hand
example: everything fp16 (2 bytes): weights, gradients, both Adam slots and activations.

FLOPs per sample (a multiply-add = 2 FLOPs):
  forward   2 * 1024 * 1024            = 2,097,152
  backward  2 x forward (dX and dW)    = 4,194,304
  total                                = 6,291,456
Bytes:
  weights   1,048,576 params * 2 B     = 2,097,152
  gradients                            = 2,097,152
  Adam      2 slots * 2,097,152        = 4,194,304
  state                                = 8,388,608
  activation (output, 1024 fp16)       = 2,048 B/sample; L = 1 layer, i = 0 -> 2*(L-i) = 2
                                          samples in flight -> 4,096 B
  memory                               = 8,392,704 B -> ceil(/49,152) = 171 cores minimum
cs2.yaml: grid 757 x 996 = 753,972 usable cores, 48 KB each; 8 FLOPs/cycle/core at 1.1 GHz
  = 8.8e9 FLOP/s per core; calibrated pipelined efficiency 0.449 -> 3.9512e9 FLOP/s per core;
  per-layer token latency 455 cycles / 1.1 GHz = 413.636 ns per token (1 token: not a sequence).
Useful cores: the compiler stops where compute is 5% of the latency:
  6,291,456 / (3.9512e9 * 0.05 * 413.636e-9) = 76,988 cores -> ceil(76,988 / 996) = 78 columns.
Placement: Region(0, 0, 78, 996) = 77,688 cores; the other 679 columns stay idle.
Per sample: 6,291,456 / (77,688 * 3.9512e9) = 20.496 ns compute + 413.636 ns latency
  = 434.132 ns -> 2,303,445 samples/s.
Host I/O: 12 x 100 Gb/s = 150e9 B/s; input 1024 fp16 = 2,048 B/sample -> 73,242,187.5 samples/s,
so the layer is compute(latency)-bound: the step (batch 1) takes 434.132 ns.
Utilization: 2,303,445 * 6,291,456 / 7.48e15 = 0.0019374 - a one-layer model cannot use the
wafer, which is what multi_replica is for.
"""

import dataclasses

import pytest

from cerebras_tf.core import ir
from cerebras_tf.core import plans
from cerebras_tf.compiler.plan import get_planner
from cerebras_tf.engine import perf, spec


def dense_graph(batch=1):
  n = 1024 * 1024
  layer = ir.Layer(name="dense", kind="matmul", fwd_flops=2.0 * n, bwd_flops=4.0 * n,
                   num_params=n, weight_bytes=2 * n, grad_bytes=2 * n, optimizer_bytes=4 * n,
                   activation_bytes=2048.0, io_bytes=2048.0)
  return ir.LayerGraph(name="dense1024", layers=(layer,), captured_batch_size=batch)


@pytest.fixture(scope="module")
def cs2():
  return spec.load_engine("cs2")


def test_cs2_figures_used_by_hand(cs2):
  assert (cs2.grid_width, cs2.grid_height, cs2.usable_cores) == (757, 996, 753972)
  assert cs2.sram_per_core_bytes == 49152
  assert cs2.flops_per_core_per_s == pytest.approx(8.8e9)
  assert cs2.pipelined_efficiency == pytest.approx(0.449)
  assert cs2.pipelined_token_latency_cycles == 455
  assert cs2.peak_flops == pytest.approx(7.48e15)
  assert cs2.io_bytes_per_s == pytest.approx(150e9)


def test_dense_layer_by_hand(cs2):
  g = dense_graph()
  assert g.flops_per_sample == 6291456
  assert g.state_bytes == 8388608
  opts = plans.PlanOptions(batch_size=1)
  plan = get_planner("pipelined").plan(g, cs2, opts)
  assert plan.fits
  assert plan.memory_needed_bytes == 8392704
  (p,) = plan.layers
  assert p.region == plans.Region(0, 0, 78, 996)
  assert p.cores == 77688
  assert p.cores * cs2.sram_per_core_bytes >= 171 * 49152
  assert p.flops == 6291456
  perf_ = perf.simulate(plan, g, cs2, opts)
  assert perf_.compute_samples_per_sec == pytest.approx(2303445, rel=1e-5)
  assert perf_.io_samples_per_sec == pytest.approx(73242187.5)
  assert perf_.samples_per_sec == pytest.approx(2303445, rel=1e-5)
  assert perf_.bottleneck == "compute: dense"
  assert perf_.step_time_s == pytest.approx(434.132e-9, rel=1e-5)
  assert p.time_s == pytest.approx(434.132e-9, rel=1e-5)
  assert perf_.utilization == pytest.approx(0.0019374, rel=1e-4)


def test_io_bound_when_the_input_is_big(cs2):
  # 64 KB of input per sample: 150e9 / 65,536 = 2,288,818.4 samples/s < 2,303,445 compute.
  g = dense_graph()
  g = ir.LayerGraph(g.name, (dataclasses.replace(g.layers[0], io_bytes=65536.0),), 1)
  opts = plans.PlanOptions(batch_size=1)
  perf_ = perf.simulate(get_planner("pipelined").plan(g, cs2, opts), g, cs2, opts)
  assert perf_.samples_per_sec == pytest.approx(2288818.4, rel=1e-6)
  assert perf_.bottleneck == "io: 12 x 100 GbE host links"
