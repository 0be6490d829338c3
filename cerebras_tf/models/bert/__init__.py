"""BERT reference model: pretraining (masked LM + next sentence) and sequence classification.

  modeling.py      backbone (google-research/bert variable names; loads its checkpoints)
  heads.py         masked-LM, next-sentence and classifier heads
  model.py         model_fn(features, labels, mode, params)
  input.py         input_fn(params, mode): tensorflow-text tokenize + pack + mask

`model.name: bert` selects it; `model.task` is `pretraining` (default) or `classification`.
Its optimizer (AdamW, schedules, clipping, accumulation) is the shared `models/optimization.py`.
No TensorFlow import here: the registry imports model_fn/input_fn on first use.
"""

from cerebras_tf.models.fields import (ALWAYS_BUILT, MASKED_LM_FIELDS, TEXT_INPUT_FIELDS,
                                       TRANSFORMER_MODEL_FIELDS, check_transformer_params)
from cerebras_tf.registry import ModelSpec, register
from cerebras_tf.schema import Field

MODEL_FN = "cerebras_tf.models.bert.model:model_fn"
INPUT_FN = "cerebras_tf.models.bert.input:input_fn"

# BERT's keys beyond cerebras_tf.params' shared transformer / text-input keys.
SCHEMA = {
    "model": {
        **TRANSFORMER_MODEL_FIELDS,
        "vocab_size": Field("int", 30522, "vocabulary rows (word embeddings, MLM output)", low=1),
        "type_vocab_size": Field("int", 2, "segment (token type) embedding rows", low=1),
        "task": Field("str", "pretraining", "what the heads train",
                      choices=("pretraining", "classification")),
        "num_classes": Field("int", 2, "classes of the classification head", low=2),
        "disable_nsp": Field("bool", False, "pretraining without the next-sentence head and "
                             "loss: masked LM only (RoBERTa; modelzoo's key)"),
        "init_checkpoint": Field("path", None, "warm start: checkpoint restored by variable name "
                                 "(google-bert checkpoints load as they are)"),
        "predict_all_outputs": Field("bool", False, "predict also yields hidden states and "
                                     "log-probs (debugging, checkpoint checks)"),
        "mlm_loss_weight": Field("float", None, "null: the masked-LM loss is the mean over the "
                                 "masked positions (google-bert); a number: their sum over the "
                                 "batch size, times it (modelzoo's, about 1 / masked positions "
                                 "per sequence)", low=0, low_open=True),
        "pooling": Field("str", "cls", "what the pooler (and so the classifier and NSP heads) "
                         "reads: cls, the first token's output (google-bert), or mean, the "
                         "mean of the real tokens' outputs (a checkpoint pretrained without "
                         "NSP never trained the first token to summarize)",
                         choices=("cls", "mean")),
        "pooler_nonlinearity": Field("str", "tanh", "the pooler's activation (modelzoo key)",
                                     choices=("tanh", "gelu", "relu")),
    },
    "train_input": {
        **TEXT_INPUT_FIELDS,
        **MASKED_LM_FIELDS,
        "split": Field("str", None, "TFRecord split name (null: train)"),
        "file_pattern": Field("path", None, "glob of TFRecords (text_a/text_b, google-bert "
                              "pre-masked, or sentence/label) or of sentence<TAB>label "
                              "text; overrides data_dir and split"),
        "num_shards": Field("int", None, "shard the records (when no input_context)", low=1),
        "shard_index": Field("int", None, "this worker's shard", low=0),
        "buckets": Field("int_list", [], "modelzoo's length buckets: not built by this input "
                         "(refused when set; csconfig.vts already costs real tokens only)"),
        "mask_whole_word": Field("bool", False, "masked LM picks whole words: every wordpiece "
                                 "of a picked word is masked (pretraining)"),
    },
}
SCHEMA["eval_input"] = dict(SCHEMA["train_input"])
SCHEMA["eval_input"]["split"] = Field("str", None, "TFRecord split name (null: eval, or dev "
                                      "for classification)")

# What this BERT builds one way only (modeling.BertConfig.from_params holds to it too).
FIXED_OPTIONS = {**ALWAYS_BUILT, ("model", "position_embedding_type"): "learned",
                 ("model", "share_embedding_weights"): True}

SPEC = register(ModelSpec(name="bert", model_fn=MODEL_FN, input_fn=INPUT_FN, schema=SCHEMA,
                          check=check_transformer_params,
                          unapplied={**FIXED_OPTIONS, ("train_input", "buckets"): [],
                                     ("model", "pooler_nonlinearity"): "tanh",
                                     ("eval_input", "buckets"): []}))
