"""The package's layers point one way; no function-level import dodges a cycle.

    face (estimator, run_config, params, trainer_format, cli, runner, __main__)
      -> analysis -> compiler -> engine -> core -> errors
      -> runtime ------------------------> core
    models -> registry, schema, params, core, runtime (the reference models use the framework's
              types, and its checkpoint warm start), modelzoo_tf (modelzoo's key forms)

Read from the source with `ast`, so an import hidden inside a function counts too.
"""

import ast
import os

from conftest import ROOT

PACKAGE = os.path.join(ROOT, "cerebras_tf")

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
    "modelzoo_tf": set(),  # modelzoo TF files' families and keys: plain data
    "models": {"registry", "schema", "params", "core", "runtime", "errors", "keras_model",
               "modelzoo_tf"},
}
# Function-level imports of our own code that are not about cycles, and why.
LATE = {
    ("cerebras_tf/runner.py", "cerebras_tf.estimator"): "TensorFlow loads only once the params "
    "are valid, so a bad flag or YAML key is one line in a tenth of a second",
    ("cerebras_tf/runner.py", "cerebras_tf.run_config"): "the same",
}
FACE = {"__init__", "__main__", "estimator", "run_config", "params", "trainer_format", "cli",
        "runner"}


def layer_of(module: str) -> str:
  """`cerebras_tf.compiler.plan.base` -> "compiler"; `cerebras_tf.params` -> "params"."""
  parts = module.split(".")
  return parts[1] if len(parts) > 1 else "__init__"


def imports(path: str):
  """(imported cerebras_tf module, line, inside a function?) for every import in the file."""
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
  return [(m, line, f) for m, line, f in out if m.startswith("cerebras_tf.")]


def modules():
  for dirpath, _, files in os.walk(PACKAGE):
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


def test_no_top_level_models_package():
  """The reference models are `cerebras_tf.models`; nothing installs a top-level `models`."""
  assert not os.path.exists(os.path.join(ROOT, "models", "__init__.py"))
  setup = open(os.path.join(ROOT, "setup.py"), encoding="utf-8").read()
  assert '"models"' not in setup and "'models'" not in setup
