"""The graph lints of a training call: what tf.estimator and tf.distribute run without a word
but a user would not want (the engine's batch split against the host's, one replica's value
taken for the global one, updates the train_op never runs, a global step never advanced,
matmuls in a 16-bit type the host CPU emulates, bfloat16 sums TensorFlow's CPU kernels add up in
bfloat16).

Each reads the tf.Graph the face's model_fn wrapper built, and warns once per training call
(say_emulated_products, say_bfloat16_sums: once per process and line) or raises ModelFnError
where the run could never end; none changes the graph. The face
calls them from its training-loop override (`check_global_step_advances`,
`say_updates_not_run`, `say_slow_attention_scores`, `say_emulated_products`,
`say_bfloat16_sums`, and for an engine run `say_data_parallel`), from the model_fn wrapper
(`say_summed_loss_across_replicas`; `say_emulated_products` and `say_bfloat16_sums` for
evaluation and prediction),
and where the replicas' model_fn calls or merge step fail (`merge_in_cond_message`,
`mixed_policy_across_replicas`).
"""

import re
import traceback
from typing import FrozenSet, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from cerebras_tf.compiler import capture as capture_lib
from cerebras_tf.compiler import lower as lower_lib
from cerebras_tf.core import plans
from cerebras_tf.errors import ModelFnError, defined_at


def say_data_parallel(graph, distribution, hooks, loss, batch_norm_layers: Sequence[str],
                      plan: plans.Plan) -> None:
  """The lints of an engine run's training graph, where the host's replicas (`distribution`,
  None for one device) split the batch as the plan says.

  Args:
    graph: the training tf.Graph; `loss` its (reduced) loss tensor.
    hooks: the session hooks that read tensors (the call's and the spec's training hooks).
    batch_norm_layers: the compiled graph's batch-norm layers (ir.LayerGraph).
  """
  say_per_replica_variables(graph, distribution)
  say_per_replica_clipping(graph, distribution)
  say_replica_values(graph, distribution, hooks, loss)
  say_batch_norm_statistics(batch_norm_layers, plan)


def check_global_step_advances(train_op, global_step, hooks, who: str) -> None:
  """A step limit (StopAtStepHook) that the train_op never reaches: tf.estimator would train
  forever. Refused when nothing of the user's can stop it; else said, as a hook may."""
  if not any(isinstance(h, tf.compat.v1.train.StopAtStepHook) for h in hooks) \
      or capture_lib.writes_reached(train_op, [global_step]):
    return
  what = (f"{who}: its train_op does not advance the global step, so steps/max_steps is "
          f"never reached")
  fix = ("pass global_step=tf.compat.v1.train.get_global_step() to minimize() or "
         "apply_gradients(), or group tf.compat.v1.assign_add(global_step, 1) into the "
         "train_op")
  if not any(_users(h) for h in hooks):
    raise ModelFnError(f"{what} and training would never end: {fix}")
  tf.compat.v1.logging.warning("cerebras_tf: %s: training ends when a hook stops it; %s",
                               what, fix)


def merge_in_cond_message(error, user_model_fn) -> str:
  """A model_fn that applies its update inside a tf.cond or loop (its own gradient
  accumulation, usually) under host replicas: tf.distribute merges the replicas' gradients in
  apply_gradients, and cannot inside a cond; its error is a paragraph about tf.function."""
  where = capture_lib.user_line(error) or f"model_fn{defined_at(user_model_fn)}: "
  return (f"{where}the model_fn applies its update inside a tf.cond or a loop (gradient "
          f"accumulation?), which data-parallel host replicas cannot run: tf.distribute "
          f"merges the replicas' gradients in apply_gradients, and cannot inside a cond; "
          f"accumulate with cerebras_models.optimization.build_train_op "
          f"(optimizer.grad_accum_steps, which merges first), raise the batch instead, or "
          f"train pipelined")


def _users(hook) -> bool:
  """Whether a session hook is the user's (not TensorFlow's, nor one of ours)."""
  return not type(hook).__module__.startswith(("tensorflow", "cerebras_tf"))


_CROSS_REPLICA_UPDATE = re.compile(r"(^|/)update_\d+(_\d+)?/")


