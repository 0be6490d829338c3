"""CNN costs on the wafer: convolutions, pooling and batch norm on a region of cores. Pure.

A layer with image ops (`ir.Layer.spatial`) placed on a region of n cores tiles each op's
output spatially into `rows x cols` tiles, and the remaining factor of n over output-channel
`groups` (each group of cores holds 1/groups of the filters and computes those channels for
its tile). A conv whose filters overflow a core at every such tiling also splits its input
channels over `splits` cores (each holds c_in / splits of every filter of its group and
computes a partial sum of its output tile; `split_reduce_s`). Per core and sample:
  MACs      tile_h x tile_w x c_group x k_h x k_w x c_split (conv, c_split = c_in / splits;
            depthwise and pooling: no c_in)
  halo      a k x k window with stride s reads k - s input rows (and columns) beyond its own
            tile's s x tile rows: those border rows come from the neighbouring cores. They
            cross the fabric in two phases (rows from the cores above and below, then columns
            from the left and right, extended by the rows just received: that delivers the
            corners without diagonal links), each link carrying its side's share at
            `fabric_link_bits_per_cycle` x clock (32 bits a cycle: 4.4 GB/s on CS-2).
            Training adds the backward pass's halo of the output gradient (c_group channels).
            A 1x1 conv, or a window no larger than its stride (a 2x2 stride-2 pool), has none;
            a dimension cut into one tile has none (its padding is local).
  batch norm  per-channel mean and variance over the whole region: a tree all-reduce of 2
            fp32 partial sums per channel, ceil(log2 n) levels up and as many down, each one
            link message plus a router hop; training does a second one in backward.
  input-channel split  the splits' partial output tiles (fp32, the partial-sum width of seed
            003's "double-wide add") sum up a tree of ceil(log2 splits) levels, each one link
            message of the tile plus a router hop; training broadcasts the output gradient
            tile (fp16) back down the same tree, since every split needs it for its dX and dW.
  memory    the group's filters and their gradient accumulators (the layer's weight + gradient
            bytes per parameter), the optimizer state spread over the region, and the largest
            op's input tile with its halo plus its output tile. More than a core's SRAM:
            the layer does not fit on that region.
The tiling is the fitting one with the least time per sample (the largest tile's MACs at the
calibrated rate plus the halo exchange). The halo is added to the compute, not overlapped
with it: the border outputs wait for it (an upper bound; the interior could overlap it).
"""

import dataclasses
import functools
import math
from typing import Optional, Tuple

from cerebras_tf.core import ir

_FP32 = 4
_WEIGHTED = ("conv", "depthwise")


@dataclasses.dataclass(frozen=True)
class Tiling:
  """One op's output cut into rows x cols spatial tiles x groups of output channels."""

  rows: int
  cols: int
  groups: int
  tile_h: int
  tile_w: int
  c_group: int
  splits: int = 1     # input-channel splits (conv only)
  c_split: int = 0    # input channels per core (conv: ceil(c_in / splits))

  @property
  def cores(self) -> int:
    return self.rows * self.cols * self.groups * self.splits


def tiling(s: ir.Spatial, rows: int, cols: int, groups: int, splits: int = 1) -> Tiling:
  """The tiles of `s`'s output for a rows x cols x groups split (clipped to the output),
  with a conv's input channels split `splits` ways (other ops: 1)."""
  rows, cols = max(1, min(rows, s.out_h)), max(1, min(cols, s.out_w))
  groups = max(1, min(groups, s.c_out))
  splits = max(1, min(splits, s.c_in)) if s.op == "conv" else 1
  return Tiling(rows, cols, groups, math.ceil(s.out_h / rows), math.ceil(s.out_w / cols),
                math.ceil(s.c_out / groups), splits, math.ceil(s.c_in / splits))


def macs_per_core(s: ir.Spatial, t: Tiling) -> float:
  """Forward multiply-adds (window steps for pooling) of the core with the largest tile."""
  per_out = s.k_h * s.k_w * (t.c_split if s.op == "conv" else 1)
  return float(t.tile_h * t.tile_w * t.c_group * per_out)


