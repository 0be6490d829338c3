"""multi_replica: a user's own summaries and tensors read by name hold one host replica's
value (tf.estimator writes replica 0's; only the loss is reduced over the replicas). The
training call says so once, naming them; a value the batch does not feed (a learning rate) is
the same in every replica and is not named; pipelined says nothing.
"""

import os
import sys
import textwrap
import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = textwrap.dedent("""\
    import logging, sys, numpy as np, tensorflow as tf
    from cerebras_tf import CerebrasEstimator, CSConfig, CSRunConfig
    said = []
    logging.getLogger("tensorflow").addHandler(type("H", (logging.Handler,), {
        "emit": lambda self, r: said.append(r.getMessage())})())
    def input_fn(params):
      rng = np.random.RandomState(0)
      x = rng.randn(80, 4).astype(np.float32); y = (x[:, 0] > 0).astype(np.int32)
      return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(params["batch_size"])
    def model_fn(features, labels, mode, params):
      logits = tf.compat.v1.layers.dense(features, 2)
      loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
      mine = tf.identity(loss, name="my_loss")
      tf.compat.v1.summary.scalar("my_loss", mine)
      rate = tf.constant(0.1, name="rate")
      tf.compat.v1.summary.scalar("rate", rate)
      step = tf.compat.v1.train.GradientDescentOptimizer(rate).minimize(
          loss, tf.compat.v1.train.get_global_step())
      return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=step)
    for strategy in ("multi_replica", "pipelined"):
      said.clear()
      est = CerebrasEstimator(model_fn, params={"batch_size": 20}, config=CSRunConfig(
          model_dir=f"{sys.argv[1]}/{strategy}", save_summary_steps=1, cs_config=CSConfig(
              execution_strategy=strategy,
              num_replicas=2 if strategy == "multi_replica" else None)))
      hook = tf.compat.v1.train.LoggingTensorHook({"mine": "my_loss:0"}, every_n_iter=1)
      est.train(input_fn, max_steps=2, use_cs=True, hooks=[hook])
      print(strategy, "SAID", [m for m in said if "hold replica 0's value" in m])
    """)


def test_replica_valued_summaries_and_named_tensors_are_said_once(tmp_path):
  script = tmp_path / "replica_values.py"
  script.write_text(SCRIPT)
  proc = warm_python.run([sys.executable, str(script), str(tmp_path)], cwd=ROOT, timeout=600,
                         capture_output=True, text=True, check=False,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
  out = proc.stdout + proc.stderr[-3000:]
  lines = {l.split(" SAID ")[0]: l.split(" SAID ", 1)[1] for l in proc.stdout.splitlines()
           if " SAID " in l}
  assert set(lines) == {"multi_replica", "pipelined"}, out
  said = lines["multi_replica"]
  assert said.count("hold replica 0's value") == 1, said
  assert "each of the 2 host replicas trains on 1/2 of the batch" in said
  # The tag as TensorBoard shows it ("my_loss_1": TF made the name unique beside the tensor).
  assert "summary 'my_loss_1'" in said and "LoggingTensorHook tensor 'my_loss:0'" in said, said
  assert "'rate'" not in said, said  # the same in every replica
  assert lines["pipelined"] == "[]", out
