"""Models people bring compile for the engine (cerebras_tf/models/cnn/foreign.py).

Each of ResNet50, MobileNetV2, EfficientNetB0 (tf.keras.applications, weights=None), a U-Net
and an LSTM language model goes through keras_model.model_fn_from_keras and compile: every
op has a kernel, the plan fits, and the FLOPs match published or hand-counted figures.
"""

import pytest
import tensorflow as tf

from cerebras_tf import CerebrasEstimator, CSConfig, CSRunConfig, keras_model
from cerebras_tf.models.cnn import foreign

BATCH = 8


def _compile(tmp_path, model):
  # The bare model_fn: compiling needs no warm-start checkpoint (ResNet50's is 94 MB).
  est = CerebrasEstimator(keras_model.model_fn_from_keras(model), config=CSRunConfig(
      model_dir=str(tmp_path / "m"), cs_config=CSConfig(execution_strategy="pipelined")))
  result = est.compile(foreign.input_fn_for(model, BATCH))
  tf.keras.backend.clear_session()
  return result


def _fwd(result):
  return sum(l.fwd_flops for l in result.graph.layers)


# Published multiply-accumulates per 224x224 image (the architectures' papers / Keras docs):
# ResNet50 4.1 G, MobileNetV2 0.30 G, EfficientNetB0 0.39 G. Convolution cost scales with the
# pixels, so at 96x96 a forward pass is 2 x MACs x (96/224)^2 FLOPs; the classifier heads
# (10 classes here) are negligible. Within 15%: the papers round, and stride-2 "same"
# convolutions on 96 (not 224) pixels round their output sizes differently.
PUBLISHED_MACS_224 = {"ResNet50": 4.1e9, "MobileNetV2": 0.30e9, "EfficientNetB0": 0.39e9}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PUBLISHED_MACS_224))
def test_keras_applications_compile_with_published_flops(tmp_path, name):
  build, _ = foreign.SUITE[name]
  result = _compile(tmp_path, build(size=96))
  assert result.plan.fits, result.plan.reason
  expected = 2 * PUBLISHED_MACS_224[name] * (96 / 224) ** 2
  assert _fwd(result) == pytest.approx(expected, rel=0.15)
  assert result.performance.samples_per_sec > 0 and result.performance.bottleneck


def test_unet_compiles(tmp_path):
  """Conv/BN/ReLU, max-pool, Conv2DTranspose and skip concatenations all have kernels; the
  lowered graph holds exactly the Keras model's trainable weights, and the up-path
  (Conv2DTranspose) layers are there with their FLOPs."""
  model = foreign.unet(size=32, base=8, depth=2)
  trainable = sum(int(tf.size(w)) for w in model.trainable_weights)
  result = _compile(tmp_path, model)
  assert result.plan.fits
  assert result.graph.num_params == trainable
  up = [l for l in result.graph.layers if l.name.startswith("conv2d_transpose")]
  # 2x2 stride-2 transposed conv from 32 channels at 8x8 to 16 at 16x16: each of the
  # 8 x 8 x 32 = 2,048 inputs scatters into 2 x 2 x 16 = 64 outputs: 2 x 2,048 x 64 = 262,144
  # FLOPs (+ a 16 x 16 x 16 = 4,096 bias), the first up-step of depth 2 with base 8.
  assert len(up) == 2 and up[0].fwd_flops == 262_144 + 4_096


def test_lstm_language_model_compiles_with_its_loop_costed(tmp_path):
  """Embedding -> LSTM(128) over 32 steps -> Dense(1000) per position, per sample:
    LSTM loop, 32 steps x (x @ W: 2 x 64 x 512 + h @ U: 2 x 128 x 512 = 196,608
      + bias 512 + add 512 + 3 sigmoid, 2 tanh, 3 mul, 1 add over 128 = 1,152
      + 2 loop counters)                                        = 32 x 198,786 = 6,361,152
    Dense: 32 x (2 x 128 x 1000 + bias 1000)                                   = 8,224,000
    sparse softmax cross-entropy: 6 x 32 x 1000                                =   192,000
                                                                         total  14,777,152
  (the label cast, mean and metric ops add a few hundred)."""
  result = _compile(tmp_path, foreign.lstm_lm())
  assert result.plan.fits
  assert _fwd(result) == pytest.approx(14_777_152, rel=1e-4)
  lstm = [l for l in result.graph.layers if l.name.startswith("lstm")]
  assert len(lstm) == 1 and lstm[0].num_params == 4 * 128 * (64 + 128 + 1)
