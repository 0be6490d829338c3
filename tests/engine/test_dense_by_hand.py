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
  activation (output, 1024 fp16)       = 2,048 B/sample
cs2.yaml: grid 757 x 996 = 753,972 usable cores, 48 KB each; 8 FLOPs/cycle/core at 1.1 GHz
  = 8.8e9 FLOP/s per core; calibrated pipelined efficiency 0.4196 -> 3.69248e9 FLOP/s per core;
  per-layer token latency 495.8 cycles / 1.1 GHz = 450.727 ns per token (1 token: not a
  sequence); 1 ms of host time per step (assumed, pipelined_step_overhead_s; cs2.yaml).
In flight (memory): priced before placement, with the grid shared by FLOPs: t = 6,291,456 /
  (753,972 * 3.69248e9) + 450.727 ns = 452.987 ns; the round trip from the layer is one hop
  forward and one back, 901.455 ns (no attention barrier), so 1 + ceil(901.455 / 452.987) = 3
  samples, at most the batch: batch 1 -> 1 sample (2,048 B), batch 4096 -> 3 (6,144 B).
  memory (batch 1)                     = 8,390,656 B -> ceil(/49,152) = 171 cores minimum
Useful cores: the compiler stops where compute is 5% of the latency:
  6,291,456 / (3.69248e9 * 0.05 * 450.727e-9) = 75,605 cores -> ceil(75,605 / 996) = 76 columns.
Placement: Region(0, 0, 76, 996) = 75,696 cores; the other 681 columns stay idle.
Per sample: 6,291,456 / (75,696 * 3.69248e9) = 22.509 ns compute + 450.727 ns latency
  = 473.236 ns. PE utilization: 22.509 / 473.236 = 4.756% (the layer is the interval).
Step (batch 1): 473.236 ns + the drain, the sample's round trip back to the layer (2 hops,
  901.455 ns) + 1 ms = 1,001.375 us -> 998.627 samples/s: the host sets the pace. At batch
  4096: 4096 * 473.236 ns + 901.455 ns + 1 ms = 2,939.278 us -> 1,393,539 samples/s.
