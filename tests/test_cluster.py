"""The local weight-server cluster: start/stop with no process left, restarts, and faults."""

import json
import os
import socket
import time

import pytest

from cerebras_tf.errors import ConfigError
from cerebras_tf.runtime import cluster as cluster_lib


def _alive(pid):
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  with open(f"/proc/{pid}/stat") as fh:
    return fh.read().split()[2] != "Z"


def test_starts_serves_on_loopback_and_stops_without_orphans(tmp_path):
  with cluster_lib.LocalCluster(num_ps=2, log_dir=str(tmp_path)) as c:
    pids = [p.pid for p in c.procs]
    assert all(_alive(p) for p in pids)
    for address in c.cluster["ps"]:
      assert address.startswith("127.0.0.1:")
      with socket.create_connection(tuple(address.rsplit(":", 1)[0:1]) + (int(address.rsplit(":", 1)[1]),), 2):
        pass
  time.sleep(0.2)
  assert not any(_alive(p) for p in pids)
  assert sorted(os.listdir(tmp_path)) == ["ps_0.log", "ps_1.log"]


def test_dead_weight_server_is_restarted_on_its_port(tmp_path):
  with cluster_lib.LocalCluster(num_ps=1, log_dir=str(tmp_path)) as c:
    first = c.procs[0].pid
    os.kill(first, 9)
    deadline = time.monotonic() + 60
    while (c.procs[0].pid == first or not cluster_lib._port_open(c.cluster["ps"][0])) \
        and time.monotonic() < deadline:
      time.sleep(0.1)
    assert c.restarts == 1 and c.procs[0].pid != first and _alive(c.procs[0].pid)
    assert cluster_lib._port_open(c.cluster["ps"][0])
  assert not _alive(c.procs[0].pid)


def test_weight_servers_run_in_the_clients_directory_and_follow_it(tmp_path, monkeypatch):
  """They run the restore ops of the client's graph, so a relative checkpoint path must mean
  the same to both; a process that changes directory between training calls (a notebook, a
  test suite) gets them restarted there, not counted as a crash."""
  first, second = tmp_path / "first", tmp_path / "second"
  first.mkdir()
  second.mkdir()
  monkeypatch.chdir(first)
  with cluster_lib.LocalCluster(num_ps=2, log_dir=str(tmp_path / "logs")) as c:
    assert {os.readlink(f"/proc/{p.pid}/cwd") for p in c.procs} == {str(first)}
    c.follow_cwd()  # the same directory: nothing restarts
    pids = [p.pid for p in c.procs]
    assert [p.pid for p in c.procs] == pids
    monkeypatch.chdir(second)
    c.follow_cwd()
    assert {os.readlink(f"/proc/{p.pid}/cwd") for p in c.procs} == {str(second)}
    assert not set(pids) & {p.pid for p in c.procs} and c.restarts == 0
    assert all(cluster_lib._port_open(a) for a in c.cluster["ps"])


def test_port_already_in_use_retries_with_fresh_ports(tmp_path, monkeypatch):
  squatter = socket.socket()
  squatter.bind(("127.0.0.1", 0))
  squatter.listen(1)
  taken = squatter.getsockname()[1]
  ports = iter([taken])
  real = cluster_lib.free_port
  monkeypatch.setattr(cluster_lib, "free_port", lambda: next(ports, None) or real())
  try:
    with cluster_lib.LocalCluster(num_ps=1, log_dir=str(tmp_path)) as c:
      assert c.cluster["ps"][0] != f"127.0.0.1:{taken}"
      assert cluster_lib._port_open(c.cluster["ps"][0])
  finally:
    squatter.close()


def test_task_that_never_comes_up_times_out_naming_it(tmp_path, monkeypatch):
  dead = cluster_lib.free_port()  # nothing listens there
  monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"ps": [f"127.0.0.1:{dead}"],
                                                          "chief": ["127.0.0.1:1"]},
                                              "task": {"type": "chief", "index": 0}}))
  t = time.monotonic()
  with pytest.raises(ConfigError, match=rf"weight server ps:0 \(127.0.0.1:{dead}\) did not come "
                                        r"up within 1s"):
    cluster_lib.LocalCluster(1, str(tmp_path), ready_timeout_s=1,
                             ps_addresses=cluster_lib.ps_addresses_from_tf_config()).__enter__()
  assert time.monotonic() - t < 10


@pytest.mark.parametrize("raw,fragment", [
    ("{not json", "TF_CONFIG is not valid JSON"),
    (json.dumps({"cluster": {"worker": ["a:1"]}}), "has a cluster but no task"),
    (json.dumps({"cluster": {"chief": ["a:1"]}, "task": {"type": "chief"}}),
     "must name the weight servers in cluster.ps"),
    (json.dumps({"cluster": {"ps": []}}), "non-empty list of 'host:port'"),
    (json.dumps({"cluster": {"ps": ["nohostport"]}}), "non-empty list of 'host:port'")])
