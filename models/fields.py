"""Params keys shared by the reference model families (text input, transformer shapes), and
their cross-checks, and the helpers that make a family's config dataclass its schema
(`param`, `schema_of`), check it by the schema's rules (`check_config`) and build it from
params (`params_kwargs`). No TensorFlow."""

import dataclasses
from typing import Any, Dict, Mapping, Optional

from cerebras_tf.runtime import precision
from cerebras_tf.schema import Field, pos_int as _pos_int

AUTOTUNE = -1  # tf.data.AUTOTUNE, named here without importing TensorFlow


def prefetch_batches(section, default: int = AUTOTUNE) -> int:
  """Batches an input prepares ahead: the section's prefetch_factor, else `default`."""
  return int(section.get("prefetch_factor") or default)


def parallel_calls(section) -> int:
  """Parallel calls of an input's maps: num_parallel_calls (modelzoo's num_workers), else
  tf.data's AUTOTUNE."""
  return int(section.get("num_parallel_calls") or AUTOTUNE)


# Shared by text models (BERT, Transformer, GPT): they add these in their registry schema.
TEXT_INPUT_FIELDS = {
    "vocab_file": Field("path", None, "WordPiece / BPE vocabulary file"),
    "vocab_size": _pos_int(None, "vocabulary size (null: from vocab_file)"),
    "max_sequence_length": _pos_int(128, "tokens per example, padded"),
    "do_lower": Field("bool", True, "lower-case text before tokenizing"),
}
# Masked-LM input (BERT): a GPT or Transformer input has no masks to count (its default of 20
# refused a GPT at sequence length 8, "max_predictions_per_seq 20 must be <= 8").
MASKED_LM_FIELDS = {
    "max_predictions_per_seq": _pos_int(20, "masked-LM predictions per sequence"),
    "masked_lm_prob": Field("float", 0.15, "fraction of tokens masked", low=0, high=1),
}

TRANSFORMER_MODEL_FIELDS = {
    "hidden_size": _pos_int(768, "width of the embeddings and every layer"),
    "num_hidden_layers": _pos_int(12, "encoder (decoder) layers"),
    "num_heads": _pos_int(12, "attention heads; must divide hidden_size"),
    "filter_size": _pos_int(3072, "feed-forward inner width"),
    "dropout_rate": Field("float", 0.1, "dropout after embeddings and sublayers", low=0, high=1,
                          high_open=True),
    "attention_dropout_rate": Field("float", 0.1, "dropout on attention probabilities", low=0,
                                    high=1, high_open=True),
    "layer_norm_epsilon": Field("float", 1e-12, "layer norm epsilon", low=0, low_open=True),
    "max_position_embeddings": _pos_int(512, "rows of the position table"),
    "use_position_embedding": Field("bool", True, "add position embeddings"),
    "use_segment_embedding": Field("bool", True, "add segment (token type) embeddings"),
    "position_embedding_type": Field("str", "learned", "position embeddings",
                                     choices=("learned", "fixed")),
    "share_embedding_weights": Field("bool", True, "tie input and output embeddings"),
    "encoder_nonlinearity": Field("str", "gelu", "feed-forward activation",
                                  choices=("gelu", "relu", "tanh")),
    "use_ffn_bias": Field("bool", True, "bias in the feed-forward layers"),
    "use_projection_bias_in_attention": Field("bool", True, "bias in the attention's q, k, v "
                                              "and output projections"),
    "nonlinearity": Field("str", None, "modelzoo GPT's name for encoder_nonlinearity",
                          choices=("gelu", "relu", "tanh")),
    "use_vsl": Field("bool", False, "variable sequence length: modelzoo's name for "
                     "csconfig.vts (true sets it)"),
    "initializer_range": Field("float", 0.02, "stddev of the truncated-normal init", low=0,
                               low_open=True),
}


CHECKED_KINDS = ("int", "float", "bool", "str", "int_list")  # the kinds Field.check rules on


def param(field: Field):
  """A config dataclass field declared by its params key: default, type, range and help are
  `field`'s (schema_of reads it back, check_fields applies it). A list default (the YAML's)
  is the frozen config's tuple."""
  default = tuple(field.default) if isinstance(field.default, list) else field.default
  return dataclasses.field(default=default, metadata={"field": field})


def schema_of(config_cls) -> Dict[str, Field]:
  """{key: Field} of a config dataclass's `param` fields: the family's `model` keys it builds."""
  return {f.name: f.metadata["field"] for f in dataclasses.fields(config_cls)
          if "field" in f.metadata}


