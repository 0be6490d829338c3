"""Compile reports: report.txt, plan.json, wafer.png and timeline.json in the compile dir.

Besides the plan and the prediction, report.txt gives what a user deciding whether to buy time
on the hardware needs: the PE utilization per layer, the forward-only (eval) rate, the
uncertainty band of the prediction (the validation-set error of the nearest class of model,
engine/specs/fidelity_bands.yaml), the three calibration constants the prediction is most
sensitive to, and the advisor's suggestions (registered by the compiler: `register_advisor`).

Pure Python, Pillow and matplotlib (Agg); no TensorFlow.
"""

import dataclasses
import functools
import json
import math
import os
import re
from typing import Callable, Dict, List, Optional

import yaml
from PIL import Image, ImageDraw, ImageFont

from cerebras_tf.core import ir
from cerebras_tf.core import plans
from cerebras_tf.core.plans import fmt_share
from cerebras_tf.engine import perf as perf_model
from cerebras_tf.engine import spec as spec_lib

_GB = 1e9
BANDS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "specs",
                          "fidelity_bands.yaml")
# Calibration constants, the assumed per-step costs and engine figures the sensitivity analysis
# perturbs (the per-step and per-layer costs are what a small model's step is made of).
SENSITIVE = ("pipelined_efficiency", "pipelined_token_latency_cycles",
             "weight_streaming_efficiency", "memoryx_bandwidth_bytes_per_s",
             "sparsity_partial_sum_cycles", "io_link_bits_per_s", "swarmx_hop_latency_s",
             "fabric_link_bits_per_cycle", "pipelined_step_overhead_s",
             "weight_streaming_step_overhead_s", "weight_streaming_layer_overhead_s")
_ADVISORS: List[Callable] = []


def register_advisor(fn: Callable) -> None:
  """Adds fn(graph, plan, performance, engine, options) -> ["advice: ..."] to report.txt (the
  compiler registers its advisor; the engine knows no planner)."""
  if fn not in _ADVISORS:
    _ADVISORS.append(fn)


def default_options(plan: plans.Plan) -> plans.PlanOptions:
  """The options a plan was most likely made with (when the caller does not pass them)."""
  return plans.PlanOptions(
      batch_size=plan.batch_size, execution_strategy=plan.execution_strategy,
      num_csx=plan.num_csx,
      num_replicas=plan.num_replicas if plan.mode.replicates else None)


@functools.lru_cache(maxsize=8)
def _bands_file(path: str, stamp: Optional[tuple]) -> dict:
  """The bands file parsed once a process while unchanged (report.txt reads it at every
  compile)."""
  if stamp is None:
    return {}
  with open(path) as fh:
    return yaml.safe_load(fh) or {}


def load_bands(path: str = BANDS_PATH) -> List[dict]:
  return list(_bands_file(path, spec_lib.file_stamp(path)).get("classes", []))


def load_sweeps(path: str = BANDS_PATH) -> List[dict]:
  """Published batch sweeps against the simulator (fidelity.batch_sweeps, written with the
  bands)."""
  return list(_bands_file(path, spec_lib.file_stamp(path)).get("sweeps", []))


def batch_effect_line(plan: plans.Plan, sweeps: Optional[List[dict]] = None) -> List[str]:
  """One line when published sweeps in the plan's mode gained more from batch than the
  simulator predicts for them (more than 10% apart): its batch advice is then a floor."""
  under = [w for w in (load_sweeps() if sweeps is None else sweeps)
           if w["mode"] == plan.execution_strategy and
           w["published_gain"] > 1.1 * w["predicted_gain"]]
  if not under:
    return []
  runs = ", ".join(f"{w['model']} on {w['system']} {w['published_gain']:.2f}x from batch "
                   f"{w['batches'][0]} to {w['batches'][-1]} (predicted "
                   f"{w['predicted_gain']:.2f}x)" for w in under)
  return [f"batch effect:     published {plan.execution_strategy} runs gained more from batch "
          f"than this model predicts for them: {runs}; read its batch advice as a floor "
          f"(validation/README.md)"]


def band(plan: plans.Plan, graph: ir.LayerGraph, performance: plans.Performance,
         bands: Optional[List[dict]] = None) -> Optional[dict]:
  """{"class", "n", "low", "high", ...}: where the measurement would fall, from the validation
  errors of the nearest class of model (mode, size); None without a class or prediction."""
  if performance is None or not plan.fits or performance.samples_per_sec <= 0:
    return None
  for c in (load_bands() if bands is None else bands):
    hi = c.get("max_params")
    if (plan.execution_strategy in c["modes"] and graph.num_params >= c["min_params"] and
        (hi is None or graph.num_params < hi)):
      p = performance.samples_per_sec
      return dict(c, low=p / (1.0 + c["highest"]), high=p / (1.0 + c["lowest"]))
  return None


