"""The UNet family (modelzoo's TF 2D UNet) on synthetic defect images.

Its parameter count is the hand count below; the synthetic input's masks sit on the defects
after augmentation; modelzoo's DAGM params file (train_batch_size, eval_batch_size in
train_input, no eval_input) loads, and without data its input says what to do in one line;
a tiny UNet trains with use_cs=True with the losses of plain tf.estimator and evaluates
modelzoo's metrics. The family is new: before the wheel is reinstalled the tests name it
through CEREBRAS_TF_MODEL_MODULES.
"""

import os

import numpy as np
import pytest
import tensorflow as tf

from cerebras_tf.errors import DataError
from cerebras_tf.params import load_params
from cerebras_models.unet import input as input_lib
from cerebras_models.unet import modeling
from cerebras_models.unet.model import model_fn
from event_losses import engine_and_plain_losses

tf1 = tf.compat.v1
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))))

TINY = ("model: {{name: unet, encoder_filters: [4, 8], decoder_filters: [4], data_format: "
        "{layout}}}\n"
        "train_input: {{synthetic: true, num_examples: 16, image_shape: [16, 16, 1], "
        "train_batch_size: 4, eval_batch_size: 4, shuffle: false, augment_data: {augment}}}\n"
        "optimizer: {{optimizer_type: sgd, learning_rate: 0.5}}\n"
        "runconfig: {{max_steps: 4, tf_random_seed: 0}}\n")


@pytest.fixture(autouse=True)
def _registered(monkeypatch):
  monkeypatch.setenv("CEREBRAS_TF_MODEL_MODULES", "cerebras_models.unet")


def _params(tmp_path, layout="channels_first", augment="false"):
  (tmp_path / "p.yaml").write_text(TINY.format(layout=layout, augment=augment))
  return load_params(str(tmp_path / "p.yaml"))


def test_parameter_count_by_hand(tmp_path):
  """encoder [2, 4], decoder [2], two 3x3 convs a block, 1 channel, biases:
  encoder block (1 -> 2 -> 2): 9*1*2+2 + 9*2*2+2 = 20 + 38 = 58; bottleneck (2 -> 4 -> 4):
  9*2*4+4 + 9*4*4+4 = 76 + 148 = 224; decoder up-conv 2x2 (4 -> 2): 4*4*2+2 = 34, block on the
  skip concat (2+2 -> 2 -> 2): 9*4*2+2 + 9*2*2+2 = 74 + 38 = 112; output 1x1 (2 -> 1): 3.
  Total 58 + 224 + 34 + 112 + 3 = 431."""
  params = _params(tmp_path)
  params["model"].update(encoder_filters=[2, 4], decoder_filters=[2])
  config = modeling.UNetConfig.from_params(params["model"])
  with tf.Graph().as_default():
    logits = modeling.unet(tf.zeros([2, 1, 16, 16]), config)
    count = sum(int(np.prod(v.shape)) for v in tf1.trainable_variables())
  assert logits.shape.as_list() == [2, 16, 16, 1]
  assert count == modeling.num_parameters(config, 1) == 431


def test_synthetic_masks_cover_the_defects_after_augmentation(tmp_path):
  """The defect shifts brightness by 40..80 of 255 (0.31..0.63 zero-centered): in every
  augmented example the masked pixels' mean differs from the rest by more than 0.2, which a
  mask flipped or rotated apart from its image would not keep."""
  params = _params(tmp_path, layout="channels_last", augment="true")
  with tf.Graph().as_default():
    get = tf1.data.make_one_shot_iterator(input_lib.input_fn(params)).get_next()
    with tf1.Session() as sess:
      for _ in range(3):
        features, mask = sess.run(get)
        image = features["image"].reshape(4, -1)
        assert features["image"].shape == (4, 16, 16, 1) and mask.shape == (4, 256)
        for img, m in zip(image, mask.astype(bool)):
          assert 0 < m.sum() < m.size
          assert abs(img[m].mean() - img[~m].mean()) > 0.2


