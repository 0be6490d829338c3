"""The model registry: `model.name` in a params file -> a model family.

A model family registers itself when its package is imported:

    # models/bert/__init__.py
    from cerebras_models.fields import TEXT_INPUT_FIELDS, TRANSFORMER_MODEL_FIELDS
    from cerebras_tf.registry import ModelSpec, register
    from cerebras_tf.schema import Field

    register(ModelSpec(
        name="bert",
        model_fn="cerebras_models.bert.model:model_fn",     # "module:attr", imported on first use
        input_fn="cerebras_models.bert.input:input_fn",     # input_fn(params, mode)
        schema={
            "model": {**TRANSFORMER_MODEL_FIELDS,
                      "vocab_size": Field("int", 30522, "vocabulary rows", low=1)},
            "train_input": TEXT_INPUT_FIELDS,
            "eval_input": TEXT_INPUT_FIELDS,
        }))

Rules:
- `model_fn(features, labels, mode, params)` is the plain tf.estimator model_fn; `params` is the
  dict `cerebras_tf.params.load_params` returns (sections `model`, `train_input`, ...).
- `input_fn(params, mode)` returns a tf.data.Dataset of (features, labels); `mode` is a
  tf.estimator.ModeKeys value ("train", "eval", "infer"). The runner binds `mode` with
  functools.partial, so the Estimator sees the usual `input_fn(params)`. On the engine,
  `params["batch_size"]` is the batch to return: per replica when training, eval_input's
  batch_size for eval and predict.
- `schema` adds keys (`cerebras_tf.schema.Field`) to the `model`, `train_input` and
  `eval_input` sections; a key named like a base key replaces it (e.g. another default).
- Give model_fn/input_fn as "module:attr" strings and keep TensorFlow imports out of the
  package `__init__`: loading and validating params (and every CLI error) then never imports
  TensorFlow. Callables work too.
- `check_params(params, fail)` (optional) cross-checks the family's keys after validation;
  `fail(key_path, message)` raises the one-line error with the key's file:line.
- `unapplied` maps the shared keys the family does not apply, `("model",
  "mixed_precision")` say, to their "off" value; any other value is refused by name. A
  validated key is applied or refused, never silently ignored. (modelzoo keys that steer only
  the CS compiler are taken out before validation and named in the log: `modelzoo.tf_files`.)
- Installed families are declared as entry points of the group `cerebras_tf.model_families` (name ->
  package; the reference models' setup.py does so) and imported the first time
  their name is asked for.
- Models outside this package: list their modules, comma-separated, in the environment
  variable CEREBRAS_TF_MODEL_MODULES; they are imported (and register) on the first lookup.
"""

import dataclasses
import difflib
import functools
import importlib
import importlib.metadata
import importlib.util
import os
import traceback
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

from cerebras_tf.errors import ConfigError, ParamsError
from cerebras_tf.schema import EXTENSIBLE_SECTIONS, Field

# Installed distributions declare their model families as entry points of this group, name ->
# package (the reference models: setup.py); the framework itself imports no model.
ENTRY_POINT_GROUP = "cerebras_tf.model_families"


