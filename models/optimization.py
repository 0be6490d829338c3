"""The reference models' optimizer (BERT, GPT, Transformer, MLP): AdamW, warm-up + decay,
clipping, gradient accumulation, loss scaling; every `optimizer` key of a params file.

`build_train_op` reads `params["optimizer"]`:
  optimizer_type      adamw (default) | adam | sgd | momentum
  learning_rate       a list of schedule segments (modelzoo form, as cerebras_tf.params
                      validates it), or a peak rate with the google-bert keys below
  warmup_steps        linear warm-up from 0 over this many optimizer updates
  learning_rate_decay linear | polynomial | constant (default constant, or linear when
                      warmup_steps is set); decays to end_learning_rate (0) at the last
                      update, counted from step 0 (as google-bert)
  decay_power         power of the polynomial decay (1.0 = linear)
  max_gradient_norm   clip by global norm (0/None = no clipping)
  weight_decay_rate   decoupled weight decay; never applied to LayerNorm or bias variables
  beta1, beta2, epsilon
  correct_bias        AdamW with Adam's bias correction (PyTorch's AdamW); default off, as
                      google-bert trained
  grad_accum_steps    N micro-batches per update (default 1)
  loss_scaling_factor static loss scale (default 1.0); "dynamic" means none here
  log_summaries       TensorBoard scalars optimizer/learning_rate and optimizer/gradient_norm

Steps. `global_step` counts micro-batches, like every Estimator hook and `max_steps`. The
optimizer update count is `global_step // grad_accum_steps`, and the learning-rate schedule
(warm-up and decay length) is in updates.

Loss scaling. bfloat16 has float32's exponent range, so bf16 mixed precision needs no loss
scaling and the default factor is 1.0. A static factor is there for float16-style runs:
the loss is multiplied before differentiation and the gradients divided after.
"""

import re
from typing import Any, Mapping, Optional, Sequence

import tensorflow as tf


tf1 = tf.compat.v1

DEFAULT_EXCLUDE_FROM_WEIGHT_DECAY = ("LayerNorm", "layer_norm", "bias")


