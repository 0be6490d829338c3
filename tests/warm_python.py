"""Python processes for the tests that need a real one (a signal, a kill, a cluster of tasks, a
fresh runtime), started without paying for `import tensorflow` each time.

`Popen` and `run` take subprocess's arguments. `[sys.executable, (-u), SCRIPT | -c CODE | -m
MODULE, ...]` is forked from a server process (tests/warm_python_server.py) that imported
TensorFlow, tensorflow-text, Keras, matplotlib and cerebras_tf once; anything else is started as
subprocess starts it. The child is a process of its own: its pid takes signals and kills, it
has its own session when asked, its standard streams, cwd and environment are the request's,
and its exit status is what `python ...` would give (a script's SystemExit, 1 after a
traceback, killed by SIGINT after an uncaught KeyboardInterrupt, -N when killed by signal N).
What it does not repeat is the start-up: 2.5-3.5 s of CPU a process on the AVX-512 host
(issue 42), where the suite starts ~60 of them.

A test about the start-up itself (what a process imports, the order of imports, environment
read at import) keeps `subprocess`. Environment that is read at import (TensorFlow's log level,
oneDNN, thread pools, Python's own, cerebras_tf's CEREBRAS_TF_* bounds) selects a server of its
own, as does each TF_CONFIG task, so the tasks of one cluster do not share a hash seed, as they
would not on separate hosts.
"""

import atexit
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading

from conftest import as_from_a_shell

_TESTS = os.path.dirname(os.path.abspath(__file__))
_SERVER = os.path.join(_TESTS, "warm_python_server.py")
_RUN_PY = os.path.realpath(os.path.join(_TESTS, "..", "scripts", "run.py"))
# Read by Python, TensorFlow, its kernels' thread pools or cerebras_tf when a process imports
# them: the server's value is what a child gets.
_IMPORT_TIME = re.compile(r"^(PYTHON\w*|TF_CPP_\w+|TF_ENABLE_\w+|TF_NUM_\w+|TF_XLA_\w+|XLA_\w+|"
                          r"OMP_\w+|KMP_\w+|MKL\w*|OPENBLAS_\w+|ONEDNN_\w+|DNNL_\w+|CUDA_\w+|"
                          r"LD_\w+|LANG|LC_\w+|CEREBRAS_TF_\w+)$")
# cerebras_tf's variables that are read when used, not at import (precision.py, registry.py,
# runtime/cluster.py's stall floor).
_READ_WHEN_USED = {"CEREBRAS_TF_FORCE_BF16", "CEREBRAS_TF_MODEL_MODULES",
                   "CEREBRAS_TF_STALL_TIMEOUT_S"}
_MAX_SERVERS = 5  # per test process; ~220 MB each
# The top-level packages the server imports (warm_python_server.PRELOAD), where they are here.
_PRELOADED = {name: os.path.realpath(os.path.join(_TESTS, "..", name))
              for name in ("cerebras_tf", "models", "cerebras")}
_PRELOADED.update({name: None for name in ("tensorflow", "tensorflow_estimator",
                                           "tensorflow_text", "keras", "matplotlib",
                                           "numpy")})
_PRELOADED["conftest.py"] = os.path.realpath(os.path.join(_TESTS, "conftest.py"))


def _task(env: dict) -> str:
  try:
    task = json.loads(env.get("TF_CONFIG") or "{}").get("task") or {}
  except ValueError:
    return ""
  return f"{task.get('type')}:{task.get('index')}" if task else ""


class _Server:
  """One warm server process and the socket to it."""

  def __init__(self, env: dict):
    self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    self.proc = subprocess.Popen(  # pylint: disable=consider-using-with
        [sys.executable, _SERVER, str(theirs.fileno())], pass_fds=[theirs.fileno()],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True)
    theirs.close()
    self.lock = threading.Lock()
    self.cpu = 0.0  # the server's own CPU seconds, as last reported
    if self.sock.recv(16) != b"ready":
      raise RuntimeError(f"{_SERVER} did not start (exit {self.proc.wait()})")

  def spawn(self, request: dict, fds: list) -> int:
    global reaped_cpu  # pylint: disable=global-statement
    with self.lock:
      socket.send_fds(self.sock, [json.dumps(request).encode()], fds)
      pid, cpu = self.sock.recv(64).split()
      reaped_cpu += float(cpu) - self.cpu
      self.cpu = float(cpu)
      return int(pid)

  def close(self) -> None:
    """The server exits once its running children have ended."""
    self.sock.close()


# CPU seconds of the warm children reaped so far and of their servers, which getrusage's
# RUSAGE_CHILDREN does not see (benchmarks/suite_cpu_plugin.py adds it to a test's children).
reaped_cpu = 0.0
_servers: dict = {}  # key -> _Server, least recently used first
_lock = threading.Lock()


def _shadows(pythonpath: str) -> bool:
  """Whether a PYTHONPATH entry holds a package the server imported, found there first."""
  return any(os.path.exists(os.path.join(entry, name)) and
             os.path.realpath(os.path.join(entry, name)) != _PRELOADED.get(name)
             for entry in pythonpath.split(os.pathsep) if entry
             for name in _PRELOADED)


def server_key(env: dict) -> tuple:
  """What a child's server must share with it: the environment read at import, its task."""
  # PYTHONPATH is read at start-up, but only for what is imported after it: the child puts
  # its entries on sys.path itself, unless one would have given the server another package.
  return (tuple(sorted((k, v) for k, v in env.items()
                       if _IMPORT_TIME.match(k) and k not in _READ_WHEN_USED and
                       (k != "PYTHONPATH" or _shadows(v)))), _task(env))


