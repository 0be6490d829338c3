"""A small CNN image classifier, a Keras model on the engine: `model.name: cnn`.

The reference model for "bring your own model": a `tf.keras.Sequential` (Conv2D, BatchNorm,
MaxPool, Dense) that reaches the engine through cerebras_tf/keras_model.py, trained on the UCI
handwritten digits that scikit-learn's wheel ships (cerebras_tf/models/data/acquire.py:
"digits"). No TensorFlow import here: the registry imports model_fn/input_fn on first use.
`foreign.py` beside it holds the foreign-model suite (ResNet50, MobileNetV2, EfficientNetB0,
a U-Net, an LSTM language model).
"""

from cerebras_tf.registry import ModelSpec, register
from cerebras_tf.schema import Field

SCHEMA = {
    "model": {
        "filters": Field("int_list", [16, 32], "Conv2D filters per block (each: conv, BN, "
                         "ReLU, 2x2 max-pool)"),
        "dense_units": Field("int", 64, "units of the hidden Dense layer", low=1),
        "num_classes": Field("int", 10, "classes", low=2),
        "seed": Field("int", 0, "initializer seed", low=0),
    },
}

SPEC = register(ModelSpec(name="cnn", model_fn="cerebras_tf.models.cnn.model:model_fn",
                          input_fn="cerebras_tf.models.cnn.model:input_fn", schema=SCHEMA))
