"""A generic TensorFlow task server (one ps task = one MemoryX weight server).

    python -m cerebras_tf.runtime.server --cluster JSON --job ps --index 0 [--parent PID]
    TF_CONFIG=... python -m cerebras_tf.runtime.server        (a ps task of a real cluster)

It holds variables and runs the optimizer ops the client places on it; it needs none of the
user's code. It exits when its parent dies (so a killed run leaves no orphans) or on SIGTERM.
"""

import argparse
import glob
import importlib.util
import json
import os
import signal
import sys
import threading
import time
import types

from cerebras_tf.errors import ConfigError
from cerebras_tf.runtime import tf_config


def _watch_parent(parent: int) -> None:
  while True:
    if os.getppid() != parent:
      os._exit(0)  # the launcher is gone: leave no orphan behind
    time.sleep(0.5)


def _server_lib():
  """TensorFlow's `server_lib` with its runtime library, but not TensorFlow's Python API.

  A task server runs the graph partitions its client sends, in C++: every core kernel is in
  the runtime library that `server_lib` loads. `import tensorflow` and `import tensorflow_text`
  would also build their Python APIs (autograph, tf.distribute, tf.data, Keras' hooks): a
  server took 2.1 s of CPU to come up that way, 0.6 s this way, at every start and restart
  (the test suite starts ~40). So the package's `__init__` is not run:
  `tensorflow` is bound to a bare package object over the same directory, which Python's
  import system then fills with just the submodules asked for. TensorFlow is pinned
  (setup.py); a layout change would fail here, loudly, in tests/test_cluster.py (which runs
  a core and a tf-text op on a server) and every weight-streaming test.
  """
  if "tensorflow" not in sys.modules:
    spec = importlib.util.find_spec("tensorflow")
    package = types.ModuleType("tensorflow")
    package.__spec__, package.__path__ = spec, list(spec.submodule_search_locations)
    sys.modules["tensorflow"] = package
  # pylint: disable=import-outside-toplevel
  from tensorflow.python.framework import load_library
  from tensorflow.python.training import server_lib
  # tf-text's kernels, for text ops a client places on this task: its op libraries alone, as
  # its own modules load them, without its Python (which imports all of TensorFlow).
  text = importlib.util.find_spec("tensorflow_text")
  if text is not None:
    for library in sorted(glob.glob(os.path.join(os.path.dirname(text.origin), "python", "ops",
                                                 "*.so"))):
      load_library.load_op_library(library)
  return server_lib


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
  server_lib = _server_lib()
  cluster = server_lib.ClusterSpec(json.loads(args.cluster))
  server = server_lib.Server(cluster, job_name=args.job, task_index=args.index, start=True)
  print(f"cerebras_tf task {args.job}:{args.index} serving at {server.target}", flush=True)
  # Wait in Python, not in server.join(): a thread blocked in C++ never returns to the
  # interpreter, so the SIGTERM handler above never ran and every stop waited out the
  # launcher's 10 s grace before SIGKILL (the server serves from its own threads meanwhile).
  while True:
    signal.pause()


if __name__ == "__main__":
  sys.exit(main())
