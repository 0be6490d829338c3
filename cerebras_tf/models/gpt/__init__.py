"""Decoder-only GPT (GPT-2/GPT-3 shapes with learned positions; GPT-J with rotary positions and
parallel attention+FFN). It is what weight streaming is for: configs run from gpt_tiny (trains
here on the real corpus) to GPT-3 175B (compile only).

  modeling.py  backbone     model.py  model_fn     input.py  input_fn
No TensorFlow import here.
"""

from cerebras_tf.models.fields import (ALWAYS_BUILT, NO_SEGMENTS, TEXT_INPUT_FIELDS,
                                       TRANSFORMER_MODEL_FIELDS, check_transformer_params)
from cerebras_tf.registry import ModelSpec, register
from cerebras_tf.schema import Field

SCHEMA = {
    "model": {
        **TRANSFORMER_MODEL_FIELDS,
        **NO_SEGMENTS,
        "vocab_size": Field("int", 50257, "vocabulary rows", low=1),
        "position_embedding_type": Field("str", "learned", "learned (GPT-2/3) or rotary (GPT-J)",
                                         choices=("learned", "rotary")),
        "rotary_dim": Field("int", 64, "features per head that rotary rotates", low=2),
        "parallel_attention": Field("bool", False, "GPT-J: attention and FFN in parallel"),
        "loss_scaling": Field("str", "num_tokens", "the loss is the token loss summed and "
                              "divided by the real tokens (num_tokens) or by the batch size "
                              "(batch_size), as modelzoo's key", choices=("num_tokens",
                                                                          "batch_size")),
        "layer_norm_epsilon": Field("float", 1e-5, "layer norm epsilon", low=0, low_open=True),
        "dropout_rate": Field("float", 0.0, "dropout", low=0, high=1, high_open=True),
        "attention_dropout_rate": Field("float", 0.0, "attention dropout", low=0, high=1,
                                        high_open=True),
    },
    "train_input": {**TEXT_INPUT_FIELDS,
                    "synthetic": Field("bool", False, "random tokens instead of the corpus"),
                    "file_pattern": Field("path", None, "your own text files (a glob, one "
                                          "passage a line) or modelzoo GPT-2 TFRecords; "
                                          "overrides data_dir")},
}
SCHEMA["eval_input"] = SCHEMA["train_input"]

SPEC = register(ModelSpec(name="gpt", model_fn="cerebras_tf.models.gpt.model:model_fn",
                          input_fn="cerebras_tf.models.gpt.input:input_fn", schema=SCHEMA,
                          check=check_transformer_params,
                          unapplied={**ALWAYS_BUILT, ("model", "use_segment_embedding"): False,
                                     ("model", "encoder_nonlinearity"): "gelu"}))
