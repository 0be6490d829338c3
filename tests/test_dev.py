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
