"""Every directory the framework writes refuses a write as one line naming the path (issue 40).

A read-only filesystem is a real read-only tmpfs mount where this process may mount one (as
root: chmod does not stop root); elsewhere those cases skip, and a path under a regular file
(ENOTDIR) takes the same code path.
"""

import errno
import os
import subprocess
import time
import uuid

import pytest

from cerebras_tf import cli
from cerebras_tf.compiler import compile as compile_lib
from cerebras_tf.engine import report

MLP = "configs/params_mlp.yaml"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def _at_root(monkeypatch):
  monkeypatch.chdir(ROOT)
  monkeypatch.delenv("TF_CONFIG", raising=False)


@pytest.fixture
def read_only_dir(tmp_path):
  path = tmp_path / f"ro{uuid.uuid4().hex[:6]}"
  path.mkdir()
  proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)],
                        capture_output=True, text=True, check=False)
  if proc.returncode:
    pytest.skip(f"cannot mount a read-only tmpfs here (needs root): {proc.stderr.strip()}")
  yield path
  subprocess.run(["umount", "-l", str(path)], check=False)


def run(capsys, *argv):
  capsys.readouterr()
  code = cli.main(["run.py", "--params", MLP, *argv])
  err = capsys.readouterr().err
  return code, err


def one_line(err):
  assert "Traceback" not in err and err.count("\n") == 1 and err.startswith("error: "), err
  return err.strip()


def test_compile_dir_on_a_read_only_filesystem(tmp_path, capsys, read_only_dir):
  # The directory exists (the mount point): it was a 30-line traceback ending in Errno 30.
  code, err = run(capsys, "--compile_only", "--compile_dir", str(read_only_dir),
                  "--model_dir", str(tmp_path / "m"))
  assert (code, one_line(err)) == (2, f"error: csconfig.compile_dir {read_only_dir} cannot be "
                                      f"written: Read-only file system; choose a writable "
                                      f"directory (--compile_dir)")


def test_model_and_export_dir_on_a_read_only_filesystem(tmp_path, capsys, read_only_dir):
  code, err = run(capsys, "--compile_only", "--model_dir", str(read_only_dir))
  # The run's log file is the first thing written there: the rule for every later write names
  # it, with the key that chose the directory (before it, the up-front check did).
  line = one_line(err)
  assert code == 2 and str(read_only_dir) in line and "Read-only file system" in line \
      and "runconfig.model_dir" in line, line
  code, err = run(capsys, "--mode", "export", "--export_dir", str(read_only_dir / "e"),
                  "--model_dir", str(tmp_path / "m"))
  assert code == 2 and f"--export_dir {read_only_dir}/e cannot be created: Read-only" \
      in one_line(err)


def test_export_dir_naming_a_file(tmp_path, capsys):
  afile = tmp_path / "afile"
  afile.write_text("a file\n")
  code, err = run(capsys, "--mode", "export", "--export_dir", str(afile),
                  "--model_dir", str(tmp_path / "m"))
  assert (code, one_line(err)) == (2, f"error: --export_dir {afile} is a file, not a directory; "
                                      f"choose a directory for the SavedModel (--export_dir)")
  assert afile.read_text() == "a file\n"


def test_a_refused_write_after_the_checks_is_one_line(tmp_path, capsys, monkeypatch):
  """The rule behind the checks: a write the filesystem refuses later (here the compiler's
  report, fault-injected as EROFS: a disk remounted read-only mid-run) is one line naming the
  path and the flag that chose its directory."""
  compile_dir = tmp_path / "c"

  def refuse(directory, *args, **kw):
    del args, kw
    path = os.path.join(directory, "report.txt")
    raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
  monkeypatch.setattr(report, "write_reports", refuse)
  code, err = run(capsys, "--compile_only", "--compile_dir", str(compile_dir),
                  "--model_dir", str(tmp_path / "m"))
  line = one_line(err)
  assert code == 2 and line.startswith(f"error: cannot write {compile_dir}/cache/") and \
      line.endswith("report.txt: Read-only file system; csconfig.compile_dir (--compile_dir) "
                    "must name a writable directory: make it writable or choose another, and "
                    "rerun (nothing written before is lost)"), line


def test_a_killed_compiles_temporary_reports_are_removed_by_the_next(tmp_path):
  """A SIGKILL between writing a report's temporary file and renaming it left
  `report.txt.<pid>.tmp`; the next compile removes such files once they are older than a
  rename ever takes, and nothing else."""
  cache = tmp_path / "cache" / "abc"
  cache.mkdir(parents=True)
  stale = [tmp_path / "report.txt.4242.tmp", tmp_path / "plan.json.4242.0123abcd.tmp",
           cache / "report.txt.77.tmp"]
  keep = [tmp_path / "report.txt", tmp_path / "notes.tmp", tmp_path / "fresh.json.5.tmp"]
  for path in stale + keep:
    path.write_text("x")
  old = time.time() - 2 * compile_lib.STALE_TMP_S
  for path in stale + keep[:2]:
    os.utime(path, (old, old))
  assert compile_lib.remove_stale_tmp(str(tmp_path)) == sorted(str(p) for p in stale)
  assert all(p.exists() for p in keep) and not any(p.exists() for p in stale)
