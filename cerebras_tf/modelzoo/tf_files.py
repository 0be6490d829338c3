"""Cerebras modelzoo's TensorFlow params files as they are written: the model family from what a
file holds, and the keys modelzoo's TF code reads that have another place (or no effect) here.

modelzoo picks a model by the directory of the `run.py` it is given; its YAML never names the
model. Here the family comes from, in order: `model.name` (an override), `--model FAMILY`
(cli), else the file itself: its `data_processor` (modelzoo's input class, one per model and
task), else its model keys (FC-MNIST's `hidden_sizes`, UNet's `encoder_filters`, T5's `d_kv`,
Linformer's `projected_dims`). A file of a family not built here is refused with one line naming
the family it needs. No TensorFlow.
"""

import os
import re
from typing import Any, Mapping, NamedTuple, Optional, Tuple

# Families of modelzoo's TF releases (and of the configs customers shared with it) that have no
# counterpart here: the name a refusal gives -> what it is.
UNBUILT = {
    "genomic_bert": ("GSK genomic BERT (DNA and IDEAS token streams with summed embeddings "
                     "and a masked-LM head each, read from CSV metadata_files)"),
    "spacetimeformer": "Spacetimeformer (time-series forecasting)",
    "cretin": "LLNL's CRETIN surrogate (several named configs in one file)",
    "cyclegan": "LLNL's CycleGAN surrogate (several named configs in one file)",
}


class Family(NamedTuple):
  """`name`: the family here (or in UNBUILT); `task`: BERT's task, when the input says it;
  `why`: what in the file said so (for messages)."""

  name: str
  task: Optional[str]
  why: str


# modelzoo data_processor class (case-insensitive prefix) -> (family, BERT task).
# Ordered: a longer prefix before a shorter one it starts with.
PROCESSORS: Tuple[Tuple[str, str, Optional[str]], ...] = (
    ("bertsum", "bert", "extractive_summarization"),
    ("bertmlmonly", "bert", "pretraining"),
    ("berttfrecords", "bert", "pretraining"),
    ("bert", "bert", "pretraining"),
    ("genomedata", "genomic_bert", None),     # GSK's genomic BERT: two token streams
    ("pfamdata", "bert", "pretraining"),      # TAPE's protein BERT pretraining
    ("mnli", "bert", "classification"),
    ("sst2", "bert", "classification"),
    ("remotehomology", "bert", "classification"),
    ("ner", "bert", "token_classification"),
    ("secondarystructure", "bert", "token_classification"),
    ("questionanswering", "bert", "question_answering"),
    ("fluorescence", "bert", "regression"),
    ("stability", "bert", "regression"),
    ("genomicdata", "gpt", None),             # ANL's gene GPT: GPT TFRecords
    ("gpt", "gpt", None),
    ("transformer", "transformer", None),
    ("t5", "t5", None),
    ("stf", "spacetimeformer", None),
)

# Model keys only one family's files carry, for files without a data_processor (or whose
# processor is shared: Linformer reads BERT's MLM-only records).
MODEL_KEYS: Tuple[Tuple[str, str], ...] = (
    ("projected_dims", "linformer"), ("attention_style", "linformer"),
    ("d_kv", "t5"), ("use_relative_attention_bias", "t5"),
    ("encoder_filters", "unet"), ("decoder_filters", "unet"),
    ("hidden_sizes", "mlp"), ("activation_fn", "mlp"),
)

# modelzoo's names for its models -> the family here that builds them.
MODEL_NAMES = {"gpt2": "gpt", "gpt3": "gpt", "gptj": "gpt", "gpt_neox": "gpt", "neox": "gpt",
               "llama": "gpt", "mistral": "gpt", "roberta": "bert", "fc_mnist": "mlp",
               "fcmnist": "mlp"}


def _processor(raw: Mapping) -> str:
  for section in ("train_input", "eval_input", "predict_input"):
    value = (raw.get(section) or {}).get("data_processor") if isinstance(
        raw.get(section), dict) else None
    if isinstance(value, str) and value.strip():
      return value.strip()
  return ""


