"""BERT reference model: pretraining (masked LM + next sentence) and sequence classification.

  modeling.py      backbone (google-research/bert variable names; loads its checkpoints)
  heads.py         masked-LM, next-sentence and classifier heads
  model.py         model_fn(features, labels, mode, params)
  input.py         input_fn(params, mode): tensorflow-text tokenize + pack + mask

`model.name: bert` selects it; `model.task` is `pretraining` (default) or `classification`.
Its optimizer (AdamW, schedules, clipping, accumulation) is the shared `models/optimization.py`.
No TensorFlow import here: the registry imports model_fn/input_fn on first use.
"""

from cerebras_models.bert.config import FIXED_OPTIONS, BertConfig
from cerebras_models.fields import (MASKED_LM_FIELDS, TEXT_INPUT_FIELDS, TRANSFORMER_MODEL_FIELDS,
                                    check_transformer_params, schema_of)
from cerebras_tf.registry import ModelSpec, register
from cerebras_tf.schema import Field

# tasks.py hands pretraining and classification to model.py / input.py, and builds modelzoo's
# other fine-tuning tasks (token classification, SQuAD, BertSum, regression) itself.
MODEL_FN = "cerebras_models.bert.tasks:family_model_fn"
INPUT_FN = "cerebras_models.bert.tasks:family_input_fn"
TASKS = ("pretraining", "classification", "token_classification", "question_answering",
         "extractive_summarization", "regression")

# The model section: the shared transformer keys, the backbone's (BertConfig, declared there
# once), then the heads', tasks' and modelzoo's keys.
SCHEMA = {
    "model": {
        **TRANSFORMER_MODEL_FIELDS,
        **schema_of(BertConfig),
        "task": Field("str", "pretraining", "what the heads train (modelzoo's fine-tuning "
                      "tasks: tasks.py)", choices=TASKS),
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
        "attention_type": Field("str", "scaled_dot_product", "modelzoo key: scores scaled by "
                                "1/sqrt(head size), as built here",
                                choices=("scaled_dot_product", "dot_product")),
        "use_ffn_bias_in_attention": Field("bool", True, "modelzoo key: a bias in the "
                                           "attention's output projection (built)"),
        "mlm_loss_scaling": Field("str", None, "modelzoo key: the masked-LM loss divided by "
                                  "the masked positions (num_masked, precomputed_num_masked: "
                                  "the mean, mlm_loss_weight null) or by the batch size "
                                  "(batch_size: sum / batch * mlm_loss_weight, 1 unless given)",
                                  choices=("num_masked", "precomputed_num_masked",
                                           "batch_size")),
        "cls_dropout_rate": Field("float", None, "dropout before the classifier head (null: "
                                  "dropout_rate; modelzoo's fine-tuning key)", low=0, high=1,
                                  high_open=True),
        "encoder_output_dropout_rate": Field("float", 0.1, "token_classification: dropout "
                                             "on the encoder output before the classifier "
                                             "(modelzoo key)", low=0, high=1, high_open=True),
        "include_padding_in_loss": Field("bool", False, "token_classification: the mean "
                                         "cross-entropy over every token, padding included "
                                         "(modelzoo key); false: the real tokens' sum * "
                                         "loss_weight / batch"),
        "loss_weight": Field("float", 1.0, "token_classification, extractive_summarization: "
                             "the loss sum over the batch size, times this (modelzoo's 1 / "
                             "real tokens or sentences per example)", low=0, low_open=True),
        "num_regression_values": Field("int", 1, "regression: values predicted per example "
                                       "(modelzoo key)", low=1),
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
        "scale_mlm_weights": Field("bool", None, "modelzoo: masked-LM weights scaled by "
                                   "batch / masked positions, i.e. the loss is the mean over "
                                   "the masked positions (model.mlm_loss_weight null, what "
                                   "true does here); false needs model.mlm_loss_weight"),
        "synthetic": Field("bool", False, "token_classification, question_answering, "
                           "extractive_summarization, regression: random sequences with "
                           "labels a function of the tokens, instead of modelzoo's records"),
        "data_file": Field("path", None, "question_answering: modelzoo's SQuAD TFRecord "
                           "(its json2tfrecords.py output)"),
        "max_cls_tokens": Field("int", 50, "extractive_summarization: sentence [CLS] slots "
                                "per example", low=1),
        "label_vocab_file": Field("path", None, "token_classification: modelzoo's label2id "
                                  "json (its names for the class ids; the model reads only "
                                  "num_classes)"),
        "num_classes": Field("int", None, "TAPE secondary structure: the classes (3 or 8); "
                             "must equal model.num_classes", low=2),
        "mask_whole_word": Field("bool", False, "masked LM picks whole words: every wordpiece "
                                 "of a picked word is masked (pretraining)"),
    },
}
SCHEMA["eval_input"] = dict(SCHEMA["train_input"])
SCHEMA["eval_input"]["split"] = Field("str", None, "TFRecord split name (null: eval, or dev "
                                      "for classification)")


