"""Download the real corpora and the BERT vocab into a local cache and write TFRecords.

    python scripts/prepare_data.py [--data_dir D] [--datasets vocab,bert_pretrain,...] [--force] [--jobs N]
    python scripts/prepare_data.py --text_to_bert 'my_text/*.txt' --out DIR [--eval_fraction F]

(`cerebras-prepare-data` in an installed wheel, which has no scripts/.)
Datasets: vocab, bert_pretrain, rotten_tomatoes, review_pretrain, en_es, digits (default: all). The cache defaults to
<repo>/data_cache (or $CEREBRAS_TF_DATA_DIR). A second run only verifies checksums. Sources,
outputs and formats: models/data/acquire.py. --text_to_bert turns your own text
(one sentence per line, a blank line between documents) into BERT pretraining records
(models/data/convert.py); the vocab is still needed to train on them.
"""

import argparse
import os
import sys
import time

from cerebras_tf.errors import DataError
from cerebras_models.data import acquire, convert


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
  parser.add_argument("--data_dir", default=None,
                      help=f"cache directory (default: ${acquire.ENV_VAR} or <repo>/data_cache)")
  parser.add_argument("--datasets", default=",".join(acquire.DATASETS),
                      help="comma-separated subset of: " + ", ".join(acquire.DATASETS))
  parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
  parser.add_argument("--jobs", type=int, default=None,
                      help="datasets built at once, each in a worker process (default: one per "
                           "core; 1: one after another in this process)")
  parser.add_argument("--text_to_bert", metavar="GLOB",
                      help="your text files (one sentence per line, a blank line between "
                           "documents) -> BERT pretraining records in --out")
  parser.add_argument("--out", help="directory for --text_to_bert's train/eval.tfrecord")
  parser.add_argument("--eval_fraction", type=float, default=0.05,
                      help="documents held out whole for eval.tfrecord (--text_to_bert)")
  args = parser.parse_args(argv)
  if args.jobs is not None and args.jobs < 1:
    parser.error(f"--jobs {args.jobs} must be at least 1")
  if args.text_to_bert:
    return _text_to_bert(args, parser)
  names = [n.strip() for n in args.datasets.split(",") if n.strip()]
  t0 = time.monotonic()
  try:
    acquire.ensure_datasets(names, data_dir=args.data_dir, force=args.force, progress=True,
                            jobs=args.jobs)
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


def _text_to_bert(args, parser):
  if not args.out:
    parser.error("--text_to_bert needs --out DIR")
  if not 0 <= args.eval_fraction < 1:
    parser.error(f"--eval_fraction {args.eval_fraction} must be in [0, 1)")
  try:
    counts = convert.text_to_bert(args.text_to_bert, args.out, args.eval_fraction)
  except DataError as e:
    print(f"prepare_data: error: {e}", file=sys.stderr)
    return 2
  except KeyboardInterrupt:
    print("prepare_data: interrupted; nothing was left half-written", file=sys.stderr)
    return 130
  for path, n in counts.items():
    print(f"prepare_data: {path}: {n:,} sentence pairs", file=sys.stderr)
  print(f"prepare_data: train on them with train_input.file_pattern: "
        f"{os.path.join(args.out, 'train.tfrecord')}", file=sys.stderr)
  return 0


def console_main():
  """Console-script entry point (`cerebras-prepare-data`)."""
  sys.exit(main())


if __name__ == "__main__":
  console_main()
