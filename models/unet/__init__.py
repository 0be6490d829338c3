"""UNet: modelzoo's TF 2D UNet for binary defect segmentation (its vision/tf/unet files,
DAGM 2007 and Severstal), `model.name: unet` or a modelzoo file's `encoder_filters`.

  modeling.py      the UNet (encoder blocks, max-pools, bottleneck, transposed-conv decoder
                   with skip connections, 1x1 output conv), shapes in its docstrings
  model.py         model_fn: per-pixel sigmoid cross-entropy; eval mIOU, DSC, MPCA, Acc
  input.py         input_fn: synthetic textured images with elliptic defects and their masks
                   (no segmentation set can be had offline; `synthetic: true` says so)

modelzoo keeps the input keys in train_input (image_shape, num_classes, train_batch_size,
eval_batch_size, ...) and evaluates on train_input's data set: an eval_input that does not
give a data key takes train_input's. No TensorFlow import here.
"""

from cerebras_tf.registry import ModelSpec, register
from cerebras_tf.schema import Field

MODEL_FN = "cerebras_models.unet.model:model_fn"
INPUT_FN = "cerebras_models.unet.input:input_fn"

DATASETS = ("DAGM2007Dataset", "DAGM2007TFRecordsDataset", "SeverstalDataset",
            "SeverstalTFRecordsDataset")
METRICS = ("mIOU", "DSC", "MPCA", "Acc")
CONV_KINDS = ("3x3_conv", "1x1_conv")
NONLINEARITIES = ("ReLU", "LeakyReLU", "ELU", "relu", "leaky_relu", "elu")
# Keras initializer names modelzoo's UNet takes, built as tf.compat.v1's (modeling.py).
INITIALIZERS = ("glorot_uniform", "glorot_normal", "he_uniform", "he_normal", "lecun_uniform",
                "lecun_normal", "zeros", "ones", "constant", "random_normal", "random_uniform",
                "truncated_normal")

INPUT = {
    "dataset": Field("str", "DAGM2007Dataset", "modelzoo's input class (the data set it "
                     "reads); with synthetic: true, informational", choices=DATASETS),
    "dataset_path": Field("path", None, "modelzoo's data set folder (DAGM 2007, Severstal): "
                          "reading it is not built here; see synthetic"),
    "synthetic": Field("bool", False, "synthetic textured images with elliptic defects and "
                       "their masks (models/unet/input.py)"),
    "num_examples": Field("int", 256, "synthetic images drawn (each mode its own)", low=1),
    "image_shape": Field("int_list", [256, 256, 1], "[H, W, C] of the images (H, W divisible "
                         "by 2 ** (len(model.encoder_filters) - 1))"),
    "num_classes": Field("int", 2, "classes: 2 (defect or not; one logit a pixel), as "
                         "modelzoo's UNet", low=2, high=2),
    "class_id": Field("int", 1, "the data set's class (DAGM 2007: 1..10, Severstal: 1..4); "
                      "synthetic: a different texture family per class", low=0),
    "normalize_data_method": Field("str", "zero_centered", "pixels 0..255 to zero_centered "
                                   "(x / 127.5 - 1) or zero_one (x / 255)",
                                   choices=("zero_centered", "zero_one")),
    "only_defective_images": Field("bool", True, "only images with a defect (else about half "
                                   "have none)"),
    "augment_data": Field("bool", True, "training: random flips and 90-degree rotations"),
    "train_test_split": Field("float", None, "one pool split: this share trains, the rest "
                              "evaluates (Severstal's); null: separate draws", low=0, high=1,
                              low_open=True, high_open=True),
    "description": Field("str", None, "modelzoo's note on the input (kept as a note)"),
}

