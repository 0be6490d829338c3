"""CerebrasEstimator: a tf.estimator.Estimator that can compile for and run on the engine.

`use_cs=False` (the default) is exactly the plain Estimator. With `use_cs=True`, `train`
first compiles (capture -> lower -> validate -> plan -> simulate -> report; cached), fails
fast when the model does not fit, then trains for real on the host with the engine's predicted
throughput logged beside the host's, and TensorBoard gets the simulated scalars and the wafer
picture.

tf.estimator.Estimator refuses subclasses that override `train`, `evaluate` or `predict`
(it checks the concrete class's own __dict__), so those live in a mixin placed before
Estimator in the MRO.
"""

import contextlib
import copy
import functools
import os
from typing import Optional

import tensorflow as tf
from tensorflow_estimator.python.estimator import model_fn as model_fn_lib
from tensorflow_estimator.python.estimator import util as estimator_util

from cerebras_tf.compiler import compile as compile_lib
from cerebras_tf.compiler.plan import base as plan_base
from cerebras_tf.errors import CompileError, FitError, TrainingError
from cerebras_tf.run_config import CSConfig, CSRunConfig

ModeKeys = tf.estimator.ModeKeys
_SECTION = {ModeKeys.TRAIN: "train_input", ModeKeys.EVAL: "eval_input",
            ModeKeys.PREDICT: "eval_input"}


def _call_with_supported_args(fn, **kwargs):
  """Calls `fn` with the subset of kwargs its signature names (the Estimator's convention)."""
  args = estimator_util.fn_args(fn)
  return fn(**{k: v for k, v in kwargs.items() if k in args})


def batch_size_for_mode(params: dict, mode: str) -> Optional[int]:
  """The global batch size the params imply for `mode` (nested YAML or flat params)."""
  section = params.get(_SECTION.get(mode, "train_input"))
  if isinstance(section, dict) and section.get("batch_size"):
    return int(section["batch_size"])
  if params.get("batch_size"):
    return int(params["batch_size"])
  return None


def params_with_batch(params: dict, mode: str, batch_size: int) -> dict:
  """A copy of params whose batch size for `mode` is `batch_size` (e.g. per replica)."""
  out = copy.deepcopy(params)
  section = out.get(_SECTION.get(mode, "train_input"))
  if isinstance(section, dict) and "batch_size" in section:
    section["batch_size"] = batch_size
  if "batch_size" in out:
    out["batch_size"] = batch_size
  return out


