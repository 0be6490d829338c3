"""The Transformer's architecture hyper-parameters, declared once: each field is its params key
(the `model` section's Field: type, default, range or choices, help), so the family's registry
schema is `schema_of(TransformerConfig)` and a config built in Python is checked by the same
rules as the YAML. No TensorFlow (the family's __init__ imports this; modeling.py builds from
it)."""

import dataclasses
from typing import Any, Mapping, Optional

from cerebras_models.fields import (TRANSFORMER_MODEL_FIELDS as _T, check_config, param,
                                    params_kwargs)
from cerebras_tf.schema import Field

ACTIVATION_NAMES = ("relu", "gelu", "tanh")


def _pos_int(default, help_text):
  return Field("int", default, help_text, low=0, low_open=True)


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """The encoder-decoder's shape and switches (the `model` keys it builds)."""

  vocab_size: Optional[int] = param(_pos_int(None, "vocabulary rows (null: the vocabulary "
                                             "file's size)"))
  hidden_size: int = param(_pos_int(512, "d_model"))
  num_hidden_layers: int = param(_pos_int(6, "encoder and decoder layers (unless set apart)"))
  num_encoder_layers: Optional[int] = param(_pos_int(None, "encoder layers (null: "
                                                     "num_hidden_layers)"))
  num_decoder_layers: Optional[int] = param(_pos_int(None, "decoder layers (null: "
                                                     "num_hidden_layers)"))
  num_heads: int = param(_pos_int(8, "attention heads; must divide hidden_size"))
  filter_size: int = param(_pos_int(2048, "feed-forward inner width"))
  dropout_rate: float = param(_T["dropout_rate"])
  attention_dropout_rate: float = param(_T["attention_dropout_rate"])
  layer_norm_epsilon: float = param(Field("float", 1e-6, "layer norm epsilon", low=0,
                                          low_open=True))
  initializer_range: float = param(_T["initializer_range"])
  max_position_embeddings: int = param(_T["max_position_embeddings"])
  position_embedding_type: str = param(Field("str", "fixed", "fixed (sinusoids, as the paper) "
                                             "or learned", choices=("fixed", "learned")))
  norm_type: str = param(Field("str", "post", "post-norm (the paper) or pre-norm residual "
                               "blocks", choices=("post", "pre")))
  share_embedding_weights: bool = param(Field("bool", True, "one embedding table for source "
                                              "and target (the vocabulary is shared)"))
  tie_output_projection: bool = param(Field("bool", True, "logits use the target embedding "
                                            "table"))
  encoder_nonlinearity: str = param(Field("str", "relu", "feed-forward activation",
                                          choices=ACTIVATION_NAMES))
  # modelzoo's attention keys: biases of the q/k/v projections and of the output projection;
  # scores scaled by 1/sqrt(D) (scaled_dot_product) or not (dot_product).
  use_projection_bias_in_attention: bool = param(Field("bool", True, "biases of the "
                                                       "attention's query, key and value "
                                                       "projections"))
  use_ffn_bias_in_attention: bool = param(Field("bool", True, "modelzoo key: a bias in the "
                                                "attention's output projection"))
  attention_type: str = param(Field("str", "scaled_dot_product", "modelzoo key: scores scaled "
                                    "by 1/sqrt(head size) (scaled_dot_product) or not "
                                    "(dot_product)",
                                    choices=("scaled_dot_product", "dot_product")))
  dtype: str = "float32"  # compute dtype; model.mixed_precision picks it (runtime/precision.py)

  def __post_init__(self):
    for side in ("num_encoder_layers", "num_decoder_layers"):  # null: num_hidden_layers
      if getattr(self, side) is None:
        object.__setattr__(self, side, self.num_hidden_layers)
    check_config(self)

  @property
  def pre_norm(self) -> bool:
    return self.norm_type == "pre"

  @property
  def scaled_attention(self) -> bool:
    return self.attention_type == "scaled_dot_product"

  @property
  def head_size(self) -> int:
    return self.hidden_size // self.num_heads

  @classmethod
  def from_params(cls, model: Mapping[str, Any]) -> "TransformerConfig":
    return cls(**params_kwargs(cls, model))