def say_per_replica_variables(graph, distribution) -> None:
  """Under data parallelism (multi_replica), a non-trainable variable the step writes (a
  counter) with aggregation NONE gets one copy per host replica, each updated by its own
  replica, and a read sees the first: `examples_seen` counted half the examples on 2 replicas.
  tf.distribute says nothing in graph mode; this says it once per training call."""
  if not isinstance(distribution, (tf.distribute.MirroredStrategy,
                                   tf.distribute.MultiWorkerMirroredStrategy)):
    return
  # Writes from a replica's own step; strategy.extended.update (an optimizer's apply) writes
  # every copy alike, under `update_<device>` scopes; initializers end in /Assign; a Saver
  # the model_fn made (in its scaffold) writes what it restores.
  written = {op.inputs[0].name for op in graph.get_operations()
             if op.type in ("AssignAddVariableOp", "AssignSubVariableOp", "AssignVariableOp")
             and op.inputs and not op.name.endswith("/Assign")
             and not _CROSS_REPLICA_UPDATE.search(op.name) and not _restores(op)}
  for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES):
    copies = getattr(v, "values", None)
    if (v.trainable or getattr(v, "aggregation", None) != tf.VariableAggregation.NONE
        or not copies or len(copies) < 2):
      continue
    if any(c.handle.name in written for c in copies):
      tf.compat.v1.logging.warning(
          "cerebras_tf: %s is written by the training step with aggregation NONE: each of "
          "the %d host replicas keeps its own copy, and a read (a checkpoint) sees the "
          "first's; create it with aggregation=tf.VariableAggregation.SUM (a count) or MEAN",
          v.name.split(":")[0], len(copies))


def say_batch_norm_statistics(norms: Sequence[str], plan: plans.Plan) -> None:
  """Batch normalization takes its statistics over one group of samples: on the engine one
  replica's (multi_replica) or one micro-batch of one system's (weight streaming), on the host
  one host replica's. Said once per training call: the plan's own note when the engine's
  groups have fewer than batching.BATCH_NORM_MIN_SAMPLES samples (with 1, a dense feature's
  variance is 0), and, when the host groups the batch differently, both splits and the
  setting that makes them one. `norms`: the compiled graph's batch-norm layers
  (`ir.LayerGraph.batch_norm_layers`)."""
  split = plan.batching
  if not norms:
    return
  if not split.keeps_batch_norm:
    note = next((n for n in plan.notes if n.startswith("batch normalization (")), None)
    if note:
      tf.compat.v1.logging.warning("cerebras_tf: %s", note)
  engine, host = split.batch_norm_groups, split.host_replicas
  if engine == host:
    return
  shown = ", ".join(norms[:3]) + (f" and {len(norms) - 3} more" if len(norms) > 3 else "")
  if plan.mode.replicates:
    on_engine = (f"the multi_replica plan's {split.engine_replicas} engine replicas see "
                 f"{split.per_engine_replica} sample(s) each")
    fix = (f"csconfig.num_replicas={host} makes the engine's replicas the host's, or train "
           f"pipelined (one replica, the whole batch of {split.global_batch})")
  elif plan.mode.streams_weights:
    on_engine = (f"the weight-streaming plan's {split.num_systems} system(s) x "
                 f"{split.micro_batches} micro-batch(es) see {split.batch_norm_samples} "
                 f"sample(s) each")
    fixes = []
    if split.micro_batches > 1:
      fixes.append(f"the host does not micro-batch: csconfig.micro_batch_size="
                   f"{split.per_system} (the whole per-system batch, if the wafer holds it)")
    if split.num_systems != host:
      fixes.append(f"{split.num_systems} host replicas (one a system: run in a fresh process, "
                   f"or call cerebras_tf.runtime.strategies.reserve_logical_cpus("
                   f"{split.num_systems}) before building the model)")
    fix = " and ".join(fixes) + " make the engine's groups the host's"
  else:
    on_engine = f"the {plan.execution_strategy} plan normalizes over the whole batch"
    fix = "training on one worker reproduces the engine's"
  tf.compat.v1.logging.warning(
      "cerebras_tf: batch normalization (%s) takes its statistics over one group of samples: "
      "%s, this host trains %d replica(s) of %d, so these losses are not the engine's%s; %s",
      shown, on_engine, host, split.per_host_replica,
      " (the statistics of 1 sample are that sample's own)" if split.batch_norm_samples == 1
      else "", fix)