def sensitivity(plan: plans.Plan, graph: ir.LayerGraph, engine,
                options: Optional[plans.PlanOptions] = None, top: int = 3) -> List[tuple]:
  """[(constant, elasticity)]: d ln(samples/s) / d ln(constant) for the `top` engine constants
  the prediction moves with most (the plan is kept; each constant is raised by 10%)."""
  options = options or default_options(plan)
  if not plan.fits:
    return []
  base = perf_model.simulate(plan, graph, engine, options).samples_per_sec
  if base <= 0:
    return []
  out = []
  for k in SENSITIVE:
    v = getattr(engine, k, 0.0)
    if not v:
      continue
    e = dataclasses.replace(engine, **{k: v * 1.1})
    sps = perf_model.simulate(plan, graph, e, options).samples_per_sec
    if sps > 0:
      out.append((k, math.log(sps / base) / math.log(1.1)))
  out.sort(key=lambda kv: -abs(kv[1]))
  return [kv for kv in out[:top] if abs(kv[1]) > 1e-3]


def eval_performance(plan, graph, engine, options=None) -> Optional[plans.Performance]:
  """The same plan run forward only (eval / predict): no backward, no optimizer, no drain."""
  options = options or default_options(plan)
  if not plan.fits:
    return None
  try:
    return perf_model.simulate(plan, graph, engine, dataclasses.replace(options, phase="eval"))
  except Exception:  # pylint: disable=broad-except
    return None


def advice_lines(graph, plan, performance, engine, options=None) -> List[str]:
  options = options or default_options(plan)
  out = []
  for fn in _ADVISORS:
    try:
      out.extend(fn(graph, plan, performance, engine, options))
    except Exception as e:  # pylint: disable=broad-except
      out.append(f"advice: not available ({type(e).__name__}: {e})")
  return out


def fmt_bytes(n: float) -> str:
  """Bytes in GB, MB or KB (decimal, as the reports print memory), two decimals."""
  for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
    if abs(n) >= scale:
      return f"{n / scale:.2f} {unit}"
  return f"{n:.0f} B"


def _fmt_rate(x: float) -> str:
  return "inf" if not math.isfinite(x) else f"{x:,.1f}"


def format_summary(plan: plans.Plan, perf: plans.Performance) -> str:
  """A few lines for the console: fit, memory, samples/s, utilization, bottleneck."""
  if plan is None:
    return "cerebras_tf: validation only (no plan)"
  head = (f"{plan.execution_strategy} on {plan.engine}: "
          f"{'fits' if plan.fits else 'DOES NOT FIT'}, SRAM {plans.fmt_gb(plan.memory_needed_bytes)}"
          f" of {plan.memory_available_bytes / _GB:.1f} GB, batch {plan.batch_size}")
  if not plan.fits or perf is None:
    return head + f"\n  {plan.reason}"
  vts = ""
  if perf.padded_samples_per_sec and perf.padded_samples_per_sec != perf.samples_per_sec:
    vts = (f"\n  VTS: {perf.samples_per_sec / perf.padded_samples_per_sec:.2f}x the padded "
           f"{perf.padded_samples_per_sec:,.1f} samples/s")
  # auto says on the console, not only in report.txt, why it picked this strategy.
  why = (f"\n  auto chose it: {plan.reason}"
         if any(n.startswith("auto: chose") for n in plan.notes) else "")
  return (head + f"\n  predicted {perf.samples_per_sec:,.1f} samples/s "
          f"({perf.step_time_s * 1e3:.2f} ms/step), utilization {fmt_share(perf.utilization)}"
          f"{vts}\n  bottleneck: {perf.bottleneck}{why}")


def graph_summary(graph: ir.LayerGraph) -> dict:
  """Totals of a LayerGraph, and its full per-layer content."""
  return {
      "name": graph.name, "num_layers": len(graph.layers), "num_params": graph.num_params,
      "flops_per_sample": graph.flops_per_sample, "state_bytes": graph.state_bytes,
      "activation_bytes_per_sample": sum(l.activation_bytes for l in graph.layers),
      "io_bytes_per_sample": sum(l.io_bytes for l in graph.layers),
      "captured_batch_size": graph.captured_batch_size, "dtype_bytes": graph.dtype_bytes,
      "optimizer": graph.optimizer, "seq_len": graph.seq_len,
      "fingerprint": graph.fingerprint(),
      "layers": [l.to_dict() for l in graph.layers],
  }


