"""Simulator fidelity: every published CS-2/CS-3 figure in validation/published.yaml, predicted.

    python benchmarks/bench_fidelity.py            # the tables (markdown)
    python benchmarks/bench_fidelity.py --csv F    # also one CSV row per figure
    python benchmarks/bench_fidelity.py --write-bands   # refresh engine/specs/fidelity_bands.yaml

The split (calibration vs validation) is the registry's, fixed before any constant was fitted;
constants are fitted on the calibration set only (validation/fidelity.py, engine
YAMLs). The acceptance bands (issue 16): validation throughput mean |error| <= 20%, no case off
by more than 2x. No TensorFlow; about a second.
"""

import argparse
import csv
import math
import os
import sys

import common  # noqa: F401  (repo on sys.path)
from common import print_table

from validation import fidelity


def fmt(x) -> str:
  if isinstance(x, float):
    if not math.isfinite(x):
      return "inf"
    return f"{x:,.3f}" if abs(x) < 10 else f"{x:,.1f}"
  return str(x)


def pct(x) -> str:
  return "-" if x is None else f"{x:+.1%}"


def stat_cells(s):
  if not s.get("n"):
    return ["0", "-", "-", "-", "-"]
  return [str(s["n"]), f"{s['median_abs']:.1%}", f"{s['mean_abs']:.1%}", f"{s['max_abs']:.1%}",
          f"{s['max_factor']:.2f}x"]


BASELINE = os.path.join(common.ROOT, "validation", "baseline_09edcf7.csv")


def load_rows(path):
  """Rows of a CSV this script wrote (--csv): the table as measured at another commit."""
  out = []
  with open(path, newline="") as fh:
    for d in csv.DictReader(fh):
      num = lambda k: float(d[k]) if d[k] not in ("", "None") else None
      r = fidelity.Row(d["id"], d["kind"], d["set"], d["system"], d["mode"], d["family"],
                       d["published"], host_bound=d["host_bound"])
      r.error = num("error")
      r.agree = {"True": True, "False": False}.get(d["agree"])
      out.append(r)
  return out


