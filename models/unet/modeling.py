"""modelzoo's TF 2D UNet (Ronneberger et al. 2015) as small pure functions over
tf.compat.v1 variable scopes.

  encoder   len(encoder_filters) - 1 blocks: convs_per_block convolutions (3x3 or 1x1,
            "same" padding, each followed by the nonlinearity), then a 2x2 max-pool; each
            block's output is kept for the skip connection
  bottleneck one block of encoder_filters[-1]
  decoder   per decoder_filters[i]: a 2x2 stride-2 transposed convolution, the matching
            encoder output concatenated on the channels (skip_connect), a block
  output    a 1x1 convolution to one channel: the defect logit of each pixel (modelzoo's
            binary segmentation, num_classes 2)

Shapes: B batch, H x W image, C channels; the model computes in NHWC (TensorFlow's CPU
kernels have no NCHW convolution): an NCHW input (data_format channels_first) is transposed
first. Variables are float32; with mixed_precision the convolutions run in bfloat16 and the
logits are float32. The hyper-parameters are config.py's UNetConfig.
"""

from typing import Mapping

import tensorflow as tf

from cerebras_models.unet.config import CONV_KINDS, UNetConfig
from cerebras_tf.runtime import bias_grad

tf1 = tf.compat.v1


# Keras initializer names (modelzoo's UNet takes them) -> tf.compat.v1 initializers, which
# draw from the graph seed (runconfig.tf_random_seed) like every other variable here.
_SCALINGS = {"glorot_uniform": (1.0, "fan_avg", "uniform"),
             "glorot_normal": (1.0, "fan_avg", "truncated_normal"),
             "he_uniform": (2.0, "fan_in", "uniform"), "he_normal": (2.0, "fan_in",
                                                                    "truncated_normal"),
             "lecun_uniform": (1.0, "fan_in", "uniform"),
             "lecun_normal": (1.0, "fan_in", "truncated_normal")}
_PLAIN = {"zeros": tf1.zeros_initializer, "ones": tf1.ones_initializer,
          "constant": tf1.constant_initializer, "random_normal": tf1.random_normal_initializer,
          "random_uniform": tf1.random_uniform_initializer,
          "truncated_normal": tf1.truncated_normal_initializer}



def initializer(spec):
  """A Keras initializer by name (or {name, its arguments}) as a tf.compat.v1 initializer."""
  args = dict(spec) if isinstance(spec, Mapping) else {"name": spec}
  name = args.pop("name")
  if name in _SCALINGS:
    scale, mode, distribution = _SCALINGS[name]
    return tf1.variance_scaling_initializer(scale, mode, distribution, **args)
  return _PLAIN[name](**args)


def activation(x, config: UNetConfig):
  name = config.nonlinearity.lower().replace("_", "")
  if name == "relu":
    return tf.nn.relu(x)
  if name == "leakyrelu":
    return tf.nn.leaky_relu(x, alpha=0.3 if config.nonlinearity_alpha is None
                            else config.nonlinearity_alpha)
  alpha = 1.0 if config.nonlinearity_alpha is None else config.nonlinearity_alpha
  return tf.where(x > 0, x, alpha * tf.math.expm1(tf.minimum(x, 0)))  # ELU


def _bias(y, filters, config):
  if not config.enable_bias:
    return y
  bias = tf1.get_variable("bias", [filters], initializer=initializer(config.bias_init))
  with bias_grad.summed_in_float32(y.dtype):  # a bfloat16 model's: TF's sums it in bfloat16
    return tf.nn.bias_add(y, tf.cast(bias, y.dtype))


def conv(x, filters: int, size: int, name: str, config: UNetConfig):
  """size x size convolution, stride 1, "same" padding (scope `name`: kernel [k, k, Cin,
  filters], bias).  [B, H, W, Cin] -> [B, H, W, filters]."""
  with tf1.variable_scope(name):
    kernel = tf1.get_variable("kernel", [size, size, x.shape[-1], filters],
                              initializer=initializer(config.kernel_init))
    return _bias(tf.nn.conv2d(x, tf.cast(kernel, x.dtype), 1, "SAME"), filters, config)