@functools.lru_cache(maxsize=None)
def installed_families() -> Mapping[str, str]:
  """name -> the package that registers it, for every family an installed distribution declares."""
  return {ep.name: ep.value for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


_REGISTRY: Dict[str, "ModelSpec"] = {}

FnRef = Union[Callable, str]



def _yaml_value(value: Any) -> str:
  if value is None:
    return "null"
  if isinstance(value, bool):
    return "true" if value else "false"
  if isinstance(value, list):
    return "[" + ", ".join(_yaml_value(v) for v in value) + "]"
  return str(value)


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """A model family: its model_fn, input_fn(params, mode) and extra params keys."""

  name: str
  model_fn: FnRef
  input_fn: FnRef
  schema: Mapping[str, Mapping[str, Field]] = dataclasses.field(default_factory=dict)
  check: Optional[Callable[[dict, Callable], None]] = None
  # Shared keys this family does not apply -> their "off" value; any other value is refused.
  unapplied: Mapping[Tuple[str, str], Any] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    if not isinstance(self.name, str) or not self.name.isidentifier():
      raise ValueError(f"ModelSpec name must be an identifier such as 'bert', got {self.name!r}")
    for attr in ("model_fn", "input_fn"):
      ref = getattr(self, attr)
      if isinstance(ref, str):
        if ref.count(":") != 1 or not all(ref.split(":")):
          raise ValueError(f"ModelSpec {self.name}.{attr} must be 'module:attr', got {ref!r}")
      elif not callable(ref):
        raise ValueError(f"ModelSpec {self.name}.{attr} must be callable or 'module:attr'")
    for section, fields in self.schema.items():
      if section not in EXTENSIBLE_SECTIONS:
        raise ValueError(f"ModelSpec {self.name}: schema section {section!r} is not one of "
                         f"{EXTENSIBLE_SECTIONS}")
      for key, field in fields.items():
        if not isinstance(field, Field):
          raise ValueError(f"ModelSpec {self.name}: {section}.{key} must be a params.Field")
    # Freeze a copy: the caller's dicts may be shared module constants.
    object.__setattr__(self, "schema", {s: dict(f) for s, f in self.schema.items()})

  def check_params(self, params: dict, fail: Callable) -> None:
    """The family's cross-checks of validated params (`fail(key_path, message)` raises).
    First, a key it does not apply (`unapplied`) set to anything but off: a
    validated key is never silently ignored."""
    for (section, key), off in self.unapplied.items():
      value = (params.get(section) or {}).get(key, off)
      if value != off:
        fail((section, key), f"{section}.{key}: the {self.name} model does not apply it; "
                             f"remove it (or set it to {_yaml_value(off)})")
    if self.check is not None:
      self.check(params, fail)

  def resolve(self) -> Tuple[Callable, Callable]:
    """(model_fn, input_fn) as callables; imports string references now."""
    return _resolve(self.model_fn), _resolve(self.input_fn)


def _resolve(ref: FnRef) -> Callable:
  if callable(ref):
    return ref
  module, _, attr = ref.partition(":")
  fn = importlib.import_module(module)
  for part in attr.split("."):
    fn = getattr(fn, part)
  return fn


def register(spec: ModelSpec) -> ModelSpec:
  """Adds a model family. Registering the same name again must give an equal spec."""
  if not isinstance(spec, ModelSpec):
    raise TypeError(f"register() takes a ModelSpec, got {type(spec).__name__}")
  old = _REGISTRY.get(spec.name)
  if old is not None and (old.model_fn, old.input_fn) != (spec.model_fn, spec.input_fn):
    raise ValueError(f"model {spec.name!r} is already registered with other functions")
  _REGISTRY[spec.name] = spec
  return spec


def unregister(name: str) -> None:
  """Removes a model family (tests)."""
  _REGISTRY.pop(name, None)


MODULES_ENV = "CEREBRAS_TF_MODEL_MODULES"
_imported_env_modules = set()


def _import_env_modules():
  for module in os.environ.get(MODULES_ENV, "").split(","):
    module = module.strip()
    if module and module not in _imported_env_modules:
      _imported_env_modules.add(module)
      try:
        importlib.import_module(module)
      except ModuleNotFoundError as e:
        _imported_env_modules.discard(module)  # a notebook fixes it and asks again
        if e.name == module:
          raise ConfigError(f"{MODULES_ENV}: no module named {module!r}"
                            f"{_import_hint(module)}") from None
        raise ConfigError(f"{MODULES_ENV}: importing {module!r} failed{_failed_at(e)}: it "
                          f"imports {e.name!r}, which is not installed") from e
      except Exception as e:  # the user's module failed: one line, the cause chained
        _imported_env_modules.discard(module)
        raise ConfigError(f"{MODULES_ENV}: importing {module!r} failed{_failed_at(e)}: "
                          f"{type(e).__name__}: {e}; python -c 'import {module}' shows the "
                          f"traceback") from e


def _failed_at(error: BaseException) -> str:
  """` at file:line` of the error in the user's module (the innermost frame outside the
  import machinery), or of the bad line of a SyntaxError."""
  if isinstance(error, SyntaxError) and error.filename:
    return f" at {os.path.relpath(error.filename)}:{error.lineno}"
  frames = [f for f in traceback.extract_tb(error.__traceback__)
            if not f.filename.startswith("<frozen") and f.filename != __file__
            and "site-packages" not in f.filename]
  return f" at {os.path.relpath(frames[-1].filename)}:{frames[-1].lineno}" if frames else ""


def _import_hint(module: str) -> str:
  """Why a module the user wrote is not found: scripts/run.py puts its own directory, not the
  working one, on the import path."""
  here = os.path.join(os.getcwd(), *module.split("."))
  if os.path.isfile(here + ".py") or os.path.isfile(os.path.join(here, "__init__.py")):
    return (f" on the import path, though it is in the working directory {os.getcwd()} "
            f"(scripts/run.py does not import from there): run with PYTHONPATH=. or as "
            f"python -m cerebras_tf")
  return "; put its directory on PYTHONPATH"


def installed_family_dirs() -> List[str]:
  """The directories of the installed families' top-level packages, found without importing
  them (a top-level package's spec does not run its code)."""
  dirs = set()
  for package in installed_families().values():
    spec = importlib.util.find_spec(package.partition(".")[0])
    dirs.update((spec.submodule_search_locations or ()) if spec is not None else ())
  return sorted(dirs)


def available_models() -> List[str]:
  """Registered names plus the built-in families not imported yet."""
  _import_env_modules()
  return sorted(set(_REGISTRY) | set(installed_families()))


def get_model(name: str) -> ModelSpec:
  """The ModelSpec for `name`, importing its built-in package on first use."""
  if not isinstance(name, str):
    raise ParamsError(f"model name must be a string, got {name!r}")
  if name not in _REGISTRY and name in available_models() and name in installed_families():
    importlib.import_module(installed_families()[name])  # available_models() may have registered it
  spec = _REGISTRY.get(name)
  if spec is None:
    choices = available_models()
    # A typo keeps its first letter: 'resnet' is no misspelt 'unet' (the cnn family builds it).
    match = [m for m in difflib.get_close_matches(name, choices, n=3, cutoff=0.6)
             if m[:1].lower() == name[:1].lower()]
    hint = f" (did you mean '{match[0]}'?)" if match else ""
    listing = ", ".join(choices) if choices else "none registered"
    if name in choices:  # the package exists but did not call register()
      raise ParamsError(f"model '{name}': {installed_families()[name]} does not call "
                        "cerebras_tf.registry.register()")
    raise ParamsError(f"unknown model '{name}'{hint}; available: {listing}")
  return spec


def registered() -> Mapping[str, ModelSpec]:
  return dict(_REGISTRY)

