"""Engine YAMLs: load, validate with one-line errors, and cite a source for every figure."""

import os
import re

import pytest

from cerebras_tf.engine import spec
from cerebras_tf.errors import ParamsError


@pytest.mark.parametrize("name", ["cs1", "cs2", "cs3"])
def test_loads(name):
  e = spec.load_engine(name)
  assert e.name == name and os.path.isfile(e.source_path)
  assert e.usable_cores <= e.cores
  assert e.peak_flops == pytest.approx(e.cores * e.flops_per_core_per_s, rel=0.01)
  assert 0 < e.pipelined_efficiency <= 1
  assert spec.load_engine(e.source_path) == e  # a path works too


def test_figures_match_engine_facts():
  cs2 = spec.load_engine("cs2")
  assert cs2.cores == 850000 and cs2.sram_total_bytes == 40e9 and cs2.clock_hz == 1.1e9
  assert cs2.memoryx_bandwidth_bytes_per_s == 4e12 and cs2.sparsity_partial_sum_cycles == 4
  assert cs2.io_bytes_per_s * 8 == pytest.approx(1.2e12)


@pytest.mark.parametrize("name", ["cs1", "cs2", "cs3"])
def test_every_figure_has_a_source_comment(name):
  lines = open(spec.engine_path(name)).read().split("calibration:")[0].splitlines()
  prev = ""
  for line in lines:
    if re.match(r"^\s*[a-z_]+:\s*[-+0-9.e]+\s*(#.*)?$", line):
      assert "#" in line or "#" in prev, f"{name}: no source for {line.strip()!r}"
    if line.strip():
      prev = line


def test_unknown_engine_lists_choices():
  with pytest.raises(ParamsError, match="choices: cs1, cs2, cs3"):
    spec.load_engine("cs9")


def test_bad_key_names_file_and_key(tmp_path):
  text = open(spec.engine_path("cs2")).read()
  bad = tmp_path / "bad.yaml"
  bad.write_text(text.replace("clock_hz: 1.1e+9", "clock_hz: fast"))
  with pytest.raises(ParamsError, match=r"bad.yaml: key 'clock_hz' must be a number"):
    spec.load_engine(str(bad))
  bad.write_text(text.replace("peak_fp16_flops: 7.48e+15", "peak_fp16_flops: 9.9e+15"))
  with pytest.raises(ParamsError, match="peak_fp16_flops"):
    spec.load_engine(str(bad))
  bad.write_text(text.replace("  height: 996", "  depth: 996"))
  with pytest.raises(ParamsError, match="missing key 'grid.height'"):
    spec.load_engine(str(bad))


def test_an_unchanged_engine_file_is_parsed_once_and_an_edit_is_read(tmp_path, monkeypatch):
  # Every compile loads its engine; the parse is cached per file identity (inode, size,
  # mtime), so a second load must not parse and an edited file must be read again.
  text = open(spec.engine_path("cs2")).read()
  path = tmp_path / "mine.yaml"
  path.write_text(text)
  parses = []
  real = spec.yaml.safe_load
  monkeypatch.setattr(spec.yaml, "safe_load", lambda fh: parses.append(1) or real(fh))
  first = spec.load_engine(str(path))
  assert spec.load_engine(str(path)) is first and len(parses) == 1
  path.write_text(text.replace("name: cs2", "name: cs2-edited"))
  os.utime(path, ns=(0, os.stat(path).st_mtime_ns + 10**9))  # a new stamp even on a coarse clock
  assert spec.load_engine(str(path)).name == "cs2-edited" and len(parses) == 2
  path.write_text(text.replace("clock_hz: 1.1e+9", "clock_hz: fast"))
  os.utime(path, ns=(0, os.stat(path).st_mtime_ns + 2 * 10**9))
  with pytest.raises(ParamsError, match="clock_hz"):
    spec.load_engine(str(path))