def plan_json(graph, plan, perf, engine, options=None) -> dict:
  """The plan.json document (see write_reports)."""
  step = perf.step_time_s if perf and math.isfinite(perf.step_time_s) else None
  layers = []
  for p in plan.layers:
    d = {"name": p.name, "cores": p.cores,
         "region": None if p.region is None else
                   {"x": p.region.x, "y": p.region.y, "w": p.region.w, "h": p.region.h},
         "memory_bytes": p.memory_bytes, "flops": p.flops, "time_s": p.time_s,
         "replica": p.replica, "pe_utilization": p.pe_utilization, "detail": p.detail}
    layers.append(d)
  perf_d = None
  if perf is not None:
    perf_d = {k: v for k, v in perf.to_dict().items() if k != "timeline"}
    for k, v in perf_d.items():
      if isinstance(v, float) and not math.isfinite(v):
        perf_d[k] = None  # JSON has no inf
  return {
      "model": graph.name,
      "fits": plan.fits,
      "execution_strategy": plan.execution_strategy,
      "engine": plan.engine,
      "num_replicas": plan.num_replicas,
      "num_csx": plan.num_csx,
      "batch_size": plan.batch_size,
      "samples_per_sec": perf.samples_per_sec if perf else 0.0,
      "padded_samples_per_sec": (perf.padded_samples_per_sec or perf.samples_per_sec)
                                if perf else 0.0,
      "vts": bool(perf and perf.padded_samples_per_sec and
                  perf.padded_samples_per_sec != perf.samples_per_sec),
      "step_time_s": step,
      "utilization": perf.utilization if perf else 0.0,
      "bottleneck": perf.bottleneck if perf else "",
      "memory_needed_bytes": plan.memory_needed_bytes,
      "memory_available_bytes": plan.memory_available_bytes,
      "reason": plan.reason,
      "notes": list(plan.notes),
      "performance": perf_d,
      "pe_utilization": perf.pe_utilization if perf else 0.0,
      "band": {k: v for k, v in (band(plan, graph, perf) or {}).items() if k != "figures"},
      "sensitivity": dict(sensitivity(plan, graph, engine, options)) if perf else {},
      "engine_spec": engine.summary(),
      "layers": layers,
      "graph": graph_summary(graph),
  }


# Published tiny-model runs (FC-MNIST, validation/published.yaml) spent 0.5-5 ms a step on
# the host; a predicted step shorter than the upper end may be paced by the host instead.
HOST_STEP_S = (0.5e-3, 5e-3)


def host_may_pace(perf) -> bool:
  """True when a step is as short as the host steps of published tiny-model runs."""
  return perf is not None and 0 < perf.step_time_s < HOST_STEP_S[1]


# Published runs the input set the pace of (validation/published.yaml, flagged input-bound):
# ViT-Base decoding raw ImageNet JPEGs ran 776 samples/s on a CS-3 the simulator puts at
# about 20,000. The wafer cannot see a pipeline; the host that runs it can time it.
INPUT_LABEL = "input:"


def input_line(host_samples_per_sec: float, batches: int, seconds: float,
               plan: plans.Plan, perf: plans.Performance) -> str:
  """report.txt's "input:" line: what one process running the input_fn delivered on this
  host against what the simulated systems consume, and, when it is short, by how much."""
  need = perf.samples_per_sec
  got = (f"this host's input_fn delivered {host_samples_per_sec:,.0f} samples/s (one process, "
         f"{batches} batch(es) in {seconds:.2f} s after warm-up)")
  systems = f"{plan.num_csx} x {plan.engine} in {plan.execution_strategy}"
  if host_samples_per_sec >= need:
    return (f"{got}, {host_samples_per_sec / need:.1f}x the {need:,.0f} samples/s {systems} "
            f"takes: not the bound")
  return (f"{got}; {systems} takes {need:,.0f}, so input this fast would pace the run at "
          f"{host_samples_per_sec / need:.0%} of the engine's rate: feed it from "
          f"{math.ceil(need / host_samples_per_sec)} processes like this one (one per input "
          f"worker) or make the pipeline cheaper (pre-processed records, a parallel map, cache)")


def put_input_line(report_path: str, text: str) -> None:
  """Writes the "input:" line into report.txt after "bottleneck:", replacing an older one
  (a cached compile's report is reused by the next run, whose input is timed again)."""
  with open(report_path) as fh:
    lines = [l for l in fh.read().split("\n") if not l.startswith(INPUT_LABEL)]
  at = next((i + 1 for i, l in enumerate(lines) if l.startswith("bottleneck:")), len(lines))
  lines.insert(at, f"{INPUT_LABEL:<18}{text}")
  tmp = f"{report_path}.{os.getpid()}.tmp"  # the workers of a multi-worker run share it
  try:
    with open(tmp, "w") as fh:
      fh.write("\n".join(lines))
    os.replace(tmp, report_path)
  finally:
    if os.path.exists(tmp):  # a full disk: no half-written file left beside the report
      os.remove(tmp)


