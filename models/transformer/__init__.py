"""Encoder-decoder Transformer (Vaswani et al., 2017) for English -> Spanish translation.

  vocab.py     shared WordPiece vocabulary learned from the training split (cached), in-graph
               tokenize / detokenize
  input.py     input_fn(params, mode): tensorflow-text tokenization, length buckets, masks
  modeling.py  embeddings, encoder, decoder, cached decoder step
  decoding.py  greedy and beam search (length penalty) as in-graph while loops
  model.py     model_fn: label-smoothed loss; eval token accuracy + sacrebleu BLEU; predict
  export.py    SavedModel that translates raw English strings

`model.name: transformer` selects it. No TensorFlow import here.
"""

from cerebras_models.fields import (TEXT_INPUT_FIELDS, TRANSFORMER_MODEL_FIELDS,
                                    check_transformer_params, ALWAYS_BUILT, NO_SEGMENTS,
                                    schema_of)
from cerebras_models.transformer.config import ACTIVATION_NAMES, TransformerConfig
from cerebras_tf.registry import ModelSpec, register
from cerebras_tf.schema import Field

MODEL_FN = "cerebras_models.transformer.model:model_fn"
INPUT_FN = "cerebras_models.transformer.input:input_fn"


def _pos_int(default, help_text):
  return Field("int", default, help_text, low=0, low_open=True)


SCHEMA = {
    "model": {
        **TRANSFORMER_MODEL_FIELDS,
        **NO_SEGMENTS,
        **schema_of(TransformerConfig),  # the backbone's keys, declared there once
        "decoder_nonlinearity": Field("str", None, "modelzoo key: the decoder's feed-forward "
                                      "activation; one activation is built for both (null: "
                                      "encoder_nonlinearity)", choices=ACTIVATION_NAMES),
        "label_smoothing": Field("float", 0.1, "label smoothing of the training loss", low=0,
                                 high=1, high_open=True),
        "beam_width": _pos_int(4, "beams for predict and eval BLEU (1: greedy)"),
        "eval_beam_width": _pos_int(None, "beams for the eval BLEU (null: beam_width; 1 is "
                                    "greedy and several times faster)"),
        "length_penalty": Field("float", 0.6, "alpha of ((5 + len) / 6) ** alpha", low=0),
        "max_decode_length": _pos_int(None, "decoded tokens (null: max_target_length)"),
        "trim_padding": Field("bool", True, "on the host, compute each batch at its longest real "
                              "length (the engine compiles the static padded shapes)"),
        "eval_bleu": Field("bool", True, "decode the eval split and report BLEU"),
    },
    "train_input": {
        **TEXT_INPUT_FIELDS,
        "vocab_size": _pos_int(8000, "size of the WordPiece vocabulary learned from the "
                               "training split (when vocab_file is null)"),
        "vocab_file": Field("path", None, "vocabulary file (null: learn one and cache it under "
                            "data_dir/en_es/vocab)"),
        "split": Field("str", None, "TFRecord split name (null: train, or test for eval)"),
        "file_pattern": Field("path", None, "glob of TFRecords (en, es) or tab-separated pairs; "
                              "overrides data_dir and split"),
        "max_source_length": _pos_int(64, "source tokens per example (static, padded)"),
        "max_target_length": _pos_int(64, "target tokens incl. [START]/[END] (static, padded)"),
        "bucket_boundaries": Field("int_list", [], "length buckets: similar lengths share a "
                                   "batch (train)"),
        # modelzoo's TransformerDynamicDataProcessor: sources and targets in separate files.
        "src_data_dir": Field("path", None, "modelzoo key: glob of the source text files, one "
                              "sentence a line, line-aligned with tgt_data_dir's (overrides "
                              "data_dir; both naming one file of pairs, a .tsv or the en/es "
                              "TFRecords, read its two columns)"),
        "tgt_data_dir": Field("path", None, "modelzoo key: glob of the target text files, "
                              "line-aligned with src_data_dir's"),
        "src_vocab_file": Field("path", None, "modelzoo key: the source vocabulary; one "
                                "vocabulary is shared here, so it is vocab_file and "
                                "tgt_vocab_file must hold the same tokens (null: learned)"),
        "tgt_vocab_file": Field("path", None, "modelzoo key: the target vocabulary (the same "
                                "tokens as src_vocab_file)"),
    },
}
SCHEMA["eval_input"] = dict(SCHEMA["train_input"])

def _check(out: dict, fail) -> None:
  check_transformer_params(out, fail)
  model = out["model"]
  decoder = model.pop("decoder_nonlinearity", None)
  for section in ("train_input", "eval_input"):
    inp = out.get(section) or {}
    given = [k for k in ("src_data_dir", "tgt_data_dir") if inp.get(k)]
    if len(given) == 1:
      other = "tgt_data_dir" if given[0] == "src_data_dir" else "src_data_dir"
      fail((section, given[0]), f"{section}.{given[0]} needs {section}.{other}: sources and "
           f"targets are read from line-aligned files (modelzoo's TransformerDynamic"
           f"DataProcessor); give both, or data_dir / file_pattern for one file of pairs")
    vocab = inp.get("src_vocab_file") or inp.get("tgt_vocab_file")
    if vocab and inp.get("vocab_file") and inp["vocab_file"] != vocab:
      fail((section, "src_vocab_file"), f"{section}.src_vocab_file / tgt_vocab_file and "
           f"vocab_file name different vocabularies; one is shared here: keep one")
  if decoder is not None and decoder != model["encoder_nonlinearity"]:
    fail(("model", "decoder_nonlinearity"), f"model.decoder_nonlinearity {decoder}: one "
         f"feed-forward activation is built for encoder and decoder here, "
         f"encoder_nonlinearity {model['encoder_nonlinearity']}; make them the same")


SPEC = register(ModelSpec(name="transformer", model_fn=MODEL_FN, input_fn=INPUT_FN,
                          schema=SCHEMA, check=_check,
                          unapplied={**{k: v for k, v in ALWAYS_BUILT.items()
                                        if k != ("model", "use_projection_bias_in_attention")},
                                     ("model", "use_segment_embedding"): False}))
