"""The docs say what the code does: the generated references are current, and
docs/architecture.md names every module of the package and no other."""

import glob
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import gen_reference  # noqa: E402  pylint: disable=wrong-import-position


def _committed(path):
  with open(path, encoding="utf-8") as fh:
    return fh.read()


def test_params_reference_is_generated_from_the_schema():
  assert _committed(gen_reference.PARAMS_MD) == gen_reference.params_reference(), (
      "docs/reference/params.md is stale: run python scripts/gen_reference.py")


def test_flags_reference_is_generated_from_the_flags():
  assert _committed(gen_reference.FLAGS_MD) == gen_reference.flags_reference(), (
      "docs/reference/flags.md is stale: run python scripts/gen_reference.py")


def test_every_key_flag_is_documented_with_its_key():
  """A flag that sets a key carries the key's own help: changing the declaration changes both."""
  text = gen_reference.flags_reference()
  from cerebras_tf import cli, schema  # pylint: disable=import-outside-toplevel
  for name, key in cli.FLAG_TO_KEY.items():
    line = next(l for l in text.splitlines() if l.startswith(f"| `--{name}` |"))
    assert schema.field_of(key).help.split(";")[0] in line, line


FRAGMENT = "<!-- fragment"  # a block that needs what a test cannot give (a cluster), said why


def python_blocks():
  """(file, line, code) of every ```python block in README.md and docs/*.md, except those
  whose preceding line marks them as a fragment."""
  files = [os.path.join(ROOT, "README.md")] + sorted(
      os.path.join(ROOT, "docs", f) for f in os.listdir(os.path.join(ROOT, "docs"))
      if f.endswith(".md"))
  for path in files:
    lines = open(path, encoding="utf-8").read().split("\n")
    for i, line in enumerate(lines):
      if line.strip() == "```python" and not (i and lines[i - 1].startswith(FRAGMENT)):
        end = lines.index("```", i + 1)
        yield os.path.relpath(path, ROOT), i + 1, "\n".join(lines[i + 1:end]) + "\n"


def test_the_doc_blocks_are_found():
  found = {(f, line) for f, line, _ in python_blocks()}
  assert any(f == "README.md" for f, _ in found)
  assert len(found) >= 3, found


@pytest.mark.slow
@pytest.mark.parametrize("where,line,code", list(python_blocks()),
                         ids=lambda v: str(v) if not isinstance(v, str) or "\n" not in v else "")
def test_doc_code_runs(where, line, code, tmp_path):
  """Every example in the docs runs as printed, in a fresh directory (a user's)."""
  env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG",)}
  env["PYTHONPATH"] = str(tmp_path)
  # The registry example names a module of the user's; give it one so the lookup can import it.
  (tmp_path / "my_model_impl.py").write_text("def model_fn(*a):\n  pass\n\n"
                                             "def input_fn(*a):\n  pass\n")
  (tmp_path / "example.py").write_text(code)
  proc = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, env=env,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, f"{where}:{line}: {proc.stderr[-3000:]}"


# ---------------------------------------------------------------------------------------------
# docs/architecture.md is the map of the package: what it names exists, and it names all of it.

PACKAGE = os.path.join(ROOT, "cerebras_tf")
# A module path as the map writes it: cerebras_tf/x.py, or a subpackage's own path
# (runtime/peers.py, engine/specs/, compiler/plan/) with or without the cerebras_tf/ prefix.
# A name must end in .py, .yaml or / to count (`engine/report.input_line` is a function).
_SUBPACKAGES = sorted(d for d in os.listdir(PACKAGE)
                      if os.path.isfile(os.path.join(PACKAGE, d, "__init__.py")))
_MODULE_PATH = re.compile(
    r"(?<![\w/.])(?:cerebras_tf/)?((?:%s)(?:/[\w*]+)*(?:\.py|\.yaml|/)|"
    r"(?<=cerebras_tf/)[\w]+\.py)" % "|".join(_SUBPACKAGES))


def map_problems(text: str, package: str = PACKAGE):
  """What is wrong with a map of the package: the module paths it names that do not exist
  (globs must match something), and the package's modules and subpackages it does not
  name. -> (missing, unnamed), sorted lists of paths relative to the package."""
  named = set()
  for path in _MODULE_PATH.findall(text):
    matches = glob.glob(os.path.join(package, path.rstrip("/")))
    named.update(os.path.relpath(m, package) for m in matches)
    if not matches:
      named.add("?" + path)
  missing = sorted(p[1:] for p in named if p.startswith("?"))
  unnamed = []
  for here, dirs, files in os.walk(package):
    dirs[:] = [d for d in dirs if os.path.isfile(os.path.join(here, d, "__init__.py"))]
    rel = os.path.relpath(here, package)
    if rel != "." and rel not in named:
      unnamed.append(rel + "/")
    for f in files:
      path = os.path.normpath(os.path.join(rel, f))
      if f.endswith(".py") and f != "__init__.py" and path not in named:
        unnamed.append(path)
  return missing, sorted(unnamed)


def test_architecture_names_every_module_and_only_those_that_exist():
  text = open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8").read()
  missing, unnamed = map_problems(text)
  assert not missing, f"docs/architecture.md names cerebras_tf modules that do not exist: {missing}"
  assert not unnamed, f"docs/architecture.md does not name these cerebras_tf modules: {unnamed}"


def test_the_map_check_sees_a_stale_and_an_omitted_module():
  text = open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8").read()
  missing, unnamed = map_problems(text.replace("`runtime/peers.py`", "`runtime/gone.py`"))
  assert missing == ["runtime/gone.py"] and unnamed == ["runtime/peers.py"]
  _, unnamed = map_problems(text.replace("compiler/plan/", "compiler/plans_x/"))
  assert "compiler/plan/" in unnamed