def host_lines(perf) -> List[str]:
  """The "host:" caveat for a short step, unless the model's own short-step note (perf.py
  `short_step_note`, which also gives the assumed fixed cost's share) already says it: one
  line, not two saying the same, and never "shorter than" a range the step falls inside."""
  lo, hi = HOST_STEP_S
  step = perf.step_time_s
  if not host_may_pace(perf) or any(n.startswith("short step") for n in perf.notes):
    return []
  where = "shorter than" if step < lo else "inside"
  return [f"host:             a {step * 1e3:.3f} ms step is {where} the {lo * 1e3:g}-"
          f"{hi * 1e3:g} ms per step published tiny-model runs spent on the host (FC-MNIST, "
          f"validation/published.yaml); the host, not the wafer, may set the pace"]


def io_lines(graph: ir.LayerGraph, perf) -> List[str]:
  """What to change when the host links set the pace: the inputs' width. The io bound scales
  with the bytes per value the input_fn sends; pixels sent as uint8 and cast in the model_fn
  cross the links in a quarter of the float32 bytes (a model change: not an advisor option)."""
  width = graph.input_value_bytes
  if perf is None or not perf.bottleneck.startswith("io") or width <= 1:
    return []
  per_sample = sum(l.io_bytes for l in graph.layers)
  return [f"io:               the host sends {fmt_bytes(per_sample)} per sample at {width:g} B "
          f"per value (the input_fn's dtypes), {perf.io_samples_per_sec:,.1f} samples/s over "
          f"the links; at 1 B per value (uint8 pixels, cast in the model_fn) they would carry "
          f"{perf.io_samples_per_sec * width:,.1f} (the wafer computes "
          f"{perf.compute_samples_per_sec:,.1f})"]


def host_preprocessing_lines(graph: ir.LayerGraph) -> List[str]:
  """report.txt's "host prep:" line: the feature lookups the host runs before the engine."""
  host = graph.host_preprocessing
  if host is None:
    return []
  types = ", ".join(host.op_types[:8]) + (", ..." if len(host.op_types) > 8 else "")
  sparse = (f" and {host.sparse_tensors} sparse tensor(s) as long as the data's ids"
            if host.sparse_tensors else "")
  return [f"host prep:        {host.num_ops} ops run on the host before the engine each step "
          f"(for {types}): they depend only on the features ({', '.join(host.features)}) and "
          f"hold no variable; per sample they read {fmt_bytes(host.read_bytes)} of raw "
          f"features and send the engine {fmt_bytes(host.sent_bytes)}{sparse}"]


def fmt_duration(seconds: float) -> str:
  """"42 s", "5.5 min", "8.0 h", "3.2 days": a length of time a person budgets with."""
  if not math.isfinite(seconds) or seconds < 0:
    return "-"
  for unit, size, above in (("days", 86400.0, 2 * 86400.0), ("h", 3600.0, 3600.0),
                            ("min", 60.0, 60.0)):
    if seconds >= above:
      return f"{seconds / size:,.1f} {unit}"
  return f"{seconds:.3g} s" if seconds < 10 else f"{seconds:.0f} s"


@dataclasses.dataclass(frozen=True)
class EngineTime:
  """How long `steps` training steps take on the engine: the prediction and its band.

  low_s / high_s bracket the measurement as the band's samples/s do (`band`); None without a
  band class for the model.
  """

  steps: int
  samples: int
  seconds: float
  low_s: Optional[float] = None
  high_s: Optional[float] = None

  def scaled(self, factor: float) -> "EngineTime":
    """The same rate over `factor` times the work."""
    return EngineTime(
        steps=int(round(self.steps * factor)), samples=int(round(self.samples * factor)),
        seconds=self.seconds * factor,
        low_s=None if self.low_s is None else self.low_s * factor,
        high_s=None if self.high_s is None else self.high_s * factor)

  def text(self) -> str:
    out = fmt_duration(self.seconds)
    if self.low_s is not None:
      out += f" (band {fmt_duration(self.low_s)} - {fmt_duration(self.high_s)})"
    return out


def engine_time(plan: plans.Plan, graph: ir.LayerGraph, performance: plans.Performance,
                steps: int, bands: Optional[List[dict]] = None) -> Optional[EngineTime]:
  """`steps` steps of the plan's global batch at the predicted rate; None if it does not run.

  Engine time only: compiling on the real system, loading the data and checkpointing are not
  modelled (the report's `host:` line says when the host may set the pace instead).
  """
  if performance is None or not plan.fits or performance.samples_per_sec <= 0 or steps <= 0:
    return None
  samples = int(steps) * plan.batch_size
  b = band(plan, graph, performance, bands)
  return EngineTime(steps=int(steps), samples=samples,
                    seconds=samples / performance.samples_per_sec,
                    low_s=samples / b["high"] if b else None,
                    high_s=samples / b["low"] if b else None)


