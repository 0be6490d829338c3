"""`python -m cerebras_tf FLAGS`: scripts/run.py, for an installed wheel (no scripts/ there)
and for the local launcher's tasks."""

import sys

from cerebras_tf import cli

if __name__ == "__main__":
  sys.exit(cli.main())