class _CerebrasMethods:
  """train/evaluate/predict with `use_cs`; a mixin so tf.estimator accepts the subclass."""

  def train(self, input_fn, hooks=None, steps=None, max_steps=None, saving_listeners=None,
            use_cs=None):
    """Trains; with use_cs=True compiles for the engine first and fails fast if it won't fit."""
    if not self._resolve_use_cs(use_cs):
      return tf.estimator.Estimator.train(self, input_fn, hooks=hooks, steps=steps,
                                          max_steps=max_steps, saving_listeners=saving_listeners)
    result = self.compile(input_fn, mode=ModeKeys.TRAIN)
    self._raise_unless_fits(result)
    from cerebras_tf.runtime import checkpoints  # pylint: disable=import-outside-toplevel
    checkpoints.ensure_restorable(self.model_dir)
    last_step = max_steps
    if last_step is None and steps is not None:
      last_step = self._current_step() + steps
    self._cs_run = {"result": result, "last_step": last_step}
    try:
      with self._runtime_for(result.plan) as replicas:
        if replicas > 1:
          input_fn = self._per_replica_input_fn(input_fn, result.plan.batch_size // replicas)
        elif result.plan.execution_strategy == plan_base.PIPELINED:
          # The input pipeline's position is checkpointed with the model, so a resumed run
          # neither repeats nor skips batches. "warn": pipelines that draw random numbers
          # (BERT's on-the-fly masking) save their position; their RNG state restarts.
          hooks = list(hooks or []) + [tf.data.experimental.CheckpointInputPipelineHook(
              self, external_state_policy="warn")]
        return tf.estimator.Estimator.train(self, input_fn, hooks=hooks, steps=steps,
                                            max_steps=max_steps,
                                            saving_listeners=saving_listeners)
    except tf.compat.v1.train.NanLossDuringTrainingError as e:
      # tf.estimator's own NanTensorHook can fire before ours: say the same thing.
      hook = self._cs_run.get("hook")
      raise TrainingError(hook.nan_message(float("nan")) if hook else str(e)) from None
    finally:
      self._cs_run = None

  def evaluate(self, input_fn, steps=None, hooks=None, checkpoint_path=None, name=None,
               use_cs=None):
    """Evaluates; with use_cs=True the model is compiled (cached) and checked first."""
    if self._resolve_use_cs(use_cs):
      self._raise_unless_fits(self.compile(input_fn, mode=ModeKeys.TRAIN))
    return tf.estimator.Estimator.evaluate(self, input_fn, steps=steps, hooks=hooks,
                                           checkpoint_path=checkpoint_path, name=name)

  def predict(self, input_fn, predict_keys=None, hooks=None, checkpoint_path=None,
              yield_single_examples=True, use_cs=None):
    """Predicts; with use_cs=True the model is compiled (cached) and checked first."""
    if self._resolve_use_cs(use_cs):
      self._raise_unless_fits(self.compile(input_fn, mode=ModeKeys.TRAIN))
    return tf.estimator.Estimator.predict(self, input_fn, predict_keys=predict_keys, hooks=hooks,
                                          checkpoint_path=checkpoint_path,
                                          yield_single_examples=yield_single_examples)


class CerebrasEstimator(_CerebrasMethods, tf.estimator.Estimator):
  """A tf.estimator.Estimator that targets the (simulated) Cerebras engine when use_cs=True.

  Args:
    model_fn: the user's `model_fn(features, labels, mode, params, config)`, unchanged.
    model_dir: checkpoints and summaries.
    compile_dir: where compile reports and the compile cache go (default `<model_dir>/cs_compile`).
    config: a `CSRunConfig` (a plain `RunConfig` means the default `CSConfig`).
    params: dict passed to model_fn and input_fn.
    warm_start_from: as for tf.estimator.Estimator.
    use_cs: legacy default for the `use_cs` argument of train/evaluate/predict.
  """

  def __init__(self, model_fn, model_dir=None, compile_dir=None, config=None, params=None,
               warm_start_from=None, use_cs=None):
    model_fn_lib.verify_model_fn_args(model_fn, params)
    self._user_model_fn = model_fn
    self._default_use_cs = bool(use_cs)
    self._cs_run = None
    self._compile_memo = {}
    super().__init__(model_fn=self._wrap_model_fn(model_fn), model_dir=model_dir,
                     config=config, params=params, warm_start_from=warm_start_from)
    self._compile_dir = compile_dir or os.path.join(self.model_dir, "cs_compile")

  # --- configuration ----------------------------------------------------------------------

  @property
  def compile_dir(self) -> str:
    return self._compile_dir

  @property
  def cs_config(self) -> CSConfig:
    cfg = self.config
    return cfg.cs_config if isinstance(cfg, CSRunConfig) else CSConfig()

  def _resolve_use_cs(self, use_cs) -> bool:
    return self._default_use_cs if use_cs is None else bool(use_cs)

  def _current_step(self) -> int:
    ckpt = tf.train.latest_checkpoint(self.model_dir)
    if not ckpt:
      return 0
    try:
      return int(tf.train.load_variable(ckpt, tf.compat.v1.GraphKeys.GLOBAL_STEP))
    except (tf.errors.NotFoundError, ValueError):
      return 0

  # --- the runtime for the plan's execution strategy ----------------------------------------

  @contextlib.contextmanager
  def _runtime_for(self, plan):
    """Installs the plan's runtime for one call; yields the number of data-parallel replicas.

    pipelined: as is. multi_replica: MirroredStrategy over the host's replicas
    (`strategies.host_replicas`: the plan's R when csconfig.num_replicas set it, else at most
    2 logical CPUs or one per GPU, always the plan's global batch). When `auto` chose
    multi_replica and TensorFlow already runs with too few devices, training falls back to one
    device (same update on the same global batch) with a warning; an explicit multi_replica
    keeps the ConfigError. weight_streaming: variables and optimizer on ps tasks (MemoryX),
    compute on one device per CS system in this process, synchronously (one device: a device
    function; several: CentralStorageStrategy with the ps as the parameter device).
    """
    from cerebras_tf.errors import ConfigError  # pylint: disable=import-outside-toplevel
    from cerebras_tf.runtime import strategies  # pylint: disable=import-outside-toplevel
    strategy_name = plan.execution_strategy
    replicas = (plan.num_replicas if strategy_name == plan_base.MULTI_REPLICA
                else plan.num_csx if strategy_name == plan_base.WEIGHT_STREAMING else 1)
    strategy = None
    if strategy_name == plan_base.MULTI_REPLICA and replicas > 1:
      cs = self.cs_config
      chosen_by = "auto" if cs.execution_strategy == plan_base.AUTO else "the compiler"
      if strategies.multi_worker():
        host = replicas  # MultiWorkerMirroredStrategy: the cluster decides the devices
      else:
        host = strategies.host_replicas(replicas, plan.batch_size, cs.num_replicas is not None,
                                        len(tf.config.list_physical_devices("GPU")))
      if host != replicas:
        tf.compat.v1.logging.info(
            "cerebras_tf: multi_replica plan: R=%d replicas on the engine (chosen by %s); the "
            "host trains them as %d replica(s) of %d samples: the same global batch %d and "
            "synchronous update (csconfig.num_replicas fixes R on both)", replicas, chosen_by,
            host, plan.batch_size // host, plan.batch_size)
      if host > 1:
        try:
          strategy = strategies.mirrored_strategy(host)
        except ConfigError as e:
          if cs.execution_strategy != plan_base.AUTO:
            raise
          tf.compat.v1.logging.warning(
              "cerebras_tf: auto chose multi_replica (R=%d), but the host cannot run %d "
              "replicas here (%s); it trains on one device instead: the same update on the "
              "global batch %d, as pipelined does", replicas, host, e, plan.batch_size)
          host = 1
      replicas = host
    if strategy_name not in (plan_base.MULTI_REPLICA, plan_base.WEIGHT_STREAMING) or (
        strategy_name == plan_base.MULTI_REPLICA and replicas <= 1):
      yield 1
      return
    saved = (self._config, self._train_distribution, self._session_config, self._device_fn)
    config = copy.copy(self._config)  # RunConfig.replace refuses unvalidated strategies
    if strategy_name == plan_base.MULTI_REPLICA:
      config._train_distribute = strategy  # pylint: disable=protected-access
      where = ", ".join(strategy.extended.worker_devices)
    else:
      from cerebras_tf.runtime import cluster as cluster_lib  # pylint: disable=import-outside-toplevel
      client = cluster_lib.client_for(self.cs_config.max_wgt_servers,
                                      os.path.join(self.model_dir, "cluster_logs"), replicas)
      config._master = client.target  # pylint: disable=protected-access
      # Fail cleanly (checkpoints intact) rather than wait 2 h for a weight server that is gone.
      config._session_creation_timeout_secs = cluster_lib.SESSION_TIMEOUT_S  # pylint: disable=protected-access
      if replicas == 1:
        config._device_fn = client.device_fn()  # pylint: disable=protected-access
      else:
        config._train_distribute = client.strategy(replicas)  # pylint: disable=protected-access
      where = f"{len(client.cluster['ps'])} weight server(s) {', '.join(client.cluster['ps'])}"
    config._session_config = strategies.session_config(replicas)  # pylint: disable=protected-access
    self._config, self._train_distribution = config, config.train_distribute
    self._session_config, self._device_fn = config.session_config, config.device_fn
    tf.compat.v1.logging.info("cerebras_tf: %s runtime: %d replica(s); %s", strategy_name,
                              replicas, where)
    try:
      yield replicas
    finally:
      self._config, self._train_distribution, self._session_config, self._device_fn = saved

  def _per_replica_input_fn(self, input_fn, per_replica_batch: int):
    """input_fn called with params whose batch size is the per-replica batch."""
    def wrapped(params, mode, config, input_context=None):
      return _call_with_supported_args(
          input_fn, params=params_with_batch(params, mode, per_replica_batch), mode=mode,
          config=config, input_context=input_context)
    return wrapped

  # --- the model_fn seen by tf.estimator -------------------------------------------------

  def _wrap_model_fn(self, user_model_fn):
    @functools.wraps(user_model_fn)
    def model_fn(features, labels, mode, params, config):
      spec = _call_with_supported_args(user_model_fn, features=features, labels=labels,
                                       mode=mode, params=params, config=config)
      run = self._cs_run
      if run is not None and mode == ModeKeys.TRAIN and isinstance(spec, tf.estimator.EstimatorSpec):
        spec = spec._replace(training_hooks=tuple(spec.training_hooks) + (
            self._progress_hook(spec.loss, run),))
      return spec
    return model_fn

  def _progress_hook(self, loss, run):
    from cerebras_tf.runtime.hooks import CSProgressHook  # pylint: disable=import-outside-toplevel
    result = run["result"]
    png = None
    wafer = result.report_paths.get("wafer")
    if wafer and os.path.exists(wafer):
      with open(wafer, "rb") as fh:
        png = fh.read()
    run["hook"] = CSProgressHook(
        loss=loss, batch_size=result.plan.batch_size,
        simulated_samples_per_sec=result.performance.samples_per_sec,
        utilization=result.performance.utilization, summary_dir=self.model_dir,
        last_step=run["last_step"], every_n_steps=self.config.log_step_count_steps or 100,
        wafer_png=png, model_dir=self.model_dir)
    return run["hook"]

  # --- compile ----------------------------------------------------------------------------

  def compile(self, input_fn, validate_only=False, mode=ModeKeys.TRAIN):
    """Compiles the model for the engine in the configured execution strategy.

    Args:
      input_fn: the training input_fn (its element spec fixes the input shapes).
      validate_only: stop after checking every op against the engine's kernels.
      mode: only TRAIN graphs are compiled (the engine trains); other modes reuse them.

    Returns:
      A `CompileResult` (plan, performance, report paths, whether it came from the cache).

    Raises:
      UnsupportedOpError: an op has no engine kernel (names op, type and source line).
      CompileError: the graph cannot be captured with static shapes.
    """
    from cerebras_tf.compiler import capture, lower  # pylint: disable=import-outside-toplevel
    from cerebras_tf.engine import spec as spec_lib  # pylint: disable=import-outside-toplevel
    del mode  # The engine compiles the training graph; eval/predict reuse it.
    t0 = compile_lib.now()
    cs = self.cs_config
    engine = spec_lib.load_engine(cs.engine)
    engine_file = engine.source_path
    params = self.params
    key = compile_lib.fast_key(self._user_model_fn, params, engine_file, cs._asdict(),
                               "validate" if validate_only else ModeKeys.TRAIN)
    cache = compile_lib.CompileCache(self._compile_dir)
    hit = self._compile_memo.get(key) or (None if validate_only else cache.get(key))
    if hit is not None:
      result = (hit if isinstance(hit, compile_lib.CompileResult)
                else compile_lib.result_from_entry(hit, self._compile_dir, 0.0))
      result = compile_lib.dataclasses.replace(result, cached=True,
                                               seconds=compile_lib.now() - t0)
      self._log_compile(result)
      return result

    default_batch = batch_size_for_mode(params, ModeKeys.TRAIN)
    captured = capture.capture(
        lambda: self._call_input_fn(input_fn, ModeKeys.TRAIN),
        lambda f, l: self._call_model_fn(f, l, ModeKeys.TRAIN, self.config),
        default_batch or 0)
    if not captured.batch_size:
      raise CompileError("cannot tell the batch size: batch the dataset with drop_remainder=True "
                         "or set train_input.batch_size in params")
    fwd = lower.forward_ops(captured)
    lower.validate(captured, fwd)
    if validate_only:
      result = compile_lib.CompileResult(None, None, None, {}, False, self._compile_dir,
                                         compile_lib.now() - t0, validate_only=True)
      self._compile_memo[key] = result
      tf.compat.v1.logging.info("cerebras_tf: validation passed: every op has an engine kernel")
      return result
    name = getattr(self._user_model_fn, "__module__", "model") or "model"
    seq_len = _seq_len(captured)
    sources = _length_sources(captured, seq_len)
    graph = lower.lower(captured, name=name, fwd=fwd, seq_len=seq_len,
                        token_lengths=sorted({s.seq_len for s in sources}))
    options = plan_base.PlanOptions(
        batch_size=captured.batch_size, execution_strategy=cs.execution_strategy,
        num_csx=cs.num_csx, num_replicas=cs.num_replicas, max_wgt_servers=cs.max_wgt_servers,
        sparsity=cs.sparsity, vts=cs.vts,
        **(self._token_fractions(input_fn, captured, sources) if cs.vts else {}))
    gkey = compile_lib.graph_key(graph, engine_file, options)
    entry = cache.get(gkey)
    if entry is not None:
      result = compile_lib.result_from_entry(entry, self._compile_dir, compile_lib.now() - t0)
    else:
      the_plan, perf, paths = compile_lib.plan_and_report(graph, engine, options,
                                                          self._compile_dir)
      result = compile_lib.CompileResult(graph, the_plan, perf, paths, False, self._compile_dir,
                                         compile_lib.now() - t0)
      cache.put([key, gkey], {"graph": graph.to_dict(), "plan": the_plan.to_dict(),
                              "performance": perf.to_dict(), "report_paths": paths})
    self._compile_memo[key] = result
    self._log_compile(result)
    return result

  def _token_fractions(self, input_fn, captured, sources) -> dict:
    """VTS: token_fraction / token_sq_fraction measured on a sample of the training input.

    The lengths are relative to the captured (compiled) static shapes. The fractions go into
    PlanOptions, hence into the graph cache key: a VTS compile never reuses a padded entry.
    """
    from cerebras_tf.compiler import tokens  # pylint: disable=import-outside-toplevel
    if not sources:
      names = ", ".join(f"{n}{t.shape.as_list()}"
                        for n, t in sorted(captured.inputs.items())) or "none"
      raise CompileError(f"csconfig.vts is true but the training input says no sequence lengths: "
                         f"looked for {tokens.LOOKED_FOR} among the inputs ({names}); add a "
                         f"padding mask or a length feature to the input_fn, or set "
                         f"csconfig.vts false")
    stats = tokens.measure(lambda: self._call_input_fn(input_fn, ModeKeys.TRAIN), sources,
                           seed=self.config.tf_random_seed)
    if not stats[0].sequences:
      raise CompileError(f"csconfig.vts is true but the training input_fn gave no batch to "
                         f"measure sequence lengths on (read {sources[0].feature}); check "
                         f"its data files, or set csconfig.vts false")
    pooled = tokens.pool(stats)
    where = tokens.describe(sources, stats)
    tf.compat.v1.logging.info("cerebras_tf: VTS %s: token_fraction %.3f, token_sq_fraction %.3f",
                              where, pooled.token_fraction, pooled.token_sq_fraction)
    return {"token_fraction": pooled.token_fraction,
            "token_sq_fraction": pooled.token_sq_fraction, "vts_source": where}

  def _log_compile(self, result):
    from cerebras_tf.engine import report  # pylint: disable=import-outside-toplevel
    how = "compile cache hit" if result.cached else "compiled"
    tf.compat.v1.logging.info("cerebras_tf: %s in %.2fs; reports in %s\n%s", how, result.seconds,
                              result.compile_dir,
                              report.format_summary(result.plan, result.performance))

  def _raise_unless_fits(self, result):
    if not result.plan.fits:
      raise FitError(f"model does not fit {result.plan.engine} in {result.plan.execution_strategy} "
                     f"mode: {result.plan.reason}")


def _seq_len(captured) -> int:
  """The sequence length: the longest 2nd dim of the rank-2 integer features, else 0.

  The longest, not the first: BERT's `masked_lm_ids` [batch, max_predictions] sorts before
  `token_ids` [batch, max_seq_length].
  """
  lengths = [int(t.shape[1]) for name, t in captured.inputs.items()
             if name.startswith("features") and t.dtype.is_integer and t.shape.rank == 2
             and t.shape[1] is not None]
  return max(lengths, default=0)


def _length_sources(captured, seq_len: int):
  """Where VTS reads sequence lengths from (compiler/tokens.py), from the captured inputs."""
  from cerebras_tf.compiler import tokens  # pylint: disable=import-outside-toplevel
  return tokens.find_length_sources(
      {n: (t.shape.as_list(), t.dtype.name) for n, t in captured.inputs.items()}, seq_len)
