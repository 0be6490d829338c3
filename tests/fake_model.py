"""A TensorFlow-free model family for params/CLI/runner tests (registered as `toy`)."""

from cerebras_models.fields import (MASKED_LM_FIELDS, TEXT_INPUT_FIELDS,
                                       check_transformer_params)
from cerebras_tf.registry import ModelSpec, register
from cerebras_tf.schema import Field

CALLS = []


def model_fn(features, labels, mode, params):
  raise AssertionError("the fake estimator never calls model_fn")


def input_fn(params, mode):
  CALLS.append(mode)
  return {"mode": mode, "batch_size": params["train_input"]["batch_size"]}


SPEC = register(ModelSpec(
    name="toy", model_fn=model_fn, input_fn=input_fn,
    schema={
        "model": {
            "hidden_size": Field("int", 16, "width", low=0, low_open=True),
            "num_heads": Field("int", 2, "heads", low=0, low_open=True),
            "dropout_rate": Field("float", 0.0, "dropout", low=0, high=1, high_open=True),
        },
        "train_input": {"num_examples": Field("int", 64, "examples", low=1),
                        **TEXT_INPUT_FIELDS, **MASKED_LM_FIELDS},
        "eval_input": {"num_examples": Field("int", 64, "examples", low=1),
                       **TEXT_INPUT_FIELDS, **MASKED_LM_FIELDS},
    },
    check=check_transformer_params))
