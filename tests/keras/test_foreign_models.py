"""Models people bring compile for the engine (models/cnn/foreign.py).

Each of ResNet50, MobileNetV2, EfficientNetB0, ConvNeXtTiny (tf.keras.applications,
weights=None), a U-Net and an LSTM language model goes through keras_model.model_fn_from_keras
and compile: every op has a kernel, the plan fits, and the FLOPs match published or
hand-counted figures. A GPT-2 written in Keras predicts what the reference config predicts.
"""

import os

import pytest
import tensorflow as tf

from cerebras_tf import CerebrasEstimator, CSConfig, CSRunConfig, keras_model
from cerebras_models.cnn import foreign
from cerebras_tf.params import load_params
from cerebras_tf.registry import get_model

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))), "configs")

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
# ResNet50 4.1 G, MobileNetV2 0.30 G, EfficientNetB0 0.39 G, ConvNeXt-T 4.5 G (its paper's
# "4.5G FLOPs" are multiply-accumulates, as the others'). Convolution cost scales with the
# pixels, so at 96x96 a forward pass is 2 x MACs x (96/224)^2 FLOPs; the classifier heads
# (10 classes here) are negligible. Within 15%: the papers round, and stride-2 "same"
# convolutions on 96 (not 224) pixels round their output sizes differently.
PUBLISHED_MACS_224 = {"ResNet50": 4.1e9, "MobileNetV2": 0.30e9, "EfficientNetB0": 0.39e9,
                      "ConvNeXtTiny": 4.5e9}


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


def _keras_gpt_model_fn(cfg):
  """GPT-2 as a user writes it in a model_fn: Keras layers, MultiHeadAttention with a causal
  mask, the head tied by a top-level matmul with the word embeddings."""
  seq, width, heads = cfg["max_position_embeddings"], cfg["hidden_size"], cfg["num_heads"]

  def block(x):
    h = tf.keras.layers.LayerNormalization(epsilon=1e-5)(x)
    x = x + tf.keras.layers.MultiHeadAttention(heads, width // heads)(h, h, use_causal_mask=True)
    h = tf.keras.layers.LayerNormalization(epsilon=1e-5)(x)
    h = tf.keras.layers.Dense(cfg["filter_size"], activation="gelu")(h)
    return x + tf.keras.layers.Dense(width)(h)

  def model_fn(features, labels, mode):
    words = tf.keras.layers.Embedding(cfg["vocab_size"], width)
    x = words(features) + tf.keras.layers.Embedding(seq, width)(tf.range(seq))[None]
    for _ in range(cfg["num_hidden_layers"]):
      x = block(x)
    x = tf.keras.layers.LayerNormalization(epsilon=1e-5)(x)
    logits = tf.matmul(x, words.embeddings, transpose_b=True)
    loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(labels, logits, True))
    train_op = tf.compat.v1.train.AdamOptimizer(1e-4).minimize(
        loss, tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
  return model_fn


@pytest.mark.slow
def test_a_keras_gpt2_predicts_what_the_reference_gpt2_predicts(tmp_path):
  """The same architecture written two ways is one model on the engine: a user's Keras GPT-2
  small and configs/params_gpt2_small.yaml (float32 on both sides) have the same parameter
  count and, in weight streaming at batch 32, the same FLOPs and speed within 2% (the trial
  at GPT-3 XL size: 74.4 vs 74.1 samples/s). The Keras spelling (einsum attention, Keras's
  GELU, layer-norm epsilon) differs by a few elementwise ops, not by a matmul."""
  params = load_params(os.path.join(CONFIGS, "params_gpt2_small.yaml"))
  params["model"]["mixed_precision"] = False
  cs = CSConfig(execution_strategy="weight_streaming", engine="cs2")
  model_fn, input_fn = get_model("gpt").resolve()
  ours = CerebrasEstimator(model_fn, params=params, config=CSRunConfig(
      model_dir=str(tmp_path / "ours"), cs_config=cs)).compile(lambda params: input_fn(params, "train"))
  seq = params["model"]["max_position_embeddings"]

  def tokens(params):
    ds = tf.data.Dataset.from_tensors((tf.zeros([seq], tf.int32), tf.zeros([seq], tf.int32)))
    return ds.repeat().batch(params["batch_size"], drop_remainder=True)
  theirs = CerebrasEstimator(_keras_gpt_model_fn(params["model"]), params={"batch_size": 32},
                             config=CSRunConfig(model_dir=str(tmp_path / "keras"), cs_config=cs)
                             ).compile(tokens)
  tf.keras.backend.clear_session()
  # 124,439,808: GPT-2 small with its 1,024 learned positions and the tied head.
  assert ours.graph.num_params == theirs.graph.num_params == 124_439_808
  assert _fwd(theirs) == pytest.approx(_fwd(ours), rel=0.02)
  assert theirs.performance.samples_per_sec == pytest.approx(
      ours.performance.samples_per_sec, rel=0.02)
  assert theirs.plan.fits and ours.plan.fits
