"""Linformer (Wang et al. 2020, arXiv:2006.04768): BERT's masked-LM pretraining with each
layer's keys and values projected along the sequence, from S positions to k = projected_dims,
so attention costs S x k, not S x S. modelzoo's TF `linformer` (its RoBERTa-style files).

  config.py        LinformerConfig: BertConfig's keys with its defaults, projected_dims and
                   attention_style (the schema's model section is built from it)
  modeling.py      the projected self-attention, plugged into models/bert's encoder
  model.py         model_fn(features, labels, mode, params): masked LM (+ NSP unless disabled)
  input.py         input_fn: models/bert's pretraining input (modelzoo's Linformer reads BERT's
                   MLM-only TFRecords processors too)

`model.name: linformer` selects it, or a modelzoo file's `projected_dims` / `attention_style`.
`attention_style`: `linformer-shared-heads` (one E for the keys and one F for the values per
layer, shared by the heads) or `linformer-shared-kv` (E = F). No TensorFlow import here.
"""

from cerebras_models import bert as bert_family
from cerebras_models.fields import schema_of
from cerebras_models.linformer.config import LinformerConfig
from cerebras_tf.registry import ModelSpec, register
from cerebras_tf.schema import Field

MODEL_FN = "cerebras_models.linformer.model:model_fn"
INPUT_FN = "cerebras_models.linformer.input:input_fn"

# BERT's keys without its fine-tuning task keys, then LinformerConfig's (its defaults and its
# projection's keys, declared there once) and modelzoo's debugging switch.
_BERT_ONLY = ("task", "num_classes", "cls_dropout_rate", "predict_all_outputs")
SCHEMA = {
    "model": {
        **{k: f for k, f in bert_family.SCHEMA["model"].items() if k not in _BERT_ONLY},
        **schema_of(LinformerConfig),
        "disable_attention": Field("bool", False, "modelzoo's debugging switch (attention "
                                   "replaced by q * q); read by none of its TF code: built as "
                                   "false"),
    },
    "train_input": bert_family.SCHEMA["train_input"],
    "eval_input": bert_family.SCHEMA["eval_input"],
}


def _check(out: dict, fail) -> None:
  bert_family.SPEC.check(out, fail)
  model = out["model"]
  if model.get("disable_attention"):
    fail(("model", "disable_attention"), "model.disable_attention: true (modelzoo's debugging "
         "switch, q * q for attention) is not built here; remove it or set it to false")
  lengths = {s: (out.get(s) or {}).get("max_sequence_length")
             for s in ("train_input", "eval_input", "predict_input") if out.get(s)}
  train = lengths.get("train_input")
  for section, msl in lengths.items():
    if msl != train:  # E and F are [S, k]: one S for every mode of one checkpoint
      fail((section, "max_sequence_length"), f"{section}.max_sequence_length {msl} must equal "
           f"train_input's {train}: the Linformer's projections E, F are [max_sequence_length, "
           f"projected_dims] matrices, so every mode reads sequences of one length")


SPEC = register(ModelSpec(name="linformer", model_fn=MODEL_FN, input_fn=INPUT_FN, schema=SCHEMA,
                          check=_check, unapplied=dict(bert_family.SPEC.unapplied)))
