"""Whether this process's TensorFlow runs oneDNN CPU kernels.

TensorFlow decides once, at its import: TF_ENABLE_ONEDNN_OPTS if set, else on only for CPUs
with AVX-512 VNNI or bf16, AVX-VNNI or AMX. `IsMklEnabled()` reads the variable again at every
call, so after `import cerebras_tf` sets it for a TensorFlow imported earlier the call said "on"
where the kernels were TensorFlow's own (AVX2), and the guard for that said "off" where they
were oneDNN's (an AVX-512 host: the slower loss forms, and a false hint). One traced MatMul of
a tiny graph tells which kernels really run, once a process.
"""

import functools

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1


@functools.lru_cache(maxsize=None)
def active() -> bool:
  """True when TensorFlow's CPU kernels in this process are oneDNN's (_Mkl* ops)."""
  graph = tf.Graph()
  with graph.as_default():
    x = tf1.placeholder(tf.float32, [2, 2])
    y = tf.matmul(x, x)
  meta = tf1.RunMetadata()
  with tf1.Session(graph=graph) as sess:
    sess.run(y, {x: np.ones((2, 2), np.float32)},
             options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE), run_metadata=meta)
  return any(node.timeline_label.split(" = ")[-1].startswith("_Mkl")
             for dev in meta.step_stats.dev_stats for node in dev.node_stats)