def say_summed_loss_across_replicas(loss) -> None:
  """A loss summed over the batch (tf.reduce_sum) under data parallelism: each host replica
  sums its 1/R share, and tf.distribute's optimizers, taking the loss for a mean, divide the
  replicas' gradients by R, so every update is 1/R of the one-device one (SGD's step halved on
  2 replicas, silently). Said once per graph, from the first replica."""
  ctx = tf.distribute.get_replica_context()
  if not tf.distribute.has_strategy() or ctx is None or ctx.num_replicas_in_sync < 2:
    return
  r = ctx.num_replicas_in_sync
  if tf.get_static_value(ctx.replica_id_in_sync_group) not in (0, None):
    return
  if tf.compat.v1.distribute.get_loss_reduction() != tf.distribute.ReduceOp.MEAN:
    return  # tf.compat.v1.losses with reduction=SUM: the optimizer does not divide
  op = loss.op
  while op.type in ("Identity", "Cast") and op.inputs:
    op = op.inputs[0].op
  rank = op.inputs[0].shape.rank if op.type == "Sum" else None
  axes = tf.get_static_value(op.inputs[1]) if rank else None
  if axes is None or 0 not in {int(a) % rank for a in np.atleast_1d(axes)}:
    return
  where = lower_lib.user_source(op)
  tf.compat.v1.logging.warning(
      "cerebras_tf: %sthe loss is a sum over the batch (tf.reduce_sum): each of the %d host "
      "replicas sums its 1/%d share and the optimizer, taking the loss for a mean, divides "
      "their gradients by %d, so each update is 1/%d of the one-device one; use a mean, or "
      "tf.compat.v1.losses.* with reduction=SUM (the optimizer then does not divide)",
      f"{where}: " if where else "", r, r, r, r)


_SUMMARY_OPS = ("ScalarSummary", "HistogramSummary", "ImageSummary", "AudioSummaryV2",
                "TensorSummaryV2", "WriteScalarSummary", "WriteHistogramSummary",
                "WriteSummary", "WriteImageSummary")


_REPLICA_SCOPE = re.compile(r"^replica_\d+/")


def _reads_the_batch(tensor, limit: int = 100000) -> bool:
  """Whether `tensor`'s value comes from the input batch (an iterator's output), so each
  host replica has its own; a learning rate or a weight norm is the same in all."""
  seen, stack = set(), [tensor.op]
  while stack and len(seen) < limit:
    op = stack.pop()
    if op in seen:
      continue
    seen.add(op)
    if op.type in ("IteratorGetNext", "IteratorGetNextSync", "MultiDeviceIteratorGetNextFromShard"):
      return True
    stack.extend(t.op for t in op.inputs)
  return False


def replica_valued(graph, hooks, loss=None) -> Sequence[str]:
  """The user's summaries (by tag) and hook-read tensors (by name) whose value is one host
  replica's under data parallelism: made in the model_fn from the batch, outside the
  framework's global loss. tf.estimator writes replica 0's; the loss summary is the reduced
  one."""
  names = []
  loss_op = loss.op if loss is not None else None
  for op in graph.get_operations():
    if op.type not in _SUMMARY_OPS or _REPLICA_SCOPE.match(op.name):
      continue
    tag_t, value = (op.inputs[0], op.inputs[1]) if op.type.endswith("Summary") or \
        op.type == "TensorSummaryV2" else (op.inputs[2], op.inputs[3])
    if value.op is loss_op or not _reads_the_batch(value):
      continue
    tag = tf.get_static_value(tag_t)
    tag = tag.decode() if isinstance(tag, bytes) else op.name
    if tag not in ("loss",):
      names.append(f"summary '{tag}'")
  for hook in hooks:
    tensors = getattr(hook, "_tensors", None)  # LoggingTensorHook and the like
    if not isinstance(tensors, dict):
      continue
    for tag, t in tensors.items():
      try:
        t = graph.as_graph_element(t) if not isinstance(t, tf.Tensor) else t
      except (KeyError, ValueError, TypeError):
        continue
      if isinstance(t, tf.Tensor) and t.graph is graph and t.op is not loss_op and \
          _reads_the_batch(t):
        names.append(f"{type(hook).__name__} tensor '{t.name}'")
  return names


