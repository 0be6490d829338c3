"""The docs say what the code does: the generated references are current."""

import os
import sys

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
