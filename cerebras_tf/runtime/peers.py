"""The training tasks of a TF_CONFIG cluster and whether they answer (plain Python, no TF).

    python -m cerebras_tf.runtime.peers --formation_watch PID SECONDS

is the formation watchdog: TensorFlow forms a MultiWorkerMirroredStrategy cluster in C++
while holding the GIL, so no thread of the task itself can time out; this separate process
(TF_CONFIG inherited) waits SECONDS for its stdin to close (the task joined, or died), else
prints one line naming the tasks that do not answer and ends the task with EXIT_SIGNAL, which
the task (`exit_on_signal`) turns into exit code EXIT_FORMATION at the C level: a scheduler
reads a SIGKILL's 137 as an out-of-memory kill. SIGKILL only if that did not end it.
"""

import argparse
import ctypes
import errno
import os
import select
import signal
import socket
import sys
import time
from typing import Callable, List

from cerebras_tf.runtime import tf_config

TRAINING_JOBS = ("chief", "worker")
EXIT_FORMATION = 2
# libc's _exit as a signal handler exits with the signal's number: SIGINT's 2 is the
# framework's code for a problem the user can fix (errors.CerebrasTFError.exit_code).
EXIT_SIGNAL = signal.SIGINT
assert EXIT_SIGNAL == EXIT_FORMATION


def exit_on_signal(signum: int = EXIT_SIGNAL) -> Callable[[], None]:
  """Until the returned function restores Python's handler, `signum` ends this process at
  once with exit code `signum` (libc's _exit as the C handler): it works while C++ holds the
  GIL, where no Python handler can run. Ctrl-C in that window exits 2 at once as well."""
  saved = signal.getsignal(signum)
  libc = ctypes.CDLL(None)
  libc.signal.restype = ctypes.c_void_p
  libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
  libc.signal(signum, ctypes.cast(libc._exit, ctypes.c_void_p))  # pylint: disable=protected-access

  def restore():
    signal.signal(signum, saved if saved is not None else signal.SIG_DFL)
  return restore


def training_tasks(cluster: tf_config.TFConfig) -> List[str]:
  """`job:index (host:port)` of every task that trains, chief first."""
  return [f"{job}:{i} ({address})" for job in TRAINING_JOBS
          for i, address in enumerate(cluster.cluster.get(job, []))]


def address_of(task: str) -> str:
  return task.split("(", 1)[1].rstrip(")")


def reachable(address: str, timeout: float = 1.0) -> bool:
  host, port = address.rsplit(":", 1)
  try:
    with socket.create_connection((host, int(port)), timeout=timeout):
      return True
  except OSError:
    return False


def port_taken(address: str) -> bool:
  """Whether this host cannot serve `address`'s port: something holds it. Bound as gRPC binds
  it (every interface, SO_REUSEADDR), so the answer is gRPC's, before gRPC prints 1.5 kB of
  its own error text."""
  port = int(address.rsplit(":", 1)[1])
  for family, anywhere in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
    try:
      with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((anywhere, port))
      return False
    except OSError as e:
      if e.errno == errno.EADDRINUSE:
        return True
      continue  # no IPv6 here: try IPv4
  return False


def missing(cluster: tf_config.TFConfig) -> List[str]:
  """Training tasks, other than this one, whose server does not answer."""
  return [t for t in training_tasks(cluster)
          if t != cluster.task and not reachable(address_of(t))]


def formation_message(cluster: tf_config.TFConfig, timeout_s: float) -> str:
  gone = missing(cluster)
  who = ", ".join(gone) if gone else "a task (every port answers; check TF_CONFIG is the same " \
                                     "on every host)"
  return (f"cluster formation: {who} did not join within {timeout_s:.0f}s (this task is "
          f"{cluster.task}); start the same command with its TF_CONFIG on every host and check "
          f"that the ports are open")


def _formation_watch(parent: int, timeout_s: float) -> int:
  ready, _, _ = select.select([sys.stdin], [], [], timeout_s)
  if ready or os.getppid() != parent:
    return 0  # stdin closed: the task joined (or is gone)
  print(f"error: {formation_message(tf_config.current(), timeout_s)}", file=sys.stderr,
        flush=True)
  try:
    os.kill(parent, EXIT_SIGNAL)
    for _ in range(50):  # _exit is immediate; SIGKILL if the task did not install it
      time.sleep(0.1)
      if os.getppid() != parent:
        return EXIT_FORMATION
    os.kill(parent, signal.SIGKILL)
  except ProcessLookupError:
    pass
  return EXIT_FORMATION


def main(argv=None) -> int:
  ap = argparse.ArgumentParser()
  ap.add_argument("--formation_watch", nargs=2, metavar=("PID", "SECONDS"), required=True)
  args = ap.parse_args(argv)
  return _formation_watch(int(args.formation_watch[0]), float(args.formation_watch[1]))


if __name__ == "__main__":
  sys.exit(main())