DAGM = """
train_input:
    shuffle: True
    shuffle_buffer_size: 10000
    dataset: "DAGM2007Dataset"
    description: "UNet base model params on DAGM 2007 dataset"
    dataset_path: "/path/to/dagm2007/dataset"
    train_batch_size: 64
    eval_batch_size: 32
    normalize_data_method: "zero_centered"
    only_defective_images: True
    augment_data: True
    image_shape: [256, 256, 1]
    class_id: 1
    num_classes: 2
model:
    skip_connect: True
    enable_bias: True
    data_format: "channels_first"
    downscale_method: "max_pool"
    convs_per_block: ["3x3_conv", "3x3_conv"]
    encoder_filters: [32, 64, 128, 256]
    decoder_filters: [128, 64, 32]
    initializer: "glorot_uniform"
    bias_initializer: "zeros"
    eval_metrics: ["mIOU", "DSC", "MPCA"]
    boundary_casting: False
    mixed_precision: True
    tf_summary: False
    log_image_summaries: False
optimizer:
    optimizer_type: "adam"
    learning_rate: 1.0e-4
    log_summaries: True
    log_grads: False
    log_hists: False
    loss_scaling_factor: "dynamic"
runconfig:
    max_steps: 6000
    model_dir: "model_dir_unet_base_dagm"
    cs_ip:
    mode: "train"
csconfig:
    use_cbfloat16: False
"""


def test_modelzoo_dagm_file_loads_and_without_data_says_what_to_do(tmp_path):
  (tmp_path / "params_dagm.yaml").write_text(DAGM)
  params = load_params(str(tmp_path / "params_dagm.yaml"))
  assert params["model"]["name"] == "unet"
  assert params["train_input"]["batch_size"] == 64 and params["eval_input"]["batch_size"] == 32
  # modelzoo evaluates on train_input's data set: eval_input takes its data keys.
  assert params["eval_input"]["image_shape"] == [256, 256, 1]
  assert params["eval_input"]["dataset_path"] == "/path/to/dagm2007/dataset"
  with pytest.raises(DataError, match=r"train_input.dataset_path /path/to/dagm2007/dataset: "
                     r"reading DAGM2007Dataset is not built here .* set "
                     r"train_input.synthetic: true"):
    input_lib.input_fn(params)


def test_trains_on_the_engine_as_plain_tf_estimator_and_evaluates(tmp_path):
  """4 SGD steps on the family's own input: the per-step losses with use_cs=True are plain
  tf.estimator's, the first about ln(2) = 0.69 (a sigmoid near 1/2 at init); eval gives
  modelzoo's four metrics, each in [0, 1]."""
  params = _params(tmp_path)

  def input_fn(params):
    return input_lib.input_fn(params)

  want, got, est = engine_and_plain_losses(model_fn, input_fn, tmp_path, 4, params)
  assert len(got) == 4 and abs(got[0] - np.log(2)) < 0.3, got
  np.testing.assert_allclose(got, want, rtol=1e-5)
  metrics = est.evaluate(lambda params: input_lib.input_fn(params, "eval"), steps=2,
                         use_cs=True)
  for name in ("mean_iou", "dice_coefficient", "mean_per_class_accuracy", "accuracy"):
    assert 0.0 <= metrics[name] <= 1.0, (name, metrics)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["pipelined", "multi_replica", "weight_streaming"])
def test_tiny_config_compiles_in_every_mode(tmp_path, strategy):
  """configs/params_unet_tiny.yaml (synthetic input) through run.py --compile_only."""
  from cerebras_tf import cli  # pylint: disable=import-outside-toplevel
  config = os.path.join(ROOT, "configs", "params_unet_tiny.yaml")
  assert cli.main(["run.py", "--params", config, "--compile_only", "--execution_strategy",
                   strategy, "--model_dir", str(tmp_path / "m")]) == 0
  report = open(tmp_path / "m" / "cs_compile" / "report.txt", encoding="utf-8").read()
  assert strategy in report and "unet/decoder/block1/conv1" in report
