#!/usr/bin/env python3
"""`python scripts/prepare_data.py FLAGS`: models/data/prepare.py from a checkout."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cerebras_models.data import prepare  # noqa: E402  pylint: disable=wrong-import-position

if __name__ == "__main__":
  prepare.console_main()
