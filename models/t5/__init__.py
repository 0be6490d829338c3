"""T5 (Raffel et al., 2020): an encoder-decoder Transformer with relative position bias, trained
on the span-corruption (denoising) objective, as Cerebras modelzoo's TF T5.

  modeling.py  RMS layer norm, bucketed relative position bias, encoder, decoder, tied logits
  input.py     input_fn(params, mode): text lines -> WordPiece -> span corruption
  model.py     model_fn: cross-entropy over real target tokens; eval accuracy and perplexity

`model.name: t5` selects it, and so does a modelzoo T5 file (its `d_kv`, or its
`T5DynamicDataProcessor`). Key names are modelzoo's (`d_model`, `d_kv`, `d_ff`,
`use_relative_attention_bias`, `num_relative_attention_buckets`, ...); its
`encoder_num_hidden_layers` / `decoder_num_hidden_layers`, `share_encoder_decoder_embedding` and
`src_/tgt_max_sequence_length` arrive under the names below (cerebras_tf.modelzoo.tf_files.RENAMED).
No TensorFlow import here.
"""

import logging

from cerebras_models.fields import TRANSFORMER_MODEL_FIELDS, schema_of
from cerebras_models.t5.config import DECODER_FOLLOWS, T5Config
from cerebras_tf.registry import ModelSpec, register
from cerebras_tf.schema import Field, pos_int

MODEL_FN = "cerebras_models.t5.model:model_fn"
INPUT_FN = "cerebras_models.t5.input:input_fn"

log = logging.getLogger("cerebras_models.t5")

# T5's denoising objective (modelzoo's T5 input fixes both): 15% of the tokens are corrupted,
# in spans of 3 on average.
NOISE_DENSITY = 0.15
MEAN_NOISE_SPAN_LENGTH = 3.0

SCHEMA = {
    "model": {
        **schema_of(T5Config),  # the backbone's keys, declared there once
        "use_projection_bias_in_attention": Field("bool", False, "modelzoo key: T5's attention "
                                                  "projections have no bias (built as false)"),
        "use_ffn_bias_in_attention": Field("bool", False, "modelzoo key: T5's attention output "
                                           "has no bias (built as false)"),
        "position_embedding_type": Field("str", None, "modelzoo's T5 files carry `fixed`, "
                                         "which its T5 never reads: T5 has no absolute "
                                         "positions (kept without effect, said in the log)",
                                         choices=("fixed", "learned", "relative")),
        "use_vsl": TRANSFORMER_MODEL_FIELDS["use_vsl"],
    },
    "train_input": {
        "vocab_file": Field("path", None, "WordPiece vocabulary, one token a line (null: "
                            "<data_dir>/vocab/bert_uncased_vocab.txt, the prepared one)"),
        "vocab_size": pos_int(None, "tokens of vocab_file that are used (null: all its lines); "
                              "the model's vocabulary is this plus extra_ids"),
        "extra_ids": Field("int", 100, "sentinel tokens appended to the vocabulary (the "
                           "denoising objective's span markers)", low=1),
        "do_lower": Field("bool", True, "lower-case text before tokenizing (the prepared "
                          "vocabulary is uncased)"),
        "max_source_length": pos_int(512, "encoder tokens (modelzoo: src_max_sequence_length)"),
        "max_target_length": pos_int(114, "decoder tokens (modelzoo: tgt_max_sequence_length); "
                                     "at least the corrupted spans of a full source"),
    },
}
SCHEMA["eval_input"] = dict(SCHEMA["train_input"])


def corruption(raw: int, density: float = NOISE_DENSITY,
               mean_span: float = MEAN_NOISE_SPAN_LENGTH):
  """(noise tokens, spans) of a raw-token chunk: noise = round(raw * density) in [1, raw - 1],
  spans = round(noise / mean_span), at least 1 (T5's random_spans_noise_mask counts)."""
  noise = min(max(int(round(raw * density)), 1), raw - 1)
  return noise, max(int(round(noise / mean_span)), 1)


def raw_length(max_source_length: int):
  """The text tokens one example corrupts so that its encoder input fills max_source_length.

  Returns (raw, encoder length, decoder length, spans): the encoder sees raw - noise + spans + 1
  tokens (a sentinel per span, an end token), the decoder noise + spans + 1.
  (512 -> 568 raw, 512, 114, 28 spans: modelzoo's src 512 / tgt 114.)
  """
  def lengths(raw):
    noise, spans = corruption(raw)
    return raw - noise + spans + 1, noise + spans + 1, spans

  raw = max(int(max_source_length), 2)
  while lengths(raw)[0] < max_source_length:
    raw += 1
  while raw > 2 and lengths(raw)[0] > max_source_length:
    raw -= 1
  return (raw, *lengths(raw))


def _check(out: dict, fail) -> None:
  model = out["model"]
  for key, source in DECODER_FOLLOWS.items():
    if model.get(key) is None:
      model[key] = model[source]
  if model.pop("position_embedding_type", None) is not None:
    log.info("model.position_embedding_type kept without effect: T5 has no absolute positions "
             "(modelzoo's T5 does not read it)")
  if (out.get("runconfig") or {}).get("mode") == "predict":
    fail(("runconfig", "mode"), "runconfig.mode predict: the t5 model trains and evaluates "
         "(as modelzoo's T5); use train, eval or train_and_eval")
  for section in ("train_input", "eval_input"):
    inp = out.get(section)
    if not inp:
      continue
    src, tgt = inp.get("max_source_length"), inp.get("max_target_length")
    if src is None or tgt is None:
      continue
    if src < 4:
      fail((section, "max_source_length"), f"{section}.max_source_length {src}: the denoising "
           f"objective needs at least 4 tokens (a kept token, a span, its sentinel, the end)")
    raw, _, needed, spans = raw_length(src)
    if needed > tgt:
      fail((section, "max_target_length"), f"{section}.max_target_length {tgt} is shorter "
           f"than the {needed} decoder tokens that corrupting {raw} text tokens into a "
           f"{src}-token source makes; set it to at least {needed}")
    if spans > inp["extra_ids"]:
      fail((section, "extra_ids"), f"{section}.extra_ids {inp['extra_ids']}: a {src}-token "
           f"source has {spans} corrupted spans, each needing its own sentinel; set at least "
           f"{spans}")


SPEC = register(ModelSpec(
    name="t5", model_fn=MODEL_FN, input_fn=INPUT_FN, schema=SCHEMA, check=_check,
    unapplied={("model", "use_projection_bias_in_attention"): False,
               ("model", "use_ffn_bias_in_attention"): False}))
