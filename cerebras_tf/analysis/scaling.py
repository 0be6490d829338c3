"""Weight-streaming scaling across systems: samples/s, speedup and efficiency per system count.

Rule: the GLOBAL batch stays fixed (strong scaling) and is split evenly, so each of n systems
trains on batch / n samples. The useful global batch is bounded by the critical batch size
(Kaplan et al. 2020, "Scaling Laws for Neural Language Models"): past it, more samples per step
buy little loss, so adding systems must split a fixed batch rather than grow it. Scaling then
bends as the per-system batch shrinks, because per-layer step costs (the fitted per-layer
overhead, SwarmX tree latency, partial sums per micro-batch) do not shrink with it - less for
bigger models, whose layers carry more work per sample (seed 003). System counts that do not
divide the batch are reported as skipped. Pure Python + matplotlib (Agg); no TensorFlow (the
TensorBoard event file is written with TensorBoard's protobufs, see `write_tensorboard`).
"""

import dataclasses
import json
import os
import socket
import struct
import time
from typing import Dict, List, Sequence

from cerebras_tf.core import ir
from cerebras_tf.core import plans
from cerebras_tf.compiler.plan import get_planner
from cerebras_tf.engine import perf

RULE = ("global batch fixed (strong scaling), split evenly across systems; bounded by the "
        "critical batch size (Kaplan et al. 2020)")


def scaling_report(graph: ir.LayerGraph, engine, options: plans.PlanOptions,
                   systems: Sequence[int] = (1, 2, 4, 8, 16)) -> List[Dict]:
  """One row per system count: samples_per_sec, speedup and efficiency vs the first count.

  Args:
    graph, engine: the model and the engine.
    options: batch_size is the global batch (kept fixed); strategy is forced to weight streaming.
    systems: system counts, ascending.

  Returns:
    Rows {"systems", "per_system_batch", "fits", "samples_per_sec", "speedup", "efficiency",
    "micro_batch", "bottleneck", "note"}; speedup/efficiency are relative to the first row
    (efficiency = speedup / (n / n0)).
  """
  rows, ref = [], None
  planner = get_planner(plans.WEIGHT_STREAMING)
  for n in systems:
    row = {"systems": n, "per_system_batch": options.batch_size / n, "fits": False,
           "samples_per_sec": 0.0, "speedup": None, "efficiency": None, "micro_batch": None,
           "bottleneck": "", "note": ""}
    if options.batch_size % n:
      row["note"] = f"skipped: batch {options.batch_size} not divisible by {n}"
      rows.append(row)
      continue
    opts = dataclasses.replace(options, execution_strategy=plans.WEIGHT_STREAMING, num_csx=n)
    plan = planner.plan(graph, engine, opts)
    row["fits"] = plan.fits
    if not plan.fits:
      row["note"] = plan.reason
      rows.append(row)
      continue
    pf = perf.simulate(plan, graph, engine, opts)
    cost = perf.ws_cost(graph, engine, opts)
    row.update(samples_per_sec=pf.samples_per_sec, micro_batch=cost.micro_batch,
               bottleneck=pf.bottleneck)
    if ref is None:
      ref = (n, pf.samples_per_sec)
    row["speedup"] = pf.samples_per_sec / ref[1]
    row["efficiency"] = row["speedup"] / (n / ref[0])
    rows.append(row)
  return rows


def format_rows(rows: List[Dict]) -> str:
  """scaling.txt: a fixed-width table."""
  out = [f"{'systems':>7}  {'batch/sys':>9}  {'micro':>5}  {'samples/s':>12}  {'speedup':>8}  "
         f"{'efficiency':>10}  bottleneck / note"]
  for r in rows:
    sp = f"{r['speedup']:.2f}x" if r["speedup"] is not None else "-"
    ef = f"{r['efficiency']:.1%}" if r["efficiency"] is not None else "-"
    out.append(f"{r['systems']:>7}  {r['per_system_batch']:>9g}  {r['micro_batch'] or '-':>5}  "
               f"{r['samples_per_sec']:>12,.2f}  {sp:>8}  {ef:>10}  "
               f"{r['bottleneck'] or r['note']}")
  return "\n".join(out) + "\n"


