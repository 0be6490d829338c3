"""Masked-LM baseline: always predict the token masked most often in the TRAIN split.

    python scripts/mlm_baseline.py --params configs/params_bert_tiny_msl128.yaml

The masks come from BERT's own input pipeline (`models/bert/input.py`, same seed as
training), so the baseline sees the positions the model is scored on: the most frequent
masked token is counted over one pass of the train split, and its accuracy is measured on the
held-out (eval) split's masked positions, weighted like `masked_lm_accuracy`.
"""

import collections
import copy
import os
import sys
from typing import Any, Dict, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)


def _masked_ids(params, mode, max_batches: Optional[int]):
  """Yields the weighted masked_lm_ids of each batch, one pass, in a fresh graph."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from cerebras_models.bert import input as input_lib  # pylint: disable=import-outside-toplevel
  tf1 = tf.compat.v1
  with tf.Graph().as_default():
    seed = (params.get("runconfig") or {}).get("tf_random_seed")
    if seed is not None:
      tf1.set_random_seed(seed)  # as RunConfig(tf_random_seed) does: the training masks
    it = tf1.data.make_initializable_iterator(input_lib.input_fn(params, mode))
    features, _ = it.get_next()
    fetch = (features["masked_lm_ids"], features["masked_lm_weights"])
    with tf1.Session() as sess:
      sess.run([it.initializer, tf1.tables_initializer()])
      done = 0
      while max_batches is None or done < max_batches:
        try:
          ids, weights = sess.run(fetch)
        except tf.errors.OutOfRangeError:
          return
        yield ids[weights > 0]
        done += 1


def most_frequent_token_baseline(params: Dict[str, Any],
                                 max_batches: Optional[int] = None) -> Dict[str, Any]:
  """Counts masked tokens in the train split, scores the most frequent one on eval.

  Args:
    params: BERT pretraining params (train_input and eval_input sections).
    max_batches: stop each pass after this many batches (None: the whole split).
  Returns:
    dict: token_id, train_masked (positions counted), train_frequency (share of the top
    token), eval_masked, eval_accuracy.
  """
  params = copy.deepcopy(params)
  params["train_input"].update(shuffle=False, repeat=False)  # exactly one pass
  params.setdefault("eval_input", copy.deepcopy(params["train_input"]))
  params["eval_input"].update(shuffle=False, repeat=False)
  counts = collections.Counter()
  for ids in _masked_ids(params, "train", max_batches):
    counts.update(ids.tolist())
  if not counts:
    raise ValueError("the train split gave no masked positions")
  token, top = counts.most_common(1)[0]
  hits = total = 0
  for ids in _masked_ids(params, "eval", max_batches):
    hits += int((ids == token).sum())
    total += int(ids.size)
  return {"token_id": int(token), "train_masked": sum(counts.values()),
          "train_frequency": top / sum(counts.values()), "eval_masked": total,
          "eval_accuracy": hits / max(total, 1)}


def main(argv):
  import argparse  # pylint: disable=import-outside-toplevel
  from cerebras_tf import params as params_lib  # pylint: disable=import-outside-toplevel
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--params", required=True, help="BERT pretraining params YAML")
  ap.add_argument("--max_batches", type=int, default=None,
                  help="batches per split (default: all)")
  fv = ap.parse_args(argv[1:])
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  params = params_lib.load_params(fv.params)
  result = most_frequent_token_baseline(params, fv.max_batches)
  vocab_file = params["train_input"].get("vocab_file") or os.path.join(
      params["train_input"]["data_dir"], "vocab", "bert_uncased_vocab.txt")
  with open(vocab_file) as f:
    vocab = [line.rstrip("\n") for line in f]
  print(f"most frequent masked train token: {vocab[result['token_id']]!r} (id "
        f"{result['token_id']}), {result['train_frequency']:.2%} of "
        f"{result['train_masked']} train masked positions")
  print(f"baseline masked_lm_accuracy on eval: {result['eval_accuracy']:.4f} "
        f"({result['eval_masked']} masked positions)")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