def up_conv(x, filters: int, name: str, config: UNetConfig):
  """2x2 transposed convolution, stride 2: [B, H, W, Cin] -> [B, 2H, 2W, filters]."""
  with tf1.variable_scope(name):
    kernel = tf1.get_variable("kernel", [2, 2, filters, x.shape[-1]],
                              initializer=initializer(config.kernel_init))
    batch = tf.shape(x)[0]
    out_shape = tf.stack([batch, 2 * x.shape[1], 2 * x.shape[2], filters])
    y = tf.nn.conv2d_transpose(x, tf.cast(kernel, x.dtype), out_shape, 2, "SAME")
    y.set_shape([x.shape[0], 2 * x.shape[1], 2 * x.shape[2], filters])
    return _bias(y, filters, config)


def block(x, filters: int, name: str, config: UNetConfig):
  """convs_per_block convolutions, each followed by the nonlinearity (scope `name`)."""
  with tf1.variable_scope(name):
    for i, kind in enumerate(config.convs_per_block):
      x = activation(conv(x, filters, CONV_KINDS[kind], f"conv{i}", config), config)
  return x


def unet(images, config: UNetConfig):
  """The UNet (scope `unet`).

  Args:
    images: [B, C, H, W] (channels_first) or [B, H, W, C] float; H and W divisible by
      2 ** (len(encoder_filters) - 1).
  Returns:
    logits [B, H, W, 1] float32.
  """
  x = tf.cast(images, config.dtype)
  if config.channels_first:
    x = tf.transpose(x, [0, 2, 3, 1])
  skips = []
  with tf1.variable_scope("unet"):
    if config.initial_conv_filters:
      x = tf.nn.relu(conv(x, config.initial_conv_filters, 3, "initial_conv", config))
    with tf1.variable_scope("encoder"):
      for i, filters in enumerate(config.encoder_filters[:-1]):
        x = block(x, filters, f"block{i}", config)
        skips.append(x)
        x = tf.nn.max_pool2d(x, 2, 2, "VALID")                  # [B, H/2, W/2, filters]
    x = block(x, config.encoder_filters[-1], "bottleneck", config)
    with tf1.variable_scope("decoder"):
      for i, filters in enumerate(config.decoder_filters):
        with tf1.variable_scope(f"block{i}"):
          x = up_conv(x, filters, "up_conv", config)
          if config.skip_connect:
            x = tf.concat([x, skips[-1 - i]], axis=-1)
        x = block(x, filters, f"block{i}", config)
    logits = conv(x, 1, 1, "output_conv", config)
  return tf.cast(logits, tf.float32)


def num_parameters(config: UNetConfig, channels: int) -> int:
  """Trainable parameters for `channels` input channels (for tests and reports)."""
  bias = 1 if config.enable_bias else 0
  total, cin, skips = 0, channels, []

  def block_params(cin, filters):
    n = 0
    for kind in config.convs_per_block:
      k = CONV_KINDS[kind]
      n += k * k * cin * filters + bias * filters
      cin = filters
    return n

  if config.initial_conv_filters:
    total += 9 * cin * config.initial_conv_filters + bias * config.initial_conv_filters
    cin = config.initial_conv_filters
  for filters in config.encoder_filters[:-1]:
    total += block_params(cin, filters)
    skips.append(filters)
    cin = filters
  total += block_params(cin, config.encoder_filters[-1])
  cin = config.encoder_filters[-1]
  for i, filters in enumerate(config.decoder_filters):
    total += 4 * cin * filters + bias * filters
    cin = filters + (skips[-1 - i] if config.skip_connect else 0)
    total += block_params(cin, filters)
    cin = filters
  return total + cin + bias