def _server_for(env: dict) -> _Server:
  key = server_key(env)
  with _lock:
    server = _servers.pop(key, None)
    if server is None or server.proc.poll() is not None:
      server = _Server({k: v for k, v in env.items() if k != "TF_CONFIG"})
    _servers[key] = server
    while len(_servers) > _MAX_SERVERS:
      _servers.pop(next(iter(_servers))).close()
    return server


@atexit.register
def _close_all() -> None:
  """Closes every server and reaps it (bounded), so that its CPU and its children's reach this
  process's parent as a subprocess's would."""
  for server in _servers.values():
    server.close()
  for server in _servers.values():
    try:
      server.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
      pass


def _request(args, executable, preexec_fn, pass_fds, shell, env, others) -> dict:
  """What to run in a warm child, or None when `args` is not a Python command it can run."""
  if executable is not None or shell or pass_fds or any(others):
    return None
  if preexec_fn not in (None, as_from_a_shell):
    return None
  args = [os.fspath(a) for a in args] if isinstance(args, (list, tuple)) else None
  if not args or args[0] != sys.executable:
    return None
  rest, unbuffered = args[1:], False
  while rest and rest[0] == "-u":
    rest, unbuffered = rest[1:], True
  if not rest:
    return None
  if rest[0] in ("-c", "-m") and len(rest) > 1:
    kind, target, rest = {"-c": "code", "-m": "module"}[rest[0]], rest[1], rest[2:]
  elif rest[0].startswith("-"):
    return None
  else:
    kind, target, rest = "script", rest[0], rest[1:]
  sigint_ignored = preexec_fn is None and signal.getsignal(signal.SIGINT) == signal.SIG_IGN
  return {"kind": kind, "target": target, "args": rest, "unbuffered": unbuffered,
          "sigint_ignored": sigint_ignored}


class Popen(subprocess.Popen):
  """subprocess.Popen whose Python children are forked warm (see the module docstring)."""

  _status_fd = None  # the pipe the server writes the child's wait status to

  def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env,
                     startupinfo, creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite,
                     errread, errwrite, restore_signals, gid, gids, uid, umask,
                     start_new_session, process_group):
    env = dict(os.environ if env is None else env)
    request = _request(args, executable, preexec_fn, pass_fds, shell, env,
                       (gid, gids, uid, process_group not in (None, -1),
                        umask not in (None, -1)))
    cwd = os.path.abspath(os.fspath(cwd)) if cwd is not None else os.getcwd()
    server_env = env
    if request is not None and "TF_CPP_MIN_LOG_LEVEL" not in env:
      # TensorFlow reads it once, at import: a server's value would hold for the child. But
      # scripts/run.py sets 3 before it imports TensorFlow (cli.main), as the server then has.
      if request["kind"] == "script" and \
          os.path.realpath(os.path.join(cwd, request["target"])) == _RUN_PY:
        server_env = dict(env, TF_CPP_MIN_LOG_LEVEL="3")
      else:
        request = None
    if request is None:
      return super()._execute_child(
          args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo,
          creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite,
          restore_signals, gid, gids, uid, umask, start_new_session, process_group)
    request.update(cwd=cwd, env=env, new_session=bool(start_new_session))
    status_r, status_w = os.pipe()
    try:
      self.pid = _server_for(server_env).spawn(
          request, [p2cread if p2cread != -1 else 0, c2pwrite if c2pwrite != -1 else 1,
                    errwrite if errwrite != -1 else 2, status_w])
      self._child_created = True
      self._status_fd = status_r
    except BaseException:
      os.close(status_r)
      raise
    finally:
      os.close(status_w)
      self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)

  def _try_wait(self, wait_flags):
    """(pid, wait status) as os.waitpid gives them, read from the server's status pipe."""
    if self._status_fd is None:
      return super()._try_wait(wait_flags)
    if wait_flags & os.WNOHANG and not select.select([self._status_fd], [], [], 0)[0]:
      return 0, 0
    global reaped_cpu  # pylint: disable=global-statement
    text = os.read(self._status_fd, 64).split()
    os.close(self._status_fd)
    self._status_fd = -1
    if not text:  # the server is gone (killed with the test process): report it as killed
      return self.pid, signal.SIGKILL
    reaped_cpu += float(text[1])
    return self.pid, int(text[0])

  def _internal_poll(self, _deadstate=None, **kwargs):  # pylint: disable=arguments-differ
    if self._status_fd is None:
      return super()._internal_poll(_deadstate, **kwargs)
    if self.returncode is None and self._waitpid_lock.acquire(False):
      try:
        if self.returncode is None and self._status_fd != -1:
          pid, status = self._try_wait(os.WNOHANG)
          if pid == self.pid:
            self._handle_exitstatus(status)
      finally:
        self._waitpid_lock.release()
    return self.returncode


# pylint: disable-next=redefined-builtin
def run(*popenargs, input=None, capture_output=False, timeout=None, check=False, **kwargs):
  """subprocess.run with a warm child where `Popen` can fork one."""
  if input is not None:
    kwargs["stdin"] = subprocess.PIPE
  if capture_output:
    kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
  with Popen(*popenargs, **kwargs) as process:
    try:
      stdout, stderr = process.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
      process.kill()
      exc.stdout, exc.stderr = process.communicate()
      raise
    except BaseException:
      process.kill()
      raise
    code = process.poll()
    if check and code:
      raise subprocess.CalledProcessError(code, process.args, output=stdout, stderr=stderr)
  return subprocess.CompletedProcess(process.args, code, stdout, stderr)