def flags(r) -> str:
  """The table's flag column: registry-flagged host-bound, and seen before a choice."""
  return ", ".join(f for f, on in (("host-bound", r.host_bound),
                                   ("seen", r.id in fidelity.CHOICES_SEEN)) if on)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--csv", default="", help="write one row per figure to this CSV file")
  ap.add_argument("--write-bands", action="store_true",
                  help="write the validation error bands report.txt quotes")
  a = ap.parse_args(argv)
  rows = fidelity.evaluate()
  body = []
  for r in rows:
    if r.kind == "fit":
      continue
    body.append([r.id, r.set[:3], f"{r.system} {r.mode}", fmt(r.published), fmt(r.predicted),
                 pct(r.error), flags(r), r.detail[:90]])
  print_table("Published throughputs and ratios vs the simulator",
              ["figure", "set", "system / mode", "published", "predicted", "error", "flag",
               "bottleneck / detail"], body)
  print_table("Published fit verdicts vs the planners",
              ["figure", "set", "system / mode", "published", "simulator", "detail"],
              [[r.id, r.set[:3], f"{r.system} {r.mode}", r.published, r.predicted,
                r.detail[:110]] for r in rows if r.kind == "fit"])
  s = fidelity.summary(rows)
  table = []
  for name in ("calibration", "validation"):
    for key, label in (("throughput", "throughput, all"),
                       ("throughput_wafer", "throughput, wafer-bound"),
                       ("throughput_wafer_unseen", "throughput, wafer-bound, no choice seen"),
                       ("ratio", "scaling / CS-3:CS-2 / release ratios")):
      if key == "throughput_wafer_unseen" and name == "calibration":
        continue  # every calibration figure was seen: it was fitted to
      table.append([name, label] + stat_cells(s[name][key]))
    f = s[name]["fit"]
    table.append([name, "fit verdicts agree", str(f["n"]), f"{f['agree']} of {f['n']}", "", "",
                  ""])
  print_table("Error by set (error = predicted / published - 1; 'wafer-bound' leaves out the "
              "figures the registry flagged host-/input-bound before fitting; 'no choice seen' "
              "also the validation figures a modelling choice was made looking at, flagged "
              "'seen' above: fidelity.CHOICES_SEEN)",
              ["set", "figures", "n", "median abs", "mean abs", "max abs", "max factor off"],
              table)
  if os.path.exists(BASELINE):
    before = fidelity.summary(load_rows(BASELINE))
    comp = []
    for name in ("calibration", "validation"):
      for key, label in (("throughput", "throughput, all"),
                         ("throughput_wafer", "throughput, wafer-bound"),
                         ("ratio", "ratios")):
        b, n = before[name][key], s[name][key]
        if not n.get("n"):
          continue
        comp.append([name, label, f"{b['median_abs']:.1%} / {b['mean_abs']:.1%} / "
                     f"{b['max_factor']:.2f}x", f"{n['median_abs']:.1%} / {n['mean_abs']:.1%} / "
                     f"{n['max_factor']:.2f}x"])
      bf, nf = before[name]["fit"], s[name]["fit"]
      comp.append([name, "fit verdicts agree", f"{bf['agree']} of {bf['n']}",
                   f"{nf['agree']} of {nf['n']}"])
    print_table("Before issue 16 (commit 09edcf7, validation/baseline_09edcf7.csv) vs now: "
                "median / mean |error| / worst factor",
                ["set", "figures", "before", "now"], comp)
  bands = fidelity.bands(rows)
  print_table("Error bands report.txt quotes (validation set, wafer-bound; a prediction p "
              "brackets the measurement in [p / (1 + highest), p / (1 + lowest)])",
              ["class", "n", "median |error|", "lowest", "highest"],
              [[b["class"], b["n"], f"{b['median_abs']:.1%}", f"{b['lowest']:+.1%}",
                f"{b['highest']:+.1%}"] for b in bands])
  sweeps = fidelity.batch_sweeps(rows)
  print_table("What batch buys: published sweeps (steady runs, median per batch) vs the "
              "simulator",
              ["model", "system / mode", "release", "batches", "runs", "published", "predicted",
               "published gain", "predicted gain"],
              [[w["model"], f"{w['system']} {w['mode']}", w["release"],
                " / ".join(str(b) for b in w["batches"]), " / ".join(str(n) for n in w["runs"]),
                " / ".join(fmt(v) for v in w["published"]),
                " / ".join(fmt(v) for v in w["predicted"]), f"{w['published_gain']:.2f}x",
                f"{w['predicted_gain']:.2f}x"] for w in sweeps])
  if a.write_bands:
    import yaml  # pylint: disable=import-outside-toplevel
    from cerebras_tf.engine import report  # pylint: disable=import-outside-toplevel
    with open(report.BANDS_PATH, "w") as fh:
      fh.write("# Validation-set throughput errors by class of model, for report.txt's band.\n"
               "# Written by `python benchmarks/bench_fidelity.py --write-bands`; checked by\n"
               "# tests/engine/test_fidelity.py. error = predicted / published - 1. sweeps: what\n"
               "# batch buys in published runs (either set) against the simulator.\n")
      yaml.safe_dump({"classes": bands, "sweeps": sweeps}, fh, sort_keys=False)
  v = s["validation"]["throughput"]
  print(f"\nacceptance (issue 16): validation throughput mean |error| {v['mean_abs']:.1%} "
        f"(goal <= 20%), worst {v['max_factor']:.2f}x off (goal <= 2x); wafer-bound: "
        f"{s['validation']['throughput_wafer']['mean_abs']:.1%}, "
        f"{s['validation']['throughput_wafer']['max_factor']:.2f}x")
  if a.csv:
    with open(a.csv, "w", newline="") as fh:
      w = csv.writer(fh)
      w.writerow(["id", "set", "kind", "system", "mode", "family", "published", "predicted",
                  "error", "agree", "host_bound", "detail"])
      for r in rows:
        w.writerow([r.id, r.set, r.kind, r.system, r.mode, r.family, r.published, r.predicted,
                    r.error, r.agree, r.host_bound, r.detail])
  return 0


if __name__ == "__main__":
  sys.exit(main())