def infer_family(raw: Mapping) -> Optional[Family]:
  """The family a modelzoo TF params file is for (see the module doc), or None when nothing
  in it says. A multi-config file (LLNL's: top-level `base`, `compile`, ...) is named by its
  model."""
  if not isinstance(raw, dict):
    return None
  model = raw.get("model") if isinstance(raw.get("model"), dict) else {}
  for key, family in MODEL_KEYS:
    if key in model and family in ("linformer", "t5", "unet"):
      return Family(family, None, f"model.{key}")
  processor = _processor(raw)
  if processor:
    plain = re.sub(r"[^a-z0-9]", "", processor.lower())
    for prefix, family, task in PROCESSORS:
      if plain.startswith(prefix):
        return Family(family, task, f"data_processor {processor}")
  for key, family in MODEL_KEYS:
    if key in model:
      return Family(family, None, f"model.{key}")
  named = _named_configs(raw)
  if named:
    return named
  if {"scenario", "n_towers"} <= set(raw):  # an entry of LLNL's list of CRETIN variants
    return Family("cretin", None, "a list of variants (scenario, n_towers)")
  return None


def _named_configs(raw: Mapping) -> Optional[Family]:
  """LLNL's files: several complete configs under names (base, compile, ...)."""
  configs = {k: v for k, v in raw.items() if isinstance(v, dict) and "model" in v}
  if not configs:
    return None
  models = [v["model"] for v in configs.values() if isinstance(v.get("model"), dict)]
  keys = {k for m in models for k in m}
  family = "cyclegan" if {"forward", "inverse"} & keys else "cretin"
  return Family(family, None, f"several named configs ({', '.join(list(configs)[:3])}, ...)")


def family_defaults(family: Family, model: Mapping) -> Mapping[Tuple[str, str], Any]:
  """(section, key) -> value: what a modelzoo model builds without its file saying, for a file
  inferred to be it. Its GPT-J (gptj/run.py; the only TF model that reads rotary_dim) is
  always rotary positions and a parallel attention + FFN block; FC-MNIST is MNIST's 784
  inputs and 10 classes, trained with Adam unless optimizer_type says."""
  if family.name == "gpt" and "rotary_dim" in model:
    # Its embedding dropout is its own key, 0 unless given (here: dropout_rate unless given).
    return {("model", "position_embedding_type"): "rotary",
            ("model", "parallel_attention"): True, ("model", "embedding_dropout_rate"): 0.0}
  if family.name == "mlp" and family.why.startswith("model."):
    return {("model", "input_dim"): 784, ("model", "num_classes"): 10,
            ("optimizer", "optimizer_type"): "adam"}
  return {}


def refusal(family: Family) -> str:
  """The one line for a file whose family is not built here."""
  what = UNBUILT[family.name]
  return (f"this is a modelzoo {what} config ({family.why}): it needs the "
          f"'{family.name}' model family, which is not built here")


# ---------------------------------------------------------------------------------------------
# Keys.

