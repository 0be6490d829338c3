"""The reference models are the framework's own code though they live beside it (models/):
their log lines reach the terminal and their optimizer is not linted as a user's."""

import logging
import os

from conftest import ROOT
from cerebras_tf import estimator  # noqa: F401  (registers the families' directories)
from cerebras_tf import registry
from cerebras_tf.core import source
from cerebras_tf.runtime import logs


def test_the_families_are_found_without_importing_them():
  assert os.path.join(ROOT, "models") in registry.installed_family_dirs()


def test_reference_model_code_is_own_and_user_code_is_not(tmp_path):
  assert source.is_own(os.path.join(ROOT, "models", "optimization.py"))
  assert source.is_own(os.path.join(ROOT, "cerebras_tf", "estimator.py"))
  assert not source.is_own(str(tmp_path / "my_model.py"))
  assert not source.is_own(os.path.join(ROOT, "tests", "fake_model.py"))


def test_a_reference_model_s_log_record_is_ours():
  record = logging.LogRecord("tensorflow", logging.INFO,
                             os.path.join(ROOT, "models", "bert", "model.py"), 1, "x", (), None)
  assert logs.ours(record)
  record.pathname = "/elsewhere/my_model.py"
  assert not logs.ours(record)