def say_replica_values(graph, distribution, hooks, loss) -> None:
  """In multi_replica each host replica trains on 1/R of the batch; a summary the model_fn
  writes, or a tensor a hook reads by name, is replica 0's value on its share, not the
  global one (only the loss is reduced over the replicas). Said once per training call,
  naming them."""
  replicas = getattr(distribution, "num_replicas_in_sync", 1)
  if replicas < 2:
    return
  names = replica_valued(graph, hooks, loss)
  if names:
    tf.compat.v1.logging.warning(
        "cerebras_tf: in multi_replica each of the %d host replicas trains on 1/%d of the "
        "batch, and these hold replica 0's value on its share, not the global one: %s (the "
        "loss is the global mean); average them in a metric, or train pipelined to see the "
        "whole batch's", replicas, replicas, ", ".join(names))


_GLOBAL_NORM_CLIP = re.compile(r"(?:^|/)clip_by_global_norm(?:_\d+)?/")


def say_per_replica_clipping(graph, distribution) -> None:
  """A model_fn that clips its gradients by their global norm (google-research/bert's
  optimizer does) clips, under data parallelism, each host replica's 1/R share of the
  gradient by the whole limit: the update can be up to R times the one-device step (the
  reference models' optimizer sums first). tf.distribute says nothing; this names the line,
  once per training call."""
  replicas = getattr(distribution, "num_replicas_in_sync", 1)
  if replicas < 2:
    return
  for op in graph.get_operations():
    if _GLOBAL_NORM_CLIP.search(op.name) and not lower_lib.built_by_cerebras_tf(op):
      where = lower_lib.user_source(op)
      tf.compat.v1.logging.warning(
          "cerebras_tf: %sthe model_fn clips its gradients by their global norm in each of "
          "the %d host replicas: each clips its own 1/%d share by the whole limit, so a "
          "clipped update is up to %dx the one-device one; clip the replicas' sum (the "
          "reference optimizer, cerebras_models.optimization.build_train_op, does), or "
          "train pipelined", f"{where}: " if where else "", replicas, replicas, replicas)
      return


def say_updates_not_run(graph, train_op, global_step) -> None:
  """Names the non-trainable variables whose writes the train_op never runs: batch
  normalization's moving statistics when its update ops (the UPDATE_OPS collection of
  tf.compat.v1.layers, a Keras layer's `.updates`) are left out of the train_op. They keep
  their initial values, which eval and predict then read; tf.estimator says nothing."""
  handles = {}
  for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES):
    if not v.trainable and v is not global_step:
      handles.update((name, v.name.split(":")[0]) for name in capture_lib.handle_names(v))
  written = {}
  for op in graph.get_operations():
    if op.type in capture_lib.READS or op.name.endswith("/Assign") or _restores(op):
      continue  # reads, initializers, a Saver's restores
    for t in op.inputs:
      name = handles.get(t.name) or handles.get(t.op.name)
      if name:
        written.setdefault(name, set()).add(op)
  if not written:
    return
  run = set(capture_lib.ancestors(train_op))
  unrun = sorted(name for name, ops in written.items() if not ops & run)
  if unrun:
    more = f" (and {len(unrun) - 1} more)" if len(unrun) > 1 else ""
    tf.compat.v1.logging.warning(
        "cerebras_tf: %s%s is written by ops the train_op does not run (batch normalization's "
        "moving statistics, say), so it keeps its initial value, and eval and predict read "
        "that: build the train_op under tf.control_dependencies(tf.compat.v1.get_collection("
        "tf.compat.v1.GraphKeys.UPDATE_OPS)) (tf.compat.v1.layers), adding a Keras model's "
        ".updates", unrun[0], more)


# Ops of a batched matmul; TF 2.15's remapper fuses one times (or over) a scalar plus an addend
# into one oneDNN op (_MklFusedBatchMatMulV2), whose kernel for a [1, 1, L, L] addend took
# 936 ms where the ops unfused take 4 ms (benchmarks/bench_eval_speed.py, table b); a division
# by sqrt(d) is rewritten to a multiply first (837 ms). Other addend shapes are fast, and so is
# an Einsum, which the remapper leaves alone.
_BATCH_MATMULS = frozenset({"BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"})
_SCALINGS = frozenset({"Mul", "RealDiv", "Div"})


