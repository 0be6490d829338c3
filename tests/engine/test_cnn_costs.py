"""CNN costs on the wafer (engine/conv.py), priced by hand from cs2.yaml, then asserted.

cs2.yaml: a fabric link carries 32 data bits per cycle per direction at 1.1 GHz = 4.4e9 B/s;
48 KB of SRAM per core; activations fp16 (2 B).
"""

import os
import shutil
import tempfile

import pytest

from cerebras_tf.core import ir
from cerebras_tf.engine import conv, spec

LINK = 4.4e9  # B/s: 32 bits x 1.1 GHz / 8


@pytest.fixture(scope="module")
def cs2():
  return spec.load_engine("cs2")


def conv3x3():
  return ir.Spatial("conv", 56, 56, 56, 56, 64, 64, 3, 3, 1, 1, "SAME")


def test_link_bandwidth(cs2):
  assert conv.link_bytes_per_s(cs2) == pytest.approx(LINK)


def test_3x3_conv_tiled_8x8_over_64_cores(cs2):
  # 3x3, stride 1, 'same', 56x56x64 -> 64, output tiled 8 x 8 over 64 cores: 7 x 7 tiles.
  s = conv3x3()
  t = conv.tiling(s, 8, 8, 1)
  assert (t.tile_h, t.tile_w, t.c_group, t.cores) == (7, 7, 64, 64)
  # MACs per core: 7 x 7 outputs x 64 channels x 3 x 3 x 64 inputs = 1,806,336
  # (the whole conv: 56 x 56 x 64 x 576 = 115,605,504 = 64 x 1,806,336).
  assert conv.macs_per_core(s, t) == 1806336
  assert conv.total_macs(s) == 64 * 1806336
  # Halo: k - s = 2 rows and 2 columns (1 on each side) of the 7 x 7 input tile, 64 channels:
  # (2 x 7 + 2 x 7 + 2 x 2 corners) x 64 x 2 B = 32 x 128 = 4,096 B per core per sample
  # forward; training adds the output gradient's border, 64 channels: another 4,096 B.
  assert conv.halo_bytes(s, t, 2, training=False) == 4096
  assert conv.halo_bytes(s, t, 2, training=True) == 8192
  # Time: rows first, 1 row x 7 x 64 x 2 B = 896 B per link; then columns extended by the rows
  # received (carrying the corners), 1 x 9 x 64 x 2 B = 1,152 B: 2,048 B / 4.4e9 B/s
  # = 465.45 ns forward, twice that in training.
  assert conv.halo_time_s(s, t, cs2, 2, training=False) == pytest.approx(2048 / LINK)
  assert conv.halo_time_s(s, t, cs2, 2, training=False) == pytest.approx(465.45e-9, rel=1e-4)
  assert conv.halo_time_s(s, t, cs2, 2, training=True) == pytest.approx(930.91e-9, rel=1e-4)
  # Memory: 3 x 3 x 64 x 64 = 36,864 filter params per core at 8 B (fp32 weight + gradient)
  # = 294,912 B alone: more than a core's 49,152 B, so on 64 cores this conv does not fit.
  assert conv.weight_params(s, t) == 36864
  layer = ir.Layer("c", "matmul", 2.0 * 64 * 1806336, 4.0 * 64 * 1806336, 36864, 4 * 36864,
                   4 * 36864, 8 * 36864, 56 * 56 * 64 * 2.0, spatial=(s,))
  c = conv.layer_cost(layer, 64, cs2, 2)
  assert not c.fits and c.core_bytes > cs2.sram_per_core_bytes


def test_1x1_conv_has_no_halo(cs2):
  s = ir.Spatial("conv", 56, 56, 56, 56, 64, 256, 1, 1, 1, 1, "SAME")
  t = conv.tiling(s, 8, 8, 1)
  assert conv.halo_bytes(s, t, 2) == 0
  assert conv.halo_time_s(s, t, cs2, 2) == 0