# Keys that steer only the real system's compiler and kernels (numerics of the wafer's own
# number formats, how a layer is cast or summarized, the appliance's servers): accepted and
# named once in the log as kept without effect here. (section, key) -> what it does on a CS.
COMPILER_ONLY = {
    ("model", "precision_opt_level"): "the CS compiler's numerics/speed trade-off",
    ("model", "boundary_casting"): "casting at layer boundaries in the CS kernels",
    ("model", "tf_summary"): "activation summaries of modelzoo's layers",
    ("model", "attention_softmax_fp32"): "the CS kernel's softmax precision",
    ("model", "enable_gpu_optimizations"): "GPU-only kernels",
    ("csconfig", "use_cbfloat16"): "Cerebras's own 16-bit float on the wafer",
    ("runconfig", "boundary_casting"): "casting at layer boundaries in the CS kernels",
    ("runconfig", "tf_summary"): "activation summaries of modelzoo's layers",
    ("runconfig", "mixed_precision"): "the CS compiler's precision switch (model."
                                      "mixed_precision sets it here)",
    ("runconfig", "enable_gpu_optimizations"): "GPU-only kernels",
    ("runconfig", "use_cs_grad_accum"): "the CS runtime's own gradient accumulation",
    ("runconfig", "disable_standard_logs"): "modelzoo's logging hook choice",
    ("runconfig", "compile_only"): "run.py's flag (--compile_only here)",
    ("runconfig", "validate_only"): "run.py's flag (--validate_only here)",
    ("optimizer", "ws_summary"): "weight-streaming summaries of the appliance",
    ("optimizer", "log_grads"): "per-variable gradient summaries",
    ("optimizer", "log_hists"): "per-variable histograms",
    ("train_input", "mixed_precision"): "the input's dtype (modelzoo copies model."
                                        "mixed_precision there)",
    ("eval_input", "mixed_precision"): "the input's dtype (modelzoo copies model."
                                       "mixed_precision there)",
    ("predict_input", "mixed_precision"): "the input's dtype",
    ("model", "bits_per_x_dataset"): "an eval metric (bits per byte of a named corpus) not "
                                     "computed here",
    ("model", "use_cache"): "GPT-J's decoding cache at inference; training is the same",
    ("model", "future_implementations"): "read by no modelzoo TF code (Linformer's files)",
}
for _section in ("train_input", "eval_input", "predict_input"):
  COMPILER_ONLY.update({
      (_section, "add_special_tokens"): "read by none of modelzoo's TFRecords inputs (the "
                                        "records were tokenized offline)",
      (_section, "n_gram"): "read by no modelzoo TF code",
      (_section, "ngram"): "read by no modelzoo TF code",
      (_section, "n_parallel_reads"): "TFRecord files read at once: host input speed only",
      (_section, "steps"): "read by no modelzoo TF input (Linformer's files)",
      (_section, "num_parallel_reads"): "files read at once: host input speed only",
      (_section, "buckets"): "batches of like lengths, to speed variable-length runs on a CS; "
                             "batches here are not bucketed",
      (_section, "num_buckets"): "batches of like lengths, to speed variable-length runs on "
                                 "a CS; batches here are not bucketed",
  })

# modelzoo keys (its set_defaults dumps them into configs) accepted at the one value the models
# here build; any other value is refused by name. (section, key) -> the value built here.
BUILT_AS = {
    ("model", "use_pre_normalization"): True,
    ("model", "fixed_sparse_attention"): None,
    ("model", "topk_args"): None,
    ("model", "output_nonlinearity"): None,
    ("model", "disable_attention_op"): False,
    ("model", "input_pad_id"): -1,
    ("model", "mlm_nonlinearity"): "gelu",
    ("model", "use_output_bias_in_mlm"): True,
    ("model", "use_ffn_bias_in_mlm"): True,
    ("model", "use_cls_bias"): True,  # the classifier's pooler and output layer have biases
    ("runconfig", "multiple_workers"): False,
    ("train_input", "skip_steps"): 0,
}

# modelzoo TF keys of what is not built here: a file that sets one is refused with what it is,
# never with a did-you-mean to a key of another meaning.
NOT_BUILT = {
    "use_untied_layer_norm": "GPT-NeoX's separate norms for the parallel attention and FFN",
    "encoder_num_hidden_layers": "modelzoo's encoder-decoder depths (Transformer, T5)",
    "decoder_num_hidden_layers": "modelzoo's encoder-decoder depths (Transformer, T5)",
    "metadata_files": "ANL/GSK genomic inputs",
    "vocab_file_dna": "GSK's genomic input", "vocab_file_ideas": "GSK's genomic input",
    "stride": "GSK's genomic input",
}

