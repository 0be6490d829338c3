"""T5's architecture hyper-parameters, declared once: each field is its params key (the
`model` section's Field: type, default, range or choices, help), so the family's registry
schema is `schema_of(T5Config)` and a config built in Python is checked by the same rules as
the YAML. No TensorFlow (the family's __init__ imports this; modeling.py builds from it)."""

import dataclasses
from typing import Any, Mapping, Optional

from cerebras_models.fields import check_config, param, params_kwargs
from cerebras_tf.schema import Field, pos_int

ACTIVATION_CHOICES = ("relu", "gelu")
# A null decoder key takes the encoder's value: the one rule for the YAML (the family's check
# fills the params dict, which the framework's analysis reads) and for T5Config.
DECODER_FOLLOWS = {"num_decoder_layers": "num_encoder_layers",
                   "decoder_nonlinearity": "encoder_nonlinearity"}


def _rate(default, help_text):
  return Field("float", default, help_text, low=0, high=1, high_open=True)


@dataclasses.dataclass(frozen=True)
class T5Config:
  """The encoder-decoder's shape and switches (the `model` keys it builds)."""

  d_model: int = param(pos_int(512, "width of the embeddings and of every layer's residual "
                               "stream"))
  d_kv: int = param(pos_int(64, "size of each head's query, key and value (num_heads * d_kv "
                            "is the attention's inner width; it need not be d_model)"))
  num_heads: int = param(pos_int(8, "attention heads"))
  d_ff: int = param(pos_int(2048, "feed-forward inner width"))
  num_encoder_layers: int = param(pos_int(6, "encoder layers (modelzoo: "
                                          "encoder_num_hidden_layers)"))
  num_decoder_layers: Optional[int] = param(pos_int(None, "decoder layers (modelzoo: "
                                                    "decoder_num_hidden_layers; null: "
                                                    "num_encoder_layers)"))
  dropout_rate: float = param(_rate(0.1, "dropout of the embeddings, attention probabilities, "
                                    "sublayer outputs and the stacks' outputs (T5 has one "
                                    "rate)"))
  layer_norm_epsilon: float = param(Field("float", 1e-6, "epsilon of the RMS layer norm", low=0,
                                          low_open=True))
  attention_type: str = param(Field("str", "dot_product", "dot_product: scores are q.k "
                                    "unscaled (T5: the 1/sqrt(d_kv) is in the query's "
                                    "initializer); scaled_dot_product: q.k / sqrt(d_kv)",
                                    choices=("dot_product", "scaled_dot_product")))
  use_relative_attention_bias: bool = param(Field(
      "bool", True, "add T5's bucketed relative position bias to the self-attention scores "
      "(one table per stack, shared by its layers); false: no position information at all, "
      "as modelzoo"))
  num_relative_attention_buckets: int = param(pos_int(32, "buckets of relative distance (half "
                                                      "per direction in the encoder)"))
  relative_attention_max_distance: int = param(pos_int(128, "distances from this on share the "
                                                       "last bucket (T5's 128)"))
  use_ffn_bias: bool = param(Field("bool", False, "biases in the feed-forward layers (T5: "
                                   "none)"))
  encoder_nonlinearity: str = param(Field("str", "relu", "encoder feed-forward activation",
                                          choices=ACTIVATION_CHOICES))
  decoder_nonlinearity: Optional[str] = param(Field("str", None, "decoder feed-forward "
                                                    "activation (null: encoder_nonlinearity)",
                                                    choices=ACTIVATION_CHOICES))
  share_embedding_weights: bool = param(Field(
      "bool", True, "one embedding table for encoder and decoder (modelzoo: "
      "share_encoder_decoder_embedding); the logits always use the decoder's table"))
  initializer_factor: float = param(Field(
      "float", 1.0, "scales every default initializer's stddev (mesh-TF T5's: embeddings "
      "N(0, 1), query N(0, (d_model * d_kv)^-1/2), key/value N(0, d_model^-1/2), ...)", low=0,
      low_open=True))
  # Not model keys: the vocabulary (train_input's, plus extra_ids) and the compute dtype
  # (model.mixed_precision picks it: runtime/precision.py).
  vocab_size: int = 32128
  dtype: str = "float32"

  def __post_init__(self):
    for key, source in DECODER_FOLLOWS.items():
      if getattr(self, key) is None:
        object.__setattr__(self, key, getattr(self, source))
    check_config(self, heads=False)

  @property
  def inner(self) -> int:
    return self.num_heads * self.d_kv

  @property
  def scaled_attention(self) -> bool:
    return self.attention_type == "scaled_dot_product"

  @classmethod
  def from_params(cls, model: Mapping[str, Any], vocab_size: int) -> "T5Config":
    return cls(**dict(params_kwargs(cls, model), vocab_size=int(vocab_size)))