def slow_attention_scores(graph) -> List[tf.Operation]:
  """The Add ops of `graph` adding a [1, 1, ?, ?] tensor (a causal bias) to a BatchMatMul times
  or over a scale: attention scores in the form TF 2.15 runs slowly where oneDNN is on."""
  found = []
  for op in graph.get_operations():
    if op.type not in ("Add", "AddV2") or len(op.inputs) != 2:
      continue
    for addend, scaled in (tuple(op.inputs), tuple(reversed(op.inputs))):
      dims = addend.shape.as_list() if addend.shape.rank == 4 else None
      if dims and dims[:2] == [1, 1] and scaled.op.type in _SCALINGS and any(
          t.op.type in _BATCH_MATMULS for t in scaled.op.inputs):
        found.append(op)
        break
  return found


def say_slow_attention_scores(graph) -> None:
  """Names the user's line of attention scores in the slow fused form. For a process whose
  TensorFlow runs oneDNN kernels (the face checks); the reference models use an einsum."""
  found = [op for op in slow_attention_scores(graph) if not lower_lib.built_by_cerebras_tf(op)]
  if not found:
    return
  where = lower_lib.user_source(found[0]) or found[0].name
  tf.compat.v1.logging.warning(
      "cerebras_tf: %s: attention scores as a batched tf.matmul scaled plus a "
      "[1, 1, L, L] bias (%d such op(s)), which TensorFlow 2.15 with oneDNN fuses into one op "
      "that runs about 200x slower than the ops apart: compute the scores with "
      "tf.einsum('bnqd,bnkd->bnqk', q, k), which it does not fuse, or give the bias another "
      "shape ([B, 1, L, L])", where, len(found))


# The ops that carry a step's FLOPs: where they compute in a 16-bit type TensorFlow has no fast
# kernel for on this CPU, it emulates it (float16 matmuls at 1 GFLOP/s where float32's run at
# 142 on an AVX2 EPYC), and nothing says so.
_PRODUCTS = frozenset({"MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum",
                       "Conv2D", "Conv3D", "DepthwiseConv2dNative", "Conv2DBackpropInput",
                       "Conv2DBackpropFilter", "Conv3DBackpropInputV2", "Conv3DBackpropFilterV2",
                       "DepthwiseConv2dNativeBackpropInput",
                       "DepthwiseConv2dNativeBackpropFilter"})


def emulated_products(graph, emulated: FrozenSet[str]) -> List[tf.Operation]:
  """The matmuls and convolutions of `graph` (forward and backward) whose output dtype is
  one of `emulated` (dtype names TensorFlow emulates on this CPU: precision.emulated_dtypes)."""
  return [op for op in graph.get_operations()
          if op.type in _PRODUCTS and op.outputs and op.outputs[0].dtype.name in emulated]


_SAID_EMULATED = set()  # say_emulated_products's lines said in this process


def say_emulated_products(graph, emulated: FrozenSet[str]) -> None:
  """Names the user's line of the first matmul or convolution in a 16-bit type TensorFlow
  emulates on this CPU (a Keras mixed_float16 policy, brought from a GPU, trains ~60x slower on
  an AVX2 host than in float32, ~100x on a Xeon with avx512_fp16), and what to set instead:
  mixed_bfloat16 where bfloat16 is fast here, else float32. For training, evaluation and
  prediction graphs; each line once per process (a train_and_evaluate loop's evaluations build
  the same graph again and again)."""
  found = emulated_products(graph, emulated)
  if not found:
    return
  candidates = [op for op in found if "gradients" not in op.name.split("/")] + found
  # The op's name too: a Keras model cloned in tf.estimator's model_fn has no line of the
  # user's but the train call's, and its op's name starts with the layer's.
  line, first = next(((w, op) for op in candidates if (w := lower_lib.user_source(op))),
                     ("", candidates[0]))
  line = line or _calling_line()
  where = f"{line} (op {first.name})" if line else f"op {first.name}"
  names = sorted({op.outputs[0].dtype.name for op in found})
  dtypes = " and ".join(names)
  if (where, len(found), dtypes) in _SAID_EMULATED:
    return
  _SAID_EMULATED.add((where, len(found), dtypes))
  # Where bfloat16 is fast, a float16 model (a GPU guide's mixed_float16) keeps its 16 bits.
  policy, dtype = (("mixed_bfloat16", "bfloat16") if "bfloat16" not in emulated
                   else ("float32", "float32"))
  cost = "; ".join(_EMULATED_COST[d] for d in names)
  gain = _BFLOAT16_GAIN if policy == "mixed_bfloat16" else ""
  tf.compat.v1.logging.warning(
      "cerebras_tf: %s: %d matmul/convolution op(s) compute in %s, which TensorFlow emulates "
      "on this CPU (no fast kernel here; measured, %s): for speed on this host set the "
      "Keras policy to %s%s (tf.keras.mixed_precision.set_global_policy('%s')) or cast to %s; "
      "the engine's estimate assumes 16-bit activations either way",
      where, len(found), dtypes, cost, policy, gain, policy, dtype)