def time_line(graph: ir.LayerGraph, plan: plans.Plan, performance: plans.Performance,
              bands: Optional[List[dict]] = None) -> List[str]:
  """report.txt's "time:" line: 1,000 steps and, for a sequence model, a billion (padded)
  tokens, the units people budget hardware time in."""
  per_k = engine_time(plan, graph, performance, 1000, bands)
  if per_k is None:
    return []
  out = f"time:             1,000 steps of batch {plan.batch_size} in {per_k.text()}"
  if graph.seq_len > 0:
    per_b = per_k.scaled(1e9 / (1000 * plan.batch_size * graph.seq_len))
    out += f"; 1e9 tokens (sequence {graph.seq_len}) in {per_b.text()}"
  return [out + "; engine time only (compiling, data loading and checkpoints not modelled)"]


def prediction_lines(graph, plan, perf, engine, options=None, advice=True) -> List[str]:
  """The lines after the header: PE utilization, eval rate, band, sensitivity, advice."""
  if perf is None or not plan.fits:
    return advice_lines(graph, plan, perf, engine, options) if advice else []
  out = [f"PE utilization:   {fmt_share(perf.pe_utilization)} (the layers' cores computing at the "
         f"calibrated rate, per layer below; vendor compile reports call it PE utilization)"]
  ev = eval_performance(plan, graph, engine, options)
  if ev is not None and ev.samples_per_sec > 0:
    out.append(f"eval samples/s:   {ev.samples_per_sec:,.1f} (forward only, same placement)")
  b = band(plan, graph, perf)
  if b:
    of = f" of {', '.join(b['families'])}" if b.get("families") else ""
    out.append(f"band:             {b['low']:,.1f} - {b['high']:,.1f} samples/s: the "
               f"validation error of {b['class']} models ({b['n']} published runs{of}: "
               f"{b['lowest']:+.0%} to {b['highest']:+.0%}, median |error| "
               f"{b['median_abs']:.0%}; benchmarks/bench_fidelity.py)"
               + ("; wafer-bound runs only: a step this short may be paced by the host"
                  if host_may_pace(perf) else "")
               + ("; no CNN throughput has been published for any Cerebras system "
                  "(validation/README.md), so this band is from transformers: the image "
                  "layers' costs are checked by hand calculations only"
                  if any(l.spatial for l in graph.layers) else ""))
  out.extend(time_line(graph, plan, perf))
  out.extend(batch_effect_line(plan))
  sens = sensitivity(plan, graph, engine, options)
  if sens:
    out.append("sensitive to:     " + ", ".join(
        f"{k} ({e:+.2f}% per +1%)" for k, e in sens))
  out.extend(host_lines(perf))
  out.extend(io_lines(graph, perf))
  if advice:
    out.extend(advice_lines(graph, plan, perf, engine, options))
  return out


