"""The server of tests/warm_python.py: imports TensorFlow and the project once, then forks a
child for each request and runs the requested script in it as `python [-u] SCRIPT|-c|-m ...`
would, with the request's argv, cwd, environment, standard streams and session.

Protocol, over the SOCK_SEQPACKET socket whose fd is argv[1]: a request is one JSON message
with 4 file descriptors attached (the child's stdin, stdout, stderr, and a pipe the server
writes the child's wait status and CPU seconds to, as text, when it reaps it); the reply is
the child's pid and the server's own CPU seconds so far.
The server stays single-threaded (forking a process with other Python threads is unsafe) and
exits when the client has gone and its last child has been reaped.
"""

import gc
import json
import os
import runpy
import select
import signal
import socket
import sys
import types

import conftest  # noqa: F401  its exit handler, registered first, is each child's last

# What a TensorFlow process of this project imports before it does anything of its own. The
# runtime is not started (no session, no eager context): a child still configures its devices.
PRELOAD = ("cerebras_tf", "tensorflow", "tensorflow_estimator", "tensorflow_text", "keras",
           "cerebras_tf.cli", "cerebras_tf.estimator", "cerebras_tf.runner",
           "matplotlib.figure", "matplotlib.backends.backend_agg", "numpy")


# The server's own PYTHONPATH entries on sys.path, which a child's PYTHONPATH replaces.
_OWN_PYTHONPATH = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                   if p]


def _become(request: dict, fds: list) -> None:
  """In the forked child: the process `python ARGS` would have been, up to running main."""
  signal.set_wakeup_fd(-1)
  signal.signal(signal.SIGCHLD, signal.SIG_DFL)
  signal.signal(signal.SIGINT,
                signal.SIG_IGN if request["sigint_ignored"] else signal.default_int_handler)
  if request["new_session"]:
    os.setsid()
  for target, fd in enumerate(fds[:3]):
    os.dup2(fd, target)
  for fd in set(fds):
    if fd > 2:
      os.close(fd)
  os.chdir(request["cwd"])
  os.environ.clear()
  os.environ.update(request["env"])
  # PYTHONPATH's entries, as Python's start-up puts them: after the script's directory, before
  # the rest. The server's own (the same, or none) come out first.
  entries = [os.path.abspath(p) for p in request["env"].get("PYTHONPATH", "").split(os.pathsep)
             if p]
  sys.path[1:] = entries + [p for p in sys.path[1:]
                            if p not in _OWN_PYTHONPATH and p not in entries]
  if request["unbuffered"]:
    for stream in (sys.stdout, sys.stderr):
      stream.reconfigure(write_through=True)
  # A fresh process draws fresh numpy randomness (Python's own `random` reseeds at fork).
  import numpy as np  # pylint: disable=import-outside-toplevel
  np.random.seed()


def _run(request: dict) -> None:
  """Runs the script, the code or the module as Python's command line does."""
  kind, target, args = request["kind"], request["target"], request["args"]
  if kind == "script":
    path = os.path.abspath(target)
    sys.argv = [target, *args]
    sys.path[0] = os.path.dirname(path)
    runpy.run_path(path, run_name="__main__")
  elif kind == "code":
    sys.argv = ["-c", *args]
    sys.path[0] = ""
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    exec(compile(target, "<string>", "exec"), main.__dict__)  # pylint: disable=exec-used
  else:
    sys.argv = [target, *args]
    sys.path[0] = request["cwd"]
    runpy.run_module(target, run_name="__main__", alter_sys=True)


def serve(sock: socket.socket):
  """Forks a child per request. Returns None in the server when done; in a child, returns the
  request to run (the caller unwinds to the top level first, so the child's interpreter shuts
  down as a normal process's does)."""
  wake_r, wake_w = os.pipe()
  os.set_blocking(wake_w, False)
  signal.set_wakeup_fd(wake_w)
  signal.signal(signal.SIGCHLD, lambda *_: None)
  status_fds = {}  # pid -> the pipe its wait status goes to
  client = True
  while client or status_fds:
    readable, _, _ = select.select([sock, wake_r] if client else [wake_r], [], [], 5.0)
    if wake_r in readable:
      os.read(wake_r, 4096)
    while status_fds:  # reap: SIGCHLD coalesces, so take all that have ended
      try:
        pid, status, usage = os.wait4(-1, os.WNOHANG)
      except ChildProcessError:
        break
      if pid == 0:
        break
      fd = status_fds.pop(pid, None)
      if fd is not None:
        try:
          os.write(fd, f"{status} {usage.ru_utime + usage.ru_stime}\n".encode())
        except OSError:  # the client closed its end: nobody waits for this status
          pass
        os.close(fd)
    if client and sock in readable:
      try:
        message, fds, _, _ = socket.recv_fds(sock, 1 << 20, 4)
      except OSError:
        message, fds = b"", []
      if not message:
        client = False
        continue
      request = json.loads(message)
      sys.stdout.flush()
      sys.stderr.flush()
      pid = os.fork()
      if pid == 0:
        sock.close()
        os.close(wake_r)
        os.close(wake_w)
        for fd in status_fds.values():
          os.close(fd)
        os.close(fds[3])
        _become(request, fds[:3])
        return request
      for fd in fds[:3]:
        os.close(fd)
      status_fds[pid] = fds[3]
      own = os.times()
      sock.send(f"{pid} {own.user + own.system}".encode())
  return None


def main() -> int:
  sock = socket.socket(fileno=int(sys.argv[1]))
  for module in PRELOAD:
    __import__(module)
  # What the imports made stays out of the collector: its passes would otherwise write to
  # every object's header, and each child would copy those pages (Python's gc.freeze docs).
  gc.freeze()
  sock.send(b"ready")
  request = serve(sock)
  if request is None:
    return 0
  _run(request)
  return 0


if __name__ == "__main__":
  sys.exit(main())
