"""Multi-worker scaling on this machine: 1, 2 and 3 workers (scripts/launch.py on 127.0.0.1,
MultiWorkerMirroredStrategy), the same MLP, global batch and seed.

    python benchmarks/bench_multiworker.py [--steps 300] [--batch 48] [--workers 1,2,3]

Per worker count: host examples/s (the chief's steady-state step time, steps after the first
20, global batch / mean step seconds), overhead per step against one worker, and the per-step
loss agreement with the 1-worker run (max relative difference over all steps). Beside it, the
simulated engine's scaling for the same model and global batch over 1..3 CS-2 systems (weight
streaming, `run.py --compile_only`). On 2 shared cores more workers cannot be faster; the
columns that matter are the loss agreement and the all-reduce overhead per step.
"""

import argparse
import os
import re
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  pylint: disable=wrong-import-position

WARMUP = 20


def _flags(model_dir, steps, batch):
  return ["--params", "configs/params_mlp.yaml", "--model_dir", model_dir,
          "--max_steps", str(steps), "--params_override", f"train_input.batch_size={batch}",
          "--params_override", "runconfig.log_step_count_steps=1",
          "--params_override", f"runconfig.save_checkpoints_steps={steps}",
          "--params_override", "runconfig.op_determinism=true",
          "--execution_strategy", "multi_replica"]


def run_workers(n, steps, batch, out_dir):
  """(losses [steps], seconds per step [steps]) of the chief of an n-worker cluster."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=common.ROOT)
  model_dir = os.path.join(out_dir, f"w{n}")
  proc = subprocess.run([sys.executable, "scripts/launch.py", "--workers", str(n), "--",
                         *_flags(model_dir, steps, batch)], cwd=common.ROOT, env=env,
                        capture_output=True, text=True, timeout=1800)
  if proc.returncode != 0:
    raise SystemExit(f"{n} workers failed:\n{proc.stdout[-3000:]}")
  found = {int(s): (float(l), float(t or 0)) for l, s, t in re.findall(
      r"\[chief:0\] .*loss = ([-\d.e]+), step = (\d+)(?: \(([\d.]+) sec\))?", proc.stdout)}
  assert sorted(found) == list(range(steps)), sorted(found)[-5:]
  return (np.array([found[s][0] for s in range(steps)]),
          np.array([found[s][1] for s in range(steps)]))


def simulated(n, batch):
  """The engine's predicted samples/s for the MLP on n CS-2 systems (weight streaming)."""
  proc = subprocess.run([sys.executable, "scripts/run.py", "--params", "configs/params_mlp.yaml",
                         "--compile_only", "--execution_strategy", "weight_streaming",
                         "--num_csx", str(n), "--params_override",
                         f"train_input.batch_size={batch}", "--model_dir",
                         os.path.join(common.ROOT, "..", "runs", f"bench_mw_sim{n}")],
                        cwd=common.ROOT, capture_output=True, text=True, timeout=600,
                        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
  m = re.search(r"([\d,.]+) samples/s predicted", proc.stdout)
  return float(m.group(1).replace(",", "")) if m else float("nan")


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--steps", type=int, default=300)
  ap.add_argument("--batch", type=int, default=48)
  ap.add_argument("--workers", default="1,2,3")
  ap.add_argument("--out", default=os.path.join(common.ROOT, "..", "runs", "bench_multiworker"))
  a = ap.parse_args(argv)
  counts = [int(x) for x in a.workers.split(",")]
  os.makedirs(a.out, exist_ok=True)
  results = {n: run_workers(n, a.steps, a.batch, a.out) for n in counts}
  sims = {n: simulated(n, a.batch) for n in counts}
  base_losses, base_secs = results[counts[0]]
  base_step = float(np.mean(base_secs[WARMUP:]))
  rows = []
  for n in counts:
    losses, secs = results[n]
    step = float(np.mean(secs[WARMUP:]))
    agree = float(np.max(np.abs(losses - base_losses) / np.abs(base_losses)))
    rows.append([n, f"{a.batch // n}", f"{a.batch / step:,.0f}", f"{step * 1e3:.1f}",
                 f"{(step - base_step) * 1e3:+.1f}", f"{agree:.1e}",
                 f"{sims[n]:,.0f}", f"{sims[n] / sims[counts[0]]:.2f}x"])
  print(f"machine: {common.machine()}; MLP (configs/params_mlp.yaml), global batch {a.batch}, "
        f"{a.steps} steps, mean over steps {WARMUP}..{a.steps - 1}")
  common.print_table(
      "Multi-worker data parallel on 127.0.0.1 vs the simulated engine",
      ["workers", "per-worker batch", "host examples/s", "ms/step", "overhead ms/step vs 1",
       "max rel. loss diff vs 1 worker", "engine samples/s (sim., n CS-2, WS)",
       "engine speedup (sim.)"], rows)


if __name__ == "__main__":
  main()
