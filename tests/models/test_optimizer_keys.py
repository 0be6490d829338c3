"""The keys a params file validates are applied, or refused: never ignored.

The MLP's model_fn hard-coded Adam at the first rate of a schedule, so `optimizer_type: sgd`,
`max_gradient_norm` or a schedule were validated and then silently not used. It now builds its
train op with the shared `cerebras_models.optimization`, as BERT, GPT and the Transformer
do; the Keras CNN refuses the keys its Keras optimizer cannot apply (docs/bad_inputs.md row
optimizer_key_not_applied).
"""

import os
import re

import numpy as np
import pytest
import tensorflow as tf

from cerebras_tf import cli
from cerebras_tf.errors import ParamsError
from cerebras_tf.params import load_params

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MLP = os.path.join(ROOT, "configs", "params_mlp.yaml")


def _train_one_step(model_dir, *overrides):
  flags = [f for o in overrides for f in ("--params_override", o)]
  assert cli.main(["run.py", "--params", MLP, "--model_dir", str(model_dir), "--max_steps", "1",
                   "--params_override", "runconfig.save_checkpoints_steps=1", *flags]) == 0
  return (tf.train.load_checkpoint(os.path.join(model_dir, "model.ckpt-0")),
          tf.train.load_checkpoint(os.path.join(model_dir, "model.ckpt-1")))


def _slots(reader):
  return sorted({n.rsplit("/", 1)[1] for n in reader.get_variable_to_shape_map()
                 if n.startswith("dense_0/kernel/")})


@pytest.mark.parametrize("kind, slots", [("sgd", []), ("momentum", ["Momentum"]),
                                         ("adam", ["Adam", "Adam_1"])])
def test_the_mlp_uses_the_optimizer_it_is_given(tmp_path, kind, slots):
  _, after = _train_one_step(tmp_path / kind, f"optimizer.optimizer_type={kind}")
  assert _slots(after) == slots


def test_the_mlp_clips_to_max_gradient_norm(tmp_path):
  """SGD at rate 1 with the global gradient norm clipped to 1e-3: the step moves the weights
  by exactly lr x 1e-3 in global norm (the raw gradient's norm is far above 1e-3)."""
  before, after = _train_one_step(
      tmp_path, "optimizer.optimizer_type=sgd", "optimizer.learning_rate=1.0",
      "optimizer.max_gradient_norm=0.001")
  names = [n for n in before.get_variable_to_shape_map() if n != "global_step"]
  moved = np.sqrt(sum(np.sum((after.get_tensor(n) - before.get_tensor(n)) ** 2) for n in names))
  assert moved == pytest.approx(1e-3, rel=1e-3)


def test_the_keras_cnn_refuses_what_its_optimizer_cannot_apply(tmp_path):
  cnn = os.path.join(ROOT, "configs", "params_cnn_digits.yaml")
  assert load_params(cnn)["optimizer"]["optimizer_type"] == "adam"
  for override, key in [("optimizer.optimizer_type=adamw", "optimizer_type"),
                        ("optimizer.warmup_steps=10", "warmup_steps"),
                        ("optimizer.grad_accum_steps=2", "grad_accum_steps")]:
    with pytest.raises(ParamsError, match=rf"optimizer.{key}"):
      load_params(cnn, overrides=[override])


@pytest.mark.parametrize("config, override, built", [
    ("params_gpt_tiny.yaml", "model.use_segment_embedding=true", "false"),
    ("params_gpt_tiny.yaml", "model.attention_type=dot_product", "scaled_dot_product"),
    ("params_transformer_tiny.yaml", "model.use_position_embedding=false", "true"),
    ("params_bert_tiny_msl128.yaml", "model.position_embedding_type=fixed", "learned"),
])
def test_a_key_the_model_does_not_apply_is_refused_when_set(config, override, built):
  """(mixed_precision is applied by every family now: tests/models/test_bf16.py; tf_summary and
  boundary_casting, which steer only the CS compiler, are kept without effect and named in the
  log: tests/test_modelzoo_tf_files.py); the shared transformer switches by the families that build them
  (GPT read neither use_ffn_bias nor its activation; BERT failed tracing on them): the value
  a family builds is accepted, any other refused, never silently ignored."""
  key = override.split("=")[0]
  path = os.path.join(ROOT, "configs", config)
  with pytest.raises(ParamsError, match=rf"{key}: the \w+ model does not apply it; remove it "
                                        rf"\(or set it to {re.escape(built)}\)"):
    load_params(path, overrides=[override])
  load_params(path, overrides=[f"{key}={built}"])


