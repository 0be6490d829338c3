"""Soak: memory of a long training run (BERT-tiny on the real corpus) must stay flat.

Runs `scripts/run.py` on configs/params_bert_tiny_msl128.yaml in a subprocess for --steps
steps and samples the child's resident memory from /proc/<pid>/status (VmRSS, VmHWM) every
--interval seconds. Warm-up ends at --warmup_fraction of the run's wall time (graph built,
first checkpoint written, input pipeline buffers full); the goal is RSS growth from there to
the end below 5%.

    python benchmarks/bench_soak.py [--steps 5000] [--no_cs] [--interval 3]
    python benchmarks/bench_soak.py --quick        # 300 steps

With --as_configured the child is the config's own run (its learning-rate schedule and
checkpoint/eval cadence, `--mode train_and_eval` into --model_dir): one run then gives both the
soak figures and the pretrained tiny BERT the classifier config warm-starts from.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

from common import ROOT, machine, print_table

CONFIG = os.path.join(ROOT, "configs", "params_bert_tiny_msl128.yaml")


def read_status(pid: int):
  """(VmRSS, VmHWM) in MiB, or None once the process is gone."""
  try:
    with open(f"/proc/{pid}/status") as f:
      fields = dict(line.split(":", 1) for line in f if ":" in line)
  except OSError:
    return None
  kib = lambda key: int(fields.get(key, "0 kB").split()[0])  # noqa: E731
  return kib("VmRSS") / 1024, kib("VmHWM") / 1024


def soak(steps: int, use_cs: bool, interval: float, model_dir=None, as_configured=False):
  model_dir = model_dir or tempfile.mkdtemp(prefix="bench_soak_")
  os.makedirs(model_dir, exist_ok=True)
  cmd = [sys.executable, os.path.join(ROOT, "scripts", "run.py"), "--params", CONFIG,
         "--model_dir", model_dir, "--max_steps", str(steps)]
  if as_configured:
    cmd += ["--mode", "train_and_eval"]
  else:
    # a constant rate: the config's warm-up schedule is longer than a short soak
    cmd += ["--params_override", "optimizer.learning_rate=0.0001",
            "--params_override", f"runconfig.save_checkpoints_steps={max(steps // 5, 1)}",
            "--params_override", "runconfig.log_step_count_steps=500"]
  if not use_cs:
    cmd.append("--no_cs")
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  log = open(os.path.join(model_dir, "soak.log"), "w")
  t0 = time.monotonic()
  proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
  samples = []  # (seconds, rss, hwm)
  while proc.poll() is None:
    status = read_status(proc.pid)
    if status:
      samples.append((time.monotonic() - t0, *status))
    time.sleep(interval)
  log.close()
  return proc.returncode, time.monotonic() - t0, samples, model_dir


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--steps", type=int, default=5000)
  ap.add_argument("--quick", action="store_true", help="300 steps")
  ap.add_argument("--no_cs", action="store_true", help="plain Estimator (no compile)")
  ap.add_argument("--interval", type=float, default=3.0)
  ap.add_argument("--warmup_fraction", type=float, default=0.2)
  ap.add_argument("--model_dir", default=None, help="default: a new temp dir")
  ap.add_argument("--as_configured", action="store_true",
                  help="the config's own schedule and train_and_eval (see the docstring)")
  args = ap.parse_args()
  steps = 300 if args.quick else args.steps
  code, seconds, samples, model_dir = soak(steps, not args.no_cs, args.interval,
                                           args.model_dir, args.as_configured)
  if code != 0 or len(samples) < 3:
    print(f"soak run failed: exit code {code}, {len(samples)} samples; see "
          f"{model_dir}/soak.log", file=sys.stderr)
    return 1
  # RSS: the highest sample in the first and in the last tenth of the run after warm-up (the
  # very last samples can fall in the child's teardown, which frees memory and would flatter).
  warm = [s for s in samples if s[0] >= args.warmup_fraction * seconds] or samples[-1:]
  tenth = max(1, len(warm) // 10)
  rss_warm = max(s[1] for s in warm[:tenth])
  rss_end = max(s[1] for s in warm[-tenth - 2:-2] or warm[-tenth:])
  hwm_warm, hwm_end = warm[0][2], samples[-1][2]
  growth = (rss_end - rss_warm) / rss_warm * 100
  hwm_growth = (hwm_end - hwm_warm) / hwm_warm * 100
  rows = [
      ("steps", f"{steps:,}", "", ""),
      ("wall time", f"{seconds:,.0f} s ({steps / seconds:.1f} steps/s)", "", ""),
      ("samples", f"{len(samples)} every {args.interval:g} s", "", ""),
      (f"RSS, first tenth after warm-up (from t={warm[0][0]:.0f} s)", f"{rss_warm:,.0f} MiB",
       "", ""),
      ("RSS, last tenth", f"{rss_end:,.0f} MiB", "", ""),
      ("RSS growth after warm-up", f"{growth:+.1f}%", "< 5%", "yes" if growth < 5 else "NO"),
      ("peak RSS (VmHWM) growth after warm-up", f"{hwm_warm:,.0f} -> {hwm_end:,.0f} MiB "
       f"({hwm_growth:+.1f}%)", "< 5%", "yes" if hwm_growth < 5 else "NO"),
  ]
  print_table(f"Soak: BERT-tiny msl128, batch 32, real corpus, "
              f"{'use_cs=True (simulated CS-2, pipelined)' if not args.no_cs else '--no_cs'}"
              f" - {machine()}", ("figure", "value", "goal", "met"), rows)
  trace = samples[::max(1, len(samples) // 10)] + samples[-1:]
  print_table("Soak: RSS over time", ("t (s)", "VmRSS (MiB)", "VmHWM (MiB)"),
              [(f"{t:.0f}", f"{r:,.0f}", f"{h:,.0f}") for t, r, h in trace])
  return 0


if __name__ == "__main__":
  sys.exit(main())