# What an emulated dtype cost, as the warning quotes it (benchmarks/bench_keras_policies.py,
# bench_bf16.py; docs/performance.md): float16 on every CPU, bfloat16 without bf16 math.
_EMULATED_COST = {
    "float16": "float16 against float32: a Keras MLP ~60-110x slower, a ResNet-style CNN ~175x "
               "(an AVX2 EPYC, a Xeon with avx512_fp16, an EPYC with avx512_bf16)",
    "bfloat16": "bfloat16 without bf16 math: BERT-tiny 0.73x float32's speed on an AVX2 host, "
                "0.35x on an AVX-512 Xeon without avx512_bf16",
}
_BFLOAT16_GAIN = (", which this CPU computes natively (a Keras ResNet-style CNN trained 1.72x "
                  "faster under it than in float32 on an EPYC with avx512_bf16)")


# TensorFlow 2.15's CPU kernels that add bfloat16 values up in bfloat16 (an AVX-512 EPYC,
# 2026-12-02; tests/test_estimator_lints.py checks TensorFlow still does): a Mean over axes
# other than the last (Keras's global average pooling, a mean over the batch) came 3% off at
# 2,048 values, 34% at 3,072, 50% at 4,096; UnsortedSegmentSum (as in a bfloat16 gather's
# gradient made dense: the rows of repeated ids) and Cumsum 6% off at 512 rows into one, 51% at
# 1,024, where the running sum stops growing (SegmentSum like Mean; its rows per segment are
# not known while the graph is built, so it is not named). Sum, a Mean over the last axis or
# over everything, and the products add up in float32. (BiasAddGrad too: runtime/bias_grad.py.)
BF16_MEAN_LIMIT = 2048    # values a Mean over outer axes adds up within ~3%
BF16_RUNNING_LIMIT = 512  # rows a segment sum or Cumsum adds up into one within ~6%


def _static_axes(op) -> Optional[List[int]]:
  """The axes `op` (a Mean, a Cumsum) reduces along, from its constant input 1, each in
  [0, rank); None where the rank or the axes are not known while the graph is built."""
  rank = op.inputs[0].shape.rank
  axes = tf.get_static_value(op.inputs[1])
  if rank is None or axes is None:
    return None
  return sorted({int(a) % rank for a in np.atleast_1d(axes)})


def _summed_in_bfloat16(op) -> int:
  """How many bfloat16 values `op` adds up along one output element where TensorFlow's CPU
  kernel accumulates them in bfloat16 (0: none, or unknown while the graph is built)."""
  if not op.inputs or op.inputs[0].dtype != tf.bfloat16:
    return 0
  dims = op.inputs[0].shape.as_list() if op.inputs[0].shape.rank is not None else None
  if op.type in ("Mean", "Cumsum") and dims is not None:
    axes = _static_axes(op)
    if not axes or (op.type == "Mean" and len(dims) - 1 in axes):
      return 0  # a Mean over the last axis (or over everything) sums in float32
    sizes = [dims[a] for a in axes]
    return int(np.prod(sizes)) if None not in sizes else 0
  if op.type == "UnsortedSegmentSum" and dims and dims[0]:
    if _gather_gradient(op):  # the rows of repeated ids: tokens gathered from a table repeat;
      # rows gathered from activations (BERT's masked positions) rarely do
      return dims[0] if _reads_a_table(_forward_op(op).inputs[0].op) else 0
    segments = tf.get_static_value(op.inputs[2])  # rows per segment, on average (an MoE
    return dims[0] // int(segments) if segments else 0  # dispatch to unique slots: ~1)
  return 0


