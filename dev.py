#!/usr/bin/env python3
"""Set up (or refresh) the project's virtualenv, then run the demo or the tests.

    python3 dev.py demo     # YAML-driven training on the embedded simulated CS-2 (use_cs=True)
    python3 dev.py test     # the whole test suite

Needs only python3 (3.11). The venv lives in .venv and is reinstalled when setup.py changes.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import venv

ROOT = os.path.dirname(os.path.abspath(__file__))
VENV = os.path.join(ROOT, ".venv")
PY = os.path.join(VENV, "bin", "python")
STAMP = os.path.join(VENV, ".cerebras_tf_installed")
DEFAULT_PYCACHE = os.path.join(VENV, "pycache")  # bytecode of the processes dev.py starts
EXTRAS = "test,data"

# The demo: BERT-tiny pretraining on the real corpus, compiled for the simulated CS-2.
DEMO_DATASETS = "vocab,bert_pretrain"
# Its model_dir (runs/bert_tiny_msl128, from the YAML) is what params_bert_tiny_classifier.yaml
# warm-starts from.
DEMO = ["scripts/run.py", "--params", "configs/params_bert_tiny_msl128.yaml",
        "--mode", "train_and_eval"]


def _setup_hash() -> str:
  h = hashlib.sha256()
  for name in ("setup.py", "dev.py"):
    with open(os.path.join(ROOT, name), "rb") as fh:
      h.update(fh.read())
  return h.hexdigest()


def ensure_env() -> bool:
  """Creates or refreshes .venv; True when it (re)installed."""
  want = _setup_hash()
  if os.path.exists(STAMP) and open(STAMP).read() == want:
    return False
  if sys.version_info[:2] != (3, 11):
    sys.exit(f"dev.py: Python 3.11 is required (tensorflow 2.15 wheels), this is {sys.version.split()[0]}")
  if not os.path.exists(PY):
    print("dev.py: creating .venv ...", flush=True)
    venv.EnvBuilder(with_pip=True).create(VENV)
  print("dev.py: installing cerebras_tf and its pinned dependencies into .venv ...", flush=True)
  subprocess.check_call([PY, "-m", "pip", "install", "-q", "--upgrade", "pip"])
  subprocess.check_call([PY, "-m", "pip", "install", "-q", "-e", f".[{EXTRAS}]"], cwd=ROOT)
  with open(STAMP, "w") as fh:
    fh.write(want)
  return True


def seed_bytecode(prefix: str, roots) -> int:
  """Links the bytecode pip and Python's installer compiled (`__pycache__` beside the sources
  under `roots`) into `prefix`'s mirror tree, where Python reads it once PYTHONPYCACHEPREFIX
  is set; returns how many files it linked.

  With an empty prefix the first processes of a new venv each compiled TensorFlow again:
  `import cerebras_tf, tensorflow, tensorflow_text, keras, ...` took 9.9 s of CPU instead of
  3.3 s, in each of the test workers that start together on a fresh clone (issue 42). Linking
  the 20,000 files takes 1.6 s. Python checks each file against its source's size and time
  and writes a new file, not into this one, when a source has changed.
  """
  tag = f".{sys.implementation.cache_tag}.pyc"
  linked = 0
  for root in roots:
    for dirpath, _, filenames in os.walk(root):
      if os.path.basename(dirpath) != "__pycache__":
        continue
      mirror = os.path.join(prefix, os.path.dirname(dirpath).lstrip(os.sep))
      for name in filenames:
        target = os.path.join(mirror, name)
        if not name.endswith(tag) or os.path.exists(target):
          continue
        os.makedirs(mirror, exist_ok=True)
        try:
          os.link(os.path.join(dirpath, name), target)
        except OSError:  # another filesystem: a copy does as well
          shutil.copyfile(os.path.join(dirpath, name), target)
        linked += 1
  return linked


def _venv_library_dirs() -> list:
  """The venv's site-packages and the standard library its Python imports from."""
  code = ("import json, sysconfig; p = sysconfig.get_paths(); "
          "print(json.dumps(sorted({p['purelib'], p['platlib'], p['stdlib']})))")
  return json.loads(subprocess.check_output([PY, "-c", code], text=True))


def _cores() -> int:
  """The cores this process may run on: its CPU affinity, capped by a cgroup CPU quota."""
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  try:
    quota, period = open("/sys/fs/cgroup/cpu.max").read().split()
    if quota != "max":
      cores = min(cores, max(1, int(quota) // int(period)))
  except (OSError, ValueError):
    pass  # no cgroup v2 quota to read
  return max(1, cores or 1)


def pytest_command(args, paths=("tests",)) -> list:
  """The test command: pytest on `paths` (all of tests/) with `args` after them.

  One pytest-xdist worker more than the CPU has cores: with one a core, the cores sat
  13% idle (1,641 CPU s in 944 s on 2 cores) while tests waited on the processes they
  start, on a timeout or a weight server coming up; with 3 on 2 cores the suite took
  881 s, the same tests passing (issue 42). worksteal: each takes its share of the tests
  in file order (a file's module fixtures are built once, unless its tests end up split
  at a steal), and one that finishes first takes tests from another's queue. With
  loadfile (a whole file each, biggest test count first) a few-test file of long
  processes (multiworker, execution modes) could start last and run alone for minutes.
  """
  return [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", str(_cores() + 1),
          "--dist", "worksteal", *paths, *args]


def child_env() -> dict:
  """The environment of the processes dev.py starts: TensorFlow's C++ INFO lines off, and
  compiled bytecode kept under .venv/pycache.

  Where PYTHONDONTWRITEBYTECODE is set (as on the machines this is developed on), every Python
  process compiled the project's 36,000 lines again: 0.24 s of CPU a process that imports them
  all, and the suite starts 160 processes. With a PYTHONPYCACHEPREFIX inside the venv the
  source tree still gets no __pycache__ (what that variable is usually set for), and
  test_never_lost.py + test_bad_inputs.py took 121 s of CPU instead of 128 (AVX-512 host,
  issue 42). A prefix the caller set is kept.
  """
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
  env.setdefault("PYTHONPYCACHEPREFIX", DEFAULT_PYCACHE)
  env.pop("PYTHONDONTWRITEBYTECODE", None)
  return env


def main(argv) -> int:
  if len(argv) < 2 or argv[1] not in ("demo", "test", "run"):
    print(__doc__.strip(), file=sys.stderr)
    return 2
  installed = ensure_env()
  env = child_env()
  prefix = env["PYTHONPYCACHEPREFIX"]
  # Only dev.py's own prefix: one the caller chose (a tmpfs, a shared cache) is left as it is.
  if prefix == DEFAULT_PYCACHE and (installed or not os.path.isdir(prefix)):
    seed_bytecode(prefix, _venv_library_dirs())
  if argv[1] == "test":
    rc = subprocess.call(pytest_command(argv[2:]), cwd=ROOT, env=env)
    return 1 if rc == 5 else rc  # 5: no tests collected, which is a failure here
  if argv[1] == "run":
    return subprocess.call([PY, *argv[2:]], cwd=ROOT, env=env)
  rc = subprocess.call([PY, "scripts/prepare_data.py", "--datasets", DEMO_DATASETS], cwd=ROOT, env=env)
  if rc:
    return rc
  return subprocess.call([PY, *DEMO, *argv[2:]], cwd=ROOT, env=env)


if __name__ == "__main__":
  sys.exit(main(sys.argv))
