"""The resume order (runtime/checkpoints.py) and the frozen records of a call
(model_fn_wrapper.py), on their own: which checkpoint a call reads, when evaluate/predict take
the newest again, and that a call's record cannot be changed behind the graph's back."""

import dataclasses
import os
from types import SimpleNamespace

import pytest
import tensorflow as tf

from cerebras_tf.model_fn_wrapper import CallContext, EngineRun
from cerebras_tf.runtime import checkpoints


def _save(model_dir, steps):
  """model_dir with a checkpoint at each of `steps` (one variable, the global step)."""
  with tf.Graph().as_default():
    step = tf.compat.v1.train.get_or_create_global_step()
    saver = tf.compat.v1.train.Saver(max_to_keep=None)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for s in steps:
        session.run(step.assign(s))
        saver.save(session, os.path.join(model_dir, "model.ckpt"), global_step=s)


def test_resume_order_retires_the_input_state_on_the_chief_only(tmp_path):
  """A run that saves no input position (signature None) renames checkpoint_input to
  .retired on the chief; a worker sharing the model_dir leaves it; both resume from the
  latest model checkpoint."""
  model_dir = str(tmp_path)
  _save(model_dir, [2, 4])
  state = tmp_path / checkpoints.INPUT_STATE
  state.write_text('model_checkpoint_path: "input.ckpt-4"\n')
  assert checkpoints.resume_point(model_dir).endswith("model.ckpt-4")
  assert checkpoints.resume_order(model_dir, None, is_chief=False).endswith("model.ckpt-4")
  assert state.exists()
  assert checkpoints.resume_order(model_dir, None, is_chief=True).endswith("model.ckpt-4")
  assert not state.exists() and (tmp_path / (checkpoints.INPUT_STATE + ".retired")).exists()


def test_to_read_takes_the_named_checkpoint_else_the_latest(tmp_path):
  model_dir = str(tmp_path)
  assert checkpoints.to_read(model_dir, None) is None  # nothing trained: the initializers
  _save(model_dir, [2, 4])
  assert checkpoints.to_read(model_dir, None).endswith("model.ckpt-4")
  named = os.path.join(model_dir, "model.ckpt-2")
  assert checkpoints.to_read(model_dir, named) == named


def test_vanished_retries_only_a_deleted_latest_checkpoint_and_not_forever(tmp_path):
  """True only when the checkpoint read is gone, the caller did not name it, and an attempt
  is left: VANISHED_RETRIES = 3 attempts after the first."""
  model_dir = str(tmp_path)
  _save(model_dir, [2])
  kept = os.path.join(model_dir, "model.ckpt-2")
  gone = os.path.join(model_dir, "model.ckpt-1")
  error = tf.errors.NotFoundError(None, None, "gone")
  assert not checkpoints.vanished(kept, False, 0, error)        # still there: a real error
  assert checkpoints.vanished(gone, False, 0, error)
  assert checkpoints.vanished(gone, False, checkpoints.VANISHED_RETRIES - 1, error)
  assert not checkpoints.vanished(gone, False, checkpoints.VANISHED_RETRIES, error)
  assert not checkpoints.vanished(gone, True, 0, error)         # named by the caller
  assert not checkpoints.vanished(None, False, 0, error)        # nothing was restored


def test_a_calls_record_is_frozen_and_replaced_by_name():
  call = CallContext(restore_from="/m/model.ckpt-4")
  with pytest.raises(dataclasses.FrozenInstanceError):
    call.restore_from = None  # pylint: disable=assigning-non-slot
  later = call.replace(model_fn_batch=8)
  assert (later.restore_from, later.model_fn_batch, call.model_fn_batch) == (
      "/m/model.ckpt-4", 8, None)
  with pytest.raises(TypeError):
    call.replace(hook=None)  # a field that does not exist is refused, not carried along


def test_an_engine_runs_progress_hook_reads_the_record(tmp_path):
  """The progress hook gets the plan's global batch, the predicted rate and utilization, and
  the record's last step, interval and input rate (no wafer picture: none was written)."""
  result = SimpleNamespace(
      report_paths={"wafer": str(tmp_path / "none.png")},
      plan=SimpleNamespace(batch_size=64),
      performance=SimpleNamespace(samples_per_sec=1000.0, utilization=0.25))
  run = EngineRun(result, last_step=40, every_n_steps=5, input_samples_per_sec=2000.0)
  with tf.Graph().as_default():
    hook = run.progress_hook(tf.constant(1.0), str(tmp_path))
  seen = vars(hook)
  assert [seen[k] for k in ("_batch", "_sim_sps", "_util", "_last_step", "_every", "_input_sps",
                            "_wafer_png")] == [64, 1000.0, 0.25, 40, 5, 2000.0, None]