SCHEMA = {
    "model": {
        "encoder_filters": Field("int_list", [32, 64, 128, 256], "filters of each encoder "
                                 "block, the last one the bottleneck's"),
        "decoder_filters": Field("int_list", [128, 64, 32], "filters of each decoder block "
                                 "(one fewer than encoder_filters)"),
        "convs_per_block": Field("spec", ["3x3_conv", "3x3_conv"], "the convolutions of a "
                                 "block, each 3x3_conv or 1x1_conv"),
        "skip_connect": Field("bool", True, "concatenate each encoder block's output to the "
                              "decoder block of its size"),
        "enable_bias": Field("bool", True, "biases in the convolutions"),
        "data_format": Field("str", "channels_first", "the images' layout: channels_first "
                             "[B, C, H, W] (modelzoo's default) or channels_last; computed "
                             "NHWC here", choices=("channels_first", "channels_last")),
        "downscale_method": Field("str", "max_pool", "encoder downsampling: a 2x2 max-pool",
                                  choices=("max_pool",)),
        "nonlinearity": Field("str", "ReLU", "activation after each convolution (a Keras "
                              "layer name)", choices=NONLINEARITIES),
        "nonlinearity_params": Field("mapping", None, "its arguments: alpha (LeakyReLU, ELU)"),
        "initializer": Field("str", "glorot_uniform", "kernels' Keras initializer",
                             choices=INITIALIZERS),
        "initializer_params": Field("mapping", None, "the initializer's arguments"),
        "bias_initializer": Field("str", "zeros", "biases' Keras initializer",
                                  choices=INITIALIZERS),
        "bias_initializer_params": Field("mapping", None, "the bias initializer's arguments"),
        "initial_conv_filters": Field("int", None, "a 3x3 ReLU convolution of this many "
                                      "filters before the encoder (null: none)", low=1),
        "eval_metrics": Field("spec", list(METRICS), "eval metrics: mIOU (mean IoU), DSC "
                              "(Dice), MPCA (mean per-class accuracy), Acc (pixel accuracy)"),
        "log_image_summaries": Field("bool", False, "image summaries of inputs and masks: "
                                     "not built here (false only)"),
    },
    "train_input": INPUT,
    "eval_input": INPUT,
}

# The data keys an eval_input takes from train_input when it does not give them (modelzoo
# evaluates on train_input's data set).
SHARED_INPUT_KEYS = ("dataset", "dataset_path", "synthetic", "num_examples", "image_shape",
                     "num_classes", "class_id", "normalize_data_method",
                     "only_defective_images", "train_test_split")


def _list_of(value, allowed):
  return isinstance(value, list) and value and all(v in allowed for v in value)


def _check(out: dict, fail) -> None:
  model, train = out["model"], out["train_input"]
  for section in ("eval_input", "predict_input"):
    target = out.get(section)
    if target is None:
      continue
    for key in SHARED_INPUT_KEYS:
      if target.get(key) == INPUT[key].default and train.get(key) != INPUT[key].default:
        target[key] = train[key]
  enc, dec = model["encoder_filters"], model["decoder_filters"]
  if len(enc) != len(dec) + 1 or min(enc + dec) < 1:
    fail(("model", "decoder_filters"), f"model.decoder_filters {dec} must have one entry "
         f"fewer than model.encoder_filters {enc} (its last is the bottleneck), all positive")
  if not _list_of(model["convs_per_block"], CONV_KINDS):
    fail(("model", "convs_per_block"), f"model.convs_per_block must be a list of "
         f"{' / '.join(CONV_KINDS)}, got {model['convs_per_block']!r}")
  if not _list_of(model["eval_metrics"], METRICS):
    fail(("model", "eval_metrics"), f"model.eval_metrics must be a list of "
         f"{', '.join(METRICS)}, got {model['eval_metrics']!r}")
  if model["log_image_summaries"]:
    fail(("model", "log_image_summaries"), "model.log_image_summaries: true is not built "
         "here (image summaries); remove it or set it to false")
  scale = 2 ** (len(enc) - 1)
  for section in ("train_input", "eval_input", "predict_input"):
    shape = (out.get(section) or {}).get("image_shape")
    if shape is None:
      continue
    if len(shape) != 3 or min(shape) < 1 or shape[0] % scale or shape[1] % scale:
      fail((section, "image_shape"), f"{section}.image_shape {shape} must be [H, W, C] with "
           f"H and W divisible by {scale} (the encoder's {len(enc) - 1} 2x2 max-pools)")


SPEC = register(ModelSpec(name="unet", model_fn=MODEL_FN, input_fn=INPUT_FN, schema=SCHEMA,
                          check=_check))