_GATHERS = frozenset({"GatherV2", "Gather", "ResourceGather"})


def _gather_gradient(op) -> bool:
  """Whether `op` is the segment sum that makes a gather's gradient dense."""
  return op.type == "UnsortedSegmentSum" and _forward_op(op).type in _GATHERS


def _reads_a_table(op, depth: int = 4) -> bool:
  """Whether `op` reads a variable whole, behind casts and identities: a gather from it is an
  embedding lookup, whose ids (tokens) repeat."""
  if op.type in ("VarHandleOp", "VariableV2", "ReadVariableOp"):
    return True
  return bool(depth and op.type in ("Cast", "Identity") and op.inputs and
              _reads_a_table(op.inputs[0].op, depth - 1))


def bfloat16_sums(graph) -> List[tf.Operation]:
  """The ops of `graph` past the limits above: a bfloat16 Mean over more than BF16_MEAN_LIMIT
  values, a bfloat16 Cumsum over BF16_RUNNING_LIMIT rows or more, an UnsortedSegmentSum of as
  many rows per segment (on average; a gather's gradient: rows gathered from a table)."""
  return [op for op in graph.get_operations()
          if (n := _summed_in_bfloat16(op)) and n >= (
              BF16_MEAN_LIMIT + 1 if op.type == "Mean" else BF16_RUNNING_LIMIT)]


def _forward_op(op):
  """The forward op a gradient op was built for ("gradients/x/y_grad/..." -> op "x/y"), or `op`
  itself. A segment sum that makes a gather's gradient dense, named for the op that needed it
  dense ("gradients/AddN/inputs_1", "gradients/Reshape_grad/..."): the gather's."""
  names = [op.name]
  if op.type == "UnsortedSegmentSum":
    names.insert(0, op.inputs[0].op.name)  # "gradients/GatherV2_grad/Reshape"
  for name in names:
    match = re.match(r"^(?:.*/)?gradients(?:_\d+)?/(.+?)_grad/", name)
    if match:
      try:
        return op.graph.get_operation_by_name(match.group(1))
      except KeyError:
        pass
  return op


_SAID_BF16_SUMS = set()  # say_bfloat16_sums's lines said in this process


def _calling_line() -> str:
  """The user's line in the current stack (their train/evaluate call): for an op built where
  no frame of theirs is, as a Keras model cloned in tf.distribute's replica threads."""
  return lower_lib.user_source(None, traceback.extract_stack())


def say_16_bit_variables(graph) -> None:
  """Names the first trainable variable of `graph` stored in a 16-bit type (tf.compat.v1.layers
  make their variables in their input's dtype, so a model that casts its input to bfloat16
  trains bfloat16 weights), with the user's line: the optimizer's slots and updates round to
  that type. Adam's beta2 0.999 is 1.0 in bfloat16; a feature-column DNN so made reached a
  loss of 37,680 after 200 Adam steps against 0.13 with float32 weights (use_cs=False alike,
  2026-12-02). Once per process and line."""
  found = [v for v in graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)
           if v.dtype.base_dtype in (tf.bfloat16, tf.float16)]
  if not found:
    return
  line = lower_lib.user_source(found[0].op) or _calling_line()
  where = f"{line} (variable {found[0].op.name})" if line else f"variable {found[0].op.name}"
  if (where, len(found)) in _SAID_BF16_SUMS:
    return
  _SAID_BF16_SUMS.add((where, len(found)))
  tf.compat.v1.logging.warning(
      "cerebras_tf: %s: %d trainable variable(s) are %s, so the optimizer's state and updates "
      "round to it (Adam's beta2 0.999 is 1.0 in bfloat16; such a model diverged here): keep "
      "the variables float32 and cast them where they are used, as tf.keras layers under "
      "set_global_policy('mixed_bfloat16') do, or tf.cast(tf.compat.v1.get_variable(...), "
      "tf.bfloat16) in a layer of your own", where, len(found),
      found[0].dtype.base_dtype.name)