# Every key name the params sections of modelzoo's TF files use (its releases and the configs
# shared with it). An unknown key among them is a modelzoo key the family does not build: no
# did-you-mean to a key of another meaning (attention_type -> attention_dropout_rate was one).
MODELZOO_KEYS = frozenset((
    'activation_fn', 'add_special_tokens', 'attention_dropout_rate', 'attention_style',
    'attention_type', 'augment_data', 'batch_size', 'beta1', 'beta2', 'beta_1', 'beta_2',
    'bias_initializer', 'bits_per_x_dataset', 'boundary_casting', 'buckets', 'class_id',
    'cls_dropout_rate', 'cls_nonlinearity', 'compile_only', 'contains_hr_min',
    'context_length', 'convs_per_block', 'cs_ip', 'd_ff', 'd_kv', 'd_model', 'data_dir',
    'data_file', 'data_format', 'data_path', 'data_processor', 'dataset', 'dataset_path',
    'decoder_filters', 'decoder_nonlinearity', 'decoder_num_hidden_layers', 'description',
    'disable_attention', 'disable_attention_op', 'disable_lr_steps_reset', 'disable_nsp',
    'disable_standard_logs', 'do_lower', 'downscale_method', 'dropout', 'dropout_rate',
    'dropout_seed', 'embedding_dropout_rate', 'embedding_initializer', 'embedding_size',
    'enable_bias', 'enable_distributed', 'enable_gpu_optimizations', 'encoder_filters',
    'encoder_nonlinearity', 'encoder_num_hidden_layers', 'encoder_output_dropout_rate',
    'epsilon', 'eval_batch_size', 'eval_metrics', 'eval_steps', 'extra_ids', 'filter_size',
    'fixed_sparse_attention', 'future_implementations', 'grad_accum_steps', 'hidden_size',
    'hidden_sizes', 'image_shape', 'include_padding_in_loss', 'initial_loss_scale',
    'initializer', 'input_pad_id', 'keep_checkpoint_max', 'label_vocab_file',
    'layer_norm_epsilon', 'learning_rate', 'log_grads', 'log_hists', 'log_image_summaries',
    'log_step_count_steps', 'log_summaries', 'loss_scaling', 'loss_scaling_factor',
    'loss_weight', 'mask_whole_word', 'max_cls_tokens', 'max_gradient_norm', 'max_loss_scale',
    'max_position_embeddings', 'max_predictions_per_seq', 'max_sequence_length', 'max_steps',
    'metadata_files', 'mixed_precision', 'mlm_loss_scaling', 'mlm_loss_weight',
    'mlm_nonlinearity', 'mode', 'model_dir', 'multiple_workers', 'multireplica', 'n_gram',
    'n_parallel_reads', 'ngram', 'nonlinearity', 'normalize_data_method', 'num_buckets',
    'num_classes', 'num_cls_classes', 'num_heads', 'num_hidden_layers', 'num_parallel_calls',
    'num_parallel_reads', 'num_regression_values', 'num_vars', 'num_wgt_servers',
    'only_defective_images', 'optimizer_type', 'output_layer_initializer',
    'output_nonlinearity', 'position_embedding_type', 'positional_embedding_type',
    'precision_opt_level', 'pretrain_params_path', 'projected_dims', 'random_seed', 'repeat',
    'residual_dropout_rate', 'rotary_dim', 'save_checkpoints_steps', 'save_summary_steps',
    'scale_mlm_weights', 'scaler_stats_path', 'seed', 'share_embedding_weights',
    'share_encoder_decoder_embedding', 'shuffle', 'shuffle_buffer', 'shuffle_buffer_size',
    'shuffle_seed', 'skip_connect', 'skip_steps', 'src_data_dir', 'src_max_sequence_length',
    'src_vocab_file', 'start_token_length', 'steps', 'stride', 'target_length',
    'tf_random_seed', 'tf_summary', 'tgt_data_dir', 'tgt_max_sequence_length',
    'tgt_vocab_file', 'throttle_secs', 'time_resolution', 'topk_args', 'train_batch_size',
    'train_test_split', 'use_bias_correction', 'use_bias_in_output', 'use_cache',
    'use_cbfloat16', 'use_cls_bias', 'use_cs_grad_accum', 'use_ffn_bias',
    'use_ffn_bias_in_attention', 'use_ffn_bias_in_mlm', 'use_multiple_workers',
    'use_output_bias_in_mlm', 'use_position_embedding', 'use_position_embeddings',
    'use_pre_normalization', 'use_projection_bias_in_attention', 'use_relative_attention_bias',
    'use_segment_embedding', 'use_untied_layer_norm', 'use_vsl', 'validate_only', 'vocab_file',
    'vocab_file_dna', 'vocab_file_ideas', 'vocab_size', 'weight_decay_rate',
    'weight_initialization_seed', 'ws_summary'
))

# Seeds of one kind of variable in modelzoo; here the graph-level seed (runconfig.
# tf_random_seed) fixes initializers and dropout alike: given when it is not.
SEEDS = (("model", "weight_initialization_seed"), ("model", "dropout_seed"))

