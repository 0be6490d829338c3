#!/usr/bin/env python3
"""Train, evaluate, predict or compile a model from a params YAML file.

    python scripts/run.py --params configs/params_bert_tiny_msl128.yaml --mode train

See `cerebras_tf/cli.py` for the flags (or run with --help).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cerebras_tf import cli  # noqa: E402  pylint: disable=wrong-import-position

if __name__ == "__main__":
  sys.exit(cli.main())
