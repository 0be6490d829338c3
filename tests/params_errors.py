"""The one-line ParamsError a params file gets, for the params tests."""

import pytest

from cerebras_tf import params as params_lib
from cerebras_tf.errors import ParamsError


def params_error(path, overrides=None) -> str:
  """load_params' error for `path`, asserted to be one line."""
  with pytest.raises(ParamsError) as e:
    params_lib.load_params(path, overrides)
  message = str(e.value)
  assert "\n" not in message
  return message