class AdamWeightDecayOptimizer(tf1.train.Optimizer):
  """Adam with decoupled weight decay, without bias correction (as BERT was trained) unless
  given the update step (`correct_bias`).

  update = m / (sqrt(v) + eps) + weight_decay_rate * w   (decay skipped for excluded names)
  w     <- w - lr * update
  Slots: `adam_m`, `adam_v`. Built on tf1's Optimizer so distribution strategies and slot
  creation work as for TF's own optimizers.
  """

  def __init__(self, learning_rate, weight_decay_rate: float = 0.0, beta1: float = 0.9,
               beta2: float = 0.999, epsilon: float = 1e-6,
               exclude_from_weight_decay: Sequence[str] = DEFAULT_EXCLUDE_FROM_WEIGHT_DECAY,
               name: str = "AdamWeightDecay", update_step=None):
    """update_step: the 0-based optimizer update count (a scalar tensor). Given, the Adam
    step is bias-corrected (PyTorch's AdamW, modelzoo's `correct_bias: true`): lr *
    sqrt(1 - beta2^t) / (1 - beta1^t) with t = update_step + 1, as TF's Adam applies it."""
    super().__init__(use_locking=False, name=name)
    self._lr = learning_rate
    self._weight_decay_rate = weight_decay_rate
    self._beta1, self._beta2, self._epsilon = beta1, beta2, epsilon
    self._exclude = tuple(exclude_from_weight_decay or ())
    self._update_step = update_step

  def decays(self, var_name: str) -> bool:
    """Whether the variable named `var_name` gets weight decay."""
    if not self._weight_decay_rate:
      return False
    return not any(re.search(p, var_name) for p in self._exclude)

  def _create_slots(self, var_list):
    for v in var_list:
      self._zeros_slot(v, "adam_m", self._name)
      self._zeros_slot(v, "adam_v", self._name)

  def _prepare(self):
    self._lr_t = tf.convert_to_tensor(self._call_if_callable(self._lr), name="learning_rate")

  def _beta_powers(self, dtype):
    """(beta1^t, beta2^t) for ApplyAdam: both 0 (no bias correction) without update_step."""
    if self._update_step is None:
      zero = tf.constant(0.0, dtype)
      return zero, zero
    t = tf.cast(self._update_step + 1, dtype)
    return tf.pow(tf.constant(self._beta1, dtype), t), tf.pow(tf.constant(self._beta2, dtype), t)

  def _apply(self, grad, var):
    m, v = self.get_slot(var, "adam_m"), self.get_slot(var, "adam_v")
    dtype = var.dtype.base_dtype
    lr = tf.cast(self._lr_t, dtype)
    next_m = self._beta1 * m + (1.0 - self._beta1) * grad
    next_v = self._beta2 * v + (1.0 - self._beta2) * tf.square(grad)
    b1, b2 = self._beta_powers(dtype)
    update = tf.sqrt(1.0 - b2) / (1.0 - b1) * next_m / (tf.sqrt(next_v) + self._epsilon)
    if self.decays(var.op.name):
      update += self._weight_decay_rate * var
    return tf.group(var.assign_sub(lr * update), m.assign(next_m), v.assign(next_v))

  def _resource_apply_dense(self, grad, var):
    """The same update through TF's fused Adam kernel: one pass over the variable.

    The unfused form above makes ten passes over every [V, H] embedding table; on CPU they were
    a tenth of a BERT-tiny step. ApplyAdam's step is lr * sqrt(1 - beta2^t) / (1 - beta1^t) *
    m / (sqrt(v) + eps); with both powers 0 it is lr * m / (sqrt(v) + eps), Adam without bias
    correction. The decay is applied first to the same pre-update weights, so
    w - lr * wd * w - lr * adam == w - lr * (adam + wd * w).
    """
    m, v = self.get_slot(var, "adam_m"), self.get_slot(var, "adam_v")
    dtype = var.dtype.base_dtype
    lr = tf.cast(self._lr_t, dtype)
    decay = []
    if self.decays(var.op.name):
      # After the gradient: otherwise the decay may run before the forward pass reads the
      # weights it should read undecayed, and while earlier reads are alive it copies the
      # variable first (with clipping's global norm, after every gradient of the step).
      # assign(w * (1 - lr wd)) and not assign_sub(lr wd w): the assign adopts the product's
      # buffer, one pass over a [V, H] table instead of two (BERT-tiny's table, AVX2 host:
      # 1.1 against 2.0 ms a step).
      with tf.control_dependencies([grad]):
        decay = [var.assign(var * (1.0 - lr * self._weight_decay_rate))]
    with tf.control_dependencies(decay):
      b1, b2 = self._beta_powers(dtype)
      return tf.raw_ops.ResourceApplyAdam(
          var=var.handle, m=m.handle, v=v.handle, beta1_power=b1, beta2_power=b2, lr=lr,
          beta1=tf.constant(self._beta1, dtype), beta2=tf.constant(self._beta2, dtype),
          epsilon=tf.constant(self._epsilon, dtype), grad=grad, use_locking=False)

  _apply_dense = _apply

  def _resource_apply_sparse(self, grad, handle, indices):
    # Embedding gradients arrive as slices; Adam's moments touch every row anyway.
    dense = tf.math.unsorted_segment_sum(grad, indices, tf.shape(handle)[0])
    return self._resource_apply_dense(dense, handle)

  def _apply_sparse(self, grad, var):
    return self._apply(tf.convert_to_tensor(grad), var)


def learning_rate_schedule(opt: Mapping[str, Any], update_step, total_updates: int):
  """The learning rate at `update_step`.

  `learning_rate` is either a list of modelzoo-style segments (what cerebras_tf.params
  validates: `{scheduler: Linear|Constant|Exponential|Cosine, steps, ...}`, e.g. a Linear
  warm-up 0 -> peak followed by a Linear decay peak -> 0), or a number. A number is constant
  unless `warmup_steps` / `learning_rate_decay` (linear | polynomial) are given, the
  google-bert form for plain-Estimator users.

  Args:
    opt: params["optimizer"].
    update_step: int64 scalar tensor, optimizer updates done so far.
    total_updates: updates in the whole run (the decay length; <= 0 if unknown).
  Returns:
    float32 scalar tensor.
  """
  lr = opt["learning_rate"]
  if isinstance(lr, (list, tuple)):
    return _segments_schedule(lr, update_step, total_updates,
                              bool(opt.get("disable_lr_steps_reset")))
  peak = float(lr)
  decay = opt.get("learning_rate_decay") or ("linear" if opt.get("warmup_steps") else "constant")
  if total_updates <= 0:
    decay = "constant"  # no known run length: nothing to decay towards
  step = tf.cast(update_step, tf.float32)
  if decay in ("linear", "polynomial"):
    power = 1.0 if decay == "linear" else float(opt.get("decay_power", 1.0))
    lr = tf1.train.polynomial_decay(peak, update_step, int(total_updates),
                                    end_learning_rate=float(opt.get("end_learning_rate", 0.0)),
                                    power=power)
  elif decay == "constant":
    lr = tf.constant(peak)
  else:
    raise ValueError("learning_rate_decay must be linear, polynomial or constant, got %r"
                     % (decay,))
  warmup = int(opt.get("warmup_steps") or 0)
  if warmup > 0:
    warm_lr = peak * step / float(warmup)
    lr = tf.where(step < float(warmup), warm_lr, lr)
  return lr


