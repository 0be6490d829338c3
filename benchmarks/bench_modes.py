"""Host examples/s of the three execution modes on the same small model, side by side.

pipelined (one device), multi_replica (MirroredStrategy, 2 replicas splitting the global batch)
and weight_streaming (1 system: variables and optimizer on a local ps task = MemoryX, reached
over gRPC). Same params (configs/params_mlp.yaml: MLP 32-128-128-4, global batch 64), same
steps. Each mode trains in a fresh process, as scripts/run.py does (logical CPUs and the
weight-server client are fixed per process); the modes are interleaved round by round so the
machine's noise hits all of them alike. The rate is taken inside the train call from step
`--warmup` to the last step, so process start, compile, graph building and the weight servers'
start-up are not counted. It is the host runtime's cost per step on this machine, not the
engine's speed: the simulated samples/s of each plan is shown beside it. No goal: the figure
to watch is the ratio to pipelined (what a user pays on the host for exercising the mode).

    python benchmarks/bench_modes.py [--rounds 2 --steps 300 --warmup 50] [--quick]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from common import ROOT, machine, median, print_table

PARAMS = os.path.join(ROOT, "configs", "params_mlp.yaml")
MODES = {  # label -> params overrides
    "pipelined": ["csconfig.execution_strategy=pipelined"],
    "multi_replica (R=2)": ["csconfig.execution_strategy=multi_replica",
                            "csconfig.num_replicas=2"],
    "weight_streaming (1 system, 1 ps)": ["csconfig.execution_strategy=weight_streaming",
                                          "csconfig.num_csx=1", "csconfig.max_wgt_servers=1"],
}
_TAG = "BENCH_MODES_RESULT "


def worker(label: str, steps: int, warmup: int) -> None:
  """Trains `steps` steps in this process in mode `label`; prints one JSON result line."""
  from common import quiet_tf  # pylint: disable=import-outside-toplevel
  tf = quiet_tf()
  # pylint: disable=import-outside-toplevel
  from cerebras_tf import params as params_lib, runner
  from cerebras_tf import registry

  model_dir = tempfile.mkdtemp(prefix="bench_modes_")
  params = params_lib.load_params(PARAMS, MODES[label] + [
      f"runconfig.model_dir={model_dir}", "runconfig.save_checkpoints_steps=1000000",
      "runconfig.log_step_count_steps=1000000", "runconfig.save_summary_steps=1000000"])
  model_fn, input_fn = registry.get_model(params["model"]["name"]).resolve()
  est = runner.make_estimator(model_fn, params, runner.RunOptions())

  class Rate(tf.estimator.SessionRunHook):
    def __init__(self):
      self.times = []

    def after_run(self, run_context, run_values):
      self.times.append(time.perf_counter())

  rate = Rate()
  train_input = lambda params: input_fn(params, mode=tf.estimator.ModeKeys.TRAIN)  # noqa: E731
  est.train(train_input, max_steps=steps, hooks=[rate], use_cs=True)
  t = rate.times
  batch = params["train_input"]["batch_size"]
  result = est.compile(train_input)  # cached: the plan the run used
  print(_TAG + json.dumps({
      "mode": label, "steps": len(t), "warmup": warmup,
      "examples_per_sec": (len(t) - warmup) * batch / (t[-1] - t[warmup - 1]),
      "replicas": result.plan.num_replicas, "strategy": result.plan.execution_strategy,
      "simulated": result.performance.samples_per_sec}), flush=True)


def run_mode(label: str, steps: int, warmup: int) -> dict:
  cmd = [sys.executable, os.path.abspath(__file__), "--worker", label, "--steps", str(steps),
         "--warmup", str(warmup)]
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
  line = next((l for l in proc.stdout.splitlines() if l.startswith(_TAG)), None)
  if proc.returncode != 0 or line is None:
    tail = " / ".join(proc.stderr.strip().splitlines()[-3:])
    raise SystemExit(f"bench_modes: {label} failed (exit {proc.returncode}): {tail}")
  return json.loads(line[len(_TAG):])


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--rounds", type=int, default=2)
  ap.add_argument("--steps", type=int, default=300)
  ap.add_argument("--warmup", type=int, default=50)
  ap.add_argument("--quick", action="store_true", help="1 round of 150 steps")
  ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.quick:
    args.rounds, args.steps = 1, 150
  if not 0 < args.warmup < args.steps:
    ap.error(f"--warmup must be in [1, --steps), got {args.warmup}")
  if args.worker:
    worker(args.worker, args.steps, args.warmup)
    return
  results = {label: [] for label in MODES}
  t0 = time.monotonic()
  for _ in range(args.rounds):
    for label in MODES:
      results[label].append(run_mode(label, args.steps, args.warmup))
  anchor = median([r["examples_per_sec"] for r in results["pipelined"]])
  rows = []
  for label, rs in results.items():
    eps = median([r["examples_per_sec"] for r in rs])
    rows.append((label, rs[0]["replicas"], f"{eps:,.0f}",
                 " / ".join(f"{r['examples_per_sec']:,.0f}" for r in rs),
                 f"{eps / anchor:.2f}", f"{rs[0]['simulated']:,.0f}", "-"))
  print_table(f"Execution modes on the host (MLP 32-128-128-4, global batch 64, steps "
              f"{args.warmup}..{args.steps} timed x {args.rounds} rounds, "
              f"{time.monotonic() - t0:.0f} s in all; {machine()})",
              ["mode", "replicas", "host examples/s (median)", "per round",
               "ratio to pipelined", "simulated samples/s (cs2)", "goal"], rows)


if __name__ == "__main__":
  main()
