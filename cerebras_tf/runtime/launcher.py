"""A TF_CONFIG cluster on this machine, for trying multi-worker training, and the TF_CONFIG
each host of a real cluster needs (scripts/launch.py is the command line).

One process per task, each in its own process group and in the launcher's directory:
`python -m cerebras_tf` (scripts/run.py) for the chief and the workers, `python -m
cerebras_tf.runtime.server` for ps tasks (MemoryX weight servers). Their output is printed line
by line with a `[chief:0]` prefix. The first task to fail stops the others; Ctrl-C or SIGTERM
on the launcher stops them all; each task also gets SIGKILL from the kernel if the launcher
itself dies (PR_SET_PDEATHSIG), so no task outlives it.

Plain Python (no TensorFlow): the tasks import it, not the launcher.
"""

import argparse
import ctypes
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional, Sequence, Tuple

from cerebras_tf.errors import CerebrasTFError, ConfigError
from cerebras_tf.runtime import cluster as cluster_lib
from cerebras_tf.runtime import tf_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_PORT = 2222  # TF's customary task port
STOP_GRACE_S = 10.0
_PR_SET_PDEATHSIG = 1


def cluster_spec(hosts: Sequence[str], ps_hosts: Sequence[str] = (),
                 port: int = DEFAULT_PORT) -> Dict[str, List[str]]:
  """{"chief": [first host], "worker": [the others], "ps": [...]}; `host` or `host:port`."""
  if not hosts:
    raise ConfigError("give at least one host (the first is the chief)")
  if not isinstance(port, int) or not 0 < port < 65536:
    raise ConfigError(f"--port must be an int from 1 to 65535, got {port!r}")

  def address(h: str) -> str:
    return h if ":" in h else f"{h}:{port}"

  spec = {"chief": [address(hosts[0])]}
  if len(hosts) > 1:
    spec["worker"] = [address(h) for h in hosts[1:]]
  if ps_hosts:
    spec["ps"] = [address(h) for h in ps_hosts]
  tf_config.parse(tf_config_for(spec, "chief", 0))  # the checks every task will make
  return spec


def tasks(spec: Dict[str, List[str]]) -> List[Tuple[str, int]]:
  """(job, index) of every task: chief, workers, then ps."""
  return [(job, i) for job in ("chief", "worker", "ps") for i in range(len(spec.get(job, [])))]


def tf_config_for(spec: Dict[str, List[str]], job: str, index: int) -> str:
  return json.dumps({"cluster": spec, "task": {"type": job, "index": index}})


def local_spec(num_workers: int, num_ps: int = 0) -> Dict[str, List[str]]:
  """A cluster of free ports on 127.0.0.1."""
  if num_workers < 1 or num_ps < 0:
    raise ConfigError(f"--workers must be >= 1 and --ps >= 0, got {num_workers} and {num_ps}")
  return cluster_spec([f"127.0.0.1:{cluster_lib.free_port()}" for _ in range(num_workers)],
                      [f"127.0.0.1:{cluster_lib.free_port()}" for _ in range(num_ps)])


def _die_with_parent() -> None:
  """In the child, before exec: SIGKILL when the launcher dies (Linux)."""
  try:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
  except OSError:
    pass  # not Linux: Ctrl-C and SIGTERM still stop the tasks


def _signal_name(code: int) -> str:
  if code < 0:
    try:
      return f"killed by {signal.Signals(-code).name}"
    except ValueError:
      pass
  return f"exit code {code}"