def test_malformed_tf_config_is_one_clear_line(monkeypatch, raw, fragment):
  monkeypatch.setenv("TF_CONFIG", raw)
  with pytest.raises(ConfigError, match=fragment) as err:
    cluster_lib.ps_addresses_from_tf_config()
  assert "\n" not in str(err.value)


def test_stall_limit_is_the_floor_or_twenty_times_the_longest_step(tmp_path, monkeypatch):
  """A 2 s step makes 40 s the stall limit (20 x 2 s) above a 3 s floor; without steps the
  floor holds. The cluster is not launched: the bookkeeping is plain Python."""
  monkeypatch.setenv("CEREBRAS_TF_STALL_TIMEOUT_S", "3")
  c = cluster_lib.LocalCluster(num_ps=1, log_dir=str(tmp_path))
  assert c.stall_limit_s() == 3.0
  c.step_started()
  c._step_started -= 2.0  # pylint: disable=protected-access
  c.step_finished()
  assert c.stall_limit_s() == pytest.approx(40.0, abs=0.1)
  monkeypatch.delenv("CEREBRAS_TF_STALL_TIMEOUT_S")
  assert c.stall_limit_s() == cluster_lib.STALL_TIMEOUT_S == 600.0


def test_cpu_seconds_counts_what_a_process_burns():
  """The stall watch calls a step stalled only when the processes are idle too (in the hang
  both sat at 0% CPU; a long save or an evaluation inside the step keeps them busy)."""
  before = cluster_lib._cpu_seconds([os.getpid()])  # pylint: disable=protected-access
  end = time.process_time() + 0.3
  while time.process_time() < end:
    pass
  after = cluster_lib._cpu_seconds([os.getpid()])  # pylint: disable=protected-access
  assert 0.2 <= after - before <= 2.0
  assert cluster_lib._cpu_seconds([2 ** 22 + 12345]) is None  # pylint: disable=protected-access


def test_a_long_busy_step_is_not_a_stall_an_idle_one_is(tmp_path, monkeypatch, capsys):
  """Past the time limit, a step whose processes still use CPU (a checkpoint save, an
  evaluation run from a saving listener) is left alone; an idle one is acted on."""
  monkeypatch.setenv("CEREBRAS_TF_STALL_TIMEOUT_S", "1")
  monkeypatch.setattr(cluster_lib, "IDLE_WINDOW_S", 2.0)
  used = {"cpu": 0.0, "busy": True}

  def cpu_seconds(pids):
    del pids
    used["cpu"] += 1.0 if used["busy"] else 0.0
    return used["cpu"]
  monkeypatch.setattr(cluster_lib, "_cpu_seconds", cpu_seconds)
  c = cluster_lib.LocalCluster(num_ps=1, log_dir=str(tmp_path))  # not launched: no process
  with c.training(str(tmp_path)):
    c.step_started()
    time.sleep(4.5)
    assert c.stalls == 0  # 4.5 s over a 1 s limit, but busy
    used["busy"] = False
    deadline = time.monotonic() + 10
    while c.stalls == 0 and time.monotonic() < deadline:
      time.sleep(0.2)
  assert c.stalls == 1
  assert "no training step finished in" in capsys.readouterr().err


def test_a_weight_server_runs_core_and_text_ops_placed_on_it(tmp_path):
  """The server loads TensorFlow's runtime and tf-text's op libraries, not their Python
  (runtime/server.py): a graph run on it directly, a matmul and a tf-text tokenizer on
  its device, must find both kernels ("Op type not registered" without the second)."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  import tensorflow_text as tf_text  # pylint: disable=import-outside-toplevel
  with cluster_lib.LocalCluster(num_ps=1, log_dir=str(tmp_path)) as c:
    graph = tf.Graph()
    with graph.as_default(), tf.device("/job:ps/task:0/device:CPU:0"):
      product = tf.matmul(tf.constant([[1.0, 2.0]]), tf.constant([[3.0], [4.0]]))
      words = tf_text.WhitespaceTokenizer().tokenize(tf.constant(["a weight server"]))
    # The cluster names a client task that is not running here: look only at the ps job.
    config = tf.compat.v1.ConfigProto(device_filters=["/job:ps/task:0"])
    with tf.compat.v1.Session("grpc://" + c.cluster["ps"][0], graph=graph, config=config) as sess:
      got_product, got_words = sess.run([product, words.flat_values])
  assert got_product.tolist() == [[11.0]]
  assert got_words.tolist() == [b"a", b"weight", b"server"]
