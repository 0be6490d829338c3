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

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cerebras_tf.runtime import launcher  # noqa: E402  pylint: disable=wrong-import-position

if __name__ == "__main__":
  sys.exit(launcher.main())