def test_2x2_stride_2_pool_has_no_halo_3x3_stride_2_has_one_row(cs2):
  # Windows of 2 with stride 2 do not overlap: k - s = 0.
  s = ir.Spatial("maxpool", 56, 56, 28, 28, 64, 64, 2, 2, 2, 2, "VALID")
  t = conv.tiling(s, 4, 4, 1)
  assert conv.halo_bytes(s, t, 2) == 0
  # ResNet's 3x3 stride-2 pool overlaps by k - s = 1: on 7 x 7 output tiles (14 x 14 input)
  # 1 row x 14 + 1 column x 14 + 1 corner = 29 x 64 channels x 2 B = 3,712 B forward.
  s = ir.Spatial("maxpool", 56, 56, 28, 28, 64, 64, 3, 3, 2, 2, "SAME")
  t = conv.tiling(s, 4, 4, 1)
  assert (t.tile_h, t.tile_w) == (7, 7)
  assert conv.halo_bytes(s, t, 2, training=False) == 3712


def test_one_tile_dimension_has_no_halo():
  s = conv3x3()
  assert conv.halo_rows(s, conv.tiling(s, 1, 8, 1)) == (0, 2)
  assert conv.halo_rows(s, conv.tiling(s, 1, 1, 1)) == (0, 0)


def test_batch_norm_reduction_grows_with_log2_cores(cs2):
  # 64 channels: a level sends (sum, sum of squares) in fp32 = 512 B over a link, 116.36 ns,
  # plus one hop, 1 cycle = 0.909 ns: 117.27 ns. Up and down the tree: 2 x log2(cores) levels.
  level = 512 / LINK + 1 / 1.1e9
  assert conv.norm_reduce_s(64, 64, cs2, training=False) == pytest.approx(2 * 6 * level)
  assert conv.norm_reduce_s(64, 64, cs2, training=False) == pytest.approx(1.4073e-6, rel=1e-4)
  assert conv.norm_reduce_s(64, 4096, cs2, training=False) == pytest.approx(2 * 12 * level)
  # Training reduces again in backward; one core has nothing to reduce.
  assert conv.norm_reduce_s(64, 4096, cs2) == pytest.approx(4 * 12 * level)
  assert conv.norm_reduce_s(64, 1, cs2) == 0


def test_tiling_choice_fits_sram_and_uneven_tiles_cost(cs2):
  # On 3,000 cores the 3x3 conv above needs channel groups to fit: 8 groups hold 3 x 3 x 64 x 8
  # = 4,608 params x 8 B = 36,864 B of filters; 3,000 / 8 = 375 spatial tiles -> 19 x 19 of
  # 3 x 3 outputs (57 > 56: the last row and column are short).
  layer = ir.Layer("c", "matmul", 2.0 * 64 * 1806336, 4.0 * 64 * 1806336, 36864, 4 * 36864,
                   4 * 36864, 8 * 36864, 56 * 56 * 64 * 2.0, spatial=(conv3x3(),))
  c = conv.layer_cost(layer, 3000, cs2, 2)
  assert c.fits and c.core_bytes <= cs2.sram_per_core_bytes
  (o,) = c.ops
  assert (o.tiling.rows, o.tiling.cols, o.tiling.groups) == (19, 19, 8)
  # Evenness: ideal 115,605,504 / 3,000 = 38,535.2 MACs per core; the largest tile does
  # 3 x 3 x 8 x 576 = 41,472: 92.9%.
  assert c.tiling_efficiency == pytest.approx(38535.168 / 41472, rel=1e-6)
  assert "19x19 tiles of 3x3 x 8 channel groups" in conv.describe(c)


