"""GPT's architecture hyper-parameters, declared once: each field is its params key (the
`model` section's Field: type, default, range or choices, help), so the family's registry
schema is `schema_of(GPTConfig)` and a config built in Python is checked by the same rules as
the YAML. No TensorFlow (the family's __init__ imports this; modeling.py builds from it)."""

import dataclasses
from typing import Any, Mapping, Optional

from cerebras_models.fields import (TRANSFORMER_MODEL_FIELDS as _T, check_config, param,
                                    params_kwargs)
from cerebras_tf.schema import Field

FFN = ("gelu", "relu", "tanh", "swiglu")


def _moe(kind, default):
  """A key of model.moe (modelzoo's block, flattened onto the config by the family's check)."""
  return dataclasses.field(default=default, metadata={"moe_kind": kind})


def moe_keys():
  """{key: (kind, default)} of model.moe's keys, as GPTConfig declares them."""
  return {f.name: (f.metadata["moe_kind"], f.default) for f in dataclasses.fields(GPTConfig)
          if "moe_kind" in f.metadata}


@dataclasses.dataclass(frozen=True)
class GPTConfig:
  """The decoder's shape and switches (the `model` keys it builds)."""

  vocab_size: int = param(Field("int", 50257, "vocabulary rows", low=1))
  hidden_size: int = param(_T["hidden_size"])
  num_hidden_layers: int = param(_T["num_hidden_layers"])
  num_heads: int = param(_T["num_heads"])
  filter_size: int = param(_T["filter_size"])
  max_position_embeddings: int = param(_T["max_position_embeddings"])
  position_embedding_type: str = param(Field("str", "learned", "learned (GPT-2/3) or rotary "
                                             "(GPT-J)", choices=("learned", "rotary")))
  rotary_dim: int = param(Field("int", 64, "features per head that rotary rotates", low=2))
  parallel_attention: bool = param(Field("bool", False, "GPT-J: attention and FFN in "
                                         "parallel"))
  use_untied_layer_norm: bool = param(Field("bool", False, "GPT-NeoX: a parallel block "
                                            "normalizes the FFN's input with its own norm "
                                            "(ln_2)"))
  use_position_embedding: bool = param(_T["use_position_embedding"])
  share_embedding_weights: bool = param(_T["share_embedding_weights"])  # GPT-J: false
  dropout_rate: float = param(Field("float", 0.0, "dropout", low=0, high=1, high_open=True))
  attention_dropout_rate: float = param(Field("float", 0.0, "attention dropout", low=0, high=1,
                                              high_open=True))
  layer_norm_epsilon: float = param(Field("float", 1e-5, "layer norm epsilon", low=0,
                                          low_open=True))
  initializer_range: float = param(_T["initializer_range"])
  # modelzoo's embedding_initializer / output_layer_initializer (truncated normal stddevs).
  # The output layers are attention's `output` and the FFN's fc_out.
  embedding_initializer_range: Optional[float] = param(Field(
      "float", None, "stddev of the embeddings' truncated-normal init (null: "
      "initializer_range)", low=0, low_open=True))
  output_layer_initializer_range: Optional[float] = param(Field(
      "float", None, "stddev of attention's output and the FFN's fc_out init (GPT-2's scaled "
      "init: 0.02/sqrt(2 * layers); null: initializer_range)", low=0, low_open=True))
  # LLaMA's variations, under modelzoo's names.
  norm_type: str = param(Field("str", "layernorm", "layernorm, or rmsnorm (LLaMA)",
                               choices=("layernorm", "rmsnorm")))
  encoder_nonlinearity: str = param(Field("str", "gelu", "feed-forward activation; swiglu: a "
                                          "gated FFN (LLaMA)", choices=FFN))
  num_kv_groups: Optional[int] = param(Field("int", None, "K/V heads of grouped-query "
                                             "attention (null: num_heads)", low=1))
  rope_theta: float = param(Field("float", 10000.0, "base of the rotary frequencies", low=0,
                                  low_open=True))
  use_ffn_bias: bool = param(_T["use_ffn_bias"])
  use_projection_bias_in_attention: bool = param(_T["use_projection_bias_in_attention"])
  use_ffn_bias_in_attention: bool = param(Field("bool", True, "a bias in the attention's "
                                                "output projection "
                                                "(use_projection_bias_in_attention is query, "
                                                "key and value's)"))
  use_bias_in_output: Optional[bool] = param(Field(
      "bool", None, "a bias in the LM head (null: an untied head has one, a tied head none; "
      "true: a tied head too, as modelzoo's GPT-J)"))
  embedding_dropout_rate: Optional[float] = param(Field(
      "float", None, "dropout after the embeddings (null: dropout_rate)", low=0, high=1,
      high_open=True))
  pos_scaling_factor: float = param(Field("float", 1.0, "rotary context extension: "
                                          "frequencies divided by it (linear) or per band "
                                          "(llama3)", low=0, low_open=True))
  pos_scaling_type: str = param(Field("str", "linear", "how pos_scaling_factor applies",
                                      choices=("linear", "llama3")))
  pos_scaling_extra_args: Optional[Mapping[str, float]] = param(Field(
      "numbers", None, "llama3 scaling: low_freq_factor, high_freq_factor, "
      "original_max_position_embeddings"))
  # Not params keys of their own: modelzoo's initializer specs by group (layers, embedding,
  # output), {name, args} (tf_files.initializer_spec), which win over the ranges above ...
  initializer_specs: Optional[Mapping[str, Mapping[str, Any]]] = None
  # ... and the mixture of experts (modelzoo's `model.moe`, flattened by the family's check):
  # each FFN is num_experts expert FFNs, each token routed to top_k of them; 0: a plain FFN.
  # Declared here once: the family's check reads model.moe's kinds and defaults from these.
  num_experts: int = _moe(int, 0)
  top_k: int = _moe(int, 1)
  load_balancing_loss_coef: float = _moe(float, 0.0)
  router_fp32: bool = _moe(bool, True)
  num_shared_experts: int = _moe(int, 0)
  expert_weighting_normalization: bool = _moe(bool, True)
  capacity_factor: Optional[float] = _moe(float, None)  # None: dropless (any expert any token)
  dtype: str = "float32"  # compute dtype; model.mixed_precision picks it (runtime/precision.py)

  def __post_init__(self):
    check_config(self)

  @classmethod
  def from_params(cls, model: Mapping[str, Any]) -> "GPTConfig":
    return cls(**params_kwargs(cls, model))

  def init(self, group: str):
    """The initializer of a group ("layers", "embedding", "output"): a stddev or a spec,
    for bert.modeling.initializer."""
    specs = self.initializer_specs or {}
    layers = specs.get("layers") or self.initializer_range
    if group == "embedding":
      return specs.get("embedding") or self.embedding_initializer_range or layers
    if group == "output":
      return specs.get("output") or self.output_layer_initializer_range or layers
    return layers

  @property
  def output_range(self):
    return self.init("output")

  @property
  def kv_heads(self) -> int:
    return self.num_kv_groups or self.num_heads

  @property
  def head_bias(self) -> bool:
    """Whether the LM head has a bias: an untied one unless use_bias_in_output is false; a
    tied one only when it is true (modelzoo's GPT-J: the shared table plus a bias)."""
    if self.share_embedding_weights:
      return self.use_bias_in_output is True
    return self.use_bias_in_output is not False

  @property
  def learned_positions(self) -> bool:
    return self.position_embedding_type == "learned" and self.use_position_embedding