def total_macs(s: ir.Spatial) -> float:
  """Forward multiply-adds of the whole op, per sample."""
  return macs_per_core(s, tiling(s, 1, 1, 1))


def halo_rows(s: ir.Spatial, t: Tiling) -> Tuple[int, int]:
  """(rows, columns) of input a core receives beyond its own: k - stride per cut dimension."""
  hr = max(0, s.k_h - s.stride_h) if t.rows > 1 else 0
  hc = max(0, s.k_w - s.stride_w) if t.cols > 1 else 0
  return hr, hc


def _in_channels(s: ir.Spatial, t: Tiling) -> int:
  """Input channels a core needs: its split's for a conv (all of them unsplit), its
  group's for the rest."""
  return t.c_split if s.op == "conv" else t.c_group


def halo_elements(s: ir.Spatial, t: Tiling, channels: int) -> Tuple[float, float]:
  """(phase 1, phase 2) elements crossing the busiest link of an interior core: its half of
  the border rows (tile width wide), then its half of the border columns (tile height plus
  the rows just received high, which carries the corners)."""
  hr, hc = halo_rows(s, t)
  in_h, in_w = t.tile_h * s.stride_h, t.tile_w * s.stride_w
  return (math.ceil(hr / 2) * in_w * channels, math.ceil(hc / 2) * (in_h + hr) * channels)


def halo_bytes(s: ir.Spatial, t: Tiling, dtype_bytes: int, training: bool = True) -> float:
  """Bytes an interior core receives per sample: the input's border (+ the output gradient's
  in training): rows x tile width + columns x tile height + the corners, x channels."""
  hr, hc = halo_rows(s, t)
  in_h, in_w = t.tile_h * s.stride_h, t.tile_w * s.stride_w
  per_channel = hr * in_w + hc * in_h + hr * hc
  channels = _in_channels(s, t) + (t.c_group if training else 0)
  return float(per_channel * channels * dtype_bytes)


def link_bytes_per_s(engine) -> float:
  """One fabric link, one direction (ENGINE_FACTS: 32 data bits per cycle)."""
  return engine.fabric_link_bits_per_cycle / 8.0 * engine.clock_hz


def halo_time_s(s: ir.Spatial, t: Tiling, engine, dtype_bytes: int,
                training: bool = True) -> float:
  """Seconds per sample of the two-phase halo exchange (forward; + backward in training)."""
  out = 0.0
  for channels in (_in_channels(s, t),) + ((t.c_group,) if training else ()):
    p1, p2 = halo_elements(s, t, channels)
    out += (p1 + p2) * dtype_bytes / link_bytes_per_s(engine)
  return out


def norm_reduce_s(channels: int, cores: int, engine, training: bool = True) -> float:
  """Tree all-reduce of per-channel (sum, sum of squares) in fp32 over `cores` cores: ceil(log2
  cores) levels up and down, each a 2 x channels x 4 B link message plus one router hop;
  training reduces again in backward (the sums of dy and dy x x-hat)."""
  if cores <= 1:
    return 0.0
  level = 2.0 * channels * _FP32 / link_bytes_per_s(engine) + 1.0 / engine.clock_hz
  return (2 if training else 1) * 2.0 * math.ceil(math.log2(cores)) * level


def split_reduce_s(t: Tiling, engine, dtype_bytes: int, training: bool = True) -> float:
  """Seconds per sample to sum an input-channel split's partial output tiles: ceil(log2
  splits) tree levels, each a link message of the tile in fp32 plus a router hop; training
  sends the output gradient tile (dtype) back down the tree. 0 unsplit."""
  if t.splits <= 1:
    return 0.0
  levels = math.ceil(math.log2(t.splits))
  elems = t.tile_h * t.tile_w * t.c_group
  hop = 1.0 / engine.clock_hz
  out = levels * (elems * _FP32 / link_bytes_per_s(engine) + hop)
  if training:
    out += levels * (elems * dtype_bytes / link_bytes_per_s(engine) + hop)
  return out