def test_input_channel_split_when_no_output_tiling_fits(cs2):
  # A 3x3 'same' conv 4x4x1024 -> 4x4x512 (a ResNet conv5-like layer on a small image):
  # P = 3 x 3 x 1024 x 512 = 4,718,592 params; weight + gradient 8 B/param, Adam 8 B/param.
  # On 8,192 cores (= its 4 x 4 x 512 outputs) the optimizer share is 4,718,592 x 8 / 8,192
  # = 4,608 B per core, leaving 44,544 B. Without an input split the smallest filter share is
  # one output channel: 3 x 3 x 1024 x 8 B = 73,728 B: no output/spatial tiling fits.
  s = ir.Spatial("conv", 4, 4, 4, 4, 1024, 512, 3, 3, 1, 1, "SAME")
  p = 9 * 1024 * 512
  macs = 4 * 4 * 512 * 9 * 1024
  layer = ir.Layer("c", "matmul", 2.0 * macs, 4.0 * macs, p, 4 * p, 4 * p, 8 * p,
                   4 * 4 * 512 * 2.0, spatial=(s,))
  assert all(conv.weight_params(s, t) * 8 > 44544 for t in conv.candidates(s, 8192))
  c = conv.layer_cost(layer, 8192, cs2, 2)
  assert c.fits
  (o,) = c.ops
  # Chosen: the whole 4 x 4 output on one tile (no halo), 512 groups of 1 output channel, the
  # 1024 inputs split 16 ways (64 each): 1 x 1 x 512 x 16 = 8,192 cores, 4 x 4 x 1 x 9 x 64
  # = 9,216 MACs per core = 75,497,472 / 8,192 (even). Per core: filters 3 x 3 x 64 x 8 B
  # = 4,608 B; input tile with its 1-pixel border (6 x 6 x 64 x 2 B) 4,608 B + output 4 x 4
  # x 2 B = 32 B; + the 4,608 B optimizer share = 13,856 B.
  t = o.tiling
  assert (t.rows, t.cols, t.groups, t.splits, t.c_split) == (1, 1, 512, 16, 64)
  assert o.macs_per_core == 9216 and c.tiling_efficiency == 1.0
  assert c.core_bytes == 13856
  # The partial-sum tree: log2 16 = 4 levels, each the 16-element output tile in fp32 (64 B,
  # 14.545 ns at 4.4e9 B/s) + one hop (0.909 ns); training sends the fp16 gradient tile back
  # down (32 B, 7.273 ns + 0.909 ns): 4 x 15.455 + 4 x 8.182 = 94.55 ns per sample.
  assert o.split_s == pytest.approx(4 * (64 / LINK + 1 / 1.1e9) + 4 * (32 / LINK + 1 / 1.1e9))
  assert o.split_s == pytest.approx(94.55e-9, rel=1e-3)
  assert o.halo_s == 0
  # Why 16 ways: 4 ways (2 x 2 tiles of 2 x 2, 256 channels each) also fits (31,240 B), but
  # its halo, (1 x 2 + 1 x 4) x 256 x 2 B = 3,072 B over a link = 698 ns, costs more than the
  # tree; 32 ways halves the groups and has 5 levels of 32 elements: 227.3 ns.
  t4 = conv.tiling(s, 2, 2, 512, 4)
  assert conv.halo_time_s(s, t4, cs2, 2, training=False) == pytest.approx(3072 / LINK)
  t32 = conv.tiling(s, 1, 1, 256, 32)
  assert conv.split_reduce_s(t32, cs2, 2) == pytest.approx(227.27e-9, rel=1e-3)
  assert "x 16 input-channel splits" in conv.describe(c) and "split reduce 0.095 us" in \
      conv.describe(c)
  # A conv an output tiling already fits is never split (a split only adds a reduction).
  small = conv.layer_cost(ir.Layer("c", "matmul", 2.0 * 64 * 1806336, 4.0 * 64 * 1806336,
                                   36864, 4 * 36864, 4 * 36864, 8 * 36864,
                                   56 * 56 * 64 * 2.0, spatial=(conv3x3(),)), 3000, cs2, 2)
  assert small.ops[0].tiling.splits == 1 and small.ops[0].split_s == 0


def test_layer_roundtrips_spatial_through_json():
  layer = ir.Layer("c", "matmul", 1.0, 2.0, 0, 0, 0, 0, 0.0, spatial=(conv3x3(),))
  g = ir.LayerGraph("g", (layer,), 1)
  assert ir.LayerGraph.from_dict(g.to_dict()) == g


# ---- TF-heavy: the reference CNN and a keras.applications model compile with conv costs ----

