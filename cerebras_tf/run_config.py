"""CSRunConfig and CSConfig: where the engine is and how to run on it.

`CSRunConfig` is a `tf.estimator.RunConfig` with the engine's address (`cs_ip`), its system
name, a `CSConfig` (execution strategy, engine model, systems, weight servers, replicas) and
free-form `stack_params`. Like RunConfig it is immutable: change it with `replace()`, which
keeps the Cerebras fields and validates them again.
"""

import copy
import numbers
from typing import Optional

import tensorflow as tf

from cerebras_tf.cs_config import DEFAULT_CS_PORT, CSConfig, parse_cs_ip  # noqa: F401 (API)
from cerebras_tf.errors import ConfigError

_CS_FIELDS = ("cs_ip", "system_name", "cs_config", "stack_params")

# RunConfig's own constructor arguments, read back from its properties (from_run_config).
_RUN_CONFIG_ARGS = (
    "model_dir", "tf_random_seed", "save_summary_steps", "save_checkpoints_steps",
    "save_checkpoints_secs", "session_config", "keep_checkpoint_max",
    "keep_checkpoint_every_n_hours", "log_step_count_steps", "train_distribute", "device_fn",
    "protocol", "eval_distribute", "experimental_max_worker_delay_secs",
    "session_creation_timeout_secs", "checkpoint_save_graph_def")


class CSRunConfig(tf.estimator.RunConfig):
  """A RunConfig that also says where the Cerebras system is and how to use it."""

  def __init__(self, cs_ip=None, system_name=None, cs_config=None, stack_params=None, **kwargs):
    try:
      super().__init__(**kwargs)  # what RunConfig refuses, it refuses with its own error
    except TypeError:
      _check_counts(kwargs)  # "'>=' not supported between 'str' and 'int'" named
      raise
    _check_counts(kwargs)
    self._cs_ip = parse_cs_ip(cs_ip)
    self._system_name = system_name
    self._cs_config = _check_cs_config(cs_config)
    self._stack_params = dict(stack_params or {})
    self._cs_master = None

  @classmethod
  def from_run_config(cls, config: tf.estimator.RunConfig, **cs_kwargs) -> "CSRunConfig":
    """A CSRunConfig with the settings of a plain RunConfig (and the default CSConfig)."""
    kwargs = {k: getattr(config, k) for k in _RUN_CONFIG_ARGS}
    if kwargs["save_checkpoints_secs"] is not None:
      kwargs["save_checkpoints_steps"] = None
    return cls(**cs_kwargs, **kwargs)

  @property
  def master(self) -> str:
    """The session target: TF_CONFIG's, or the weight-streaming client's when it runs one."""
    return self._cs_master or super().master

  @property
  def cs_ip(self) -> Optional[str]:
    """`host:port` of the system, or None for the embedded simulated engine."""
    return self._cs_ip

  @property
  def system_name(self) -> Optional[str]:
    return self._system_name

  @property
  def cs_config(self) -> CSConfig:
    return self._cs_config

  @property
  def stack_params(self) -> dict:
    return dict(self._stack_params)

  def replace(self, **kwargs) -> "CSRunConfig":
    """Returns a copy with fields replaced; Cerebras fields are kept and validated."""
    cs_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in _CS_FIELDS}
    new = super().replace(**kwargs) if kwargs else copy.deepcopy(self)
    if "cs_ip" in cs_kwargs:
      new._cs_ip = parse_cs_ip(cs_kwargs["cs_ip"])
    if "system_name" in cs_kwargs:
      new._system_name = cs_kwargs["system_name"]
    if "cs_config" in cs_kwargs:
      new._cs_config = _check_cs_config(cs_kwargs["cs_config"])
    if "stack_params" in cs_kwargs:
      new._stack_params = dict(cs_kwargs["stack_params"] or {})
    return new

  def with_master(self, master: str) -> "CSRunConfig":
    """A copy whose session target is `master` (the weight-streaming client's):
    `replace(master=...)` is refused, as RunConfig refuses it."""
    new = copy.deepcopy(self)
    new._cs_master = master
    return new


# RunConfig's arguments that are counts; RunConfig itself fails on a string with Python's
# "'>=' not supported between instances of 'str' and 'int'".
_COUNTS = ("tf_random_seed", "save_summary_steps", "save_checkpoints_steps",
           "save_checkpoints_secs", "keep_checkpoint_max", "log_step_count_steps")


def _check_counts(kwargs: dict) -> None:
  for name in _COUNTS:
    value = kwargs.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
      raise ConfigError(f"CSRunConfig {name} must be an int or None, got {value!r}")


def _check_cs_config(cs_config) -> CSConfig:
  if cs_config is None:
    return CSConfig()
  if isinstance(cs_config, CSConfig):
    return cs_config
  if isinstance(cs_config, dict):
    unknown = set(cs_config) - set(CSConfig._fields)
    if unknown:
      raise ConfigError(f"unknown cs_config key(s) {sorted(unknown)}; allowed: {', '.join(CSConfig._fields)}")
    return CSConfig(**cs_config)
  raise ConfigError(f"cs_config must be a CSConfig or a dict, got {type(cs_config).__name__}")