# modelzoo TF's name -> the key here that owns the quantity.
RENAMED = {
    ("optimizer", "use_bias_correction"): ("optimizer", "correct_bias"),
    ("optimizer", "beta_1"): ("optimizer", "beta1"),
    ("optimizer", "beta_2"): ("optimizer", "beta2"),
    ("runconfig", "num_wgt_servers"): ("csconfig", "max_wgt_servers"),
    ("runconfig", "random_seed"): ("runconfig", "tf_random_seed"),
    ("model", "use_position_embeddings"): ("model", "use_position_embedding"),
    ("model", "positional_embedding_type"): ("model", "position_embedding_type"),
    ("train_input", "shuffle_buffer_size"): ("train_input", "shuffle_buffer"),
    ("eval_input", "shuffle_buffer_size"): ("eval_input", "shuffle_buffer"),
    ("train_input", "seed"): ("train_input", "shuffle_seed"),
    # modelzoo's UNet: both batch sizes in train_input.
    ("train_input", "train_batch_size"): ("train_input", "batch_size"),
    ("train_input", "eval_batch_size"): ("eval_input", "batch_size"),
    ("eval_input", "seed"): ("eval_input", "shuffle_seed"),
    ("model", "num_cls_classes"): ("model", "num_classes"),
    ("model", "cls_nonlinearity"): ("model", "pooler_nonlinearity"),
    # GPT-J's dropout of the attention and FFN outputs.
    ("model", "residual_dropout_rate"): ("model", "dropout_rate"),
    # modelzoo's Transformer.
    ("model", "encoder_num_hidden_layers"): ("model", "num_encoder_layers"),
    ("model", "decoder_num_hidden_layers"): ("model", "num_decoder_layers"),
    ("model", "share_encoder_decoder_embedding"): ("model", "share_embedding_weights"),
    ("train_input", "src_max_sequence_length"): ("train_input", "max_source_length"),
    ("train_input", "tgt_max_sequence_length"): ("train_input", "max_target_length"),
    ("eval_input", "src_max_sequence_length"): ("eval_input", "max_source_length"),
    ("eval_input", "tgt_max_sequence_length"): ("eval_input", "max_target_length"),
}


def kept_without_effect_line(keys) -> str:
  """The one log line naming the compiler-only keys a file set."""
  return ("modelzoo keys kept without effect here: "
          + "; ".join(f"{s}.{k} ({COMPILER_ONLY[(s, k)]})" for s, k in keys))


def resolve_pretrain_params(value: str, filename: str, exists) -> Optional[str]:
  """modelzoo's fine-tuning `model.pretrain_params_path` (relative to its run.py, the folder
  above the file's configs/; or to the file itself), or None when neither exists."""
  here = os.path.dirname(os.path.abspath(filename))
  bases = [here] + ([os.path.dirname(here)] if os.path.basename(here) == "configs" else [])
  for base in bases:
    candidate = os.path.normpath(os.path.join(base, os.path.expanduser(value)))
    if exists(candidate):
      return candidate
  return None


def as_segment_of_tf_cosine(seg: dict) -> Tuple[dict, Optional[str]]:
  """modelzoo TF's Cosine (tf.compat.v1.train.cosine_decay's arguments: `decay_steps`,
  `alpha`, the floor as a fraction of the initial rate) in the names here (`steps`,
  `end_learning_rate`). Returns (segment, conflict message or None)."""
  seg = dict(seg)
  if "alpha" in seg:
    alpha = seg.pop("alpha")
    init = seg.get("initial_learning_rate")
    try:
      end = float(alpha) * float(init)
    except (TypeError, ValueError):
      return seg, f"alpha {alpha!r} and initial_learning_rate {init!r} must be numbers"
    if "end_learning_rate" in seg and float(seg["end_learning_rate"]) != end:
      return seg, (f"alpha {alpha} (end rate {end:g}) conflicts with end_learning_rate "
                   f"{seg['end_learning_rate']}; keep one of them")
    seg["end_learning_rate"] = end
  if "decay_steps" in seg and "steps" not in seg:
    seg["steps"] = seg["decay_steps"]
  return seg, None


def data_dirs(value: Any) -> list:
  """data_dir as the list of directories it names (modelzoo reads a list of several)."""
  if value is None:
    return []
  return list(value) if isinstance(value, (list, tuple)) else [value]


