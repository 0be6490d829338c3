"""The training tasks of a TF_CONFIG cluster and whether they answer (plain Python, no TF).

    python -m cerebras_tf.runtime.peers --formation_watch PID SECONDS

is the formation watchdog: TensorFlow forms a MultiWorkerMirroredStrategy cluster in C++
while holding the GIL, so no thread of the task itself can time out; this separate process
(TF_CONFIG inherited) waits SECONDS for its stdin to close (the task joined, or died), else
prints one line naming the tasks that do not answer and ends the task with SIGKILL.
"""

import argparse
import os
import select
import signal
import socket
import sys
from typing import List

from cerebras_tf.runtime import tf_config

TRAINING_JOBS = ("chief", "worker")
EXIT_FORMATION = 2


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
