#!/usr/bin/env python3
"""Download the real corpora and the BERT vocab into a local cache and write TFRecords.

    python scripts/prepare_data.py [--data_dir D] [--datasets vocab,bert_pretrain,...] [--force]

Datasets: vocab, bert_pretrain, rotten_tomatoes, en_es, digits (default: all). The cache defaults to
<repo>/data_cache (or $CEREBRAS_TF_DATA_DIR). A second run only verifies checksums. Sources,
outputs and formats: cerebras_tf/models/data/acquire.py.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cerebras_tf.models.data import acquire  # noqa: E402  pylint: disable=wrong-import-position


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
  parser.add_argument("--data_dir", default=None,
                      help=f"cache directory (default: ${acquire.ENV_VAR} or <repo>/data_cache)")
  parser.add_argument("--datasets", default=",".join(acquire.DATASETS),
                      help="comma-separated subset of: " + ", ".join(acquire.DATASETS))
  parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
  args = parser.parse_args(argv)
  names = [n.strip() for n in args.datasets.split(",") if n.strip()]
  t0 = time.monotonic()
  try:
    acquire.ensure_datasets(names, data_dir=args.data_dir, force=args.force, progress=True)
  except acquire.AcquireError as e:
    print(f"prepare_data: error: {e}", file=sys.stderr)
    return 2
  except KeyboardInterrupt:
    print("prepare_data: interrupted", file=sys.stderr)
    return 130
  data_dir = os.path.abspath(args.data_dir or acquire.default_data_dir())
  print(f"prepare_data: {', '.join(names)} ready in {data_dir} ({time.monotonic() - t0:.1f} s)",
        file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