def weight_params(s: ir.Spatial, t: Tiling) -> int:
  """Filter parameters one core holds (its group's and split's; pooling and norms: the
  norm's scale and shift per channel)."""
  if s.op == "conv":
    return s.k_h * s.k_w * t.c_split * t.c_group
  if s.op == "depthwise":
    return s.k_h * s.k_w * t.c_group
  return 2 * t.c_group if s.op == "batchnorm" else 0


def tile_bytes(s: ir.Spatial, t: Tiling, dtype_bytes: int) -> float:
  """Activation bytes one core holds for one sample: input tile with halo + output tile."""
  hr, hc = max(0, s.k_h - s.stride_h), max(0, s.k_w - s.stride_w)
  inp = (t.tile_h * s.stride_h + hr) * (t.tile_w * s.stride_w + hc) * _in_channels(s, t)
  return float((inp + t.tile_h * t.tile_w * t.c_group) * dtype_bytes)


@dataclasses.dataclass(frozen=True)
class OpCost:
  """One image op on a region: its tiling and what it costs per core and sample."""

  spatial: ir.Spatial
  tiling: Tiling
  macs_per_core: float
  halo_bytes: float       # per core per sample (forward + backward in training)
  halo_s: float
  reduce_s: float         # batch norm's all-reduce, per sample
  weight_bytes: float     # per core: filters + gradient accumulators
  tile_bytes: float       # per core: input tile with halo + output tile
  split_s: float = 0.0    # input-channel split's partial-sum tree, per sample

  @property
  def time_extra_s(self) -> float:
    return self.halo_s + self.reduce_s + self.split_s


def op_cost(s: ir.Spatial, t: Tiling, engine, dtype_bytes: int, state_per_param: float,
            training: bool = True) -> OpCost:
  """`OpCost` of `s` tiled as `t`; `state_per_param`: weight + gradient bytes per param."""
  reduce = norm_reduce_s(t.c_group, t.rows * t.cols, engine, training) \
      if s.op == "batchnorm" else 0.0
  return OpCost(s, t, macs_per_core(s, t), halo_bytes(s, t, dtype_bytes, training),
                halo_time_s(s, t, engine, dtype_bytes, training), reduce,
                weight_params(s, t) * state_per_param, tile_bytes(s, t, dtype_bytes),
                split_reduce_s(t, engine, dtype_bytes, training))


