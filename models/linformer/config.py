"""The Linformer's hyper-parameters, declared once: BertConfig's (the encoder it projects)
with modelzoo's Linformer defaults, plus its projection's keys. Each field is its params key,
so the family's `model` schema is built from `schema_of(LinformerConfig)` and a config built
in Python is checked by the same rules as the YAML. No TensorFlow (the family's __init__
imports this; modeling.py builds from it)."""

import dataclasses

from cerebras_models.bert.config import BertConfig
from cerebras_models.fields import param
from cerebras_tf.schema import Field

SHARED_HEADS, SHARED_KV = "linformer-shared-heads", "linformer-shared-kv"


@dataclasses.dataclass(frozen=True)
class LinformerConfig(BertConfig):
  """BERT's encoder shape and switches, and how its keys and values are projected."""

  use_segment_embedding: bool = param(Field("bool", False, "segment (token type) embeddings "
                                            "(modelzoo's Linformer: none unless given)"))
  layer_norm_epsilon: float = param(Field("float", 1e-8, "layer norm epsilon (modelzoo's "
                                          "Linformer default)", low=0, low_open=True))
  projected_dims: int = param(Field("int", 256, "k: the sequence positions keys and values "
                                    "are projected to (modelzoo's key)", low=1))
  attention_style: str = param(Field("str", SHARED_HEADS, "linformer-shared-heads: a key "
                                     "projection E and a value projection F per layer, shared "
                                     "by the heads; linformer-shared-kv: one projection for "
                                     "both", choices=(SHARED_HEADS, SHARED_KV)))

  @property
  def shared_kv(self) -> bool:
    """One projection E for the keys and the values (F = E)."""
    return self.attention_style == SHARED_KV
