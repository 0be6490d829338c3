"""A generic TensorFlow task server (one ps task = one MemoryX weight server).

    python -m cerebras_tf.runtime.server --cluster JSON --job ps --index 0 [--parent PID]
    TF_CONFIG=... python -m cerebras_tf.runtime.server        (a ps task of a real cluster)

It holds variables and runs the optimizer ops the client places on it; it needs none of the
user's code. It exits when its parent dies (so a killed run leaves no orphans) or on SIGTERM.
"""

import argparse
import json
import os
import signal
import sys
import threading
import time

from cerebras_tf.errors import ConfigError
from cerebras_tf.runtime import tf_config


def _watch_parent(parent: int) -> None:
  while True:
    if os.getppid() != parent:
      os._exit(0)  # the launcher is gone: leave no orphan behind
    time.sleep(0.5)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser()
  ap.add_argument("--cluster", help="cluster JSON (default: TF_CONFIG's)")
  ap.add_argument("--job", help="job name (default: TF_CONFIG's task.type)")
  ap.add_argument("--index", type=int, help="task index (default: TF_CONFIG's task.index)")
  ap.add_argument("--parent", type=int, default=0)
  args = ap.parse_args(argv)
  if args.cluster is None:
    try:
      cfg = tf_config.current()
    except ConfigError as e:
      print(f"error: {e}", file=sys.stderr)
      return 2
    if cfg is None:
      print("error: give --cluster/--job/--index or set TF_CONFIG", file=sys.stderr)
      return 2
    args.cluster, args.job, args.index = json.dumps(cfg.cluster), cfg.task_type, cfg.task_index
  if args.parent:
    threading.Thread(target=_watch_parent, args=(args.parent,), daemon=True).start()
  signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  try:
    import tensorflow_text  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  except ImportError:
    pass  # only needed when text ops are placed on this task
  cluster = tf.train.ClusterSpec(json.loads(args.cluster))
  server = tf.distribute.Server(cluster, job_name=args.job, task_index=args.index, start=True)
  print(f"cerebras_tf task {args.job}:{args.index} serving at {server.target}", flush=True)
  # Wait in Python, not in server.join(): a thread blocked in C++ never returns to the
  # interpreter, so the SIGTERM handler above never ran and every stop waited out the
  # launcher's 10 s grace before SIGKILL (the server serves from its own threads meanwhile).
  while True:
    signal.pause()


if __name__ == "__main__":
  sys.exit(main())
