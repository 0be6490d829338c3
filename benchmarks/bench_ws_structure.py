"""Weight streaming's fixed cost: what the batch-sweep calibration runs say, and what else fits.

    python benchmarks/bench_ws_structure.py            # all variants (about 2-5 min, pure Python)
    python benchmarks/bench_ws_structure.py --only 2,3

Re-fits the calibration constants (calibration figures only, as fidelity.fit_constants does)
under alternatives to the shipped weight-streaming step, and prints the error each gives, so a
change to perf.ws_cost is chosen on evidence. Nothing here changes the shipped constants.

  1 shipped: a per-layer fixed cost per micro-batch, fitted with the efficiency on CS-2's
    weight-streaming calibration figures and the BERT-Large batch sweep (CS-3 takes CS-2's).
  2 the fixed cost per step instead (a host or runtime cost, model-independent), the
    per-layer cost held at its fill-and-drain estimate (11 us).
  3 without the sweeps: the calibration figures before session 29's sweep_rule (per-layer
    cost held at 11 us; it cannot be fitted without them).
"""

import argparse

import common  # noqa: F401  (repo on sys.path)
from common import print_table

from validation import fidelity

EFF, LAYER, STEP = ("weight_streaming_efficiency", "weight_streaming_layer_overhead_s",
                    "weight_streaming_step_overhead_s")
FILL_AND_DRAIN_S = 11e-6   # cs2.yaml: 3 passes x (2 SwarmX hops + the grid crossed)

# Figures the second table shows one by one.
SHOWN = ("student-bert-large-pt-r211-b512-kharelb-cs2-ws",
         "student-bert-large-pt-r211-b2048-kharelb-cs2-ws", "alcf-esm2-35m-pt-r230-cs2-ws",
         "alcf-esm2-35m-pt-r25-cs3-ws", "alcf-bert-large-eval-r25-cs3-ws",
         "alcf-cerebras-gpt-111m-eval-r25-cs3-ws", "student-llama2-7b-pt-r26-b32-huijulee-cs3-ws",
         "alcf-fcmnist-pt-r203-cs2-ws")


def _with_ws(groups, names, sweeps=True, figs=None):
  """`groups` with each weight-streaming group's constants replaced by `names` (CS-2) or the
  efficiency alone (the others), and its sweep runs left in or taken out."""
  out = {}
  for eng, gs in groups.items():
    swept = set(fidelity.sweep_calibration_ids(figs, eng))
    out[eng] = tuple(
        ((names if eng == "cs2" else (EFF,)), ids if sweeps else tuple(i for i in ids
                                                                          if i not in swept))
        if n == (EFF, LAYER) or n == (EFF,) else (n, ids)
        for n, ids in gs)
  return out


def variants(figs):
  shipped = fidelity.fit_groups(figs)
  held = {e: {LAYER: FILL_AND_DRAIN_S} for e in ("cs2", "cs3")}
  return (
      ("shipped: per-layer cost fitted", shipped, None, fidelity.INHERITED),
      ("per-step cost fitted instead", _with_ws(shipped, (EFF, STEP), figs=figs), held,
       fidelity.INHERITED + (STEP,)),
      ("without the sweeps (per-layer cost 11 us)",
       _with_ws(shipped, (EFF,), sweeps=False, figs=figs), held, fidelity.INHERITED),
  )


def cells(s):
  c, v, r = (s["calibration"]["throughput_wafer"], s["validation"]["throughput_wafer"],
             s["validation"]["ratio"])
  return [f"{c['mean_abs']:.1%} / {c['max_factor']:.2f}x",
          f"{v['median_abs']:.1%} / {v['mean_abs']:.1%} / {v['max_factor']:.2f}x",
          f"{r['mean_abs']:.1%} / {r['max_factor']:.2f}x"]


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--only", default="", help="comma-separated variant numbers (1-based)")
  args = ap.parse_args()
  figs = fidelity.load()
  all_variants = variants(figs)
  picked = [int(x) for x in args.only.split(",") if x] or range(1, len(all_variants) + 1)
  summary, shown = [], []
  for n in picked:
    name, groups, held, inherited = all_variants[n - 1]
    fit = fidelity.fit_constants(figs, groups, held=held, inherited=inherited)
    for e in fit:
      fit[e].pop("_residuals")
    rows = fidelity.evaluate(figs, fit)
    by = {r.id: r for r in rows}
    consts = "; ".join(
        f"{e}: " + ", ".join(f"{k.replace('weight_streaming_', '')} {v:.3g}"
                             for k, v in sorted(fit[e].items()) if k.startswith("weight"))
        for e in ("cs2", "cs3"))
    summary.append([f"{n} {name}", consts] + cells(fidelity.summary(rows)))
    shown.append([f"{n}"] + [f"{by[i].error:+.0%}" if by[i].error is not None else "-"
                             for i in SHOWN])
  print_table("Weight streaming's fixed cost: error under each variant (wafer-bound throughputs)",
              ["variant", "fitted constants", "calibration mean / worst",
               "validation median / mean / worst", "validation ratios mean / worst"], summary)
  print_table("Figures that tell the variants apart (error = predicted / published - 1)",
              ["variant"] + [i.replace("-pt-", " ").replace("student-", "")[:34] for i in SHOWN],
              shown)


if __name__ == "__main__":
  main()
