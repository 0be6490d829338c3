"""A Hugging Face `config.json` as a params dict for the analytic graph (no TensorFlow).

What users have for the model they mean to train is often its Hugging Face config. Its keys
name the same shape under other names (n_embd, num_attention_heads, intermediate_size,
num_key_value_heads, tie_word_embeddings, ...), and it says nothing of the batch or the
sequence length a run uses: those come from the caller (the sequence length defaults to the
model's context, max_position_embeddings / n_positions).

    params = params_from_hf_config(json.load(open("config.json")), seq=2048, batch=1024)
    graph = analytic.graph_from_params(params)
"""

from typing import Any, Dict, Mapping, Optional

from cerebras_tf.errors import ParamsError

# model_type -> (analytic family name, the model section before the config's own shape keys)
_DECODERS = {
    "llama": ("llama", {}),
    "mistral": ("llama", {}),
    "qwen2": ("llama", {}),
    "gemma": ("llama", {"ffn_type": "geglu", "share_embedding_weights": True}),
    "gpt2": ("gpt", {"ffn_type": "gelu", "share_embedding_weights": True}),
    "gptj": ("gpt", {"ffn_type": "gelu", "position_embedding_type": "rotary",
                     "parallel_attention": True, "share_embedding_weights": False}),
    "gpt_neox": ("gpt", {"ffn_type": "gelu", "position_embedding_type": "rotary",
                         "share_embedding_weights": False}),
}
_ENCODERS = {"bert": "bert", "roberta": "bert"}
_GATED_ACT = {"silu": "swiglu", "swish": "swiglu", "gelu": "geglu", "gelu_pytorch_tanh": "geglu",
              "gelu_new": "geglu"}
_SUPPORTED = sorted(set(_DECODERS) | set(_ENCODERS) | {"t5"})


def is_hf_config(params: Any) -> bool:
  """A Hugging Face config (a top-level model_type, no params sections)."""
  return (isinstance(params, dict) and "model_type" in params
          and not isinstance(params.get("model"), dict))


def params_from_hf_config(cfg: Mapping[str, Any], seq: Optional[int] = None,
                          batch: Optional[int] = None) -> Dict[str, Any]:
  """{"model": {...}} for analytic.graph_from_params from a Hugging Face config.

  Raises:
    ParamsError: an unknown model_type, a missing shape key, or no sequence length (names it).
  """
  kind = str(cfg.get("model_type", ""))

  def pick(*keys, default=None):
    for k in keys:
      if cfg.get(k) is not None:
        return cfg[k]
    if default is not None:
      return default
    raise ParamsError(f"Hugging Face config ({kind}): no {' / '.join(keys)}")

  if kind in _DECODERS:
    family, model = _DECODERS[kind]
    model = dict(model, name=kind if kind.startswith(family) else f"{family}-{kind}")
    hidden = pick("hidden_size", "n_embd")
    model.update(hidden_size=hidden, num_hidden_layers=pick("num_hidden_layers", "n_layer"),
                 num_heads=pick("num_attention_heads", "n_head"),
                 filter_size=pick("intermediate_size", "n_inner", default=4 * hidden))
    if family == "llama":
      model["ffn_type"] = _GATED_ACT.get(str(pick("hidden_act", "hidden_activation",
                                                  default="silu")), "swiglu")
      model["share_embedding_weights"] = bool(cfg.get("tie_word_embeddings",
                                                      model.get("share_embedding_weights")))
    elif "tie_word_embeddings" in cfg:
      model["share_embedding_weights"] = bool(cfg["tie_word_embeddings"])
    if cfg.get("num_key_value_heads"):
      model["num_kv_heads"] = cfg["num_key_value_heads"]
    if cfg.get("head_dim"):
      model["head_dim"] = cfg["head_dim"]
    if kind == "gptj" and cfg.get("rotary_dim"):
      model["rotary_dim"] = cfg["rotary_dim"]
    if kind == "gpt_neox":
      model["rotary_dim"] = int(cfg.get("rotary_pct", 1.0) * hidden // model["num_heads"])
      model["parallel_attention"] = bool(cfg.get("use_parallel_residual", True))
    context = pick("max_position_embeddings", "n_positions", "n_ctx")
  elif kind in _ENCODERS:
    model = dict(name=_ENCODERS[kind], hidden_size=pick("hidden_size"),
                 num_hidden_layers=pick("num_hidden_layers"),
                 num_heads=pick("num_attention_heads"), filter_size=pick("intermediate_size"),
                 ffn_type="gelu")
    context = pick("max_position_embeddings")
    if kind == "roberta":
      context -= 2  # RoBERTa's table holds two offset rows: 514 for 512 tokens
  elif kind == "t5":
    act = str(cfg.get("feed_forward_proj", "relu"))
    model = dict(name="t5", hidden_size=pick("d_model"), num_hidden_layers=pick("num_layers"),
                 num_decoder_layers=pick("num_decoder_layers", "num_layers"),
                 num_heads=pick("num_heads"), filter_size=pick("d_ff"), head_dim=pick("d_kv"),
                 ffn_type="geglu" if "gated" in act else "relu",
                 share_embedding_weights=bool(cfg.get("tie_word_embeddings", True)))
    context = 512  # relative positions: no table; T5 trained at 512
  else:
    raise ParamsError(f"Hugging Face config: model_type {kind!r} is not one of "
                      f"{', '.join(_SUPPORTED)}; write a params YAML with a model section "
                      f"(configs/params_gpt3_xl.yaml shows the keys)")
  model["vocab_size"] = pick("vocab_size")
  model["max_sequence_length"] = int(seq or context)
  if batch:
    model["batch_size"] = int(batch)
  return {"model": model}