def report_text(graph, plan, perf, engine, options=None, advice=True) -> str:
  """report.txt: header, then one row per layer, then totals."""
  sps = perf.samples_per_sec if perf else 0.0
  lines = [
      f"model:            {graph.name} ({graph.num_params:,} params, {len(graph.layers)} layers,"
      f" {graph.flops_per_sample:.4g} FLOPs/sample)",
      f"engine:           {engine.name} ({engine.usable_cores:,} usable cores, "
      f"{engine.peak_flops / 1e15:.2f} PFLOP/s fp16 peak; {engine.source_path})",
      f"strategy:         {plan.execution_strategy} (replicas {plan.num_replicas}, systems "
      f"{plan.num_csx}, batch {plan.batch_size})",
      f"fits:             {'yes' if plan.fits else 'NO'} - {plan.reason}",
      f"memory:           {fmt_bytes(plan.memory_needed_bytes)} needed / "
      f"{fmt_bytes(plan.memory_available_bytes)} available",
      f"samples/s:        {sps:,.1f} (compute {_fmt_rate(perf.compute_samples_per_sec)}, io "
      f"{_fmt_rate(perf.io_samples_per_sec)})" if perf else "samples/s:        -",
      f"padded samples/s: {(perf.padded_samples_per_sec or perf.samples_per_sec):,.1f} (VTS "
      f"speedup {perf.samples_per_sec / (perf.padded_samples_per_sec or perf.samples_per_sec):.2f}x)"
      if perf and perf.samples_per_sec > 0 else "padded samples/s: -",
      f"step time:        {perf.step_time_s * 1e3:.3f} ms" if perf and
      math.isfinite(perf.step_time_s) else "step time:        -",
      f"utilization:      {fmt_share(perf.utilization)} of peak" if perf else "utilization:      -",
      f"bottleneck:       {perf.bottleneck}" if perf else "bottleneck:       -",
  ]
  lines += prediction_lines(graph, plan, perf, engine, options, advice)
  lines += host_preprocessing_lines(graph)
  lines += [f"note:             {n}" for n in plan.notes]
  lines += [f"model:            {n}" for n in (perf.notes if perf else ())]
  lines.append("")
  total_cores = engine.usable_cores
  step = perf.step_time_s if perf and math.isfinite(perf.step_time_s) and \
      perf.step_time_s > 0 else 0.0
  streaming = plan.mode.streams_weights
  label = "total (layers take turns)" if streaming else "total"
  width = max([len(p.name) for p in plan.layers] + [len(label)])
  hdr = (f"{'#':>4}  {'layer':<{width}}  {'cores':>9}  {'wafer%':>7}  {'memory':>11}  "
         f"{'FLOPs/step':>11}  {'step%':>6}  {'PE util':>7}")
  lines += [hdr, "-" * len(hdr)]
  # R copies are the same layers on their own slabs: replica 0 stands for them (R x the
  # layers was 1,280 rows for a 20-layer model at R=64); plan.json lists every placement.
  copies = plan.num_replicas > 1 and all(p.replica is not None for p in plan.layers)
  shown = [p for p in plan.layers if p.replica == 0] if copies else list(plan.layers)
  for i, p in enumerate(shown):
    share = p.time_s / step if step else 0.0
    lines.append(f"{i:>4}  {p.name:<{width}}  {p.cores:>9,}  {p.cores / total_cores:>7.2%}  "
                 f"{fmt_bytes(p.memory_bytes):>11}  {p.flops:>11.4g}  {share:>6.1%}  "
                 f"{p.pe_utilization:>7.1%}")
    if p.detail:
      lines.append(f"{'':>6}{p.detail}")
  if copies and len(shown) < len(plan.layers):
    lines.append(f"{'':>6}replicas 1-{plan.num_replicas - 1}: the same {len(shown)} layers, each "
                 f"copy on its own slab (plan.json lists every placement); the total is all "
                 f"{plan.num_replicas}")
  lines.append("-" * len(hdr))
  used = sum(p.cores for p in plan.layers)
  mem = sum(p.memory_bytes for p in plan.layers)
  if streaming:
    # The layers take turns on the whole grid: the wafer is used once, not once per layer,
    # and the SRAM in use at a time is the plan's figure (weight buffer + activations).
    used = max((p.cores for p in plan.layers), default=0)
    mem = plan.memory_needed_bytes
  lines.append(f"{'':>4}  {label:<{width}}  {used:>9,}  {used / total_cores:>7.2%}  "
               f"{fmt_bytes(mem):>11}  {sum(p.flops for p in plan.layers):>11.4g}")
  return "\n".join(lines) + "\n"


def trace_json(perf: plans.Performance, graph: ir.LayerGraph) -> dict:
  """Chrome trace-event JSON (Perfetto / chrome://tracing) of the simulated step."""
  tracks = []
  for e in perf.timeline if perf else ():
    if e.track not in tracks:
      tracks.append(e.track)
  # "step" and "io" first, then layers in program order.
  order = {t: i for i, t in enumerate(["step", "io"] + [l.name for l in graph.layers])}
  tracks.sort(key=lambda t: order.get(t, len(order)))
  tid = {t: i for i, t in enumerate(tracks)}
  events = [{"name": "process_name", "ph": "M", "pid": 0, "tid": 0,
             "args": {"name": f"{graph.name} (simulated)"}}]
  for t, i in tid.items():
    events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": i, "args": {"name": t}})
    events.append({"name": "thread_sort_index", "ph": "M", "pid": 0, "tid": i,
                   "args": {"sort_index": i}})
  for e in perf.timeline if perf else ():
    events.append({"name": e.name, "ph": "X", "ts": e.start_s * 1e6, "dur": e.dur_s * 1e6,
                   "pid": 0, "tid": tid[e.track], "cat": "fwd_bwd" if e.track not in
                   ("step", "io") else e.track})
  return {"traceEvents": events, "displayTimeUnit": "ms"}


def _short(name: str) -> str:
  """A label that fits in a rectangle: layer index + last scope, e.g. "L3 intermediate"."""
  m = re.search(r"(?:layer_|h_)(\d+)", name)
  tail = name.rsplit("/", 1)[-1]
  return f"L{m.group(1)} {tail}" if m else name.split("/", 1)[-1] if "/" in name else name


