"""cerebras_tf/core/batching.py: the one owner of the batch split, and its one check."""

import pytest

from cerebras_tf.core import batching
from cerebras_tf.errors import ParamsError


def test_split_names_every_share():
  # 2 systems x 4 engine replicas; the host runs 4 replicas over 2 workers; global 64.
  b = batching.split(64, engine_replicas=4, num_systems=2, host_replicas=4, num_workers=2)
  assert (b.per_system, b.per_engine_replica, b.per_worker, b.per_host_replica) == (32, 8, 32, 16)
  assert b.host_replicas_per_worker == 2
  assert batching.Batching.from_dict(b.to_dict()) == b


def test_micro_batches_and_the_groups_batch_norm_sees():
  # Weight streaming: 4 systems of 50 samples, each in 3 micro-batches (17, 17, 16: they need
  # not divide); batch norm's statistics are one micro-batch's, the fewest 50 // 3 = 16.
  b = batching.split(200, num_systems=4, host_replicas=4, micro_batches=3)
  assert (b.per_system, b.per_micro_batch, b.batch_norm_groups, b.batch_norm_samples) == \
      (50, 16, 12, 16)
  assert b.keeps_batch_norm
  assert not batching.split(200, num_systems=4, micro_batches=4).keeps_batch_norm   # 12 each
  # multi_replica: a replica's samples; one group is the whole batch, however small.
  assert batching.split(64, engine_replicas=8).batch_norm_samples == 8
  assert batching.split(8).keeps_batch_norm
  assert batching.Batching.from_dict(b.to_dict()) == b
  assert batching.Batching.from_dict({"global_batch": 8}).micro_batches == 1   # older caches
  with pytest.raises(batching.BatchError, match="5 micro-batches of a per-system batch of 4 "
                     r"leave some empty; use at most 4 \(one sample each\)"):
    batching.split(8, num_systems=2, micro_batches=5)
  with pytest.raises(batching.BatchError, match="micro-batches must be an int >= 1, got 0"):
    batching.split(8, micro_batches=0)


@pytest.mark.parametrize("kwargs,message", [
    (dict(engine_replicas=3), "250 does not split evenly over 3 replicas (num_replicas): each "
     "needs batch / 3 samples; use a multiple of 3 (e.g. 252)"),
    (dict(num_systems=4), "over 4 CS systems (num_csx)"),
    (dict(num_systems=2, engine_replicas=4), "over 2 CS systems (num_csx) x 4 replicas"),
    (dict(host_replicas=4), "over 4 host replicas"),
    (dict(num_workers=3), "over 3 workers"),
])
def test_one_check_one_message(kwargs, message):
  with pytest.raises(batching.BatchError) as e:
    batching.split(250, **kwargs)
  assert message in str(e.value)
  # Named both ways: a YAML user sets train_input.batch_size, a Python user params['batch_size'].
  assert "(train_input.batch_size, or params['batch_size'] in Python)" in str(e.value)
  assert isinstance(e.value, ParamsError)  # the CLI's exit 2, one line


@pytest.mark.parametrize("bad", [0, -1, True, 2.0])
def test_counts_must_be_positive_ints(bad):
  with pytest.raises(batching.BatchError):
    batching.split(8, num_systems=bad)
  with pytest.raises(batching.BatchError):
    batching.split(bad)


def test_host_replicas_cannot_spread_over_workers():
  with pytest.raises(batching.BatchError, match="3 host replicas cannot be spread evenly over 2"):
    batching.split(12, host_replicas=3, num_workers=2)


@pytest.mark.parametrize("engine_r,systems,batch,forced,devices,workers,want", [
    (16, 1, 16, False, 2, 1, 2),    # compiler's R on a CPU host: 2 logical CPUs, 8 samples each
    (64, 1, 64, False, 2, 1, 2),
    (16, 1, 15, False, 2, 1, 1),    # 15 % 2: one device
    (16, 1, 16, False, 4, 1, 4),    # one replica per GPU
    (2, 1, 16, False, 8, 1, 2),     # never more than the plan's R
    (8, 1, 16, True, 2, 1, 8),      # csconfig.num_replicas: the user's number on the host too
    (1, 1, 16, False, 2, 1, 1),     # pipelined
    (1, 2, 16, False, 2, 1, 2),     # weight streaming: one device per system while it has them
    (1, 8, 16, False, 2, 1, 2),     # 8 systems' shares on 2 devices
    (1, 2, 16, False, 1, 1, 1),     # TensorFlow started with one CPU device
    (1, 4, 16, True, 2, 1, 2),      # `forced` is num_replicas', not num_csx's
    (1, 1, 16, False, 1, 3, 3),     # three workers, one replica each
    (64, 1, 64, False, 1, 2, 2),    # multi_replica over 2 workers of one device
])
def test_host_replicas(engine_r, systems, batch, forced, devices, workers, want):
  assert batching.host_replicas(engine_r, systems, batch, forced=forced,
                                devices_per_worker=devices, num_workers=workers) == want


@pytest.mark.parametrize("key,bad", [("num_csx", 0), ("max_wgt_servers", -1),
                                     ("num_replicas", 0), ("sparsity", 1.0),
                                     ("execution_strategy", "fast"), ("vts", "maybe")])
def test_each_cs_setting_has_one_rule(key, bad):
  """CSConfig (Python) and the params file (YAML) refuse a bad csconfig value with the same
  rule, the setting's schema Field: one validation, two entry points."""
  from cerebras_tf import params, schema  # pylint: disable=import-outside-toplevel
  from cerebras_tf.cs_config import CSConfig  # pylint: disable=import-outside-toplevel
  from cerebras_tf.errors import ConfigError  # pylint: disable=import-outside-toplevel
  rule = schema.CSCONFIG_FIELDS[key].describe()
  with pytest.raises(ConfigError) as py:
    CSConfig(**{key: bad})
  text = f"model: {{name: mlp}}\ntrain_input: {{batch_size: 8}}\ncsconfig: {{{key}: {bad!r}}}\n"
  with pytest.raises(ParamsError) as yml:
    params.parse_params(text.replace("'", ""), "p.yaml")
  assert f"must be {rule}" in str(py.value) and f"must be {rule}" in str(yml.value)
