"""The host-memory check before an engine training run (runtime/host_memory.py): what a model
needs on this machine against what the process can get.
"""

import json
import os
import subprocess
import sys

import pytest
import tensorflow as tf

from cerebras_tf import CerebrasEstimator
from cerebras_tf.errors import FitError
from cerebras_tf.core import plans
from cerebras_models.mlp.model import model_fn
from estimator_fixtures import PARAMS, ROOT, config_in, train_input_fn


def test_a_model_this_machine_cannot_hold_is_refused_before_training(tmp_path, monkeypatch):
  """A 4-G-parameter embedding fit the engine in weight streaming, then its weight server
  segfaulted allocating 65 GB of float32 weights and Adam state on a 23 GB host, four times,
  minutes later; a 2048x2048 CNN at batch 16 ended in an allocator dump and a segfault. By
  hand for this MLP: 32x64+64 + 64x64+64 + 64x4+4 = 6,532 parameters, each with its weight,
  gradient and two Adam slots in float32: 6,532 x 16 B = 104,512 B; the gradient reads the
  input (16x32), both ReLU outputs (16x64) and the loss's backprop (16x4), in float32:
  (512 + 1,024 + 1,024 + 64) x 4 B = 10,496 B; 115,008 B in all."""
  from cerebras_tf.runtime import host_memory  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(host_memory, "available_bytes", lambda: 50_000)
  est = CerebrasEstimator(model_fn, config=config_in(tmp_path), params=PARAMS)
  with pytest.raises(FitError, match=r"needs about 115.01 KB of memory \(TensorFlow runs the "
                                     r"numerics here: 104.51 KB for 6,532 float32 parameters "
                                     r"with their gradients and adam state; 10.50 KB at least "
                                     r"for the activations the gradient reads, 16 samples a "
                                     r"step\), and 50.00 KB is available; .* to train here, "
                                     r"make the model smaller$"):
    est.train(train_input_fn, max_steps=1, use_cs=True)
  monkeypatch.setattr(host_memory, "available_bytes", lambda: 110_000)  # the state alone fits
  with pytest.raises(FitError, match=r"needs about 115.01 KB .* to train here, lower "
                                     r"train_input.batch_size \(params\['batch_size'\]\), or "
                                     r"the input size$"):
    est.train(train_input_fn, max_steps=1, use_cs=True)
  assert tf.train.latest_checkpoint(est.model_dir) is None


def test_the_host_memory_check_leaves_remote_weight_servers_alone(monkeypatch):
  """With a TF_CONFIG cluster's own weight servers (ps tasks on other hosts) the weights and
  optimizer state live there: a 1 TB model is not refused for this host's memory. Without
  them (the local weight servers run here) it is."""
  from types import SimpleNamespace  # pylint: disable=import-outside-toplevel
  from cerebras_tf.runtime import host_memory  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(host_memory, "available_bytes", lambda: 10**9)
  result = SimpleNamespace(
      graph=SimpleNamespace(state_bytes=10**12, num_params=6 * 10**10, optimizer="adam",
                            host_activation_bytes=1000.0),
      plan=SimpleNamespace(execution_strategy="weight_streaming",
                           mode=plans.mode_of(plans.WEIGHT_STREAMING),
                           batching=SimpleNamespace(host_replicas_per_worker=1, per_worker=8)))
  monkeypatch.setenv("TF_CONFIG", json.dumps({
      "cluster": {"chief": ["h0:1"], "ps": ["h1:1", "h2:1"]},
      "task": {"type": "chief", "index": 0}}))
  host_memory.check_holds(result.graph, result.plan)
  monkeypatch.delenv("TF_CONFIG")
  with pytest.raises(FitError, match=r"needs about 1000.00 GB of memory"):
    host_memory.check_holds(result.graph, result.plan)


def test_available_memory_reads_meminfo_and_a_cgroup_limit(tmp_path):
  from cerebras_tf.runtime import host_memory  # pylint: disable=import-outside-toplevel
  meminfo = tmp_path / "meminfo"
  meminfo.write_text("MemTotal:       24000000 kB\nMemAvailable:    2000000 kB\n")
  cgroup = tmp_path / "cg"
  cgroup.mkdir()
  assert host_memory.available_bytes(str(meminfo), str(cgroup)) == 2_048_000_000
  (cgroup / "memory.max").write_text("1000000000\n")
  (cgroup / "memory.current").write_text("400000000\n")
  assert host_memory.available_bytes(str(meminfo), str(cgroup)) == 600_000_000
  (cgroup / "memory.max").write_text("max\n")  # no limit
  assert host_memory.available_bytes(str(meminfo), str(cgroup)) == 2_048_000_000
  assert host_memory.available_bytes(str(tmp_path / "none"), str(cgroup)) is None


def test_available_memory_reads_the_cgroup_and_rlimits_the_process_runs_under(tmp_path):
  """Issue 40: under `ulimit -v` 4.1 GiB a 4.3 GB model passed the check (it read the
  machine's memory) and died in a 167-line ResourceExhaustedError. A v1 memory cgroup nested
  two levels deep (the parent's limit binds), and RLIMIT_AS less the VmSize already mapped."""
  import resource  # pylint: disable=import-outside-toplevel
  from cerebras_tf.runtime import host_memory  # pylint: disable=import-outside-toplevel
  meminfo = tmp_path / "meminfo"
  meminfo.write_text("MemAvailable:   20000000 kB\n")  # 20.48 GB
  proc_cgroup = tmp_path / "cgroup"
  proc_cgroup.write_text("4:memory:/job/step\n0::/\n")
  v1 = tmp_path / "fs" / "memory"
  (v1 / "job" / "step").mkdir(parents=True)
  (v1 / "job" / "step" / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # none
  (v1 / "job" / "step" / "memory.usage_in_bytes").write_text("100\n")
  (v1 / "job" / "memory.limit_in_bytes").write_text("5000000000\n")
  (v1 / "job" / "memory.usage_in_bytes").write_text("1000000000\n")
  status = tmp_path / "status"
  status.write_text("VmSize:\t 1000000 kB\nVmData:\t  500000 kB\n")

  def unlimited(which):
    del which
    return resource.RLIM_INFINITY, resource.RLIM_INFINITY

  def ulimit_v(which):  # ulimit -v 4300000 (KiB)
    return ((4_300_000 * 1024, 4_300_000 * 1024) if which == resource.RLIMIT_AS
            else unlimited(which))
  read = lambda rlimits: host_memory.available_bytes(
      str(meminfo), str(tmp_path / "fs"), str(proc_cgroup), str(status), rlimits)
  assert read(unlimited) == 4_000_000_000              # the parent cgroup: 5 GB - 1 GB used
  assert read(ulimit_v) == (4_300_000 - 1_000_000) * 1024  # 3.38 GB: the limit less VmSize


def test_a_real_ulimit_v_is_read(tmp_path):
  """The same in a process really started under `ulimit -v` 4 GiB (a subshell)."""
  code = ("from cerebras_tf.runtime import host_memory; "
          "print(host_memory.available_bytes())")
  out = subprocess.run(["bash", "-c", f"ulimit -v {4 * 1024 * 1024}; exec {sys.executable} "
                        f"-c '{code}'"], capture_output=True, text=True, check=True,
                       env=dict(os.environ, PYTHONPATH=ROOT), cwd=str(tmp_path)).stdout
  assert 0 < int(out) < 4 * 1024 ** 3
