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