_WAFER_PX = 900  # the taller side of the grid, in pixels
_MARGIN = (74, 54, 150, 56)  # left, top, right, bottom: ticks and labels, title, colour bar


@functools.lru_cache(maxsize=None)
def _font(size: int):
  """DejaVu Sans (matplotlib ships it, so the picture reads like the scaling charts)."""
  from matplotlib import get_data_path  # pylint: disable=import-outside-toplevel
  return ImageFont.truetype(os.path.join(get_data_path(), "fonts", "ttf", "DejaVuSans.ttf"),
                            size)


def _text(img, xy, text: str, size: int, fill="black", vertical=False, anchor="mm") -> None:
  """`text` centred on `xy` (`anchor` as Pillow's), read bottom to top when `vertical`."""
  if not vertical:
    ImageDraw.Draw(img).multiline_text(xy, text, font=_font(size), fill=fill, anchor=anchor,
                                       align="center")
    return
  box = ImageDraw.Draw(img).textbbox((0, 0), text, font=_font(size))
  mask = Image.new("L", (box[2] - box[0] + 2, box[3] - box[1] + 2))
  ImageDraw.Draw(mask).text((1 - box[0], 1 - box[1]), text, font=_font(size), fill=255)
  mask = mask.transpose(Image.Transpose.ROTATE_90)
  img.paste(fill, (round(xy[0] - mask.width / 2), round(xy[1] - mask.height / 2)), mask)


