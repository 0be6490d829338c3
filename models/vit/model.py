"""The ViT as a Keras functional model, put on the engine by cerebras_tf.keras_model."""

import tensorflow as tf

from cerebras_tf import keras_model
from cerebras_models.cnn.model import INPUT_NAME, compile_classifier, float32_logits, under_policy

L = tf.keras.layers


@tf.keras.utils.register_keras_serializable("cerebras_vit")
class ClassToken(L.Layer):
  """Prepends a learned [1, 1, H] token to the patch tokens: [B, N, H] -> [B, N + 1, H]."""

  def __init__(self, initializer=None, **kwargs):
    super().__init__(**kwargs)
    self.initializer = tf.keras.initializers.get(initializer or "zeros")

  def build(self, input_shape):
    self.token = self.add_weight("token", [1, 1, input_shape[-1]], initializer=self.initializer)

  def call(self, x):  # pylint: disable=arguments-differ
    return tf.concat([tf.tile(tf.cast(self.token, x.dtype), [tf.shape(x)[0], 1, 1]), x], 1)

  def get_config(self):
    return {**super().get_config(),
            "initializer": tf.keras.initializers.serialize(self.initializer)}


@tf.keras.utils.register_keras_serializable("cerebras_vit")
class PositionEmbedding(L.Layer):
  """Adds learned position embeddings [1, N, H] to the tokens."""

  def __init__(self, initializer=None, **kwargs):
    super().__init__(**kwargs)
    self.initializer = tf.keras.initializers.get(initializer or "zeros")

  def build(self, input_shape):
    self.table = self.add_weight("embeddings", [1, input_shape[1], input_shape[2]],
                                 initializer=self.initializer)

  def call(self, x):  # pylint: disable=arguments-differ
    return x + tf.cast(self.table, x.dtype)

  def get_config(self):
    return {**super().get_config(),
            "initializer": tf.keras.initializers.serialize(self.initializer)}


@tf.keras.utils.register_keras_serializable("cerebras_vit")
class Attention(L.MultiHeadAttention):
  """Keras's MultiHeadAttention with its softmax in float32 under a bfloat16 policy (Keras's
  Softmax layer would compute it in the layer's bfloat16)."""

  def _masked_softmax(self, attention_scores, attention_mask=None):
    axes = self._softmax.axis  # the key axes: one, (3,), for a sequence of tokens
    if (attention_mask is not None or attention_scores.dtype == tf.float32
        or not isinstance(axes, (tuple, list)) or len(axes) != 1):
      return super()._masked_softmax(attention_scores, attention_mask)
    probs = tf.nn.softmax(tf.cast(attention_scores, tf.float32), axis=axes[0])
    return tf.cast(probs, attention_scores.dtype)


@tf.keras.utils.register_keras_serializable("cerebras_vit")
class ClassState(L.Layer):
  """The class token's state: [B, N + 1, H] -> [B, H]."""

  def call(self, x):  # pylint: disable=arguments-differ
    return x[:, 0]


def build_keras_model(m: dict, optimizer_params: dict) -> tf.keras.Model:
  """Patch embedding (a Conv2D of patch-size stride), class token, position embeddings,
  pre-LN encoder blocks (MultiHeadAttention, an MLP), LayerNorm, the class token to logits.
  `mixed_precision`: under Keras's mixed_bfloat16 policy, softmax and logits float32."""
  model = under_policy(lambda: _build(m), m)
  return compile_classifier(float32_logits(model), optimizer_params)


def _build(m: dict) -> tf.keras.Model:
  """The uncompiled ViT of build_keras_model, under the global dtype policy."""
  seed, r = m.get("seed", 0), m["initializer_range"]
  init = lambda i: tf.keras.initializers.TruncatedNormal(stddev=r, seed=seed + i)  # noqa: E731
  h, heads, eps = m["hidden_size"], m["num_heads"], m["layer_norm_epsilon"]
  x_in = L.Input((*m["image_size"], m["num_channels"]), name=INPUT_NAME)
  x = L.Conv2D(h, m["patch_size"], strides=m["patch_size"], kernel_initializer=init(0),
               name="patch_embedding")(x_in)
  x = L.Reshape((-1, h), name="patches")(x)
  x = ClassToken(init(1), name="cls_token")(x)
  x = PositionEmbedding(init(2), name="position_embedding")(x)
  x = L.Dropout(m["embedding_dropout_rate"], name="embedding_dropout")(x)
  for i in range(m["num_hidden_layers"]):
    y = L.LayerNormalization(epsilon=eps, name=f"block{i}_ln_1")(x)
    y = Attention(heads, h // heads, dropout=m["attention_dropout_rate"],
                             kernel_initializer=init(10 + 4 * i), name=f"block{i}_attention")(
                                 y, y)
    x = L.Add(name=f"block{i}_add_1")([x, L.Dropout(m["dropout_rate"])(y)])
    y = L.LayerNormalization(epsilon=eps, name=f"block{i}_ln_2")(x)
    y = L.Dense(m["filter_size"], activation=m.get("encoder_nonlinearity") or m.get("nonlinearity") or "gelu", kernel_initializer=init(
        11 + 4 * i), name=f"block{i}_mlp_in")(y)
    y = L.Dense(h, kernel_initializer=init(12 + 4 * i), name=f"block{i}_mlp_out")(y)
    x = L.Add(name=f"block{i}_add_2")([x, L.Dropout(m["dropout_rate"])(y)])
  x = L.LayerNormalization(epsilon=eps, name="ln_f")(x)
  x = ClassState(name="class_state")(x)
  if m.get("use_encoder_pooler_layer"):
    x = L.Dense(h, activation="tanh", kernel_initializer=init(3), name="pooler")(x)
  logits = L.Dense(m["num_classes"], kernel_initializer=init(4), name="logits")(x)
  return tf.keras.Model(x_in, logits, name="vit")


def model_fn(features, labels, mode, params):
  """The Keras ViT's model_fn (cerebras_tf.keras_model), built from the params."""
  with tf.Graph().as_default():
    model = build_keras_model(params["model"], params.get("optimizer", {}))
  return keras_model.model_fn_from_keras(model)(features, labels, mode)
