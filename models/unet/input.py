"""UNet input: images and their defect masks.

No segmentation data set can be had offline here (DAGM 2007 and Severstal, modelzoo's, are
downloads), so the images are synthetic (`synthetic: true`): textured surfaces of the
section's image_shape, each with a defect (an ellipse of another texture and brightness,
DAGM-like) whose pixels are the mask. They are a deterministic function of the seed and
class_id; train and eval draw different images (or, with train_test_split, split one pool).
A `dataset_path` of the real data sets is refused with one line: reading them is not built.

Features: {"image": [B, C, H, W] (data_format channels_first, modelzoo's default) or
[B, H, W, C] float32}, normalized by normalize_data_method (zero_centered: x / 127.5 - 1,
zero_one: x / 255 of 0..255 pixels). Labels: [B, H * W] float32 mask, 1 = defect.
Training with augment_data flips left-right and rotates by 0, 90 or 180 degrees (0 or 180
for non-square images), image and mask alike, as modelzoo's DAGM input.
"""

import numpy as np
import tensorflow as tf

from cerebras_models import fields
from cerebras_tf.core import batching
from cerebras_tf.errors import DataError

ModeKeys = tf.estimator.ModeKeys


def synthetic_images(count: int, shape, seed: int, defective_share: float = 1.0):
  """(images [N, H, W, C] uint8-valued float32, masks [N, H, W] float32 in {0, 1}).

  Background: a smooth random texture (low-frequency sinusoids plus noise) around gray; a
  defect: an ellipse (random center, axes 1/16..1/4 of the side, angle) brighter or darker
  by 40..80 levels with its own streaked texture. `defective_share` of the images have one."""
  h, w, c = shape
  rng = np.random.RandomState(seed)
  yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
  images = np.empty((count, h, w, c), np.float32)
  masks = np.zeros((count, h, w), np.float32)
  for n in range(count):
    fy, fx = rng.uniform(1, 6, size=2) * 2 * np.pi / np.array([h, w])
    texture = 20 * np.sin(fy * yy + rng.uniform(0, 6.3)) * np.cos(fx * xx + rng.uniform(0, 6.3))
    img = 128 + texture[..., None] + rng.normal(0, 8, size=(h, w, c))
    if rng.uniform() < defective_share:
      cy, cx = rng.uniform(0.2, 0.8) * h, rng.uniform(0.2, 0.8) * w
      ay, ax = rng.uniform(1 / 16, 1 / 4, size=2) * np.array([h, w])
      t = rng.uniform(0, np.pi)
      dy, dx = yy - cy, xx - cx
      u, v = dy * np.cos(t) + dx * np.sin(t), -dy * np.sin(t) + dx * np.cos(t)
      inside = (u / ay) ** 2 + (v / ax) ** 2 <= 1.0
      shift = rng.choice([-1, 1]) * rng.uniform(40, 80)
      streaks = 10 * np.sin(0.9 * u)
      img[inside] += (shift + streaks[inside])[:, None]
      masks[n] = inside
    images[n] = np.clip(img, 0, 255)
  return images, masks


def _normalize(images, method: str):
  return images / 127.5 - 1.0 if method == "zero_centered" else images / 255.0


def _augment(image, mask, square: bool, seed):
  """Random left-right flip and rot90 (k in 0..2, doubled for non-square images), image
  [H, W, C] and mask [H, W, 1] alike."""
  flip = tf.random.uniform([], seed=seed) > 0.5
  image = tf.cond(flip, lambda: tf.image.flip_left_right(image), lambda: image)
  mask = tf.cond(flip, lambda: tf.image.flip_left_right(mask), lambda: mask)
  k = tf.random.uniform([], 0, 3, dtype=tf.int32, seed=seed)
  k = k if square else 2 * k
  return tf.image.rot90(image, k), tf.image.rot90(mask, k)


def _section(params, training: bool):
  if training:
    return params["train_input"]
  return params.get("eval_input") or params["train_input"]


def input_fn(params, mode=ModeKeys.TRAIN, input_context=None):
  """tf.estimator input_fn: a dataset of ({"image"}, mask) batches (see the module doc)."""
  training = mode == ModeKeys.TRAIN
  section = _section(params, training)
  name = "train_input" if training else "eval_input"
  if not section.get("synthetic"):
    where = section.get("dataset_path")
    raise DataError(f"{name}.dataset_path {where or '(unset)'}: reading "
                    f"{section.get('dataset') or 'DAGM 2007 / Severstal'} is not built here (no "
                    f"segmentation data set can be had offline); set {name}.synthetic: true to "
                    f"train on synthetic images and masks (models/unet/input.py)")
  h, w, c = section["image_shape"]
  runconfig = params.get("runconfig") or {}
  seed = section.get("shuffle_seed")
  seed = (runconfig.get("tf_random_seed") or 0) if seed is None else seed
  count = int(section["num_examples"])
  split = section.get("train_test_split")
  class_seed = 1009 * int(section.get("class_id") or 0)
  if split:  # one pool, cut in two (Severstal's train_test_split)
    images, masks = synthetic_images(count, (h, w, c), class_seed,
                                     1.0 if section.get("only_defective_images") else 0.5)
    cut = max(1, int(round(split * count)))
    images, masks = (images[:cut], masks[:cut]) if training else (images[cut:], masks[cut:])
  else:
    images, masks = synthetic_images(count, (h, w, c), class_seed + (0 if training else 1),
                                     1.0 if section.get("only_defective_images") else 0.5)
  if not len(images):
    raise DataError(f"{name}.train_test_split {split} leaves no {name[:-6]} images of "
                    f"num_examples {count}")
  channels_first = (params["model"].get("data_format") or "channels_first") == "channels_first"
  method = section.get("normalize_data_method") or "zero_centered"
  augment = training and section.get("augment_data")
  batch_size = batching.input_batch_size(params, section)

  def prepare(image, mask):
    mask = mask[:, :, tf.newaxis]
    if augment:
      image, mask = _augment(image, mask, h == w, seed)
    image = _normalize(image, method)
    if channels_first:
      image = tf.transpose(image, [2, 0, 1])
    return {"image": image}, tf.reshape(mask, [h * w])

  ds = tf.data.Dataset.from_tensor_slices((images, masks))
  if input_context is not None and input_context.num_input_pipelines > 1:
    ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
  if training and section.get("shuffle"):
    ds = ds.shuffle(min(int(section.get("shuffle_buffer") or count), count), seed=seed)
  if section.get("repeat", training):
    ds = ds.repeat()
  ds = ds.map(prepare, num_parallel_calls=fields.parallel_calls(section))
  return ds.batch(batch_size, drop_remainder=True).prefetch(fields.prefetch_batches(section))