def _compile(model, batch, strategy):
  from cerebras_tf import CerebrasEstimator, CSConfig, CSRunConfig, keras_model  # pylint: disable=import-outside-toplevel
  from cerebras_models.cnn import foreign  # pylint: disable=import-outside-toplevel
  tmp = tempfile.mkdtemp(prefix="cnn_costs_")
  try:
    # The bare model_fn: compiling needs no warm-start checkpoint (ResNet50's took 12 s).
    est = CerebrasEstimator(keras_model.model_fn_from_keras(model), config=CSRunConfig(
        model_dir=tmp, cs_config=CSConfig(engine="cs2", execution_strategy=strategy)))
    result = est.compile(foreign.input_fn_for(model, batch))
    report = open(os.path.join(est.compile_dir, "report.txt")).read()
    return result, report
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


def test_reference_cnn_report_lists_conv_tiling_and_halo():
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from cerebras_models.cnn import model as cnn  # pylint: disable=import-outside-toplevel
  from cerebras_tf.params import load_params  # pylint: disable=import-outside-toplevel
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  params = load_params(os.path.join(root, "configs", "params_cnn_digits.yaml"))
  model = cnn.build_keras_model(params["model"], params["optimizer"])
  result, report = _compile(model, 32, "pipelined")
  tf.keras.backend.clear_session()
  convs = {l.name: l for l in result.graph.layers if l.spatial}
  # conv0: 3x3 'same' on the 8x8x1 digit -> 16 channels (configs/params_cnn_digits.yaml).
  (s,) = [s for s in convs["conv0"].spatial if s.op == "conv"]
  assert (s.in_h, s.in_w, s.c_in, s.c_out, s.k_h, s.stride_h) == (8, 8, 1, 16, 3, 1)
  assert result.plan.fits
  assert "conv 3x3/1 8x8x1->8x8x16" in report and "B/core/sample" in report
  # No CNN rate was ever published (validation/README.md): the band says it is not a CNN's.
  band = next(l for l in report.splitlines() if l.startswith("band:"))
  assert "no CNN throughput has been published" in band


def test_keras_resnet50_compiles_with_conv_costs():
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from cerebras_models.cnn import foreign  # pylint: disable=import-outside-toplevel
  result, report = _compile(foreign.resnet50(), 8, "weight_streaming")
  tf.keras.backend.clear_session()
  kinds = {s.op for l in result.graph.layers for s in l.spatial}
  assert {"conv", "batchnorm", "maxpool"} <= kinds
  # The stem: 7x7 stride 2 on 96x96x3 (padded to 102x102 by ZeroPadding2D, 'valid') -> 48x48x64.
  stem = [s for l in result.graph.layers for s in l.spatial if s.k_h == 7]
  assert stem and (stem[0].in_h, stem[0].out_h, stem[0].c_out, stem[0].stride_h) == \
      (102, 48, 64, 2)
  assert result.plan.fits
  assert "conv 7x7/2 102x102x3->48x48x64" in report and "norm reduce" in report


def _chain(*norms):
  """Layers l0.. with the given batch-norm flags (FLOPs so every one works)."""
  return ir.LayerGraph("chain", tuple(ir.Layer(f"l{i}", "elementwise", 1e3, 2e3, 0, 0, 0, 0,
                                                100.0, batch_norm=bn)
                                       for i, bn in enumerate(norms)), 10)


def test_batch_norm_cuts_a_training_pipeline_into_segments_run_in_turn():
  # l0 (batch norm), l1, l2 (batch norm), l3 at 1, 2, 3, 1 us a sample, batch 10. Streamed
  # straight through, the slowest layer paces all: 10 x 3 = 30 us. A batch norm hands nothing
  # on before the whole batch has arrived, so segments [l0], [l1 l2], [l3] run in turn:
  # 10 x (1 + 3 + 1) = 50 us. Forward-only steps use the moving statistics: no barrier.
  from cerebras_tf.core import plans  # pylint: disable=import-outside-toplevel
  from cerebras_tf.engine import perf  # pylint: disable=import-outside-toplevel
  g = _chain(True, False, True, False)
  times = [1e-6, 2e-6, 3e-6, 1e-6]
  assert [list(s) for s in perf.batch_segments(g)] == [[0], [1, 2], [3]]
  assert perf.pipelined_busy_s(times, g, 10) == pytest.approx(50e-6)
  evaluation = plans.PlanOptions(batch_size=10, phase="eval")
  assert perf.pipelined_busy_s(times, g, 10, evaluation) == pytest.approx(30e-6)
  assert perf.pipelined_busy_s(times, _chain(False, False, False, False), 10) == \
      pytest.approx(30e-6)
  # Memory: no backward starts before the whole batch has passed the last batch norm, so
  # l0..l2 keep all 10 samples' activations; l3, after it, only those in flight.
  cs2 = spec.load_engine("cs2")
  flight = perf.in_flight_samples(times, g, cs2, None, 10)
  plain = perf.in_flight_samples(times, _chain(False, False, False, False), cs2, None, 10)
  assert flight[:3] == [10, 10, 10] and flight[3] == plain[3] < 10


