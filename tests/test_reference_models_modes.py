"""The reference models (BERT, Transformer) train through CerebrasEstimator in the two
distributed modes, on the real data, as users run them: `scripts/run.py`'s main, the four runs in one fresh process.

Cross-mode loss agreement is proved on the MLP (tests/test_execution_modes.py); here the point
is that the real models' graphs (tf-text input pipelines, masking, bucketing, their optimizers)
go through MirroredStrategy and the weight-server cluster: the runtime line names the mode, the
losses are finite and the step counter and checkpoint reach the end.
"""

import os
import re

import pytest

from progress_log import losses_by_step
from fenced_runs import run_in_one_process

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 6

# (config, datasets, step-0 loss of one device). The configs read <repo>/data_cache, where
# scripts/prepare_data.py writes. BERT at init: ln(30522) = 10.33, masked LM only (the demo
# config disables NSP; with it, + ln(2) = 11.02). Transformer:
# 10.18 measured on one device (label-smoothed, 7,734 tokens). Replicas must report the same
# mean, not R times it (tf.estimator SUMs replica losses unless the optimizer scaled them).
MODELS = {
    "bert": ("configs/params_bert_tiny_msl128.yaml", ["vocab", "bert_pretrain"], 10.33),
    "transformer": ("configs/params_transformer_tiny.yaml", ["en_es"], 10.18),
}
MODES = {
    # R fixed so the host runs exactly 2 replicas of half the global batch.
    "multi_replica": (["--execution_strategy", "multi_replica",
                       "--params_override", "csconfig.num_replicas=2"],
                      r"multi_replica runtime: 2 replica\(s\)"),
    "weight_streaming": (["--execution_strategy", "weight_streaming"],
                         r"weight_streaming runtime: 1 replica\(s\) of \d+ samples over 1 worker\(s\); 1 weight server"),
}


# The four runs one after another in ONE fresh process (as tests/test_execution_modes.py runs
# its host runs; the first, multi_replica, reserves the 2 logical CPUs its plan needs), instead
# of a process each: 3 TensorFlow and tf-text start-ups fewer. Each run's output is fenced.
# The second weight_streaming run trains on the weight server the first one launched (one
# cluster a process, runtime/cluster.client_for), as a second run in a notebook would.


def _argv(model, mode, model_dir):
  config, _, _ = MODELS[model]
  flags, _ = MODES[mode]
  # The transformer's warm-up segment must fit in the run; a constant rate is enough here.
  lr = ["--params_override", "optimizer.learning_rate=0.0005"]
  # One layer (per stack) of the real model: the same layer code, input pipeline, heads and
  # optimizer through the mode, and a fraction of the graph to build, place and optimize (graph
  # building, once per replica, and TF's first-step optimization dominated these runs).
  layers = ["--params_override", "model.num_hidden_layers=1"]
  return ["--params", config, "--mode", "train", "--model_dir", str(model_dir),
          "--max_steps", str(STEPS),
          "--params_override", "train_input.batch_size=8",
          "--params_override", "runconfig.log_step_count_steps=1",
          "--params_override", f"runconfig.save_checkpoints_steps={STEPS}", *lr, *layers, *flags]


# multi_replica first: its 2 logical CPUs are reserved before TensorFlow starts.
RUNS = [(model, mode) for mode in ("multi_replica", "weight_streaming") for model in sorted(MODELS)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """{(model, mode): (its stdout, its stderr, its model_dir)} of RUNS, in one process."""
  from cerebras_models.data import ensure_datasets  # pylint: disable=import-outside-toplevel
  try:
    ensure_datasets(sorted({d for _, datasets, _ in MODELS.values() for d in datasets}))
  except Exception as e:  # pylint: disable=broad-except
    pytest.skip(f"the reference data cannot be fetched here: {e}")
  tmp = tmp_path_factory.mktemp("reference_modes")
  argvs = [(f"{model}-{mode}", _argv(model, mode, tmp / f"{model}-{mode}"))
           for model, mode in RUNS]
  out, err, proc = run_in_one_process(argvs, ROOT, timeout=1200)
  assert sorted(out) == sorted(name for name, _ in argvs), proc.stderr[-3000:]
  return {(model, mode): (out[f"{model}-{mode}"], err[f"{model}-{mode}"],
                          tmp / f"{model}-{mode}") for model, mode in RUNS}


@pytest.mark.slow
@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("model", sorted(MODELS))
def test_reference_model_trains_in_mode(model, mode, runs):
  _, _, first_loss = MODELS[model]
  _, runtime_line = MODES[mode]
  stdout, stderr, model_dir = runs[(model, mode)]
  assert stdout.rstrip().endswith("=== exit 0"), stderr[-3000:]
  assert re.search(runtime_line, stdout), stdout[-3000:]
  losses = losses_by_step(stdout)
  assert sorted(losses) == list(range(STEPS)), sorted(losses)
  assert losses[0] == pytest.approx(first_loss, rel=0.15), losses
  assert all(0 < l < 1.5 * first_loss for l in losses.values()), losses
  assert os.path.exists(model_dir / f"model.ckpt-{STEPS}.index")
