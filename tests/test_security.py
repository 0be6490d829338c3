"""Security properties: safe YAML only, no pickle, no shell strings, loopback servers.

- The source tree is scanned (by AST, so strings and comments do not count) for unsafe YAML
  loading, pickle-family imports, `shell=True`, `os.system`/`os.popen` and eval/exec; any use
  must be listed in ALLOWED with a reason: today only the test harness's `python -c`.
- Paths in a params file resolve relative to the YAML file, not the working directory.
- The weight servers (TF `ps` tasks) are advertised on 127.0.0.1. TensorFlow 2.15's gRPC
  server listens on all interfaces whatever the address: GrpcServer::Init hard-codes
  `"0.0.0.0:" + port` (tensorflow/core/distributed_runtime/rpc/grpc_server_lib.cc) and neither
  ServerDef nor ConfigProto has a bind-address field. `test_ps_listens_on_loopback_only`
  records that as a strict xfail: it starts failing (XPASS) the day TensorFlow binds the
  advertised host, so the note in docs/security.md can be dropped.
"""

import ast
import os
import tempfile

import pytest

from cerebras_tf import params as params_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCANNED = ("cerebras_tf", "models", "scripts", "benchmarks", "tests", "dev.py", "setup.py")

# (path relative to ROOT, finding) -> why it is acceptable.
ALLOWED = {
    ("tests/warm_python_server.py", "exec()"):
        "runs a test's own `python -c CODE` in the forked child, as the interpreter's -c does",
}

_BAD_MODULES = {"pickle", "cPickle", "_pickle", "dill", "shelve", "marshal", "cloudpickle"}
_BAD_CALLS = {("yaml", "load"), ("yaml", "unsafe_load"), ("yaml", "full_load"),
              ("yaml", "load_all"), ("yaml", "unsafe_load_all"), ("yaml", "full_load_all"),
              ("os", "system"), ("os", "popen"), ("subprocess", "getoutput"),
              ("subprocess", "getstatusoutput")}
_BAD_NAMES = {"UnsafeLoader", "FullLoader", "Loader"}  # as yaml.<name>


def _python_files():
  for entry in SCANNED:
    path = os.path.join(ROOT, entry)
    if os.path.isfile(path):
      yield path
      continue
    for dirpath, dirnames, filenames in os.walk(path):
      dirnames[:] = [d for d in dirnames if not d.startswith(".") and d != "__pycache__"]
      for name in filenames:
        if name.endswith(".py"):
          yield os.path.join(dirpath, name)


def findings(source: str):
  """(line, finding) for each unsafe construct in Python `source`."""
  out = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      out += [(node.lineno, f"import {a.name}") for a in node.names
              if a.name.split(".")[0] in _BAD_MODULES]
    elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in _BAD_MODULES:
      out.append((node.lineno, f"from {node.module} import"))
    elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
      pair = (node.value.id, node.attr)
      if pair in _BAD_CALLS or (node.value.id == "yaml" and node.attr in _BAD_NAMES):
        out.append((node.lineno, f"{pair[0]}.{pair[1]}"))
    elif isinstance(node, ast.Call):
      for kw in node.keywords:
        if kw.arg == "shell" and not (isinstance(kw.value, ast.Constant) and not kw.value.value):
          out.append((node.lineno, "shell=True"))
      if isinstance(node.func, ast.Name) and node.func.id in ("eval", "exec"):
        out.append((node.lineno, f"{node.func.id}()"))
  return out


def test_scanner_catches_each_pattern():
  bad = ("import pickle\nfrom shelve import open\nimport yaml\nyaml.load(s)\n"
         "yaml.unsafe_load(s)\nyaml.load(s, Loader=yaml.Loader)\nimport os\nos.system('x')\n"
         "import subprocess\nsubprocess.run('x', shell=True)\neval('1')\n")
  found = [f for _, f in findings(bad)]
  for expected in ("import pickle", "from shelve import", "yaml.load", "yaml.unsafe_load",
                   "yaml.Loader", "os.system", "shell=True", "eval()"):
    assert expected in found, (expected, found)
  ok = ("import yaml\nyaml.safe_load(s)\nyaml.compose(s, Loader=yaml.SafeLoader)\n"
        "subprocess.run(['ls'], shell=False)\ntext = 'yaml.load( pickle os.system'\n")
  assert findings(ok) == []


def test_source_tree_has_no_unsafe_loading_or_shell_strings():
  problems = []
  for path in _python_files():
    rel = os.path.relpath(path, ROOT)
    with open(path, encoding="utf-8") as f:
      source = f.read()
    for line, finding in findings(source):
      if (rel, finding) not in ALLOWED:
        problems.append(f"{rel}:{line}: {finding}")
  assert not problems, "unsafe constructs (add to ALLOWED with a reason if intended):\n" + \
      "\n".join(problems)


def test_yaml_paths_resolve_relative_to_the_yaml_file(tmp_path, monkeypatch):
  conf = tmp_path / "conf"
  conf.mkdir()
  (conf / "p.yaml").write_text("train_input:\n  batch_size: 8\n  data_dir: ../data\n"
                               "model:\n  name: mlp\nrunconfig:\n  model_dir: out\n")
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  monkeypatch.chdir(elsewhere)
  p = params_lib.load_params(str(conf / "p.yaml"))
  assert p["train_input"]["data_dir"] == str(tmp_path / "data")
  assert p["runconfig"]["model_dir"] == str(conf / "out")


def _listeners(port: int):
  """Local addresses (hex, as in /proc/net/tcp*) of the sockets listening on `port`."""
  hosts = []
  for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    if not os.path.exists(table):
      continue
    with open(table) as f:
      for line in f.read().splitlines()[1:]:
        fields = line.split()
        host, hex_port = fields[1].split(":")
        if fields[3] == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
          hosts.append(host)
  return hosts


_WILDCARD = {"00000000", "0" * 32}  # 0.0.0.0 and ::


@pytest.fixture(scope="module")
def ps_listeners():
  from cerebras_tf.runtime import cluster as cluster_lib  # pylint: disable=import-outside-toplevel
  with tempfile.TemporaryDirectory() as log_dir:
    with cluster_lib.LocalCluster(num_ps=1, log_dir=log_dir) as c:
      addresses = list(c.cluster["ps"]) + list(c.cluster[cluster_lib.CLIENT_JOB])
      port = int(c.cluster["ps"][0].rsplit(":", 1)[1])
      yield addresses, _listeners(port)


@pytest.mark.slow
def test_cluster_addresses_are_loopback(ps_listeners):
  addresses, hosts = ps_listeners
  assert all(a.startswith("127.0.0.1:") for a in addresses), addresses
  assert hosts, "the ps task is not listening"


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="TF 2.15 GrpcServer binds 0.0.0.0:<port> (dual-stack ::) "
                   "whatever the cluster address; no ServerDef/ConfigProto field changes it")
def test_ps_listens_on_loopback_only(ps_listeners):
  _, hosts = ps_listeners
  assert not set(hosts) & _WILDCARD, hosts