class LocalLauncher:
  """Starts every task of `spec` on this machine and waits; `run()` returns the exit code."""

  def __init__(self, spec: Dict[str, List[str]], run_args: Sequence[str], out=None,
               grace_s: float = STOP_GRACE_S, env: Optional[Dict[str, str]] = None):
    self.spec = spec
    self.run_args = list(run_args)
    self.out = out or sys.stdout
    self.grace_s = grace_s
    self.env = dict(os.environ if env is None else env)
    self.procs: Dict[str, subprocess.Popen] = {}
    self._lock = threading.Lock()
    self._pumps: List[threading.Thread] = []

  def _command(self, job: str) -> List[str]:
    if job == "ps":
      return [sys.executable, "-m", "cerebras_tf.runtime.server", "--parent", str(os.getpid())]
    return [sys.executable, "-m", "cerebras_tf", *self.run_args]

  def _say(self, line: str) -> None:
    with self._lock:
      self.out.write(line if line.endswith("\n") else line + "\n")
      self.out.flush()

  def _pump(self, name: str, stream) -> None:
    for line in iter(stream.readline, ""):
      self._say(f"[{name}] {line}")
    stream.close()

  def start(self) -> None:
    for job, i in tasks(self.spec):
      name = f"{job}:{i}"
      env = dict(self.env, TF_CONFIG=tf_config_for(self.spec, job, i),
                 PYTHONPATH=os.pathsep.join(p for p in (ROOT, self.env.get("PYTHONPATH")) if p))
      # In the user's directory: relative paths in the run.py flags mean what they typed.
      proc = subprocess.Popen(self._command(job), cwd=os.getcwd(), env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True, preexec_fn=_die_with_parent)
      self.procs[name] = proc
      pump = threading.Thread(target=self._pump, args=(name, proc.stdout), daemon=True)
      pump.start()
      self._pumps.append(pump)
    self._say(f"launch: {len(self.procs)} task(s) started: "
              + ", ".join(f"{n} ({self._address(n)}, pid {p.pid})" for n, p in self.procs.items()))

  def _address(self, name: str) -> str:
    job, i = name.split(":")
    return self.spec[job][int(i)]

  def stop(self) -> None:
    """SIGTERM every task's process group, SIGKILL what is left after the grace period."""
    live = [p for p in self.procs.values() if p.poll() is None]
    for p in live:
      try:
        os.killpg(p.pid, signal.SIGTERM)
      except ProcessLookupError:
        pass
    deadline = time.monotonic() + self.grace_s
    for p in live:
      try:
        p.wait(timeout=max(0.1, deadline - time.monotonic()))
      except subprocess.TimeoutExpired:
        pass
    for p in self.procs.values():
      try:
        os.killpg(p.pid, signal.SIGKILL)  # the group too: anything a task started
      except (ProcessLookupError, PermissionError):
        pass
      p.wait()
    for pump in self._pumps:
      pump.join(2)

  def wait(self) -> int:
    """Until every chief/worker is done (0) or one fails (its code; the others are stopped)."""
    trainers = {n: p for n, p in self.procs.items() if not n.startswith("ps:")}
    while True:
      for name, proc in self.procs.items():
        code = proc.poll()
        if code is not None and (code != 0 or name.startswith("ps:")):
          self._say(f"launch: {name} ({self._address(name)}) stopped ({_signal_name(code)}); "
                    f"stopping the other tasks")
          return code if code > 0 else 128 - code
      if all(p.poll() == 0 for p in trainers.values()):
        return 0
      time.sleep(0.2)

  def run(self) -> int:
    """start, wait, stop; Ctrl-C or SIGTERM stops every task."""
    def on_term(signum, _frame):
      raise KeyboardInterrupt(signal.Signals(signum).name)
    previous = signal.signal(signal.SIGTERM, on_term)
    try:
      self.start()
      code = self.wait()
    except KeyboardInterrupt as e:
      self._say(f"launch: {e.args[0] if e.args else 'SIGINT'} received; stopping every task")
      code = 130 if not e.args or e.args[0] == "SIGINT" else 143
    finally:
      self.stop()
      signal.signal(signal.SIGTERM, previous)
    return code


_USAGE_HEAD = "Start a multi-worker cluster on this machine, or print the TF_CONFIG of a real one."


def main(argv: Optional[List[str]] = None) -> int:
  """scripts/launch.py and the `cerebras-launch` command: returns the exit code."""
  argv = list(sys.argv[1:] if argv is None else argv)
  run_args = []
  if "--" in argv:
    cut = argv.index("--")
    argv, run_args = argv[:cut], argv[cut + 1:]
  ap = argparse.ArgumentParser(description=_USAGE_HEAD,
                               usage="launch.py --workers N [--ps K] -- RUN.PY FLAGS | "
                                     "launch.py --print_tf_config HOST [HOST ...]")
  ap.add_argument("--workers", type=int, help="training tasks on this machine (chief + N-1)")
  ap.add_argument("--ps", type=int, default=0, help="MemoryX weight servers (ps tasks)")
  ap.add_argument("--print_tf_config", nargs="+", metavar="HOST",
                  help="print each host's TF_CONFIG (host or host:port; the first is the chief)")
  ap.add_argument("--ps_hosts", nargs="*", default=[], metavar="HOST",
                  help="with --print_tf_config: hosts of the weight servers")
  ap.add_argument("--port", type=int, default=DEFAULT_PORT,
                  help="with --print_tf_config: the port of hosts given without one")
  args = ap.parse_args(argv)
  try:
    if args.print_tf_config:
      spec = cluster_spec(args.print_tf_config, args.ps_hosts, args.port)
      for job, i in tasks(spec):
        host = spec[job][i].rsplit(":", 1)[0]
        print(f"# {job}:{i} on {host}")
        print(f"export TF_CONFIG={shlex.quote(tf_config_for(spec, job, i))}")
      return 0
    if args.workers is None:
      ap.print_usage(sys.stderr)
      print("error: give --workers N (and the run.py flags after --) or --print_tf_config HOST..",
            file=sys.stderr)
      return 2
    if not run_args:
      print("error: give the run.py flags after --, e.g. -- --params configs/params_mlp.yaml",
            file=sys.stderr)
      return 2
    return LocalLauncher(local_spec(args.workers, args.ps), run_flags(run_args)).run()
  except CerebrasTFError as e:
    print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
    return e.exit_code


def run_flags(run_args: Sequence[str]) -> List[str]:
  """run.py's flags from what follows `--`: the flags themselves, or the command a user runs
  alone (`scripts/run.py FLAGS`, `python3 scripts/run.py FLAGS`, `python -m cerebras_tf
  FLAGS`, `cerebras-run FLAGS`), whose leading words each task's command already has."""
  args = list(run_args)
  if args and os.path.basename(args[0]).startswith("python"):
    args = args[1:]
    if args[:2] == ["-m", "cerebras_tf"]:
      return args[2:]
  if args and not args[0].startswith("-") and (
      os.path.basename(args[0]) in ("run.py", "cerebras-run")):
    return args[1:]
  return list(run_args)


def console_main():
  """Console-script entry point (`cerebras-launch`)."""
  sys.exit(main())