_INIT_ARGS = {"truncated_normal": ("mean", "stddev"), "normal": ("mean", "stddev"),
              "uniform": ("minval", "maxval"), "constant": ("value",),
              "glorot_uniform": (), "glorot_normal": (),
              "variance_scaling": ("scale", "mode", "distribution")}
_INIT_DEFAULTS = {"mean": 0.0, "stddev": 0.05, "minval": -0.05, "maxval": 0.05, "value": 0.0,
                  "scale": 1.0, "mode": "fan_in", "distribution": "truncated_normal"}


def initializer_spec(spec: Any, num_hidden_layers: int, vocab_size: int
                     ) -> Tuple[Optional[dict], Optional[str]]:
  """modelzoo's initializer spec -> (a plain {name, args} one of `_INIT_ARGS` with every
  argument filled, or None for null; else an error message). Its forms: a name, a mapping
  with `name` (common/tf create_initializer), or a one-entry list of one (GPT-J's, which adds
  `variance_scaling` with `scale_type` small_init = 2/5 or wang_init = 4/layers^2, and
  `scaled_init_normal`: stddev sigma / sqrt(key), key 2 * num_hidden_layers or vocab_size)."""
  if spec is None:
    return None, None
  if isinstance(spec, list) and len(spec) == 1:
    spec = spec[0]
  if isinstance(spec, str):
    spec = {"name": spec}
  if not isinstance(spec, dict) or "name" not in spec:
    return None, f"must name an initializer (name: truncated_normal, stddev: 0.02), got {spec!r}"
  spec, name = dict(spec), str(spec["name"])
  if name == "scaled_init_normal":
    key = spec.get("key")
    scaling = {None: 1.0, "num_hidden_layers": 2.0 * num_hidden_layers,
               "vocab_size": float(vocab_size)}.get(key)
    if scaling is None:
      return None, f"scaled_init_normal key must be num_hidden_layers or vocab_size, got {key!r}"
    name = spec.get("distribution", "normal")
    if name not in ("normal", "truncated_normal"):
      return None, "scaled_init_normal distribution must be normal or truncated_normal"
    spec = {"name": name, "mean": spec.get("mean", 0.0),
            "stddev": float(spec.get("sigma", 1.0)) / scaling ** 0.5}
  if name == "variance_scaling" and spec.get("scale_type") is not None:
    kind = spec.pop("scale_type")
    if spec.get("scale") is not None:
      return None, "variance_scaling takes scale or scale_type, not both"
    scales = {"small_init": 2.0 / 5.0, "wang_init": 4.0 / max(num_hidden_layers, 1) ** 2}
    if kind not in scales:
      return None, f"variance_scaling scale_type must be small_init or wang_init, got {kind!r}"
    spec["scale"] = scales[kind]
  if name not in _INIT_ARGS:
    return None, (f"{name} is not an initializer modelzoo builds ({', '.join(_INIT_ARGS)}, "
                  f"scaled_init_normal)")
  unknown = set(spec) - {"name", "seed", *_INIT_ARGS[name]}
  if unknown:
    return None, f"{sorted(unknown)[0]} is not a {name} argument ({', '.join(_INIT_ARGS[name])})"
  out = {"name": name}
  for arg in _INIT_ARGS[name]:
    value = spec.get(arg)
    out[arg] = _INIT_DEFAULTS[arg] if value is None else value
  if name == "variance_scaling" and out["distribution"] not in (
      "truncated_normal", "untruncated_normal", "normal", "uniform"):
    return None, f"variance_scaling distribution {out['distribution']!r} is not TensorFlow's"
  return out, None


def apply_initializers(model: dict, fail, groups: Mapping[str, str], vocab_size: int) -> None:
  """Each modelzoo initializer key of `model` (popped) onto `model["initializer_specs"]
  [group]` (`groups`: key -> group); a spec with no counterpart is refused by
  `fail(key_path, message)`."""
  specs = {}
  for key, group in groups.items():
    spec, error = initializer_spec(model.pop(key, None), model.get("num_hidden_layers") or 1,
                                   vocab_size)
    if error:
      fail(("model", key), f"model.{key}: {error}")
    if spec is not None:
      specs[group] = spec
  if specs:
    model["initializer_specs"] = specs
