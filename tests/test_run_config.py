"""CSRunConfig / CSConfig: validation and immutability."""

import re

import numpy as np
import pytest
import tensorflow as tf

from cerebras_tf.errors import ConfigError
from cerebras_tf.run_config import CSConfig, CSRunConfig, parse_cs_ip


@pytest.mark.parametrize("given,want", [
    ("10.0.0.5", "10.0.0.5:9000"), ("10.0.0.5:9100", "10.0.0.5:9100"),
    ("cs2-a.lab", "cs2-a.lab:9000"), (None, None), ("", None)])
def test_cs_ip_normalized(given, want):
  assert parse_cs_ip(given) == want


@pytest.mark.parametrize("bad,fragment", [
    ("10.0.0.256", "not a valid IPv4"), ("10.0.0.5:0", "port must be"),
    ("10.0.0.5:99999", "port must be"), ("host:abc", "port must be"),
    ("bad host", "not a valid host"), ("1.2.3", "not a valid host")])
def test_cs_ip_rejected(bad, fragment):
  with pytest.raises(ConfigError, match=fragment):
    parse_cs_ip(bad)


def test_is_a_run_config_and_replace_keeps_cs_fields():
  cfg = CSRunConfig(cs_ip="1.2.3.4", system_name="sys0",
                    cs_config=CSConfig(execution_strategy="weight_streaming", num_csx=4),
                    stack_params={"a": 1}, save_checkpoints_steps=7)
  assert isinstance(cfg, tf.estimator.RunConfig)
  new = cfg.replace(save_checkpoints_steps=11, model_dir="/tmp/x")
  assert new.save_checkpoints_steps == 11 and new.model_dir == "/tmp/x"
  assert new.cs_ip == "1.2.3.4:9000" and new.system_name == "sys0"
  assert new.cs_config.num_csx == 4 and new.stack_params == {"a": 1}
  assert cfg.save_checkpoints_steps == 7  # the original is unchanged
  moved = cfg.replace(cs_ip="5.6.7.8:1234")
  assert moved.cs_ip == "5.6.7.8:1234" and cfg.cs_ip == "1.2.3.4:9000"
  with pytest.raises(ConfigError):
    cfg.replace(cs_ip="nope nope")


@pytest.mark.parametrize("kwargs,fragment", [
    ({"execution_strategy": "fast"}, "execution_strategy"), ({"num_csx": 0}, "num_csx"),
    ({"max_wgt_servers": -1}, "max_wgt_servers"), ({"num_replicas": 0}, "num_replicas"),
    ({"sparsity": 1.0}, "sparsity")])
def test_cs_config_validated(kwargs, fragment):
  with pytest.raises(ConfigError, match=fragment):
    CSConfig(**kwargs)


@pytest.mark.parametrize("kwargs,message", [
    ({"execution_strategy": "pipelined", "num_csx": 2},
     "CSConfig num_csx 2 needs execution_strategy weight_streaming or auto (pipelined runs on "
     "one system, with the weights on the wafer)"),
    ({"execution_strategy": "multi_replica", "max_wgt_servers": 3},
     "CSConfig max_wgt_servers 3 needs execution_strategy weight_streaming or auto "
     "(multi_replica runs on one system, with the weights on the wafer)"),
    ({"execution_strategy": "pipelined", "sparsity": 0.5},
     "CSConfig sparsity 0.5 needs execution_strategy weight_streaming or auto (pipelined runs "
     "on one system, with the weights on the wafer)"),
    ({"execution_strategy": "weight_streaming", "num_replicas": 3},
     "CSConfig num_replicas 3 needs execution_strategy multi_replica or auto, got "
     "'weight_streaming'"),
])
def test_a_setting_the_chosen_strategy_would_ignore_is_refused(kwargs, message):
  """CSConfig(execution_strategy="pipelined", num_csx=2) planned 1 system without a word (the
  params file refused only num_replicas). `auto` keeps each for the strategy it belongs to."""
  with pytest.raises(ConfigError) as err:
    CSConfig(**kwargs)
  assert str(err.value) == message
  CSConfig(**{**kwargs, "execution_strategy": "auto"})


@pytest.mark.parametrize("name,value", [("save_checkpoints_steps", "100"),
                                        ("log_step_count_steps", 1.5),
                                        ("keep_checkpoint_max", True)])
def test_a_count_of_the_wrong_type_is_one_line(name, value):
  """RunConfig raised Python's "'>=' not supported between instances of 'str' and 'int'"."""
  with pytest.raises(ConfigError, match=rf"CSRunConfig {name} must be an int or None, got "
                                        rf"{re.escape(repr(value))}"):
    CSRunConfig(model_dir="unused", **{name: value})


def test_numpy_ints_are_counts():
  assert CSRunConfig(save_checkpoints_steps=np.int64(50)).save_checkpoints_steps == 50


def test_a_mistyped_strategy_is_told_the_one_it_is_close_to():
  # As the params file says it: CSConfig(execution_strategy="multi-replica") gave only the list.
  with pytest.raises(ConfigError) as err:
    CSConfig(execution_strategy="multi-replica")
  assert str(err.value) == (
      "CSConfig execution_strategy must be one of pipelined, multi_replica, weight_streaming, "
      "auto, got 'multi-replica' (did you mean 'multi_replica'?)")
  with pytest.raises(ConfigError, match=r"got 'fast'$"):  # nothing close: no guess
    CSConfig(execution_strategy="fast")
