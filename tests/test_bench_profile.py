"""benchmarks/bench_bert_vs_google.py's step profile: the wall of a step split among its ops."""

import os
import sys

import tensorflow as tf

# The benchmark quiets TensorFlow's logger at import and imports benchmarks/common.py; the
# other tests in this process read the logger and their own sys.path.
_BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           "benchmarks")
_LEVEL = tf.get_logger().level
sys.path.insert(0, _BENCHMARKS)
import bench_bert_vs_google as bench  # noqa: E402  pylint: disable=wrong-import-position
sys.path.remove(_BENCHMARKS)
tf.get_logger().setLevel(_LEVEL)


def test_each_instant_is_split_among_the_ops_running_then():
  """By hand: A runs 0-10 and 20-30 us, B 5-15. In 5-10 both run (2.5 each), so A has
  5 + 2.5 + 10 = 17.5 and B 2.5 + 5 = 7.5: 25 busy of the step's 30 (15-20 idle), where the
  ops' own durations sum to 30 (A 20, B 10)."""
  profile = bench.OpProfile([])
  profile.steps = 1
  spans = [(0, 10, ("A", True)), (5, 15, ("B", False)), (20, 30, ("A", True))]
  profile._share_wall(spans)  # pylint: disable=protected-access
  assert profile.wall_by_type == {("A", True): 17.5, ("B", False): 7.5}
  assert profile.wall_us == 30
  profile.by_type = {("A", True): 20, ("B", False): 10}
  (a, rest, step) = bench.op_rows(profile, top=1)
  assert a == ("A", "0.0", "70.0%", "0.0", "100%")
  assert rest[2] == "30.0%"
  assert step[2] == "83.3% busy" and step[4] == "70%"


def test_the_serialized_table_ranks_nodes_by_their_own_time():
  """By hand, 2 traced steps: matmul 300 us, softmax 100, two 50-us adds: 500 in all, so 0.25
  ms a step in all, the matmul 0.15 ms a step and 60%; with top=2 the adds are the rest."""
  nodes = {"head/MatMul": ["_MklMatMul", 300], "head/Softmax": ["_MklSoftmax", 100],
           "a/add": ["AddV2", 50], "b/add": ["AddV2", 50]}
  rows = bench.node_rows(nodes, steps=2, top=2)
  assert rows[0] == ("head/MatMul", "_MklMatMul", "0.15", "60.0%")
  assert rows[1] == ("head/Softmax", "_MklSoftmax", "0.05", "20.0%")
  assert rows[2] == ("(the other 2 ops)", "", "0.05", "20.0%")
  assert rows[3] == ("the step, one op at a time", "", "0.25", "100%")
  by_type = bench.node_rows(bench.by_op_type(nodes), steps=2, top=1, unit="op types")
  assert by_type[0] == ("_MklMatMul", "1 ops", "0.15", "60.0%")
  assert by_type[1] == ("(the other 2 op types)", "", "0.10", "40.0%")  # AddV2 x 2, softmax


def test_the_products_ceiling_is_the_executed_flops_over_the_products_own_time():
  """By hand, 2 traced steps: a MatMul 6,000 us, a fused MatMul 2,000 and an Einsum 2,000
  (products: 10,000 us over 2 steps = 5 ms a step), a Mul 10,000 (10 ms a step in all besides).
  1 GFLOP a step over 5 ms = 200 GFLOP/s, 50% of a 400 GFLOP/s limit; at 60% of it (240
  GFLOP/s) a step would take 1e9 / 240e9 s = 4.17 ms."""
  nodes = {"m": ["_MklMatMul", 6000], "f": ["_MklNativeFusedMatMul", 2000],
           "e": ["_MklEinsum", 2000], "x": ["Mul", 10000]}
  rows = bench.ceiling_rows(nodes, steps=2, executed_per_step=1e9, limit=400e9)
  assert rows[0][1] == "10.0"
  assert rows[1][1] == "5.0 (50%)"
  assert rows[3][1] == "200.0"
  assert rows[4][1] == "**50.0%**"
  assert rows[5][1] == "4.2"
