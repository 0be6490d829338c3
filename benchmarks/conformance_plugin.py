"""pytest plugin of bench_estimator_conformance.py: swaps the Estimator under a tf.estimator test.

Loaded with `-p conformance_plugin`; the environment picks the variant and the results file:
  CONFORMANCE_VARIANT  plain | use_cs=False | use_cs=True
  CONFORMANCE_RESULTS  a JSON file: {test id: [outcome, exception type, where it was raised]}

The test modules' assertions are not touched: only the names they reach the estimator through
are rebound, in the test module's own globals (a copy of the library module with the classes
swapped), so tensorflow_estimator itself is unchanged. keras_lib builds its estimator from its
own `estimator_lib` global, which is rebound the same way.
"""

import json
import os
import sys
import types

import pytest

VARIANT = os.environ.get("CONFORMANCE_VARIANT", "plain")
RESULTS = os.environ.get("CONFORMANCE_RESULTS")
_OUTCOMES = {}


def _classes():
  """(Estimator, RunConfig) of the variant; None for the plain one."""
  if VARIANT == "plain":
    return None
  from cerebras_tf import CerebrasEstimator, CSRunConfig  # pylint: disable=import-outside-toplevel
  if VARIANT == "use_cs=False":
    return CerebrasEstimator, CSRunConfig

  class CerebrasEstimatorOnEngine(CerebrasEstimator):
    """CerebrasEstimator with use_cs=True the default of every call."""

    def __init__(self, *args, use_cs=True, **kwargs):
      super().__init__(*args, use_cs=use_cs, **kwargs)

  return CerebrasEstimatorOnEngine, CSRunConfig


def _swapped(module, **names):
  copy = types.ModuleType(module.__name__)
  copy.__dict__.update(module.__dict__)
  copy.__dict__.update(names)
  return copy


def _swap(test_module) -> None:
  classes = _classes()
  if classes is None:
    return
  estimator_cls, run_config_cls = classes
  from tensorflow_estimator.python.estimator import estimator as estimator_lib  # pylint: disable=import-outside-toplevel
  from tensorflow_estimator.python.estimator import keras_lib  # pylint: disable=import-outside-toplevel
  from tensorflow_estimator.python.estimator import run_config as run_config_lib  # pylint: disable=import-outside-toplevel
  # Only the V2 class: the V1 `Estimator` (export_savedmodel) is not what CerebrasEstimator is.
  est = _swapped(estimator_lib, EstimatorV2=estimator_cls)
  cfg = _swapped(run_config_lib, RunConfig=run_config_cls)
  for name, value in list(vars(test_module).items()):
    if value is estimator_lib:
      setattr(test_module, name, est)
    elif value is run_config_lib:
      setattr(test_module, name, cfg)
  keras_lib.estimator_lib = est


def pytest_collection_modifyitems(session, config, items):
  del session, config
  for module in {item.module for item in items if getattr(item, "module", None)}:
    _swap(module)


def _raised_inside_framework(excinfo, test_file: str) -> str:
  """'framework' when the deepest frame of the test file or of cerebras_tf is cerebras_tf's
  and the error is not one of cerebras_tf's own (a crash, not a refusal); else 'test'."""
  from cerebras_tf.errors import CerebrasTFError  # pylint: disable=import-outside-toplevel
  if issubclass(excinfo.type, CerebrasTFError):
    return "refused"
  ours = os.sep + "cerebras_tf" + os.sep
  where = "test"
  for entry in excinfo.traceback:
    path = str(entry.path)
    if ours in path:
      where = "framework"
    elif path == test_file:
      where = "test"
  return where


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
  outcome = yield
  report = outcome.get_result()
  if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
    if report.outcome == "failed" and call.excinfo is not None:
      where = (_raised_inside_framework(call.excinfo, str(item.fspath))
               if VARIANT != "plain" and "cerebras_tf" in sys.modules else "test")
      _OUTCOMES[item.nodeid] = ["failed", call.excinfo.type.__name__, where,
                                str(call.excinfo.value).splitlines()[0][:200]
                                if str(call.excinfo.value) else ""]
    else:
      _OUTCOMES[item.nodeid] = [report.outcome, "", "", ""]


def pytest_sessionfinish(session, exitstatus):
  del session, exitstatus
  if RESULTS:
    with open(RESULTS, "w", encoding="utf-8") as fh:
      json.dump(_OUTCOMES, fh, indent=1, sort_keys=True)
