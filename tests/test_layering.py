"""The package's layers point one way; no function-level import dodges a cycle.

    face (estimator with input_pipeline and model_fn_wrapper, run_config, params,
          cli, runner, __main__)
      -> modelzoo (modelzoo's files read as written) -> registry, schema
      -> analysis -> compiler -> engine -> core -> errors
      -> runtime ------------------------> core
    models/ (installed as cerebras_models) -> registry, schema, params, core, runtime, errors,
              modelzoo (the reference models use the framework's types, its checkpoint warm
              start and modelzoo's key forms); the framework never imports a model: it finds
              families by entry point

Read from the source with `ast`, so an import hidden inside a function counts too.
"""

import ast
import os
import re

from conftest import ROOT

PACKAGE = os.path.join(ROOT, "cerebras_tf")
MODELS = os.path.join(ROOT, "models")

# layer -> the layers it may import (itself always allowed).
ALLOWED = {
    "errors": set(),
    "core": {"errors"},
    "engine": {"core", "errors"},
    "compiler": {"engine", "core", "errors"},
    "analysis": {"compiler", "engine", "core", "errors"},
    "runtime": {"core", "errors"},
    "schema": {"core", "errors"},
    "registry": {"schema", "errors"},
    "cs_config": {"schema", "core", "errors"},
    "keras_model": {"errors"},
    "modelzoo": {"registry", "schema", "core", "errors"},  # modelzoo's files: tables, steps
}
# What the reference models (models/, imported as cerebras_models) may use of the framework.
MODELS_MAY_IMPORT = {"registry", "schema", "params", "core", "runtime", "errors", "keras_model",
                     "modelzoo"}
# Function-level imports of our own code that are not about cycles, and why.
LATE = {
    ("cerebras_tf/runner.py", "cerebras_tf.estimator"): "TensorFlow loads only once the params "
    "are valid, so a bad flag or YAML key is one line in a tenth of a second",
    ("cerebras_tf/runner.py", "cerebras_tf.run_config"): "the same",
}
FACE = {"__init__", "__main__", "estimator", "input_pipeline", "model_fn_wrapper", "run_config",
        "params", "cli", "runner"}


def layer_of(module: str) -> str:
  """`cerebras_tf.compiler.plan.base` -> "compiler"; `cerebras_tf.params` -> "params"."""
  parts = module.split(".")
  return parts[1] if len(parts) > 1 else "__init__"


def imports(path: str, package: str = "cerebras_tf"):
  """(imported `package` module, line, inside a function?) for every import in the file."""
  tree = ast.parse(open(path, encoding="utf-8").read(), path)
  out = []

  def visit(node, in_function):
    for child in ast.iter_child_nodes(node):
      nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
      if isinstance(child, ast.Import):
        out.extend((a.name, child.lineno, in_function) for a in child.names)
      elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
        out.append((child.module, child.lineno, in_function))
        out.extend((f"{child.module}.{a.name}", child.lineno, in_function) for a in child.names)
      visit(child, nested)

  visit(tree, False)
  # `from cerebras_tf import errors` lists `cerebras_tf.errors` too, so the bare package name
  # adds nothing there; a bare `import cerebras_models` is an import of the models.
  return [(m, line, f) for m, line, f in out
          if m.startswith(package + ".") or (m == package != "cerebras_tf")]


def modules(root: str = PACKAGE):
  for dirpath, _, files in os.walk(root):
    for f in sorted(files):
      if f.endswith(".py"):
        path = os.path.join(dirpath, f)
        rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
        yield rel.removesuffix(".__init__"), path


def _is_module(name: str) -> bool:
  rel = os.path.join(ROOT, *name.split("."))
  return os.path.isdir(rel) or os.path.isfile(rel + ".py")


def test_layers_point_one_way():
  bad = []
  for module, path in modules():
    src = layer_of(module)
    for target, line, _ in imports(path):
      if not _is_module(target):
        continue  # `from cerebras_tf.core import plans` also lists the name `plans`
      dst = layer_of(target)
      if src in FACE or dst == src:
        continue
      if dst not in ALLOWED[src]:
        bad.append(f"{os.path.relpath(path, ROOT)}:{line}: {src} -> {dst} ({target})")
  assert not bad, "imports against the layering:\n" + "\n".join(bad)


