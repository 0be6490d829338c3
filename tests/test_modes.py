"""core/plans.ExecutionMode: what each mode is, as every layer asks it."""

import pytest

from cerebras_tf.core import plans


def test_each_mode_says_what_it_is():
  pipe, multi, ws = (plans.mode_of(s) for s in (plans.PIPELINED, plans.MULTI_REPLICA,
                                               plans.WEIGHT_STREAMING))
  assert (pipe.replicates, pipe.streams_weights, pipe.data_parallel) == (False, False, False)
  assert (multi.replicates, multi.streams_weights, multi.data_parallel) == (True, False, True)
  assert (ws.replicates, ws.streams_weights, ws.data_parallel) == (False, True, True)
  # Only a one-device pipelined run checkpoints its input position (tf.estimator takes no
  # saving listener under a distribution strategy).
  assert [m.name for m in plans.MODES.values() if m.saves_input_position] == [plans.PIPELINED]


def test_labels_name_the_replicas_only_where_there_are_copies():
  assert plans.mode_of(plans.MULTI_REPLICA).label(4) == "multi_replica (R=4)"
  assert plans.mode_of(plans.WEIGHT_STREAMING).label(4) == "weight_streaming"


def test_auto_may_plan_every_mode():
  assert plans.modes_of(plans.AUTO) == tuple(plans.MODES.values())
  assert plans.modes_of(plans.PIPELINED) == (plans.MODES[plans.PIPELINED],)
  with pytest.raises(KeyError):
    plans.modes_of("streaming")


@pytest.mark.parametrize("strategy,kwargs,key", [
    (plans.PIPELINED, {"num_csx": 2}, "num_csx"),
    (plans.MULTI_REPLICA, {"sparsity": 0.5}, "sparsity"),
    (plans.PIPELINED, {"micro_batch_size": 8}, "micro_batch_size"),
    (plans.WEIGHT_STREAMING, {"num_replicas": 2}, "num_replicas"),
    (plans.PIPELINED, {"num_replicas": 3}, "num_replicas"),
])
def test_a_setting_the_mode_cannot_apply_is_named(strategy, kwargs, key):
  conflict = plans.option_conflict(strategy, **kwargs)
  assert conflict is not None and conflict[0] == key and strategy in conflict[1]


@pytest.mark.parametrize("strategy,kwargs", [
    (plans.WEIGHT_STREAMING, {"num_csx": 4, "max_wgt_servers": 2, "sparsity": 0.3}),
    (plans.MULTI_REPLICA, {"num_replicas": 4}),
    (plans.AUTO, {"num_csx": 4, "num_replicas": 2}),
    (plans.PIPELINED, {"num_replicas": 1}),
])
def test_settings_a_mode_applies_pass(strategy, kwargs):
  assert plans.option_conflict(strategy, **kwargs) is None
