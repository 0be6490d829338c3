"""Shared by the engine tests."""

import pytest

from cerebras_tf.core import ir


@pytest.fixture
def bn_cnn_layer():
  """One small CNN layer, a 3x3 conv of 1 -> 8 channels on 16x16 then a batch norm, as the
  reference CNN (models/cnn) lowers: the batch-norm tests' model."""
  bn = ir.Spatial("batchnorm", 16, 16, 16, 16, 8, 8)
  conv = ir.Spatial("conv", 16, 16, 16, 16, 1, 8, 3, 3)
  return ir.Layer("bn0", "elementwise", 2.0e5, 4.0e5, 80, 320, 640, 1280, 8192.0,
                  spatial=(conv, bn))