def say_bfloat16_sums(graph) -> None:
  """Names the user's line of the first op whose bfloat16 sum TensorFlow's CPU kernel rounds
  away (bfloat16_sums: the line of the forward op a gradient op is for) and the fix; each
  line once per process. (The reference models sum in float32 or gather from float32.)"""
  found = bfloat16_sums(graph)
  if not found:
    return
  op = found[0]
  line = lower_lib.user_source(_forward_op(op)) or _calling_line()
  where = f"{line} (op {op.name})" if line else f"op {op.name}"
  if (where, len(found)) in _SAID_BF16_SUMS:
    return
  _SAID_BF16_SUMS.add((where, len(found)))
  n = _summed_in_bfloat16(op)
  if op.type == "Mean":
    what = f"a mean of {n:,} bfloat16 values along an outer axis"
    harm = "at 4,096 values it comes to half the true mean"
  elif _gather_gradient(op):
    what = f"a gather of {n:,} rows from a bfloat16 table, whose gradient over repeated ids"
    harm = "1,024 rows of one id come to half their sum"
  else:
    what = (f"a cumulative sum of {n:,} bfloat16 rows" if op.type == "Cumsum" else
            f"a segment sum of {n:,} bfloat16 rows into each segment (on average)")
    harm = "1,024 rows come to half their sum"
  fix = ("gather from the float32 variable and cast the rows after" if _gather_gradient(op)
         else "compute it in float32: tf.cast(x, tf.float32) before it, or dtype='float32' on "
         "its Keras layer")
  tf.compat.v1.logging.warning(
      "cerebras_tf: %s: %s (%d such op(s)), which TensorFlow 2.15's CPU kernel adds up in "
      "bfloat16: %s. On this host, %s", where, what, len(found), harm, fix)


def _restores(assign) -> bool:
  """Whether a variable write assigns a value read from a checkpoint (through Identity ops)."""
  value = assign.inputs[1].op if len(assign.inputs) > 1 else None
  while value is not None and value.type == "Identity" and value.inputs:
    value = value.inputs[0].op
  return value is not None and value.type in ("RestoreV2", "Restore", "RestoreSlice")


def mixed_policy_across_replicas(error, user_model_fn, params=None) -> Optional[str]:
  """What to do when a Keras mixed-precision policy meets multi_replica's per-replica model_fn
  calls: each replica's model wraps the shared (mirrored) weights in an AutoCastVariable of
  its own, so an update over the model's variables differs between replicas and tf.distribute
  regroups it as PerReplica (the plain Estimator with MirroredStrategy fails alike).

  The policy is the global one, or the one the model's layers were built under with the
  global policy restored after (the reference CNN and ViT with `model.mixed_precision: true`
  on a bfloat16 CPU): then only the error's AutoCast variables tell. `params` (the
  estimator's) says whether the policy came from that YAML key."""
  text = str(error)
  policy = tf.keras.mixed_precision.global_policy()
  global_mixed = policy.compute_dtype != policy.variable_dtype
  if "PerReplica" not in text or not (global_mixed or "AutoCast" in text):
    return None
  keras_model = getattr(user_model_fn, "keras_model", None)
  model_section = params.get("model") if isinstance(params, dict) else None
  from_yaml = isinstance(model_section, dict) and bool(model_section.get("mixed_precision"))
  if from_yaml:
    ways = "set model.mixed_precision: false for this run"
  elif keras_model is not None:
    ways = "set the policy back to 'float32' for this run"
  else:
    ways = ("leave var_list out of minimize()/compute_gradients() (it then takes the trainable "
            "variables, which are shared), or set the policy back to 'float32' for this run")
  who = (f"Keras model '{keras_model.name}'" if keras_model is not None else
         f"model_fn{defined_at(user_model_fn)}")
  which = f" '{policy.name}'" if global_mixed else (" (model.mixed_precision: true)"
                                                    if from_yaml else "")
  return (f"{who}: multi_replica cannot update weights through "
          f"the Keras mixed-precision policy{which}: each replica's model wraps the "
          f"shared weights in its own AutoCastVariable, so the replicas' updates do not match "
          f"({type(error).__name__}: {text.splitlines()[0][:120]}); {ways} (the engine's "
          f"estimate assumes 16-bit compute either way), or train pipelined or "
          f"weight_streaming, where it trains as it is")