def _ticks(n: int) -> List[int]:
  """0, a round step, ... up to `n` cores (4-8 ticks)."""
  step = 10 ** max(0, len(str(max(1, n // 4))) - 1)
  for k in (1, 2, 5, 10):
    if n / (step * k) <= 7:
      return list(range(0, n + 1, step * k))
  return [0, n]


def draw_wafer(path: str, graph, plan, perf, engine) -> None:
  """wafer.png: the usable grid with each layer's region, coloured by program order.

  Drawn on every compile, so drawn with Pillow straight into pixels: matplotlib's figure
  (axes, tick objects, text layout) took 0.4-0.8 s a picture on an AVX2 host, most of a small
  model's compile (issue 42). matplotlib supplies the colour map and the font.
  """
  from matplotlib import colormaps  # pylint: disable=import-outside-toplevel
  w, h = engine.grid_width, engine.grid_height
  scale = _WAFER_PX / max(w, h)  # pixels per core
  ml, mt, mr, mb = _MARGIN
  aw, ah = round(w * scale), round(h * scale)
  img = Image.new("RGB", (ml + aw + mr, mt + ah + mb), "white")
  draw = ImageDraw.Draw(img)

  def px(x, y):
    return ml + x * scale, mt + y * scale

  def box(x, y, bw, bh):
    (x0, y0), (x1, y1) = px(x, y), px(x + bw, y + bh)
    return [round(x0), round(y0), max(round(x0), round(x1) - 1), max(round(y0), round(y1) - 1)]

  draw.rectangle(box(0, 0, w, h), fill="#f2f2f2")
  placed = [p for p in plan.layers if p.region is not None]
  per_replica = max(1, len(plan.layers) // max(1, plan.num_replicas))
  n = max(1, per_replica - 1)
  cmap = colormaps["turbo"]

  def colour(v: float):
    return tuple(round(255 * c) for c in cmap(v)[:3])

  labels = []
  for i, p in enumerate(plan.layers):
    r = p.region
    if r is None:
      continue
    fill = colour((i % per_replica) / n)
    draw.rectangle(box(r.x, r.y, r.w, r.h), fill=fill,
                   outline="white" if min(r.w, r.h) * scale >= 4 else None)
    label = _short(p.name)
    ink = "white" if 0.299 * fill[0] + 0.587 * fill[1] + 0.114 * fill[2] < 110 else "black"
    vertical = r.h > r.w
    along, across = (r.h * scale, r.w * scale) if vertical else (r.w * scale, r.h * scale)
    size = min(11, int(across * 0.7))  # label only what can hold its text
    if size >= 6 and len(label) * size * 0.62 <= along:
      labels.append((px(r.x + r.w / 2, r.y + r.h / 2), label, size, vertical, ink))
  for xy, label, size, vertical, ink in labels:  # on top of every region
    _text(img, xy, label, size, fill=ink, vertical=vertical)
  for k in range(plan.num_replicas if placed else 0):  # outline each copy
    rs = [p.region for p in placed if p.replica == k]
    if rs:
      x0, x1 = min(r.x for r in rs), max(r.x + r.w for r in rs)
      draw.rectangle(box(x0, 0, x1 - x0, h), outline="black", width=2)
      if plan.num_replicas > 1:
        _text(img, px((x0 + x1) / 2, 0), f"replica {k}", 9, anchor="mt")
  if placed:
    bar_h, bar_x = round(ah * 0.6), ml + aw + 22
    bar_y = mt + (ah - bar_h) // 2
    # The colour bar, 0 at the bottom: one column of the map, stretched to the bar's width.
    column = cmap([1 - j / max(1, bar_h - 1) for j in range(bar_h)], bytes=True)[:, None, :3]
    img.paste(Image.fromarray(column.repeat(20, axis=1), "RGB"), (bar_x, bar_y))
    draw.rectangle([bar_x, bar_y, bar_x + 20, bar_y + bar_h], outline="black")
    for v in _ticks(per_replica - 1):
      y = bar_y + bar_h - bar_h * v / max(1, per_replica - 1)
      draw.line([(bar_x + 20, y), (bar_x + 24, y)], fill="black")
      _text(img, (bar_x + 27, y), str(v), 11, anchor="lm")
    _text(img, (bar_x + 70, bar_y + bar_h / 2),
          f"layer index in program order (0 = {_short(plan.layers[0].name)}, "
          f"{per_replica - 1} = {_short(plan.layers[per_replica - 1].name)})", 10,
          vertical=True)
  elif plan.fits:  # weight streaming: the whole grid runs one layer at a time
    draw.rectangle(box(0, 0, w, h), fill="#9ecae1")
    _text(img, px(w / 2, h / 2), f"{plan.execution_strategy}: the whole grid runs one layer "
          f"at a time\n(x {plan.num_csx} system(s)); weights stream from MemoryX\n" +
          _wrap(plan.reason, 50), 13)
  else:
    _text(img, px(w / 2, h / 2), "does not fit\n" + _wrap(plan.reason, 50), 14,
          fill="darkred")
  draw.rectangle(box(0, 0, w, h), outline="black")
  for v in _ticks(w):  # axes: ticks every round number of cores, row 0 at the top
    x = px(v, 0)[0]
    draw.line([(x, mt + ah), (x, mt + ah + 5)], fill="black")
    _text(img, (x, mt + ah + 7), str(v), 12, anchor="mt")
  for v in _ticks(h):
    y = px(0, v)[1]
    draw.line([(ml - 5, y), (ml, y)], fill="black")
    _text(img, (ml - 8, y), str(v), 12, anchor="rm")
  _text(img, (ml + aw / 2, mt + ah + 28), f"x (core column, {w})", 13, anchor="mt")
  _text(img, (16, mt + ah / 2), f"y (core row, {h})", 13, vertical=True)
  sps = f"{perf.samples_per_sec:,.0f} samples/s, {fmt_share(perf.utilization)} util" \
      if perf and plan.fits else "no prediction"
  _text(img, (ml + aw / 2, mt - 8),
        f"{graph.name} on {engine.name} ({plan.execution_strategy}): "
        f"{'fits' if plan.fits else 'does NOT fit'}, {sps}\n"
        f"{len(placed)} layers, {sum(p.cores for p in placed):,} of {w * h:,} cores", 12,
        anchor="md")
  img.save(path, format="PNG", compress_level=1)


def _wrap(text: str, width: int) -> str:
  words, lines, cur = text.split(), [], ""
  for wd in words:
    if len(cur) + len(wd) + 1 > width and cur:
      lines.append(cur)
      cur = wd
    else:
      cur = (cur + " " + wd).strip()
  return "\n".join(lines + [cur])


def write_reports(compile_dir: str, graph: ir.LayerGraph, plan: plans.Plan,
                  perf: plans.Performance, engine,
                  options: Optional[plans.PlanOptions] = None) -> Dict[str, str]:
  """Writes the four reports; returns {"report", "plan", "wafer", "timeline"} -> path."""
  os.makedirs(compile_dir, exist_ok=True)
  paths = {k: os.path.join(compile_dir, f) for k, f in (
      ("report", "report.txt"), ("plan", "plan.json"), ("wafer", "wafer.png"),
      ("timeline", "timeline.json"))}
  if not plan.layers:  # nothing placed (compiler/plan trivial): the summary says it all
    with open(paths["report"], "w") as fh:
      fh.write(format_summary(plan, perf) + "\n")
    return {"report": paths["report"]}
  with open(paths["report"], "w") as fh:
    fh.write(report_text(graph, plan, perf, engine, options))
  with open(paths["plan"], "w") as fh:
    json.dump(plan_json(graph, plan, perf, engine, options), fh, indent=1)
  with open(paths["timeline"], "w") as fh:
    json.dump(trace_json(perf, graph), fh)
  draw_wafer(paths["wafer"], graph, plan, perf, engine)
  return paths