def test_no_function_level_imports_of_the_package():
  """A function-level import of our own code is how a cycle hides; none is allowed (third-party
  libraries imported late to keep TensorFlow/matplotlib off a path are fine)."""
  bad = [f"{os.path.relpath(path, ROOT)}:{line}: {target}"
         for _, path in modules() for target, line, in_function in imports(path)
         if in_function and _is_module(target)
         and (os.path.relpath(path, ROOT), target) not in LATE]
  assert not bad, "function-level imports of cerebras_tf:\n" + "\n".join(bad)


def test_the_test_sees_a_violation(tmp_path):
  """The checker is not vacuous: an engine module importing the compiler is caught."""
  path = tmp_path / "perf.py"
  path.write_text("from cerebras_tf.compiler import plan\n\ndef f():\n"
                  "  from cerebras_tf.core import ir\n")
  found = imports(str(path))
  assert ("cerebras_tf.compiler", 1, False) in found and ("cerebras_tf.core.ir", 4, True) in found
  assert "compiler" not in ALLOWED[layer_of("cerebras_tf.engine.perf")]
  path.write_text("def f():\n  import cerebras_models\n")
  assert imports(str(path), "cerebras_models") == [("cerebras_models", 2, True)]


def test_the_framework_imports_no_model():
  """cerebras_tf finds model families by entry point (registry.installed_families); an import
  of cerebras_models anywhere in it, even inside a function, is an upward arrow."""
  bad = [f"{os.path.relpath(path, ROOT)}:{line}: {target}"
         for _, path in modules() for target, line, _ in imports(path, "cerebras_models")]
  assert not bad, "the framework imports reference models:\n" + "\n".join(bad)


def test_models_use_only_the_framework_s_public_layers():
  bad = [f"{os.path.relpath(path, ROOT)}:{line}: {target}"
         for _, path in modules(MODELS) for target, line, _ in imports(path)
         if _is_module(target) and layer_of(target) not in MODELS_MAY_IMPORT]
  assert not bad, "reference models import framework internals:\n" + "\n".join(bad)


def test_models_install_under_a_namespaced_name():
  """The checkout's models/ installs as cerebras_models (setup.py's package_dir); nothing
  installs a top-level `models` that could shadow a user's own models.py."""
  setup = open(os.path.join(ROOT, "setup.py"), encoding="utf-8").read()
  assert 'package_dir={"cerebras_models": "models"}' in setup
  assert not os.path.exists(os.path.join(ROOT, "cerebras_tf", "models"))


_MODE_NAME = r"""(plans\.(PIPELINED|MULTI_REPLICA|WEIGHT_STREAMING|AUTO)\b|["'](pipelined|multi_replica|weight_streaming|auto)["'])"""
_COMPARED = re.compile(rf"(==|!=)\s*{_MODE_NAME}|{_MODE_NAME}\s*(==|!=)|\bin \({_MODE_NAME}")
# Where a strategy's name may be compared: the mode objects themselves, and the planner registry
# that turns a name (or `auto`, a choice among modes) into a planner.
MODE_OWNERS = {os.path.join("cerebras_tf", "core", "plans.py"),
               os.path.join("cerebras_tf", "compiler", "plan", "__init__.py")}


def mode_name_comparisons(path: str):
  return [(i, line.strip()) for i, line in enumerate(open(path, encoding="utf-8"), 1)
          if _COMPARED.search(line)]


def test_no_mode_name_compared_outside_the_mode_object():
  """Every layer asks the plan's ExecutionMode (`plan.mode.streams_weights`, `.replicates`,
  `.saves_input_position`, `.label()`) instead of comparing strategy names."""
  bad = [f"{os.path.relpath(path, ROOT)}:{i}: {line}" for _, path in modules()
         if os.path.relpath(path, ROOT) not in MODE_OWNERS
         for i, line in mode_name_comparisons(path)]
  assert not bad, "execution modes compared by name:\n" + "\n".join(bad)


def test_the_mode_check_sees_a_comparison(tmp_path):
  path = tmp_path / "x.py"
  path.write_text("if plan.execution_strategy == plans.WEIGHT_STREAMING:\n  pass\n"
                  "if s in (plans.MULTI_REPLICA, plans.AUTO):\n  pass\n"
                  "if strategy == 'weight_streaming':\n  pass\n"
                  "if plan.mode.streams_weights:\n  pass\n")
  assert [i for i, _ in mode_name_comparisons(str(path))] == [1, 3, 5]
