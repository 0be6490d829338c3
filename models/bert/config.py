"""BERT's architecture hyper-parameters, declared once: each field is its params key (the
`model` section's Field: type, default, range or choices, help), so the family's registry
schema is `schema_of(BertConfig)` and a config built in Python is checked by the same rules as
the YAML. No TensorFlow (the family's __init__ imports this; modeling.py builds from it)."""

import dataclasses
import json
from typing import Any, Mapping

from cerebras_models.fields import (ALWAYS_BUILT, TRANSFORMER_MODEL_FIELDS as _T, check_config,
                                    param, params_kwargs)
from cerebras_tf.schema import Field

# The shared switches this BERT builds one way only (the registry refuses another value; so
# does from_params).
FIXED_OPTIONS = {**ALWAYS_BUILT, ("model", "position_embedding_type"): "learned"}


@dataclasses.dataclass(frozen=True)
class BertConfig:
  """The backbone's shape and switches (the `model` keys it builds)."""

  vocab_size: int = param(Field("int", 30522, "vocabulary rows (word embeddings, MLM output)",
                                low=1))
  hidden_size: int = param(_T["hidden_size"])
  num_hidden_layers: int = param(_T["num_hidden_layers"])
  num_heads: int = param(_T["num_heads"])
  filter_size: int = param(_T["filter_size"])
  max_position_embeddings: int = param(_T["max_position_embeddings"])
  type_vocab_size: int = param(Field("int", 2, "segment (token type) embedding rows", low=1))
  dropout_rate: float = param(_T["dropout_rate"])
  attention_dropout_rate: float = param(_T["attention_dropout_rate"])
  layer_norm_epsilon: float = param(_T["layer_norm_epsilon"])
  initializer_range: float = param(_T["initializer_range"])
  encoder_nonlinearity: str = param(_T["encoder_nonlinearity"])  # gelu: google-bert's tanh form
  use_segment_embedding: bool = param(_T["use_segment_embedding"])  # false: RoBERTa
  # false: the masked-LM output layer gets its own [V, H] matrix (cls/predictions/
  # output_weights), so a word seen only as a wrong answer in pretraining keeps its random
  # input embedding (issue 44: tied, such rows collapsed to one direction, cosine 0.95).
  share_embedding_weights: bool = param(_T["share_embedding_weights"])
  pooler_nonlinearity: str = param(Field("str", "tanh", "the pooler's activation (modelzoo key)",
                                         choices=("tanh", "gelu", "relu")))
  pooling: str = param(Field("str", "cls", "what the pooler (and so the classifier and NSP "
                             "heads) reads: cls, the first token's output (google-bert), or "
                             "mean, the mean of the real tokens' outputs (a checkpoint "
                             "pretrained without NSP never trained the first token to "
                             "summarize)", choices=("cls", "mean")))
  # Not a params key: model.mixed_precision picks it (runtime/precision.py).
  dtype: str = "float32"

  def __post_init__(self):
    check_config(self)

  @classmethod
  def from_params(cls, model_params: Mapping[str, Any]) -> "BertConfig":
    """Builds a config from `params["model"]`; other keys (task, heads, ...) are ignored.

    Shared transformer switches this BERT does not implement must keep their defaults.
    """
    for (_, key), wanted in FIXED_OPTIONS.items():
      if model_params.get(key, wanted) != wanted:
        raise ValueError(f"model.{key}={model_params[key]!r} is not supported by BERT "
                         f"(only {wanted!r})")
    return cls(**params_kwargs(cls, model_params))

  @classmethod
  def from_google_json(cls, path: str) -> "BertConfig":
    """Reads a google-research/bert `bert_config.json` (a local file)."""
    with open(path, encoding="utf-8") as f:
      cfg = json.load(f)
    return cls(vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
               num_hidden_layers=cfg["num_hidden_layers"],
               num_heads=cfg["num_attention_heads"], filter_size=cfg["intermediate_size"],
               max_position_embeddings=cfg["max_position_embeddings"],
               type_vocab_size=cfg["type_vocab_size"],
               dropout_rate=cfg["hidden_dropout_prob"],
               attention_dropout_rate=cfg["attention_probs_dropout_prob"],
               initializer_range=cfg["initializer_range"],
               encoder_nonlinearity=cfg.get("hidden_act", "gelu"))
