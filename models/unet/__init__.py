"""UNet: modelzoo's TF 2D UNet for binary defect segmentation (its vision/tf/unet files,
DAGM 2007 and Severstal), `model.name: unet` or a modelzoo file's `encoder_filters`.

  config.py        UNetConfig: the architecture's keys, declared once (the schema's model
                   section is built from it)
  modeling.py      the UNet (encoder blocks, max-pools, bottleneck, transposed-conv decoder
                   with skip connections, 1x1 output conv), shapes in its docstrings
  model.py         model_fn: per-pixel sigmoid cross-entropy; eval mIOU, DSC, MPCA, Acc
  input.py         input_fn: synthetic textured images with elliptic defects and their masks
                   (no segmentation set can be had offline; `synthetic: true` says so)

modelzoo keeps the input keys in train_input (image_shape, num_classes, train_batch_size,
eval_batch_size, ...) and evaluates on train_input's data set: an eval_input that does not
give a data key takes train_input's. No TensorFlow import here.
"""

from cerebras_models.fields import schema_of
from cerebras_models.unet.config import UNetConfig, architecture_error
from cerebras_tf.registry import ModelSpec, register
from cerebras_tf.schema import Field

MODEL_FN = "cerebras_models.unet.model:model_fn"
INPUT_FN = "cerebras_models.unet.input:input_fn"

DATASETS = ("DAGM2007Dataset", "DAGM2007TFRecordsDataset", "SeverstalDataset",
            "SeverstalTFRecordsDataset")
METRICS = ("mIOU", "DSC", "MPCA", "Acc")

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

# The model section: the architecture (UNetConfig, declared there once), then what the
# model_fn reads besides it.
SCHEMA = {
    "model": {
        **schema_of(UNetConfig),
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
  error = architecture_error(model["encoder_filters"], model["decoder_filters"],
                             model["convs_per_block"])
  if error:
    fail(("model", error[0]), error[1])
  if not _list_of(model["eval_metrics"], METRICS):
    fail(("model", "eval_metrics"), f"model.eval_metrics must be a list of "
         f"{', '.join(METRICS)}, got {model['eval_metrics']!r}")
  if model["log_image_summaries"]:
    fail(("model", "log_image_summaries"), "model.log_image_summaries: true is not built "
         "here (image summaries); remove it or set it to false")
  enc = model["encoder_filters"]
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
