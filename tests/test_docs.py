"""The docs say what the code does: the generated references are current."""

import os
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