def check_fields(config) -> None:
  """Applies each `param` field's Field to its value (the rule the params validator applies to
  the YAML key) and stores the normalized value (an int list as a tuple); ValueError
  'model.<key> must be ...'."""
  for f in dataclasses.fields(config):
    field = f.metadata.get("field")
    if field is None or field.kind not in CHECKED_KINDS:  # mappings, specs: the family's check
      continue
    try:
      value = field.check(getattr(config, f.name))
    except ValueError as e:
      raise ValueError(f"model.{f.name} {e}") from e
    object.__setattr__(config, f.name, tuple(value) if isinstance(value, list) else value)


DTYPES = ("float32", "bfloat16")  # a config's compute dtype (runtime/precision picks it)


def params_kwargs(config_cls, model: Mapping[str, Any]) -> Dict[str, Any]:
  """A config dataclass's keyword arguments from `params["model"]`: each of its fields the
  section gives (null: the field's default), and the compute dtype model.mixed_precision asks
  for (runtime/precision: bfloat16 only where the CPU has bf16 math, else float32)."""
  kwargs = {f.name: model[f.name] for f in dataclasses.fields(config_cls)
            if f.name != "dtype" and model.get(f.name) is not None}
  kwargs["dtype"] = precision.compute_dtype(model.get("mixed_precision"))
  return kwargs


def check_config(config, heads: bool = True) -> None:
  """A family config's own checks, the same for every family: its params Fields
  (check_fields), hidden_size % num_heads when `heads`, and its compute dtype."""
  check_fields(config)
  error = heads_error(config.hidden_size, config.num_heads) if heads else None
  if error:
    raise ValueError(error)
  if config.dtype not in DTYPES:
    raise ValueError(f"dtype must be float32 or bfloat16, got {config.dtype!r}")


def heads_error(hidden_size, num_heads) -> Optional[str]:
  """Why num_heads cannot split hidden_size into equal heads, or None."""
  if isinstance(hidden_size, int) and isinstance(num_heads, int) and hidden_size % num_heads:
    return (f"model.hidden_size {hidden_size} must be divisible by model.num_heads "
            f"{num_heads}")
  return None


# modelzoo's initializer specs (create_initializer's and GPT-J's forms), built by the family
# (tf_files.initializer_spec); null: the family's truncated normal of initializer_range.
MODELZOO_INITIALIZERS = {
    key: Field("spec", None, f"modelzoo's initializer of the {what}: truncated_normal, "
               f"normal, uniform, constant, glorot_*, variance_scaling (scale or scale_type "
               f"small_init / wang_init), scaled_init_normal")
    for key, what in (("initializer", "layers"), ("embedding_initializer", "embeddings"),
                      ("output_layer_initializer", "output layers (attention output, fc_out)"))}


# Shared switches a family builds only one way (registry.ModelSpec.unapplied): the value it
# builds is accepted, any other refused. Each family adds its own.
ALWAYS_BUILT = {("model", "use_position_embedding"): True, ("model", "use_ffn_bias"): True,
                ("model", "use_projection_bias_in_attention"): True}
# For the families without segments (GPT, the Transformer): the shared field, off by default.
NO_SEGMENTS = {"use_segment_embedding": Field("bool", False, "segment (token type) embeddings: "
                                              "this model has none")}


def check_transformer_params(out: dict, fail) -> None:
  """Cross-checks of the text/transformer keys; `fail(key_path, message)` raises the one line."""
  for section in ("train_input", "eval_input"):
    inp = out.get(section) or {}
    msl, mpp = inp.get("max_sequence_length"), inp.get("max_predictions_per_seq")
    if isinstance(msl, int) and isinstance(mpp, int) and mpp > msl:
      fail((section, "max_predictions_per_seq"), f"{section}.max_predictions_per_seq "
           f"{mpp} must be <= max_sequence_length {msl}")
  model = out["model"]
  table = model.get("max_position_embeddings")
  learned = (model.get("use_position_embedding", True)  # a table of rows (not sinusoids)
             and model.get("position_embedding_type", "learned") != "fixed")
  for section in ("train_input", "eval_input"):
    msl = (out.get(section) or {}).get("max_sequence_length")
    if learned and isinstance(table, int) and isinstance(msl, int) and msl > table:
      fail((section, "max_sequence_length"), f"{section}.max_sequence_length {msl} must "
           f"be <= model.max_position_embeddings {table} (rows of the position table)")
  error = heads_error(model.get("hidden_size"), model.get("num_heads"))
  if error:
    fail(("model", "num_heads"), error)
