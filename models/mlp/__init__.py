"""A small classifier written for plain tf.estimator (Keras layers inside, EstimatorSpec out).

The framework's smoke model: fast enough for tests, shaped like real user code. `model.name:
mlp` selects it. No TensorFlow import here: the registry imports model_fn/input_fn on first use.
"""

from cerebras_tf.registry import ModelSpec, register
from cerebras_tf.schema import Field

SCHEMA = {
    "model": {
        "input_dim": Field("int", 32, "features per example", low=1),
        "num_classes": Field("int", 4, "classes", low=2),
        "hidden_sizes": Field("int_list", [64, 64], "widths of the hidden Dense layers"),
        "seed": Field("int", 0, "initializer seed", low=0),
        # modelzoo FC-MNIST's keys.
        "dropout": Field("float", 0.0, "dropout after each hidden layer (FC-MNIST)", low=0,
                         high=1, high_open=True),
        "activation_fn": Field("str", "relu", "hidden layers' activation (FC-MNIST)",
                               choices=("relu", "tanh", "elu", "selu", "linear")),
    },
    "train_input": {"num_examples": Field("int", 4096, "synthetic examples", low=1)},
    "eval_input": {"num_examples": Field("int", 1024, "synthetic examples", low=1)},
}

SPEC = register(ModelSpec(name="mlp", model_fn="cerebras_models.mlp.model:model_fn",
                          input_fn="cerebras_models.mlp.model:input_fn", schema=SCHEMA))
