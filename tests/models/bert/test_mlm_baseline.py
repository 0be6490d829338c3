"""scripts/mlm_baseline.py: the most frequent masked train token, scored on eval positions."""

import collections
import os
import sys

import numpy as np

import bert_test_base as base

sys.path.insert(0, os.path.join(base.REPO, "scripts"))
import mlm_baseline  # noqa: E402  pylint: disable=wrong-import-position


class MlmBaselineTest(base.BertTestCase):

  def test_counts_train_and_scores_eval_like_masked_lm_accuracy(self):
    params = base.tiny_params(self.make_data_dir())
    result = mlm_baseline.most_frequent_token_baseline(params)
    # Recount by hand from the same seeded pipeline.
    counts = collections.Counter()
    for ids in mlm_baseline._masked_ids(dict(params, train_input=dict(
        params["train_input"], shuffle=False, repeat=False)), "train", None):
      counts.update(ids.tolist())
    token = counts.most_common(1)[0][0]
    self.assertEqual(result["token_id"], token)
    self.assertEqual(result["train_masked"], sum(counts.values()))
    eval_ids = np.concatenate(list(mlm_baseline._masked_ids(params, "eval", None)))
    self.assertEqual(result["eval_masked"], eval_ids.size)
    self.assertAllClose(result["eval_accuracy"], np.mean(eval_ids == token))
    self.assertBetween(result["eval_accuracy"], 0.0, 0.5)