def _segment_lr(seg, local_step, steps):
  kind = seg["scheduler"]
  if kind == "Constant":
    return tf.constant(float(seg["learning_rate"]))
  if kind == "Linear":
    return tf1.train.polynomial_decay(float(seg["initial_learning_rate"]), local_step,
                                      max(steps, 1), float(seg["end_learning_rate"]), power=1.0)
  if kind == "Cosine":
    init = float(seg["initial_learning_rate"])
    end = float(seg.get("end_learning_rate") or 0.0)
    alpha = end / init if init else 0.0
    decay = seg.get("decay_steps") or steps  # TF's: falls over decay_steps, then holds
    return tf1.train.cosine_decay(init, local_step, max(int(decay), 1), alpha=alpha)
  if kind == "Exponential":
    return tf1.train.exponential_decay(float(seg["initial_learning_rate"]), local_step,
                                       int(seg["decay_steps"]), float(seg["decay_rate"]),
                                       staircase=bool(seg.get("staircase")))
  raise ValueError("unknown learning-rate scheduler %r" % (kind,))


def _segments_schedule(segments, update_step, total_updates, no_reset):
  """Piecewise schedule: segment i runs from sum(steps[:i]); the last one runs on."""
  start, starts, rates = 0, [], []
  for seg in segments:
    steps = seg.get("steps")
    if steps is None:  # only the last segment: it lasts the rest of the run
      steps = max(int(total_updates) - start, 1)
    local = update_step if no_reset else tf.maximum(update_step - start, 0)
    starts.append(start)
    rates.append(tf.cast(_segment_lr(seg, local, int(steps)), tf.float32))
    start += int(steps)
  lr = rates[-1]
  for s, r in reversed(list(zip(starts[1:], rates[:-1]))):
    lr = tf.where(update_step < s, r, lr)
  return lr


def make_optimizer(opt: Mapping[str, Any], learning_rate, update_step=None):
  """The tf1 optimizer named by `optimizer_type`; `update_step` (the 0-based update count)
  bias-corrects AdamW when `correct_bias` is set."""
  kind = (opt.get("optimizer_type") or "adamw").lower()
  if kind == "adamw":
    return AdamWeightDecayOptimizer(
        learning_rate, weight_decay_rate=float(opt.get("weight_decay_rate", 0.01)),
        beta1=float(opt.get("beta1", 0.9)), beta2=float(opt.get("beta2", 0.999)),
        epsilon=float(opt.get("epsilon", 1e-6)),
        update_step=update_step if opt.get("correct_bias") else None)
  if kind == "adam":
    return tf1.train.AdamOptimizer(learning_rate, beta1=float(opt.get("beta1", 0.9)),
                                   beta2=float(opt.get("beta2", 0.999)),
                                   epsilon=float(opt.get("epsilon", 1e-6)))
  if kind == "sgd":
    return tf1.train.GradientDescentOptimizer(learning_rate)
  if kind == "momentum":
    return tf1.train.MomentumOptimizer(learning_rate, float(opt.get("momentum", 0.9)))
  raise ValueError("optimizer_type must be adamw, adam, sgd or momentum, got %r" % (kind,))


def _clip(grads, max_norm):
  if not max_norm:
    return grads, tf.linalg.global_norm(grads)
  return tf.clip_by_global_norm(grads, float(max_norm))


def _scaled(grad, factor: float):
  if isinstance(grad, tf.IndexedSlices):
    return tf.IndexedSlices(grad.values * factor, grad.indices, grad.dense_shape)
  return grad * factor


def _sum_across(distribution, *grads):
  """In cross-replica context: each replica's gradients, summed, on every replica's device.
  (ReplicaContext.all_reduce does this too, but its gradient wrapper looks the replicas'
  variables up by a name graph mode does not give them.)"""
  return distribution.extended.batch_reduce_to(tf.distribute.ReduceOp.SUM,
                                               [(g, g) for g in grads])


def _when(pred, make_op):
  """Runs the op `make_op()` builds only where `pred` is true; a bool tensor that follows it."""
  def run():
    with tf.control_dependencies([make_op()]):
      return tf.constant(True)
  return tf.cond(pred, run, lambda: tf.constant(False))


