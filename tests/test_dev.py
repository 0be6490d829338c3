"""dev.py, the README's two commands: the environment of the processes it starts."""

import os
import subprocess
import sys

import dev


def test_bytecode_goes_to_the_venv_even_where_the_shell_turned_it_off(monkeypatch):
  monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
  monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
  env = dev.child_env()
  assert "PYTHONDONTWRITEBYTECODE" not in env
  assert env["PYTHONPYCACHEPREFIX"] == os.path.join(dev.VENV, "pycache")
  assert env["TF_CPP_MIN_LOG_LEVEL"] == "2"


def test_a_prefix_and_log_level_the_caller_chose_are_kept(monkeypatch, tmp_path):
  monkeypatch.setenv("PYTHONPYCACHEPREFIX", str(tmp_path))
  monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")
  env = dev.child_env()
  assert (env["PYTHONPYCACHEPREFIX"], env["TF_CPP_MIN_LOG_LEVEL"]) == (str(tmp_path), "0")


def test_a_process_started_so_keeps_its_bytecode_out_of_the_source_tree(monkeypatch, tmp_path):
  src, cache = tmp_path / "src", tmp_path / "cache"
  src.mkdir()
  (src / "some_module.py").write_text("X = 1\n")
  monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
  monkeypatch.setenv("PYTHONPYCACHEPREFIX", str(cache))
  subprocess.run([sys.executable, "-c", "import some_module"], cwd=src, env=dev.child_env(),
                 check=True)
  assert not (src / "__pycache__").exists()
  assert list(cache.rglob("some_module*.pyc")), "no bytecode written under the prefix"


def test_the_installed_bytecode_is_seeded_where_the_prefix_makes_python_look(tmp_path):
  """Python's own mapping (importlib's cache_from_source under a pycache prefix) finds the
  seeded file; a source changed since is recompiled into a new file, not into the seed."""
  import importlib.util  # pylint: disable=import-outside-toplevel
  import py_compile  # pylint: disable=import-outside-toplevel
  site, prefix = tmp_path / "site", tmp_path / "prefix"
  (site / "pkg").mkdir(parents=True)
  source = site / "pkg" / "mod.py"
  source.write_text("X = 1\n")
  beside = os.path.join(site, "pkg", "__pycache__",
                        f"mod.{sys.implementation.cache_tag}.pyc")  # where pip compiles it
  compiled = py_compile.compile(str(source), cfile=beside, doraise=True)
  assert dev.seed_bytecode(str(prefix), [str(site)]) == 1
  assert dev.seed_bytecode(str(prefix), [str(site)]) == 0  # once
  saved = sys.pycache_prefix
  sys.pycache_prefix = str(prefix)
  try:
    seeded = importlib.util.cache_from_source(str(source))
  finally:
    sys.pycache_prefix = saved
  assert os.path.samefile(seeded, compiled)
  env = dict(os.environ, PYTHONPYCACHEPREFIX=str(prefix), PYTHONPATH=str(site))
  env.pop("PYTHONDONTWRITEBYTECODE", None)
  source.write_text("X = 22\n")
  out = subprocess.run([sys.executable, "-c", "import pkg.mod; print(pkg.mod.X)"], env=env,
                       capture_output=True, text=True, check=True).stdout
  assert out == "22\n" and open(compiled, "rb").read() != open(seeded, "rb").read()


def test_only_dev_pys_own_prefix_is_seeded(monkeypatch, tmp_path):
  """A prefix the caller chose (a tmpfs, a cache shared with other projects) is theirs: dev.py
  neither links nor copies 20,000 files into it."""
  seeded = []
  monkeypatch.setattr(dev, "ensure_env", lambda: False)
  monkeypatch.setattr(dev, "_venv_library_dirs", lambda: [])
  monkeypatch.setattr(dev, "seed_bytecode", lambda prefix, roots: seeded.append(prefix))
  monkeypatch.setattr(dev.subprocess, "call", lambda *a, **k: 0)
  monkeypatch.setattr(dev, "DEFAULT_PYCACHE", str(tmp_path / "ours"))
  monkeypatch.setenv("PYTHONPYCACHEPREFIX", str(tmp_path / "theirs"))
  assert dev.main(["dev.py", "run", "x.py"]) == 0 and seeded == []
  monkeypatch.delenv("PYTHONPYCACHEPREFIX")
  assert dev.main(["dev.py", "run", "x.py"]) == 0 and seeded == [str(tmp_path / "ours")]