@pytest.mark.parametrize("config", ["params_transformer_tiny.yaml", "params_mlp.yaml",
                                    "params_cnn_digits.yaml", "params_vit_digits.yaml"])
def test_every_family_accepts_mixed_precision(config):
  """The Transformer did once, then was refused as unapplied (issue 40): it now computes in
  bfloat16 with it (tests/models/transformer: test_mixed_precision_is_accepted...); the MLP,
  the CNN and the ViT refused it until issue 42 (Keras's mixed_bfloat16 policy: test_bf16.py)."""
  path = os.path.join(ROOT, "configs", config)
  assert load_params(path, overrides=["model.mixed_precision=true"])["model"]["mixed_precision"]


def test_log_summaries_writes_the_optimizer_scalars(tmp_path):
  """optimizer.log_summaries was validated and applied by no model."""
  _train_one_step(tmp_path, "optimizer.log_summaries=true",
                  "runconfig.save_summary_steps=1")
  tags = set()
  for path in tf.io.gfile.glob(os.path.join(str(tmp_path), "events.out.tfevents.*")):
    for event in tf.compat.v1.train.summary_iterator(path):
      tags.update(v.tag for v in event.summary.value)
  assert {"optimizer/learning_rate", "optimizer/gradient_norm"} <= tags, tags


@pytest.mark.parametrize("fused", [True, False])
def test_correct_bias_is_adams_bias_correction(fused):
  """modelzoo's PyTorch AdamW configs say `correct_bias: true`; google-bert's AdamW, the
  default, has none. Two updates of w = 0 with gradient 2 (lr 0.01, betas 0.9 / 0.999, no
  decay): corrected, each moves w by lr * sqrt(1 - b2^t) / (1 - b1^t) * m_t / (sqrt(v_t) +
  eps) = 0.01 (m_t / sqrt(v_t) = (1 - b1^t) / sqrt(1 - b2^t) for a constant gradient);
  uncorrected the first moves it by 0.01 * 0.1 * 2 / sqrt(0.001 * 4) = 0.0316."""
  from cerebras_models import optimization  # pylint: disable=import-outside-toplevel
  def after_two(correct):
    with tf.Graph().as_default():
      w = tf.compat.v1.get_variable("w", [], initializer=tf.zeros_initializer(),
                                    use_resource=fused)
      step = tf.compat.v1.train.get_or_create_global_step()
      opt = optimization.make_optimizer({"optimizer_type": "adamw", "weight_decay_rate": 0.0,
                                         "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-12,
                                         "correct_bias": correct}, 0.01, step)
      train = opt.apply_gradients([(tf.constant(2.0), w)], global_step=step)
      with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        values = []
        for _ in range(2):
          sess.run(train)
          values.append(float(sess.run(w)))
        return values
  np.testing.assert_allclose(after_two(True), [-0.01, -0.02], rtol=1e-5)
  first = -0.01 * 0.1 * 2 / np.sqrt(0.001 * 4)
  assert after_two(False)[0] == pytest.approx(first, rel=1e-5)


def test_static_loss_scale_with_an_embedding_gradient():
  """A modelzoo config's `loss_scaling_factor: 64` with an embedding (tf.gather: an
  IndexedSlices gradient) failed with "unsupported operand type(s) for /: 'IndexedSlices' and
  'float'". SGD at rate 1: the scaled-then-unscaled step equals the plain one; the gradient of
  sum(table[ids]) is 1 for each gathered row (twice for row 2), so rows 0, 2 move by -1, -2."""
  from cerebras_models import optimization  # pylint: disable=import-outside-toplevel
  tf1 = tf.compat.v1
  moved = {}
  for scale in (1.0, 64.0):
    with tf.Graph().as_default():
      table = tf1.get_variable("table", [4, 3], initializer=tf1.zeros_initializer())
      loss = tf.reduce_sum(tf.gather(table, [0, 2, 2]))
      train_op, _ = optimization.build_train_op(
          loss, {"optimizer_type": "sgd", "learning_rate": 1.0, "loss_scaling_factor": scale},
          total_steps=1)
      with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(train_op)
        moved[scale] = sess.run(table)
  np.testing.assert_allclose(moved[64.0], moved[1.0])
  np.testing.assert_allclose(moved[1.0][:, 0], [-1.0, 0.0, -2.0, 0.0])
