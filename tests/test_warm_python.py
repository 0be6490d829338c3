"""tests/warm_python.py gives the tests that need a process of their own what `python ...` would:
exit codes, signals, streams, cwd, environment, sessions, argv and sys.path, with TensorFlow
already imported; anything it cannot fork warm runs as subprocess runs it."""

import os
import signal
import subprocess
import sys
import time

import pytest

import warm_python
from conftest import as_from_a_shell

ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")


def _py(*args, **kwargs):
  return warm_python.run([sys.executable, *args], capture_output=True, text=True, timeout=120,
                         env=kwargs.pop("env", ENV), **kwargs)


def test_a_warm_child_has_tensorflow_imported_and_a_real_python_does_not():
  code = "import sys; print('tensorflow' in sys.modules)"
  assert _py("-c", code).stdout == "True\n"
  plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env=ENV)
  assert plain.stdout == "False\n"


def test_exit_codes_are_pythons(tmp_path):
  assert _py("-c", "import sys; sys.exit(3)").returncode == 3
  assert _py("-c", "import sys; sys.exit('bye')").stderr == "bye\n"
  failed = _py("-c", "raise ValueError('boom')")
  assert failed.returncode == 1 and failed.stderr.endswith("ValueError: boom\n")
  # An uncaught KeyboardInterrupt ends the process by SIGINT, as Python's does.
  assert _py("-c", "raise KeyboardInterrupt").returncode == -signal.SIGINT


def test_script_argv_path_name_cwd_and_environment(tmp_path):
  (tmp_path / "helper_mod.py").write_text("VALUE = 7\n")
  lib = tmp_path / "lib"
  lib.mkdir()
  (lib / "lib_mod.py").write_text("VALUE = 8\n")
  script = tmp_path / "script.py"
  script.write_text("import os, sys, helper_mod, lib_mod\n"
                    "print(__name__, sys.argv, helper_mod.VALUE, lib_mod.VALUE, os.getcwd(), "
                    "os.environ.get('WARM_PROBE'), os.path.isabs(__file__), sys.path[:2])\n")
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  out = _py(str(script), "a", "--b", cwd=elsewhere,
            env=dict(ENV, WARM_PROBE="here", PYTHONPATH=str(lib))).stdout
  # As Python's start-up orders sys.path: the script's directory, then PYTHONPATH's entries.
  assert out == (f"__main__ {[str(script), 'a', '--b']} 7 8 {elsewhere} here True "
                 f"{[str(tmp_path), str(lib)]}\n")


def test_module_and_unbuffered_flag():
  assert _py("-u", "-m", "json.tool", input='{"a": 1}').stdout == '{\n    "a": 1\n}\n'


def test_streams_stdin_and_stderr_into_stdout():
  proc = warm_python.run([sys.executable, "-c", "import sys; print(sys.stdin.read().upper()); "
                          "print('err', file=sys.stderr)"], input="hi", stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=120, env=ENV)
  assert proc.stdout == "HI\nerr\n"


def test_a_child_takes_signals_has_its_own_session_and_is_killed_by_pid():
  proc = warm_python.Popen([sys.executable, "-c", "import os, time; print(os.getsid(0), "
                            "flush=True); time.sleep(600)"], stdout=subprocess.PIPE, text=True,
                           env=ENV, start_new_session=True)
  try:
    assert int(proc.stdout.readline()) == proc.pid  # the session leader is the child itself
    assert proc.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
      proc.wait(timeout=0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
  finally:
    proc.kill()
    proc.stdout.close()


@pytest.mark.parametrize("preexec_fn", [None, as_from_a_shell])
def test_ctrl_c_raises_keyboard_interrupt_in_the_child_unless_sigint_is_ignored(preexec_fn):
  """A child inherits an ignored SIGINT (a background job's), as exec keeps it; conftest's
  as_from_a_shell gives it the default back, as for a real process."""
  ignored = preexec_fn is None and signal.getsignal(signal.SIGINT) == signal.SIG_IGN
  proc = warm_python.Popen([sys.executable, "-c", "import time\ntry:\n  print('up', flush=True)\n"
                            "  time.sleep(600)\nexcept KeyboardInterrupt:\n"
                            "  print('interrupted')\n  raise SystemExit(130)"],
                           stdout=subprocess.PIPE, text=True, env=ENV, preexec_fn=preexec_fn)
  assert proc.stdout.readline() == "up\n"
  proc.send_signal(signal.SIGINT)
  if ignored:
    with pytest.raises(subprocess.TimeoutExpired):
      proc.wait(timeout=1)
    proc.kill()
    proc.communicate()
    return
  assert proc.communicate(timeout=30)[0] == "interrupted\n" and proc.returncode == 130


def test_a_timeout_kills_the_child():
  start = time.monotonic()
  with pytest.raises(subprocess.TimeoutExpired):
    warm_python.run([sys.executable, "-c", "import time; time.sleep(600)"], timeout=1, env=ENV)
  assert time.monotonic() - start < 60


def test_a_server_is_shared_where_the_import_time_environment_and_the_task_agree(tmp_path):
  """Each server is a fresh interpreter, with its own string hash seed: the tasks of one
  cluster must not share one, as they would not on separate hosts."""
  key = warm_python.server_key
  chief, worker = (dict(ENV, TF_CONFIG='{"cluster": {}, "task": {"type": "%s", "index": 0}}'
                        % t) for t in ("chief", "worker"))
  assert key(chief) != key(worker) and key(chief) != key(ENV)
  assert key(chief) == key(dict(chief, CEREBRAS_TF_MODEL_MODULES="m"))  # read when used
  assert key(ENV) != key(dict(ENV, TF_CPP_MIN_LOG_LEVEL="1"))  # TensorFlow reads it at import
  assert key(ENV) != key(dict(ENV, CEREBRAS_TF_STOP_GRACE_S="3"))  # cerebras_tf reads it so
  # A PYTHONPATH entry goes on the child's sys.path, unless it holds a package of the server's.
  assert key(ENV) == key(dict(ENV, PYTHONPATH=str(tmp_path)))
  (tmp_path / "numpy").mkdir()
  assert key(ENV) != key(dict(ENV, PYTHONPATH=str(tmp_path)))


def test_what_it_cannot_fork_warm_runs_as_subprocess_runs_it():
  # No TF_CPP_MIN_LOG_LEVEL: run.py would set its own before TensorFlow logs; a server could not.
  env = {k: v for k, v in ENV.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
  code = "import sys; print('tensorflow' in sys.modules)"
  assert _py("-c", code, env=env).stdout == "False\n"
  assert warm_python.run(["echo", "plain"], capture_output=True, text=True).stdout == "plain\n"
  assert _py("-W", "ignore", "-c", code).stdout == "False\n"  # an option it does not take
