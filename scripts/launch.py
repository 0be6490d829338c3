#!/usr/bin/env python3
"""Start a multi-worker cluster on this machine, or print the TF_CONFIG of a real one.

    # 2 workers (chief + 1) on 127.0.0.1, each running scripts/run.py with these flags:
    python scripts/launch.py --workers 2 -- --params configs/params_mlp.yaml \\
        --model_dir runs/mlp2 --execution_strategy multi_replica --max_steps 400

    # weight streaming: the client (chief) and 2 MemoryX weight servers as ps tasks:
    python scripts/launch.py --workers 1 --ps 2 -- --params configs/params_mlp.yaml \\
        --model_dir runs/mlp_ws --execution_strategy weight_streaming --num_wgt_servers 2

    # the TF_CONFIG for each host of a real cluster (the first host is the chief):
    python scripts/launch.py --print_tf_config host0 host1 host2 [--ps_hosts h3 h4] [--port 2222]

Every task's output is printed with a `[chief:0]` / `[worker:N]` / `[ps:N]` prefix. Ctrl-C or
SIGTERM stops every task; when one task fails, the others are stopped. See docs/distributed.md.
"""

import argparse
import os
import shlex
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=wrong-import-position
from cerebras_tf.errors import CerebrasTFError  # noqa: E402
from cerebras_tf.runtime import launcher  # noqa: E402


def main(argv=None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  run_args = []
  if "--" in argv:
    cut = argv.index("--")
    argv, run_args = argv[:cut], argv[cut + 1:]
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0],
                               usage="launch.py --workers N [--ps K] -- RUN.PY FLAGS | "
                                     "launch.py --print_tf_config HOST [HOST ...]")
  ap.add_argument("--workers", type=int, help="training tasks on this machine (chief + N-1)")
  ap.add_argument("--ps", type=int, default=0, help="MemoryX weight servers (ps tasks)")
  ap.add_argument("--print_tf_config", nargs="+", metavar="HOST",
                  help="print each host's TF_CONFIG (host or host:port; the first is the chief)")
  ap.add_argument("--ps_hosts", nargs="*", default=[], metavar="HOST",
                  help="with --print_tf_config: hosts of the weight servers")
  ap.add_argument("--port", type=int, default=launcher.DEFAULT_PORT,
                  help="with --print_tf_config: the port of hosts given without one")
  args = ap.parse_args(argv)
  try:
    if args.print_tf_config:
      spec = launcher.cluster_spec(args.print_tf_config, args.ps_hosts, args.port)
      for job, i in launcher.tasks(spec):
        host = spec[job][i].rsplit(":", 1)[0]
        print(f"# {job}:{i} on {host}")
        print(f"export TF_CONFIG={shlex.quote(launcher.tf_config_for(spec, job, i))}")
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
    return launcher.LocalLauncher(launcher.local_spec(args.workers, args.ps), run_args).run()
  except CerebrasTFError as e:
    print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
    return e.exit_code


if __name__ == "__main__":
  sys.exit(main())
