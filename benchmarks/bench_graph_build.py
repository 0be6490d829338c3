"""What a short run costs before it trains: `scripts/run.py` start to exit, an earlier commit vs
this tree, BERT-tiny at several depths, in multi_replica (2 host replicas) and pipelined.

A run of a few steps is mostly start-up: imports, the compile's trace, tf.estimator's graph
(once per replica in multi_replica), session creation. Since 3092f2b the TF1-graph families'
model_fns are built as written where MirroredStrategy would rewrite them with AutoGraph in every
replica (models/graph_mode.py); pipelined builds them plainly either way and is the control.
Each run is a fresh process, interleaved commit by commit so the machine's noise hits both;
the table gives medians of the whole command's wall time. No goal: the ratio is the figure.

    python benchmarks/bench_graph_build.py [--before 9a8b2cc] [--layers 2,6,12] [--rounds 2]
    python benchmarks/bench_graph_build.py --quick   # 6 and 12 layers, 1 round
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

from bench_host_speed import export_tree
from common import ROOT, machine, median, print_table

MODES = {"multi_replica": ["--execution_strategy", "multi_replica",
                           "--params_override", "csconfig.num_replicas=2"],
         "pipelined": ["--execution_strategy", "pipelined"]}


def run_seconds(tree: str, layers: int, mode: str, steps: int) -> float:
  """Wall seconds of one `scripts/run.py` in `tree` (a fresh model_dir, 5 steps)."""
  model_dir = tempfile.mkdtemp(prefix="bench_graph_build_")
  cmd = [sys.executable, "scripts/run.py", "--params", "configs/params_bert_tiny_msl128.yaml",
         "--mode", "train", "--model_dir", model_dir, "--max_steps", str(steps),
         "--params_override", f"model.num_hidden_layers={layers}", *MODES[mode]]
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=tree)
  try:
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=False)
    seconds = time.monotonic() - t0
  finally:
    shutil.rmtree(model_dir, ignore_errors=True)
  if proc.returncode:
    raise RuntimeError(f"{mode} at {layers} layers in {tree} failed:\n{proc.stderr[-3000:]}")
  return seconds


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--before", default="9a8b2cc")
  ap.add_argument("--layers", default="2,6,12")
  ap.add_argument("--modes", default=",".join(MODES))
  ap.add_argument("--rounds", type=int, default=2)
  ap.add_argument("--steps", type=int, default=5)
  ap.add_argument("--quick", action="store_true", help="6 and 12 layers, 1 round")
  args = ap.parse_args()
  if args.quick:
    args.layers, args.rounds = "6,12", 1
  layers = [int(n) for n in args.layers.split(",")]
  modes = args.modes.split(",")
  before = export_tree(args.before)
  times = {}
  for _ in range(args.rounds):
    for n in layers:
      for mode in modes:
        for label, tree in (("before", before), ("after", ROOT)):
          times.setdefault((n, mode, label), []).append(run_seconds(tree, n, mode, args.steps))
  rows = []
  for n in layers:
    for mode in modes:
      b, a = median(times[(n, mode, "before")]), median(times[(n, mode, "after")])
      rows.append((n, mode, f"{b:.1f}", f"{a:.1f}", f"{a / b:.2f}x"))
  print_table(f"`scripts/run.py` of BERT-tiny ({args.steps} steps of the demo config), start to "
              f"exit, {args.before} vs this tree; {args.rounds} round(s), interleaved; {machine()}",
              ["encoder layers", "mode", f"before ({args.before}) s", "after s", "after / before"],
              rows)
  return 0


if __name__ == "__main__":
  sys.exit(main())