def write_scaling_report(out_dir: str, graph: ir.LayerGraph, engine, options: plans.PlanOptions,
                         systems: Sequence[int] = (1, 2, 4, 8, 16)) -> Dict[str, str]:
  """Writes scaling.txt, scaling.json, scaling.png and tensorboard/ (`write_tensorboard`) in
  out_dir; returns their paths."""
  rows = scaling_report(graph, engine, options, systems)
  os.makedirs(out_dir, exist_ok=True)
  paths = {k: os.path.join(out_dir, f"scaling.{k}") for k in ("txt", "json", "png")}
  head = (f"{graph.name} ({graph.num_params:,} params) on {engine.name}, weight streaming, "
          f"global batch {options.batch_size}, sparsity {options.sparsity:g}\nrule: {RULE}\n\n")
  with open(paths["txt"], "w") as fh:
    fh.write(head + format_rows(rows))
  with open(paths["json"], "w") as fh:
    json.dump({"model": graph.name, "num_params": graph.num_params, "engine": engine.name,
               "global_batch": options.batch_size, "rule": RULE, "rows": rows}, fh, indent=1)
  # A bare Figure on its own Agg canvas: pyplot (or matplotlib.use) would switch the
  # backend of a notebook that imported this module and its inline plots would stop showing.
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=import-outside-toplevel
  from matplotlib.figure import Figure  # pylint: disable=import-outside-toplevel
  ok = [r for r in rows if r["speedup"] is not None]
  fig = Figure(figsize=(6, 4.5), dpi=110)
  FigureCanvasAgg(fig)
  ax = fig.add_subplot()
  if ok:
    xs = [r["systems"] for r in ok]
    ax.plot(xs, [r["speedup"] for r in ok], "o-", label="predicted speedup")
    ax.plot(xs, [x / xs[0] for x in xs], "--", color="gray", label="linear")
    for r in ok:
      ax.annotate(f"{r['efficiency']:.0%}", (r["systems"], r["speedup"]), fontsize=7,
                  textcoords="offset points", xytext=(4, -10))
  ax.set_xscale("log", base=2)
  ax.set_yscale("log", base=2)
  if ok:
    ax.set_xticks(xs, [str(x) for x in xs])
    ys = [2 ** k for k in range(0, max(1, xs[-1] // xs[0]).bit_length())]
    ax.set_yticks(ys, [str(y) for y in ys])
  ax.set_xlabel("systems")
  ax.set_ylabel("speedup")
  ax.set_title(f"{graph.name}: weight-streaming scaling (global batch {options.batch_size})",
               fontsize=9)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(paths["png"])
  paths["tensorboard"] = write_tensorboard(os.path.join(out_dir, "tensorboard"), rows,
                                           paths["png"])
  return paths


def _record(data: bytes) -> bytes:
  """One TFRecord: length, masked CRC32C of the length, data, masked CRC32C of the data."""
  # pylint: disable=import-outside-toplevel
  from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
  head = struct.pack("<Q", len(data))
  return (head + struct.pack("<I", masked_crc32c(head)) + data +
          struct.pack("<I", masked_crc32c(data)))


def write_tensorboard(log_dir: str, rows: List[Dict], png_path: str = "") -> str:
  """An event file for `tensorboard --logdir log_dir`: scalars scaling/{samples_per_sec,
  speedup,efficiency} with the number of systems as the step, and the PNG under Images.

  Written with TensorBoard's protobufs and its pure-Python CRC (tensorboard's own writers
  import TensorFlow, which this module avoids). Returns the event file's path.
  """
  # pylint: disable=import-outside-toplevel
  from tensorboard.compat.proto import event_pb2, summary_pb2
  os.makedirs(log_dir, exist_ok=True)
  now = time.time()
  path = os.path.join(log_dir, f"events.out.tfevents.{int(now)}.{socket.gethostname()}.scaling")
  events = [event_pb2.Event(wall_time=now, step=0, file_version="brain.Event:2")]
  for r in rows:
    if r["speedup"] is None:
      continue
    values = [summary_pb2.Summary.Value(tag=f"scaling/{k}", simple_value=float(r[k]))
              for k in ("samples_per_sec", "speedup", "efficiency")]
    events.append(event_pb2.Event(wall_time=now, step=int(r["systems"]),
                                  summary=summary_pb2.Summary(value=values)))
  if png_path and os.path.exists(png_path):
    with open(png_path, "rb") as fh:
      png = fh.read()
    width, height = struct.unpack(">II", png[16:24])  # the PNG's IHDR chunk
    image = summary_pb2.Summary.Image(encoded_image_string=png, width=width, height=height,
                                      colorspace=4)
    events.append(event_pb2.Event(wall_time=now, step=0, summary=summary_pb2.Summary(
        value=[summary_pb2.Summary.Value(tag="scaling/plot", image=image)])))
  with open(path, "wb") as fh:
    for e in events:
      fh.write(_record(e.SerializeToString()))
  return path
