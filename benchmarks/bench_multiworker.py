"""Multi-worker scaling on this machine: 1, 2 and 3 workers (scripts/launch.py on 127.0.0.1,
MultiWorkerMirroredStrategy), the same MLP, global batch and seed.

    python benchmarks/bench_multiworker.py [--steps 300] [--batch 48] [--workers 1,2,3]

Per worker count, two runs: one of --steps steps logged every 100 (host examples/s = global
batch x the chief's last `global_step/sec`, steps 200..300; overhead per step against one
worker), one of --agree_steps steps logged every step (per-step loss agreement with the
1-worker run: max relative difference). 1 worker = a TF_CONFIG with only a chief, which trains
as one process does (2 MirroredStrategy replicas on 2 cores). Beside it, the
simulated engine's scaling for the same model and global batch over 1..3 CS-2 systems (weight
streaming, `run.py --compile_only`). On 2 shared cores more workers cannot be faster; the
columns that matter are the loss agreement and the all-reduce overhead per step.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  pylint: disable=wrong-import-position

LOG_EVERY = 100


def _flags(model_dir, steps, batch, log_every):
  return ["--params", "configs/params_mlp.yaml", "--model_dir", model_dir,
          "--max_steps", str(steps), "--params_override", f"train_input.batch_size={batch}",
          "--params_override", f"runconfig.log_step_count_steps={log_every}",
          "--params_override", f"runconfig.save_checkpoints_steps={steps}",
          "--params_override", "runconfig.op_determinism=true",
          "--execution_strategy", "multi_replica"]


def _launch(n, flags):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=common.ROOT)
  proc = subprocess.run([sys.executable, "scripts/launch.py", "--workers", str(n), "--", *flags],
                        cwd=common.ROOT, env=env, capture_output=True, text=True, timeout=1800)
  if proc.returncode != 0:
    raise SystemExit(f"{n} workers failed:\n{proc.stdout[-3000:]}")
  return proc.stdout


def _fresh(path):
  """A model_dir with nothing in it: a checkpoint left by an earlier run would resume at
  max_steps and train nothing (what broke this script's second run)."""
  shutil.rmtree(path, ignore_errors=True)
  return path


def losses(n, steps, batch, out_dir):
  """The chief's loss at every step of an n-worker cluster."""
  out = _launch(n, _flags(_fresh(os.path.join(out_dir, f"agree{n}")), steps, batch, 1))
  found = {int(s) - 1: float(l) for s, l in
           re.findall(r"\[chief:0\] .*?step (\d+)(?:/\d+)?  loss (\S+)", out)}
  assert sorted(found) == list(range(steps)), sorted(found)[-5:]
  return np.array([found[s] for s in range(steps)])


def steps_per_sec(n, steps, batch, out_dir):
  """The chief's steps/s over the last LOG_EVERY steps of an n-worker run (its progress line:
  `step N/M  loss L  host X examples/s ...`, X over the steps since the previous line)."""
  out = _launch(n, _flags(_fresh(os.path.join(out_dir, f"speed{n}")), steps, batch, LOG_EVERY))
  rates = re.findall(r"\[chief:0\] step \d+/\d+ .*?host ([\d,.]+) examples/s", out)
  assert rates, out[-2000:]
  return float(rates[-1].replace(",", "")) / batch


def simulated(n, batch):
  """The engine's predicted samples/s for the MLP on n CS-2 systems (weight streaming)."""
  proc = subprocess.run([sys.executable, "scripts/run.py", "--params", "configs/params_mlp.yaml",
                         "--compile_only", "--execution_strategy", "weight_streaming",
                         "--num_csx", str(n), "--params_override",
                         f"train_input.batch_size={batch}", "--model_dir",
                         _fresh(os.path.join(common.ROOT, "..", "runs", f"bench_mw_sim{n}"))],
                        cwd=common.ROOT, capture_output=True, text=True, timeout=600,
                        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
  m = re.search(r"([\d,.]+) samples/s predicted", proc.stdout)
  return float(m.group(1).replace(",", "")) if m else float("nan")


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--steps", type=int, default=300)
  ap.add_argument("--agree_steps", type=int, default=30)
  ap.add_argument("--batch", type=int, default=48)
  ap.add_argument("--workers", default="1,2,3")
  ap.add_argument("--out", default=os.path.join(common.ROOT, "..", "runs", "bench_multiworker"))
  a = ap.parse_args(argv)
  counts = [int(x) for x in a.workers.split(",")]
  os.makedirs(a.out, exist_ok=True)
  agree = {n: losses(n, a.agree_steps, a.batch, a.out) for n in counts}
  speed = {n: steps_per_sec(n, a.steps, a.batch, a.out) for n in counts}
  sims = {n: simulated(n, a.batch) for n in counts}
  base = counts[0]
  rows = []
  for n in counts:
    diff = float(np.max(np.abs(agree[n] - agree[base]) / np.abs(agree[base])))
    overhead = (1 / speed[n] - 1 / speed[base]) * 1e3
    rows.append([n, f"{a.batch // n}", f"{a.batch * speed[n]:,.0f}",
                 f"{1e3 / speed[n]:.1f}", f"{overhead:+.1f}", f"{diff:.1e}",
                 f"{sims[n]:,.0f}", f"{sims[n] / sims[base]:.2f}x"])
  common.print_table(
      f"Multi-worker data parallel on 127.0.0.1 vs the simulated engine (MLP 32-128-128-4, "
      f"global batch {a.batch}; speed: steps {a.steps - LOG_EVERY}..{a.steps}; loss agreement: "
      f"{a.agree_steps} steps; {common.machine()})",
      ["workers", "per-worker batch", "host examples/s", "ms/step", "overhead ms/step vs 1",
       "max rel. loss diff vs 1 worker", "engine samples/s (sim., n CS-2, WS)",
       "engine speedup (sim.)"], rows)


if __name__ == "__main__":
  main()
