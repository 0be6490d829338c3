"""Decoder-only GPT (GPT-2/GPT-3 shapes with learned positions; GPT-J with rotary positions and
parallel attention+FFN; LLaMA's RMSNorm, SwiGLU, grouped-query attention and bias-free layers). It is what weight streaming is for: configs run from gpt_tiny (trains
here on the real corpus) to GPT-3 175B (compile only).

  modeling.py  backbone     model.py  model_fn     input.py  input_fn
  export.py    SavedModel serving (token ids in, next token and log-probs out)
No TensorFlow import here.
"""

from cerebras_tf.modelzoo import tf_files
from cerebras_models.fields import (MODELZOO_INITIALIZERS, NO_SEGMENTS, TEXT_INPUT_FIELDS,
                                    TRANSFORMER_MODEL_FIELDS, check_transformer_params,
                                    schema_of)
from cerebras_models.gpt.config import FFN as _FFN, GPTConfig, moe_keys
from cerebras_tf.registry import ModelSpec, register
from cerebras_tf.schema import Field


# model.moe's keys as modelzoo names them -> (kind, default); ours: capacity_factor.
_MOE_KEYS = moe_keys()
# Accepted when they name what is built (learned softmax routing); refused otherwise.
_MOE_ONLY = {"routing_algorithm": ("learned",), "router_selection_nonlinearity": ("softmax",),
             "expert_weighting_nonlinearity": ("softmax",), "null_expert_bias": (0, 0.0),
             "moe_implementation": ("functional", "optimized", "experimental")}


def _check_moe(model: dict, fail) -> None:
  """model.moe (modelzoo's block) -> flat GPTConfig keys; one clear error per bad key."""
  moe = model.pop("moe", None) or {}
  where = ("model", "moe")
  for key, value in moe.items():
    if key in _MOE_ONLY:
      if value is not None and value not in _MOE_ONLY[key]:
        fail(where, f"model.moe.{key} {value!r} is not built here (only "
             f"{', '.join(map(str, _MOE_ONLY[key]))}); remove it")
      continue
    if key not in _MOE_KEYS:
      fail(where, f"model.moe.{key} is not read (known: {', '.join(sorted(_MOE_KEYS))}, "
           f"{', '.join(sorted(_MOE_ONLY))})")
    kind = _MOE_KEYS[key][0]
    ok = (value is None and _MOE_KEYS[key][1] is None) or (
        isinstance(value, kind) if kind is not float else
        isinstance(value, (int, float)) and not isinstance(value, bool))
    if not ok or (kind in (int, float) and value is not None and value < 0):
      fail(where, f"model.moe.{key} must be a {kind.__name__} >= 0, got {value!r}")
    model[key] = value
  experts = model.get("num_experts") or 0
  if experts:
    top_k = model.get("top_k") or 1
    if not 1 <= top_k <= experts:
      fail(where, f"model.moe.top_k {top_k} must be between 1 and num_experts {experts}")
    if model.get("capacity_factor") is not None and model["capacity_factor"] <= 0:
      fail(where, "model.moe.capacity_factor must be > 0 (null: dropless)")