Host I/O: 12 x 100 Gb/s = 150e9 B/s; input 1024 fp16 = 2,048 B/sample -> 73,242,187.5 samples/s,
so the layer is compute(latency)-bound.
Utilization: 998.627 * 6,291,456 / 7.48e15 = 8.3995e-7 - a one-layer model cannot use the
wafer, which is what multi_replica is for.
"""

import dataclasses

import pytest

from cerebras_tf.core import ir
from cerebras_tf.core import plans
from cerebras_tf.compiler.plan import get_planner
from cerebras_tf.engine import perf, report, spec


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
  assert cs2.pipelined_efficiency == pytest.approx(0.4196)
  assert cs2.pipelined_token_latency_cycles == pytest.approx(495.8)
  assert cs2.pipelined_step_overhead_s == pytest.approx(1e-3)
  assert cs2.peak_flops == pytest.approx(7.48e15)
  assert cs2.io_bytes_per_s == pytest.approx(150e9)


def test_dense_layer_by_hand(cs2):
  g = dense_graph()
  assert g.flops_per_sample == 6291456
  assert g.state_bytes == 8388608
  opts = plans.PlanOptions(batch_size=1)
  plan = get_planner("pipelined").plan(g, cs2, opts)
  assert plan.fits
  assert plan.memory_needed_bytes == 8390656
  # 8,390,656 B under 10 MB reads in MB (it read "0.01 GB"); 37.1 GB = 753,972 x 49,152 B.
  assert plan.reason.startswith("fits: 8.39 MB of 37.1 GB SRAM; 1 layers")
  (p,) = plan.layers
  assert p.region == plans.Region(0, 0, 76, 996)
  assert p.cores == 75696
  assert p.cores * cs2.sram_per_core_bytes >= 171 * 49152
  assert p.flops == 6291456
  assert p.pe_utilization == pytest.approx(22.509 / 473.236, rel=1e-4)
  perf_ = perf.simulate(plan, g, cs2, opts)
  assert perf_.compute_samples_per_sec == pytest.approx(998.627, rel=1e-5)
  assert perf_.io_samples_per_sec == pytest.approx(73242187.5)
  assert perf_.samples_per_sec == pytest.approx(998.627, rel=1e-5)
  # 1,000 us of the 1,001.375 us step is the host's per-step round trip, not the layer.
  assert perf_.bottleneck.startswith("per-step overhead (100% of the step: the host's 1 ms ")
  assert perf_.bottleneck.endswith("slowest layer dense)")
  assert perf_.step_time_s == pytest.approx(1001.375e-6, rel=1e-5)
  assert p.time_s == pytest.approx(473.236e-9, rel=1e-5)
  assert perf_.utilization == pytest.approx(8.3995e-7, rel=1e-4)
  # The drain and the host's step cost are paid once per step: a big batch amortizes them.
  opts = plans.PlanOptions(batch_size=4096)
  plan = get_planner("pipelined").plan(dense_graph(4096), cs2, opts)
  assert plan.memory_needed_bytes == 8388608 + 3 * 2048
  big = perf.simulate(plan, dense_graph(4096), cs2, opts)
  assert big.samples_per_sec == pytest.approx(1393539, rel=1e-5)
  # There the host's 1 ms is 34% of the 2,939.278 us step: the layer names the bottleneck.
  assert big.bottleneck == "compute: dense"
  # Weight streaming at batch 1 is also mostly the host's step (0.001 s of the step).
  opts = plans.PlanOptions(batch_size=1, execution_strategy="weight_streaming")
  plan = get_planner("weight_streaming").plan(g, cs2, opts)
  ws = perf.simulate(plan, g, cs2, opts)
  assert cs2.weight_streaming_step_overhead_s / ws.step_time_s > 0.5
  assert ws.bottleneck.startswith("per-step overhead (") and \
      ws.bottleneck.endswith(" of the step: the host's 1 ms a step, assumed)")


def test_io_bound_when_the_input_is_big(cs2):
  # 128 KB of input per sample: 150e9 / 131,072 = 1,144,409.2 samples/s < 1,393,539 compute
  # (batch 4096, above).
  g = dense_graph(4096)
  g = ir.LayerGraph(g.name, (dataclasses.replace(g.layers[0], io_bytes=131072.0),), 4096,
                    input_value_bytes=4.0)
  opts = plans.PlanOptions(batch_size=4096)
  perf_ = perf.simulate(get_planner("pipelined").plan(g, cs2, opts), g, cs2, opts)
  assert perf_.samples_per_sec == pytest.approx(1144409.2, rel=1e-6)
  assert perf_.bottleneck == "io: 12 x 100 GbE host links"
  # What to change: the same values at 1 B each are 32,768 B a sample, 150e9 / 32,768 =
  # 4,577,636.7 samples/s over the links; the compute bound (1,393,539) would then set the pace.
  (line,) = report.io_lines(g, perf_)
  assert line.endswith("the host sends 131.07 KB per sample at 4 B per value (the input_fn's "
                       "dtypes), 1,144,409.2 samples/s over the links; at 1 B per value (uint8 "
                       "pixels, cast in the model_fn) they would carry 4,577,636.7 (the wafer "
                       "computes 1,393,539.5)")
  assert report.io_lines(dataclasses.replace(g, input_value_bytes=1.0), perf_) == []


def test_cs3_core_is_eight_wide():
  # cs3.yaml: WSE-3 has an 8-wide FP16 SIMD where WSE-2 has 4 (The Next Platform, 2024-03-14):
  # 8 FMACs x 2 FLOPs = 16 FLOPs/cycle/core; peak 900,000 x 16 x 1.0 GHz = 14.4 PFLOP/s.
  # The same dense layer on 75,696 cores, pipelined, CS-2's efficiency 0.4196 (inherited):
  #   CS-3 per core 16 x 1.0e9 x 0.4196 = 6.7136e9 FLOP/s; compute 6,291,456 / (75,696 x
  #   6.7136e9) = 12.380 ns; latency 495.8 cycles / 1.0 GHz = 495.8 ns; total 508.180 ns.
  #   CS-2 per core 8 x 1.1e9 x 0.4196 = 3.69248e9: 22.509 ns + 450.727 ns = 473.236 ns.
  # The wider datapath shows in the compute term (22.509 x 8.8 / 16 = 12.380 ns); the latency
  # term is cycles, and WSE-3's slower clock makes it longer.
  cs2, cs3 = spec.load_engine("cs2"), spec.load_engine("cs3")
  assert cs3.flops_per_core_per_cycle == 16 == 2 * cs2.flops_per_core_per_cycle
  assert cs3.peak_flops == pytest.approx(900_000 * 16 * 1.0e9)
  layer = dense_graph().layers[0]
  g = dense_graph()
  t3 = perf.pipelined_sample_time(layer, 75_696, g, cs3)
  t2 = perf.pipelined_sample_time(layer, 75_696, g, cs2)
  assert t3 == pytest.approx(508.180e-9, rel=1e-4)
  assert t2 == pytest.approx(473.236e-9, rel=1e-4)
