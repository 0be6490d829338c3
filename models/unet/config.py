"""The UNet's architecture hyper-parameters, declared once under modelzoo's key names: each
field is its params key (the `model` section's Field: type, default, choices, help), so the
family's registry schema is `schema_of(UNetConfig)` plus its non-architecture keys, and a
config built in Python is checked by the same rules, with the same one-line errors, as the
YAML. No TensorFlow (the family's __init__ imports this; modeling.py builds from it)."""

import dataclasses
from typing import Any, Mapping, Optional, Tuple

from cerebras_models.fields import check_config, param, params_kwargs
from cerebras_tf.schema import Field

CONV_KINDS = {"3x3_conv": 3, "1x1_conv": 1}  # modelzoo's names -> kernel size
NONLINEARITIES = ("ReLU", "LeakyReLU", "ELU", "relu", "leaky_relu", "elu")
# Keras initializer names modelzoo's UNet takes, built as tf.compat.v1's (modeling.py).
INITIALIZERS = ("glorot_uniform", "glorot_normal", "he_uniform", "he_normal", "lecun_uniform",
                "lecun_normal", "zeros", "ones", "constant", "random_normal", "random_uniform",
                "truncated_normal")


@dataclasses.dataclass(frozen=True)
class UNetConfig:
  """The encoder, decoder and convolutions (the `model` keys the UNet builds)."""

  encoder_filters: Tuple[int, ...] = param(Field(
      "int_list", [32, 64, 128, 256], "filters of each encoder block, the last one the "
      "bottleneck's"))
  decoder_filters: Tuple[int, ...] = param(Field(
      "int_list", [128, 64, 32], "filters of each decoder block (one fewer than "
      "encoder_filters)"))
  convs_per_block: Tuple[str, ...] = param(Field(
      "spec", ["3x3_conv", "3x3_conv"], "the convolutions of a block, each 3x3_conv or "
      "1x1_conv"))
  skip_connect: bool = param(Field("bool", True, "concatenate each encoder block's output to "
                                   "the decoder block of its size"))
  enable_bias: bool = param(Field("bool", True, "biases in the convolutions"))
  data_format: str = param(Field("str", "channels_first", "the images' layout: channels_first "
                                 "[B, C, H, W] (modelzoo's default) or channels_last; computed "
                                 "NHWC here", choices=("channels_first", "channels_last")))
  downscale_method: str = param(Field("str", "max_pool", "encoder downsampling: a 2x2 "
                                      "max-pool", choices=("max_pool",)))
  nonlinearity: str = param(Field("str", "ReLU", "activation after each convolution (a Keras "
                                  "layer name)", choices=NONLINEARITIES))
  nonlinearity_params: Optional[Mapping[str, Any]] = param(Field(
      "mapping", None, "its arguments: alpha (LeakyReLU, ELU)"))
  initializer: str = param(Field("str", "glorot_uniform", "kernels' Keras initializer",
                                 choices=INITIALIZERS))
  initializer_params: Optional[Mapping[str, Any]] = param(Field(
      "mapping", None, "the initializer's arguments"))
  bias_initializer: str = param(Field("str", "zeros", "biases' Keras initializer",
                                      choices=INITIALIZERS))
  bias_initializer_params: Optional[Mapping[str, Any]] = param(Field(
      "mapping", None, "the bias initializer's arguments"))
  initial_conv_filters: Optional[int] = param(Field(
      "int", None, "a 3x3 ReLU convolution of this many filters before the encoder (null: "
      "none)", low=1))
  # Not a params key: model.mixed_precision picks it (runtime/precision.py).
  dtype: str = "float32"

  def __post_init__(self):
    if isinstance(self.convs_per_block, list):
      object.__setattr__(self, "convs_per_block", tuple(self.convs_per_block))
    check_config(self, heads=False)
    error = architecture_error(self.encoder_filters, self.decoder_filters,
                               self.convs_per_block)
    if error:
      raise ValueError(error[1])

  @classmethod
  def from_params(cls, model: Mapping[str, Any]) -> "UNetConfig":
    """Builds a config from `params["model"]`; other keys (eval_metrics, ...) are ignored."""
    kwargs = params_kwargs(cls, model)
    # The validator moves modelzoo's model.nonlinearity onto encoder_nonlinearity (GPT's name).
    if model.get("encoder_nonlinearity") is not None:
      kwargs["nonlinearity"] = model["encoder_nonlinearity"]
    return cls(**kwargs)

  @property
  def downsamplings(self) -> int:
    return len(self.encoder_filters) - 1

  @property
  def channels_first(self) -> bool:
    """Whether the input is [B, C, H, W] (transposed to NHWC first)."""
    return self.data_format == "channels_first"

  @property
  def nonlinearity_alpha(self) -> Optional[float]:
    """LeakyReLU's slope, ELU's alpha (null: the layer's default)."""
    return (self.nonlinearity_params or {}).get("alpha")

  @property
  def kernel_init(self):
    """The kernels' initializer: its name, or {name, its arguments}."""
    return _with_params(self.initializer, self.initializer_params)

  @property
  def bias_init(self):
    """The biases' initializer: its name, or {name, its arguments}."""
    return _with_params(self.bias_initializer, self.bias_initializer_params)


def _with_params(name, extra):
  return {"name": name, **extra} if extra else name


def _listed(value):
  """A config's tuple shown as the YAML's list, so both say the same line."""
  return list(value) if isinstance(value, tuple) else value


def architecture_error(encoder_filters, decoder_filters,
                       convs_per_block) -> Optional[Tuple[str, str]]:
  """(model key, one-line message) of the first shape rule the values break, else None: the
  family's params check and UNetConfig both raise its message."""
  enc, dec = list(encoder_filters), list(decoder_filters)
  if len(enc) != len(dec) + 1 or min(enc + dec) < 1:
    return "decoder_filters", (f"model.decoder_filters {dec} must have one entry fewer than "
                               f"model.encoder_filters {enc} (its last is the bottleneck), "
                               f"all positive")
  convs = convs_per_block
  if not (isinstance(convs, (list, tuple)) and convs and all(
      isinstance(c, str) and c in CONV_KINDS for c in convs)):
    return "convs_per_block", (f"model.convs_per_block must be a list of "
                               f"{' / '.join(CONV_KINDS)}, got {_listed(convs)!r}")
  return None