def candidates(s: ir.Spatial, cores: int):
  """Tilings of `s` on up to `cores` cores: output-channel groups in powers of two, the rest
  spatial, as square as the output allows."""
  g = 1
  while g <= max(1, min(s.c_out, cores)):
    spatial = max(1, cores // g)
    rows = max(1, min(s.out_h, math.isqrt(spatial)))
    yield tiling(s, rows, max(1, min(s.out_w, spatial // rows)), g)
    g *= 2


def split_candidates(s: ir.Spatial, cores: int):
  """A conv's tilings with its input channels also split in powers of two (2 .. c_in), the
  output-channel groups and the spatial tiles as in `candidates` on the rest."""
  if s.op != "conv":
    return
  p = 2
  while p <= max(1, min(s.c_in, cores)):
    g = 1
    while g <= max(1, min(s.c_out, cores // p)):
      spatial = max(1, cores // (g * p))
      rows = max(1, min(s.out_h, math.isqrt(spatial)))
      yield tiling(s, rows, max(1, min(s.out_w, spatial // rows)), g, p)
      g *= 2
    p *= 2


# The planners and the advisor ask for the same ops on the same core counts many times (a
# ResNet's repeated blocks, the planners' searches over core counts, the advisor's re-plans):
# all arguments are values, and OpCost is frozen.
@functools.lru_cache(maxsize=1 << 16)
def best_op_cost(s: ir.Spatial, cores: int, engine, dtype_bytes: int, state_per_param: float,
                 budget: float, training: bool = True) -> Tuple[OpCost, bool]:
  """(the fastest tiling's cost, fits) among `candidates` whose per-core bytes fit `budget`;
  a conv none of them fits tries `split_candidates` (a split costs a reduction, so it is the
  fallback, not a choice); none fitting: the smallest one, fits=False."""
  rate = engine.flops_per_core_per_s * engine.pipelined_efficiency
  passes = 3.0 if training else 1.0
  fit = lambda c: c.weight_bytes + c.tile_bytes <= budget
  costs = [op_cost(s, t, engine, dtype_bytes, state_per_param, training)
           for t in candidates(s, cores)]
  fitting = [c for c in costs if fit(c)]
  if not fitting:
    costs += [op_cost(s, t, engine, dtype_bytes, state_per_param, training)
              for t in split_candidates(s, cores)]
    fitting = [c for c in costs if fit(c)]
  if not fitting:
    return min(costs, key=lambda c: c.weight_bytes + c.tile_bytes), False
  return min(fitting, key=lambda c: 2 * passes * c.macs_per_core / rate + c.time_extra_s), True


@dataclasses.dataclass(frozen=True)
class LayerConvCost:
  """A layer's image ops on a region of `cores` cores (see the module docstring)."""

  cores: int
  ops: Tuple[OpCost, ...]
  core_bytes: float        # per core: all filters + optimizer share + the largest tiles
  fits: bool
  tiling_efficiency: float  # ideal MACs per core / the largest tile's (1: tiles even)

  @property
  def time_extra_s(self) -> float:
    return sum(o.time_extra_s for o in self.ops)

  @property
  def halo_bytes(self) -> float:
    return sum(o.halo_bytes for o in self.ops)


def layer_cost(layer: ir.Layer, cores: float, engine, dtype_bytes: int,
               training: bool = True) -> Optional[LayerConvCost]:
  """`LayerConvCost` of `layer` on `cores` cores; None for a layer without image ops."""
  if not layer.spatial or cores <= 0:
    return None
  n = int(min(cores, max(s.out_h * s.out_w * s.c_out for s in layer.spatial)))
  n = max(1, n)
  per_param = ((layer.weight_bytes + layer.grad_bytes) / layer.num_params
               if layer.num_params else 0.0)
  opt = (layer.optimizer_bytes if training else 0.0) / n
  budget = engine.sram_per_core_bytes - opt
  ops, fits = [], True
  for s in layer.spatial:
    c, ok = best_op_cost(s, n, engine, dtype_bytes, per_param, budget, training)
    ops.append(c)
    fits = fits and ok
  core = opt + sum(o.weight_bytes for o in ops) + max(o.tile_bytes for o in ops)
  ideal = sum(total_macs(o.spatial) / n for o in ops)
  actual = sum(o.macs_per_core for o in ops)
  return LayerConvCost(n, tuple(ops), core, fits and core <= engine.sram_per_core_bytes,
                       min(1.0, ideal / actual) if actual > 0 else 1.0)


def describe(c: LayerConvCost) -> str:
  """One report line: each op's tiling, then the halo, reductions and per-core memory."""
  parts = []
  for o in c.ops:
    s, t = o.spatial, o.tiling
    parts.append(f"{s.op} {s.k_h}x{s.k_w}/{s.stride_h} {s.in_h}x{s.in_w}x{s.c_in}->"
                 f"{s.out_h}x{s.out_w}x{s.c_out}: {t.rows}x{t.cols} tiles of "
                 f"{t.tile_h}x{t.tile_w}" + (f" x {t.groups} channel groups" if t.groups > 1
                                              else "") +
                 (f" x {t.splits} input-channel splits" if t.splits > 1 else ""))
  return (f"{'; '.join(parts)}; halo {c.halo_bytes:,.0f} B/core/sample "
          f"({sum(o.halo_s for o in c.ops) * 1e6:.3f} us), norm reduce "
          f"{sum(o.reduce_s for o in c.ops) * 1e6:.3f} us" +
          (f", split reduce {sum(o.split_s for o in c.ops) * 1e6:.3f} us"
           if any(o.split_s for o in c.ops) else "") +
          f", {c.core_bytes / 1024:.1f} KB/core, "
          f"tiles {c.tiling_efficiency:.0%} even")