def test_a_pipelined_batch_norm_cnn_pays_its_segments_and_says_so(cs2, bn_cnn_layer):
  # The hand-built CNN layer (conv + batch norm) then the same conv without one: two
  # segments. Its step is the segments' busy time + the drain + the host's per-step overhead,
  # and the report names the barrier; the same graph without the norm streams through.
  import dataclasses  # pylint: disable=import-outside-toplevel
  from cerebras_tf.compiler.plan import get_planner  # pylint: disable=import-outside-toplevel
  from cerebras_tf.core import plans  # pylint: disable=import-outside-toplevel
  from cerebras_tf.engine import perf  # pylint: disable=import-outside-toplevel
  conv_only = dataclasses.replace(bn_cnn_layer, name="c1", spatial=bn_cnn_layer.spatial[:1])
  opts = plans.PlanOptions(batch_size=64, execution_strategy="pipelined")
  results = {}
  for name, first in (("bn", bn_cnn_layer), ("plain", dataclasses.replace(
      bn_cnn_layer, spatial=bn_cnn_layer.spatial[:1]))):
    g = ir.LayerGraph("cnn", (first, conv_only), 64)
    plan = get_planner("pipelined").plan(g, cs2, opts)
    pf = perf.simulate(plan, g, cs2, opts)
    times = perf.placed_times(plan, g, cs2, opts)
    busy = (times[0] + times[1]) * 64 if name == "bn" else max(times) * 64
    assert pf.step_time_s == pytest.approx(busy + perf.drain_s(plan, g, cs2, opts) +
                                           cs2.pipelined_step_overhead_s, rel=1e-9)
    # PE utilization: each layer computes for its own time out of the per-sample interval,
    # which across the barrier is both segments' times in turn.
    per, _ = perf.pipelined_pe_utilization(plan, g, cs2, opts)
    for u, p, l in zip(per, perf.replica_layers(plan), g.layers):
      assert u == pytest.approx(perf.pe_utilization(l.flops, p.cores, busy / 64, cs2))
      assert p.pe_utilization == pytest.approx(u)  # the report's column: the same figure
    results[name] = pf
  # The trace: bn0's segment goes forward, then c1's; backward in reverse order (c1's first).
  ev = {(e.name, e.track): e for e in results["bn"].timeline}
  assert ev["fwd", "c1"].start_s >= ev["fwd", "bn0"].start_s + ev["fwd", "bn0"].dur_s
  assert ev["bwd", "c1"].start_s >= ev["fwd", "c1"].start_s + ev["fwd", "c1"].dur_s
  assert ev["bwd", "bn0"].start_s >= ev["bwd", "c1"].start_s + ev["bwd", "c1"].dur_s
  assert max(e.start_s + e.dur_s for e in results["bn"].timeline) <= \
      results["bn"].step_time_s * (1 + 1e-9)
  (note,) = [n for n in results["bn"].notes if n.startswith("batch norm is a batch barrier")]
  assert "(bn0)" in note and "runs as 2 segments one after another" in note
  (flight,) = [n for n in get_planner("pipelined").plan(
      ir.LayerGraph("cnn", (bn_cnn_layer, conv_only), 64), cs2, opts).notes
      if n.startswith("in-flight")]
  assert "layer 0 holds 64 samples" in flight and "the whole batch up to the last batch norm" \
      in flight
  assert not any(n.startswith("batch norm is") for n in results["plain"].notes)
  assert results["bn"].samples_per_sec < results["plain"].samples_per_sec
