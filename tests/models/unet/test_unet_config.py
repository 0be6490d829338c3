"""UNetConfig (models/unet/config.py) is the UNet's one declaration of its hyper-parameters:
the family's `model` schema is built from it, a config built in Python is refused with the
line the YAML's value gets, and `mixed_precision` asks runtime/precision for the dtype (no
TensorFlow here)."""

import os

import pytest

from cerebras_tf.errors import ParamsError
from cerebras_tf.params import load_params
from cerebras_tf.runtime import precision
from cerebras_models import unet
from cerebras_models.fields import schema_of
from cerebras_models.unet.config import UNetConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))))
TINY = os.path.join(ROOT, "configs", "params_unet_tiny.yaml")


@pytest.fixture(autouse=True)
def _registered(monkeypatch):
  monkeypatch.setenv("CEREBRAS_TF_MODEL_MODULES", "cerebras_models.unet")


def test_the_schema_is_the_config_plus_the_eval_keys():
  model = unet.SCHEMA["model"]
  assert {k: model[k] for k in schema_of(UNetConfig)} == schema_of(UNetConfig)
  assert set(model) - set(schema_of(UNetConfig)) == {"eval_metrics", "log_image_summaries"}
  # The YAML's defaults are the Python config's (a list held as a tuple).
  config = UNetConfig()
  for key, field in schema_of(UNetConfig).items():
    default = field.default
    assert getattr(config, key) == (tuple(default) if isinstance(default, list) else default)


@pytest.mark.parametrize("key, value", [
    ("decoder_filters", [8]),                 # the file's encoder_filters have 3 entries
    ("convs_per_block", ["5x5_conv"]),
    ("encoder_filters", "wide"),
    ("nonlinearity", "tanh"),
    ("skip_connect", 3),
    ("initial_conv_filters", 0),
])
def test_a_python_config_gets_the_yaml_line(key, value):
  with pytest.raises(ValueError) as python:
    UNetConfig(**{"encoder_filters": [8, 16, 32], "decoder_filters": [16, 8], key: value})
  with pytest.raises(ParamsError) as yaml_file:
    load_params(TINY, overrides=[f"model.{key}={value!r}".replace("'", '"')
                                 if isinstance(value, str) else f"model.{key}={value}"])
  line = str(python.value)
  assert line.startswith(f"model.{key} ") and "\n" not in line
  # The YAML's line is the file (or override) that gave it, then the same words.
  assert str(yaml_file.value).endswith(": " + line), (str(yaml_file.value), line)


def test_a_valid_file_builds_the_config_it_declares():
  params = load_params(TINY, overrides=["model.nonlinearity=LeakyReLU",
                                        "model.nonlinearity_params={alpha: 0.2}",
                                        "model.initializer_params={seed: 3}"])
  config = UNetConfig.from_params(params["model"])
  assert config.nonlinearity == "LeakyReLU" and config.nonlinearity_alpha == 0.2
  assert config.kernel_init == {"name": "glorot_uniform", "seed": 3}
  assert config.bias_init == "zeros"
  assert config.encoder_filters == tuple(params["model"]["encoder_filters"])


@pytest.mark.skipif(precision.has_bf16(), reason="this CPU has bf16 math")
def test_mixed_precision_without_bf16_math_computes_float32(monkeypatch):
  monkeypatch.delenv(precision.FORCE_ENV, raising=False)
  assert UNetConfig.from_params({"mixed_precision": True}).dtype == "float32"
  monkeypatch.setenv(precision.FORCE_ENV, "1")  # the bf16 path, forced (as tests/models/test_bf16)
  assert UNetConfig.from_params({"mixed_precision": True}).dtype == "bfloat16"
  assert UNetConfig.from_params({"mixed_precision": False}).dtype == "float32"