def build_train_op(loss, opt: Mapping[str, Any], total_steps: int,
                   var_list: Optional[Sequence[tf.Variable]] = None):
  """Gradients of `loss`, clipped and (optionally accumulated) applied; bumps global_step.

  Under a distribution strategy (multi_replica's host replicas, several systems' weight
  streaming, several workers) the update is the one-device update of the global batch: the
  replicas' gradients are summed before they are clipped, accumulated or logged (clipping
  each replica's share by the global-norm limit let through up to R times the step).

  Args:
    loss: float32 scalar.
    opt: params["optimizer"].
    total_steps: micro-batches in the run (runconfig max_steps), for the decay length.
    var_list: variables to train (default: all trainable variables).
  Returns:
    (train_op, dict of scalar tensors for logging: learning_rate, gradient_norm).
  """
  global_step = tf1.train.get_or_create_global_step()
  accum = max(int(opt.get("grad_accum_steps") or 1), 1)
  scale = opt.get("loss_scaling_factor") or 1.0
  # float32 and bfloat16 share the exponent range: "dynamic" scaling has nothing to do here.
  scale = 1.0 if scale == "dynamic" else float(scale)
  tvars = list(var_list) if var_list is not None else tf1.trainable_variables()

  lr = learning_rate_schedule(opt, global_step // accum, total_steps // accum)
  optimizer = make_optimizer(opt, lr, global_step // accum)
  # Under a distribution strategy each replica sees 1/R of the global batch: dividing its loss
  # by R makes the replicas' SUM of gradients the global-batch mean, as in one device. (tf1's
  # compute_gradients does this itself; tf.gradients does not.)
  ctx = tf.distribute.get_replica_context()
  in_replicas = tf.distribute.has_strategy() and ctx is not None
  replicas = ctx.num_replicas_in_sync if ctx is not None else 1
  grads = tf.gradients(loss * (scale / replicas) if scale != 1.0 or replicas > 1 else loss, tvars)
  if replicas > 1:
    # What tf1's compute_gradients sets when it scales: tf.estimator then reports the replicas'
    # MEAN loss, not their SUM (R times the loss of the other modes).
    tf1.get_default_graph()._is_loss_scaled_by_optimizer = True  # pylint: disable=protected-access
  if scale != 1.0:
    # An embedding's gradient is IndexedSlices, which has no `/`: scale its values.
    grads = [None if g is None else _scaled(g, 1.0 / scale) for g in grads]
  pairs = [(g, v) for g, v in zip(grads, tvars) if g is not None]
  if in_replicas and replicas > 1:
    summed = ctx.merge_call(_sum_across, args=tuple(g for g, _ in pairs))
    pairs = list(zip(summed, [v for _, v in pairs]))
  variables = [v for _, v in pairs]
  max_norm = opt.get("max_gradient_norm")

  def shares(clipped):
    # Under replicas each holds the same summed gradient and apply_gradients sums theirs.
    if not in_replicas or replicas == 1:
      return list(zip(clipped, variables))
    return [(_scaled(g, 1.0 / replicas), v) for g, v in zip(clipped, variables)]

  if accum == 1:
    clipped, norm = _clip([g for g, _ in pairs], max_norm)
    update = optimizer.apply_gradients(shares(clipped))
  else:
    # Accumulate the mean of N micro-batch gradients in float32 slots kept in checkpoints,
    # apply them on every N-th micro-step, then zero them. Every replica adds the same summed
    # gradient, so the first replica's value is the one kept.
    with tf1.variable_scope("grad_accum"):
      # v.name: a replica's own copy has "/replica_1" in its op name, the variable does not.
      slots = [tf1.get_variable(v.name.split(":")[0], v.shape, tf.float32,
                                tf1.zeros_initializer(), trainable=False,
                                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
               for v in variables]
    adds = [s.assign_add(tf.convert_to_tensor(g) / float(accum))
            for s, (g, _) in zip(slots, pairs)]
    with tf.control_dependencies(adds):
      is_update = tf.equal((global_step + 1) % accum, 0)
      clipped, norm = _clip([s.read_value() for s in slots], max_norm)

    def applied_then_zeroed(apply_op):
      with tf.control_dependencies([apply_op]):
        return tf.group([s.assign(tf.zeros(s.shape, s.dtype)) for s in slots])

    if not in_replicas:
      update = _when(is_update, lambda: applied_then_zeroed(
          optimizer.apply_gradients(shares(clipped))))
    else:
      # tf.distribute cannot merge the replicas inside a tf.cond (merge_call in a function):
      # merge first, then choose, as tf1's apply_gradients itself merges first.
      def apply_merged(distribution, grads_and_vars, is_update):
        apply = optimizer._distributed_apply  # pylint: disable=protected-access
        return _when(distribution.experimental_local_results(is_update)[0],
                     lambda: applied_then_zeroed(apply(distribution, grads_and_vars)))
      update = ctx.merge_call(apply_merged, args=(shares(clipped), is_update))
    norm = tf.where(is_update, norm, -1.0)

  with tf.control_dependencies([update]):
    train_op = global_step.assign_add(1)
  if opt.get("log_summaries"):
    tf1.summary.scalar("optimizer/learning_rate", lr)
    tf1.summary.scalar("optimizer/gradient_norm", norm)  # -1 on accumulating micro-steps
  return train_op, {"learning_rate": lr, "gradient_norm": norm}