def _check(out: dict, fail) -> None:
  check_transformer_params(out, fail)
  model = out["model"]
  tf_files.apply_initializers(model, fail, {
      "initializer": "layers", "embedding_initializer": "embedding",
      "output_layer_initializer": "output"}, model["vocab_size"])
  head = model["hidden_size"] // model["num_heads"]
  if model["position_embedding_type"] == "rotary" and model["rotary_dim"] > head:
    # modelzoo's GPT-J rotates key[..., :rotary_dim]: beyond the head size, that is the whole
    # head (ANL's gene_gptj_2B: rotary_dim 64 over 3968 / 64 = 62-feature heads).
    if head % 2:
      fail(("model", "rotary_dim"), f"model.rotary_dim {model['rotary_dim']} covers the whole "
           f"head, hidden_size {model['hidden_size']} / num_heads {model['num_heads']} = "
           f"{head} features, an odd number rotary cannot rotate in pairs; set rotary_dim to "
           f"an even number <= {head}")
    model["rotary_dim"] = head
  if model.get("use_untied_layer_norm") and not model["parallel_attention"]:
    fail(("model", "use_untied_layer_norm"), "model.use_untied_layer_norm: true is GPT-NeoX's "
         "second norm for the FFN of a parallel block; set parallel_attention: true (a "
         "sequential block has two norms already) or remove the key")
  _check_moe(model, fail)
  # use_bias_in_output: true with a tied head is modelzoo's GPT-J: modeling.lm_logits and
  # lm_xent add gpt/lm_head/bias to the shared table's logits (_tied_head_bias).
  extra = model.pop("extra_attention_params", None) or {}
  for key in extra:
    if key != "num_kv_groups":
      fail(("model", "extra_attention_params"), f"model.extra_attention_params.{key} is not "
           f"built here (num_kv_groups is); remove it")
  if "num_kv_groups" in extra:
    given = model.get("num_kv_groups")
    if given is not None and given != extra["num_kv_groups"]:
      fail(("model", "extra_attention_params"), f"model.extra_attention_params.num_kv_groups "
           f"{extra['num_kv_groups']:g} conflicts with model.num_kv_groups {given}; keep one")
    model["num_kv_groups"] = int(extra["num_kv_groups"])
  module = model.pop("attention_module", None)
  if module == "multiquery_attention" and model.get("num_kv_groups") is None:
    model["num_kv_groups"] = 1  # modelzoo's default for it: one K/V head
  if module == "aiayn_attention" and model.get("num_kv_groups") not in (None, model["num_heads"]):
    fail(("model", "attention_module"), "model.attention_module aiayn_attention has a K/V "
         "head per query head; grouped K/V (num_kv_groups) is multiquery_attention")
  kv = model.get("num_kv_groups")
  if kv and model["num_heads"] % kv:
    fail(("model", "num_kv_groups"), f"model.num_heads {model['num_heads']} must be divisible "
         f"by model.num_kv_groups {kv} (each K/V head serves a group of query heads)")
  scaling = model.get("pos_scaling_extra_args") or {}
  unknown = set(scaling) - {"low_freq_factor", "high_freq_factor",
                            "original_max_position_embeddings"}
  if unknown:
    fail(("model", "pos_scaling_extra_args"), f"model.pos_scaling_extra_args."
         f"{sorted(unknown)[0]} is not read (low_freq_factor, high_freq_factor, "
         f"original_max_position_embeddings are)")
  if model["pos_scaling_type"] == "llama3" and model["pos_scaling_factor"] != 1.0 and \
      len(scaling) < 3:
    fail(("model", "pos_scaling_extra_args"), "model.pos_scaling_type llama3 needs "
         "pos_scaling_extra_args low_freq_factor, high_freq_factor and "
         "original_max_position_embeddings")
  if model["loss_weight"] != 1.0 and model["loss_scaling"] != "batch_size":
    fail(("model", "loss_weight"), f"model.loss_weight {model['loss_weight']} scales the loss "
         f"only with loss_scaling: batch_size (modelzoo's rule); set that or remove the key")


SCHEMA = {
    "model": {
        **TRANSFORMER_MODEL_FIELDS,
        **NO_SEGMENTS,
        **MODELZOO_INITIALIZERS,
        **schema_of(GPTConfig),  # the backbone's keys, declared there once
        "loss_scaling": Field("str", "num_tokens", "the loss is the token loss summed and "
                              "divided by the real tokens (num_tokens) or by the batch size "
                              "(batch_size), as modelzoo's key", choices=("num_tokens",
                                                                          "batch_size")),
        "nonlinearity": Field("str", None, "modelzoo GPT's name for encoder_nonlinearity",
                              choices=_FFN),
        "loss_weight": Field("float", 1.0, "with loss_scaling batch_size, the loss is "
                             "multiplied by it (modelzoo; 1/max_sequence_length is usual)",
                             low=0, low_open=True),
        "attention_type": Field("str", "scaled_dot_product", "modelzoo key: scores are scaled "
                                "by 1/sqrt(head size)",
                                choices=("scaled_dot_product", "dot_product")),
        "attention_module": Field("str", None, "modelzoo key: multiquery_attention shares K/V "
                                  "heads (num_kv_groups, 1 unless given); aiayn_attention "
                                  "does not", choices=("aiayn_attention", "multiquery_attention")),
        "extra_attention_params": Field("numbers", None, "modelzoo's place for num_kv_groups"),
        "embedding_layer_norm": Field("bool", False, "a norm after the embeddings (modelzoo "
                                      "key; not built)"),
        "moe": Field("mapping", None, "mixture of experts, as modelzoo's model.moe: "
                     "num_experts, top_k, load_balancing_loss_coef, router_fp32, "
                     "num_shared_experts, expert_weighting_normalization, and "
                     "capacity_factor (ours; null: dropless)"),
    },
    "train_input": {**TEXT_INPUT_FIELDS,
                    "max_sequence_length": Field("int", None, "tokens per example (null: the "
                                                 "data's own, as modelzoo reads HDF5 and "
                                                 "TFRecords; text and synthetic: "
                                                 "max_position_embeddings)", low=1),
                    "synthetic": Field("bool", False, "random tokens instead of the corpus"),
                    "file_pattern": Field("path", None, "your own text files (a glob, one "
                                          "passage a line) or modelzoo GPT-2 TFRecords; "
                                          "overrides data_dir")},
}
SCHEMA["eval_input"] = SCHEMA["train_input"]

SPEC = register(ModelSpec(name="gpt", model_fn="cerebras_models.gpt.model:model_fn",
                          input_fn="cerebras_models.gpt.input:input_fn", schema=SCHEMA,
                          check=_check,
                          unapplied={("model", "use_segment_embedding"): False,
                                     ("model", "attention_type"): "scaled_dot_product",
                                     ("model", "embedding_layer_norm"): False}))