def _check(out: dict, fail) -> None:
  check_transformer_params(out, fail)
  model = out["model"]
  task = model.get("task")
  if model.get("loss_weight") != 1.0 and task not in ("token_classification",
                                                        "extractive_summarization"):
    fail(("model", "loss_weight"), f"model.loss_weight {model.get('loss_weight')} weighs "
         f"token_classification's and extractive_summarization's loss; BERT {task} has "
         f"mlm_loss_weight (pretraining) or none: remove it")
  for section in ("train_input", "eval_input", "predict_input"):
    if (out.get(section) or {}).get("synthetic") and task in ("pretraining", "classification"):
      fail((section, "synthetic"), f"{section}.synthetic: BERT {task} reads its data "
           f"(data_dir, file_pattern); synthetic input is for token_classification, "
           f"question_answering, extractive_summarization and regression: remove the key")
    classes = (out.get(section) or {}).get("num_classes")
    if classes is not None and classes != model.get("num_classes"):
      fail((section, "num_classes"), f"{section}.num_classes {classes} differs from "
           f"model.num_classes {model.get('num_classes')}: give the same number")
  scaling = model.pop("mlm_loss_scaling", None)
  if scaling == "batch_size" and model.get("mlm_loss_weight") is None:
    model["mlm_loss_weight"] = 1.0  # modelzoo's default weight: sum / batch size
  elif scaling in ("num_masked", "precomputed_num_masked") and \
      model.get("mlm_loss_weight") not in (None, 1.0):
    fail(("model", "mlm_loss_scaling"), f"model.mlm_loss_scaling {scaling} with "
         f"mlm_loss_weight {model['mlm_loss_weight']} (the mean over masked positions times "
         f"a weight) is not built here: the mean (mlm_loss_weight null) or sum / batch size * "
         f"weight (mlm_loss_scaling batch_size) are")
  elif scaling in ("num_masked", "precomputed_num_masked"):
    model["mlm_loss_weight"] = None  # the mean over the masked positions
  weight = model.get("mlm_loss_weight")
  for section in ("train_input", "eval_input", "predict_input"):
    scale = (out.get(section) or {}).get("scale_mlm_weights")
    if scale and weight is not None:
      fail((section, "scale_mlm_weights"), f"{section}.scale_mlm_weights: true makes the "
           f"masked-LM loss the mean over masked positions; model.mlm_loss_weight {weight} "
           f"asks for a weighted sum: keep one of them")
    if scale is False and weight is None:
      fail((section, "scale_mlm_weights"), f"{section}.scale_mlm_weights: false means "
           f"modelzoo's loss sum / batch size times a weight: set model.mlm_loss_weight")


SPEC = register(ModelSpec(name="bert", model_fn=MODEL_FN, input_fn=INPUT_FN, schema=SCHEMA,
                          check=_check,
                          unapplied={**FIXED_OPTIONS,
                                     ("model", "attention_type"): "scaled_dot_product",
                                     ("model", "use_ffn_bias_in_attention"): True}))
