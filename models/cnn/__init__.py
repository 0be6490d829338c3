"""A small CNN image classifier, a Keras model on the engine: `model.name: cnn`.

The reference model for "bring your own model": a `tf.keras.Sequential` (Conv2D, BatchNorm,
MaxPool, Dense) that reaches the engine through cerebras_tf/keras_model.py, trained on the UCI
handwritten digits that scikit-learn's wheel ships (models/data/acquire.py:
"digits"). No TensorFlow import here: the registry imports model_fn/input_fn on first use.
`foreign.py` beside it holds the foreign-model suite (ResNet50, MobileNetV2, EfficientNetB0,
a U-Net, an LSTM language model).
"""

from cerebras_tf.registry import ModelSpec, register
from cerebras_tf.schema import Field

# tf.keras.applications builders the `architecture` key selects (weights=None: no download).
APPLICATIONS = ("ResNet50", "ResNet101", "ResNet152", "ResNet50V2", "MobileNetV2",
                "MobileNetV3Small", "EfficientNetB0", "DenseNet121", "VGG16", "ConvNeXtTiny")

SCHEMA = {
    "model": {
        "architecture": Field("str", "digits_cnn", "digits_cnn (the small CNN below) or a "
                              "tf.keras.applications model built with weights=None: " +
                              ", ".join(APPLICATIONS), choices=("digits_cnn",) + APPLICATIONS),
        "image_size": Field("int_list", None, "[H, W] the images are resized to (null: the "
                            "digits' 8x8; applications need at least 32x32)"),
        "num_channels": Field("int", None, "channels the gray digits are repeated to (null: "
                              "1, applications 3)", low=1),
        "filters": Field("int_list", [16, 32], "Conv2D filters per block (each: conv, BN, "
                         "ReLU, 2x2 max-pool)"),
        "dense_units": Field("int", 64, "units of the hidden Dense layer", low=1),
        "num_classes": Field("int", 10, "classes", low=2),
        "seed": Field("int", 0, "initializer seed", low=0),
    },
}

# Keys a compiled Keras model does not apply here -> the value that means "off".
UNAPPLIED = {
    **{("optimizer", key): off for key, off in {
        "warmup_steps": None, "weight_decay_rate": 0.0, "max_gradient_norm": None,
        "loss_scaling_factor": 1.0, "grad_accum_steps": 1, "log_summaries": False,
        "disable_lr_steps_reset": False}.items()},
}


def check_cnn_params(out: dict, fail) -> None:
  """The CNN is a compiled Keras model: SGD, momentum or Adam at a constant rate."""
  model = out.get("model") or {}
  size = model.get("image_size")
  if size is not None and (len(size) != 2 or min(size) < 1):
    fail(("model", "image_size"), f"model.image_size must be [H, W], got {size}")
  if model.get("architecture", "digits_cnn") != "digits_cnn" and size is not None and \
      min(size) < 32:
    fail(("model", "image_size"), f"model.image_size {size}: tf.keras.applications models "
         f"take at least 32x32 images")
  opt = out.get("optimizer") or {}
  if opt.get("optimizer_type") not in ("sgd", "momentum", "adam"):
    fail(("optimizer", "optimizer_type"), f"optimizer.optimizer_type is "
         f"{opt.get('optimizer_type')} (the default when unset); the cnn model's Keras "
         f"optimizer is sgd, momentum or adam: set one")
  if isinstance(opt.get("learning_rate"), list):
    fail(("optimizer", "learning_rate"), "optimizer.learning_rate: the cnn model takes a "
         "constant rate, not schedule segments")


SPEC = register(ModelSpec(name="cnn", model_fn="cerebras_models.cnn.model:model_fn",
                          input_fn="cerebras_models.cnn.model:input_fn", schema=SCHEMA,
                          check=check_cnn_params, unapplied=UNAPPLIED))