"""Runs a validated params dict: train, eval, eval_all, train_and_eval, predict, or compile.

`scripts/run.py` (through `cerebras_tf.cli`) loads params, then calls `run(params, opts)`. The
model comes from `cerebras_tf.registry` by `model.name`; its `input_fn(params, mode)` is bound to a
mode with functools.partial so the Estimator sees the usual `input_fn(params)`.

TensorFlow is imported only when an estimator is built, so bad options fail fast.
"""

import contextlib
import dataclasses
import functools
import importlib
import json
import logging
import math
import os
import tempfile
import time
from typing import Any, Callable, Dict, Optional

from cerebras_tf import registry
from cerebras_tf.engine import report as engine_report
from cerebras_tf.errors import ConfigError, FitError, ParamsError
from cerebras_tf.runtime import tf_config
from cerebras_tf.runtime.dir_lock import check_local, model_dir_lock
from cerebras_tf.runtime.ckpt_files import latest_step, list_checkpoints, step_of
from cerebras_tf.schema import MAX_STEPS, MODES

# tf.estimator.ModeKeys values, spelled out to keep TensorFlow out of this module's imports.
TRAIN, EVAL, PREDICT = "train", "eval", "infer"


@dataclasses.dataclass(frozen=True)
class RunOptions:
  """What to do with the params (from flags). None means: take it from params."""

  mode: str = "train"
  validate_only: bool = False
  compile_only: bool = False
  steps: Optional[int] = None        # train this many more steps (instead of max_steps)
  max_steps: Optional[int] = None    # train up to this global step
  eval_steps: Optional[int] = None   # eval batches; None or 0: all the eval data
  checkpoint_path: Optional[str] = None
  use_cs: bool = True
  export_dir: Optional[str] = None   # SavedModel base directory (mode export, or after training)

  def __post_init__(self):
    if self.mode not in MODES:
      raise ConfigError(f"--mode must be one of {', '.join(MODES)}, got {self.mode!r}")
    for name, low in (("steps", 1), ("max_steps", 1), ("eval_steps", 0)):
      value = getattr(self, name)
      if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                or not low <= value <= MAX_STEPS):
        raise ConfigError(f"--{name} must be an int in [{low}, {MAX_STEPS}] (TensorFlow counts "
                          f"steps in int64), got {value!r}")
    if self.steps is not None and self.max_steps is not None:
      raise ConfigError("--steps and --max_steps are exclusive: --steps trains that many more "
                        "steps, --max_steps trains up to that global step")
    if self.mode == "export" and not self.export_dir:
      raise ConfigError("--mode export needs --export_dir: where to write the SavedModel")
    if (self.validate_only or self.compile_only) and not self.use_cs:
      flag = "--validate_only" if self.validate_only else "--compile_only"
      raise ConfigError(f"{flag} compiles for the engine; it cannot be combined with --no_cs")


def check_sections(params: dict, opts: RunOptions, params_path: Optional[str] = None) -> None:
  """The params sections `opts.mode` reads are there, before anything runs: train_and_eval
  would otherwise train first and fail at its evaluation (modelzoo's FC-MNIST file has no
  eval_input)."""
  needs_eval = opts.mode in ("eval", "eval_all", "train_and_eval") or (
      opts.mode == "predict" and "predict_input" not in params)
  if needs_eval and "eval_input" not in params and not (opts.validate_only or
                                                         opts.compile_only):
    where = f" {params_path}" if params_path else ""
    raise ParamsError(f"mode '{opts.mode}' needs an eval_input section in the params "
                      f"file{where}" + ("; --mode train trains without one"
                                        if opts.mode == "train_and_eval" else ""))


def make_estimator(model_fn: Callable, params: dict, opts: RunOptions):
  """CerebrasEstimator + CSRunConfig from the params sections `runconfig` and `csconfig`."""
  # What TensorFlow would otherwise fail on with a traceback, checked before it starts.
  cluster = tf_config.current()
  if cluster is not None and cluster.multi_worker:
    for section in ("train_input", "eval_input"):
      if (params.get(section) or {}).get("use_multiple_workers") is False:
        raise ConfigError(
            f"{section}.use_multiple_workers is false, but TF_CONFIG has "
            f"{cluster.num_workers} workers: each worker reads its own shard of the input "
            f"here; set it to true (or remove it)")
  check_model_dir(params["runconfig"]["model_dir"])
  check_compile_dir(params["csconfig"]["compile_dir"])
  if opts.mode == "export" or opts.export_dir:
    check_export_dir(opts.export_dir)
  if opts.checkpoint_path and opts.mode in ("eval", "predict"):
    check_checkpoint_path(opts.checkpoint_path)
  if params["runconfig"]["warm_start"]:
    check_checkpoint_path(params["runconfig"]["warm_start"], "--warm_start", dir_ok=True)
  # pylint: disable=import-outside-toplevel
  import tensorflow as tf
  from tensorflow.python.util import deprecation
  from cerebras_tf.estimator import CerebrasEstimator
  from cerebras_tf.run_config import CSConfig, CSRunConfig
  rc, cs = params["runconfig"], params["csconfig"]
  # tf.estimator warns on every call that it is deprecated; we know. Other warnings stay.
  deprecation._PRINT_DEPRECATION_WARNINGS = False  # pylint: disable=protected-access
  tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)
  if rc.get("op_determinism"):
    tf.config.experimental.enable_op_determinism()
  config = CSRunConfig(
      model_dir=rc["model_dir"],
      save_checkpoints_steps=rc["save_checkpoints_steps"],
      keep_checkpoint_max=rc["keep_checkpoint_max"],
      log_step_count_steps=rc["log_step_count_steps"],
      save_summary_steps=rc["save_summary_steps"],
      tf_random_seed=rc["tf_random_seed"],
      cs_ip=rc["cs_ip"],
      cs_config=CSConfig(**{key: cs[key] for key in CSConfig._fields}))
  return CerebrasEstimator(model_fn, model_dir=rc["model_dir"], compile_dir=cs["compile_dir"],
                           config=config, params=params, init_checkpoint=rc["warm_start"])


def run(params: dict, opts: RunOptions,
        estimator_factory: Callable[[Callable, dict, RunOptions], Any] = make_estimator) -> dict:
  """Does what `opts.mode` says; returns a summary dict (see `format_summary`)."""
  spec = registry.get_model(params["model"]["name"])
  model_fn, input_fn = spec.resolve()
  rc = params["runconfig"]
  mode = opts.mode

  def input_for(tf_mode):
    if tf_mode == PREDICT and "predict_input" in params:  # modelzoo's fine-tuning files
      return functools.partial(with_predict_input, input_fn=input_fn, mode=tf_mode)
    return functools.partial(input_fn, mode=tf_mode)

  max_steps = opts.max_steps if opts.max_steps is not None else rc["max_steps"]
  eval_steps = opts.eval_steps if opts.eval_steps is not None else rc["eval_steps"]
  eval_steps = eval_steps or None  # modelzoo: 0 means all the eval data
  trains = mode in ("train", "train_and_eval")
  evals = mode in ("eval", "eval_all", "train_and_eval")
  check_sections(params, opts)
  if trains and opts.steps is None and max_steps is None and params["train_input"]["repeat"] \
      and not (opts.validate_only or opts.compile_only):
    raise ParamsError(f"mode '{mode}' with train_input.repeat: true never ends: set "
                      "runconfig.max_steps (or --max_steps / --steps)")
  if evals and eval_steps is None and params.get("eval_input", {}).get("repeat") \
      and not (opts.validate_only or opts.compile_only):
    raise ParamsError(f"mode '{mode}' with eval_input.repeat: true never ends: set "
                      "runconfig.eval_steps (or --eval_steps)")

  est = estimator_factory(model_fn, params, opts)
  summary: Dict[str, Any] = {"mode": mode, "model": spec.name, "model_dir": rc["model_dir"]}
  if opts.export_dir and trains:
    check_serving(spec, params)  # before the training it would follow, not after

  if opts.validate_only or opts.compile_only:
    result = est.compile(input_for(TRAIN), validate_only=opts.validate_only, mode=TRAIN)
    summary.update(mode="validate_only" if opts.validate_only else "compile_only",
                   compile=result)
    plan = getattr(result, "plan", None)
    if plan is not None and not plan.fits:
      raise FitError(f"model does not fit {plan.engine} in {plan.execution_strategy} mode: "
                     f"{plan.reason}")
    if plan is not None and max_steps and result.performance is not None:
      summary["engine_time"] = engine_report.engine_time(plan, result.graph, result.performance,
                                                         max_steps)
    if plan is not None and result.performance is not None:
      # How fast it would train includes whether this input could keep the systems fed.
      summary["input_rate"] = est.time_input(input_for(TRAIN), result)
    return summary

  use_cs = opts.use_cs and rc["use_cs"]
  with (model_dir_lock(rc["model_dir"]) if trains else contextlib.nullcontext()):
    _run_mode(est, spec, params, opts, summary, input_for, use_cs, max_steps, eval_steps)
  return summary


def with_predict_input(params, input_fn, mode):
  """input_fn reading the predict_input section where it reads eval_input's (a family's
  input reads eval_input for every mode but train), as modelzoo's predict does."""
  return input_fn({**params, "eval_input": params["predict_input"]}, mode)


def write_predictions(predictions, directory: str, name: Callable[[], str]):
  """Writes each prediction as one JSON line (arrays as lists, bytes as text) to the path
  `name()` gives once they are all written; returns (count, keys, path). Written to a `.tmp`
  file in `directory` and renamed at the end, so an interrupted predict leaves no partial
  file."""
  os.makedirs(directory, exist_ok=True)
  tmp = os.path.join(directory, f".predictions-{os.getpid()}.tmp")
  count, keys = 0, set()
  try:
    with open(tmp, "w", encoding="utf-8") as fh:
      for prediction in predictions:
        count += 1
        if isinstance(prediction, dict):
          keys.update(prediction)
        fh.write(json.dumps(_jsonable(prediction)) + "\n")
    path = name()
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise
  return count, keys, path


def _jsonable(value):
  if isinstance(value, dict):
    return {str(k): _jsonable(v) for k, v in value.items()}
  if isinstance(value, bytes):
    return value.decode("utf-8", errors="replace")
  if hasattr(value, "tolist"):  # numpy arrays and scalars, without importing numpy here
    return _jsonable(value.tolist())
  if isinstance(value, (list, tuple)):
    return [_jsonable(v) for v in value]
  return value


def _chiefs_work(mode: str, summary: dict) -> bool:
  """True when another task does `mode`'s work: in a cluster the chief evaluates and predicts
  for every task (the others read the same checkpoints, and their eval events would land in
  the chief's model_dir, clobbering its own in the same second)."""
  cluster = tf_config.non_chief_task()
  if cluster is None:
    return False
  logging.getLogger("tensorflow").info(
      "cerebras_tf: %s: %s is the chief's work; this task (%s) %s", mode,
      "prediction" if mode == "predict" else "evaluation", cluster.task,
      "trains only" if mode == "train_and_eval" else "has nothing to do")
  summary["not_here"] = (f"{'predictions' if mode == 'predict' else 'evaluation'}: the "
                         f"chief's (this task is {cluster.task})")
  return True


def _run_mode(est, spec, params, opts, summary, input_for, use_cs, max_steps, eval_steps):
  rc, mode = params["runconfig"], opts.mode
  elsewhere = mode in ("eval", "eval_all", "train_and_eval", "predict") \
      and _chiefs_work(mode, summary)
  if elsewhere and mode != "train_and_eval":
    return
  if mode == "train":
    est.train(input_for(TRAIN), steps=opts.steps,
              max_steps=None if opts.steps is not None else max_steps, use_cs=use_cs)
    summary["global_step"] = latest_step(rc["model_dir"])
  elif mode == "eval":
    eval_input = input_for(EVAL)  # a params file without eval_input says so first
    require_checkpoint("evaluate", rc, opts.checkpoint_path)
    summary["evals"] = [est.evaluate(eval_input, steps=eval_steps,
                                     checkpoint_path=opts.checkpoint_path, use_cs=use_cs)]
  elif mode == "eval_all":
    checkpoints = list_checkpoints(rc["model_dir"])
    if not checkpoints:
      raise ConfigError(f"eval_all: no checkpoints in model_dir {rc['model_dir']}")
    summary["evals"] = []
    for ckpt in checkpoints:
      try:
        summary["evals"].append(est.evaluate(input_for(EVAL), steps=eval_steps,
                                             checkpoint_path=ckpt, use_cs=use_cs))
      except Exception:  # pylint: disable=broad-except  # re-raised unless the file is gone
        if os.path.exists(ckpt + ".index"):
          raise
        # Beside a training run that keeps its newest checkpoints only.
        logging.getLogger("tensorflow").warning(
            "cerebras_tf: eval_all: %s was deleted (a training run on this model_dir keeps "
            "its newest checkpoints only); skipped", os.path.basename(ckpt))
  elif mode == "train_and_eval":
    step = latest_step(rc["model_dir"])
    last = step + opts.steps if opts.steps is not None else max_steps
    interval = rc.get("eval_frequency") or rc["save_checkpoints_steps"] or last
    throttle = rc.get("throttle_secs") or 0
    summary["evals"] = []
    if step >= last:  # the loop below trains and evaluates nothing: say so, not only the step
      summary["nothing_to_do"] = (
          f"{rc['model_dir']} is at step {step} already, max_steps is {last}: nothing to train "
          f"or evaluate; --mode eval evaluates it again, a higher --max_steps trains on, "
          f"another --model_dir starts over")
    evaluated_at = None  # monotonic time the last evaluation started
    while step < last:
      target = min(step + interval, last)
      est.train(input_for(TRAIN), max_steps=target, use_cs=use_cs, run_max_steps=last)
      step = target  # never loop on a step counter that does not move
      if (target < last and evaluated_at is not None
          and time.monotonic() - evaluated_at < throttle):
        continue  # tf.estimator.train_and_evaluate's throttle_secs; the last round evaluates
      evaluated_at = time.monotonic()
      if elsewhere:
        continue
      metrics = est.evaluate(input_for(EVAL), steps=eval_steps, use_cs=use_cs)
      summary["evals"].append(metrics)
      if isinstance(metrics, dict):
        step = max(int(metrics.get("global_step", target)), target)
    summary["global_step"] = step
  elif mode == "predict":
    def path():  # named once predict is done: a training run may have moved the latest on
      step = step_of(est.last_predict_checkpoint or opts.checkpoint_path or "")
      step = step if step >= 0 else latest_step(rc["model_dir"])
      return os.path.join(rc["model_dir"], "predictions", f"predictions-{step}.jsonl")
    predict_input = input_for(PREDICT)  # a params file without its input section says so first
    require_checkpoint("predict", rc, opts.checkpoint_path)
    count, keys, written = write_predictions(
        est.predict(predict_input, checkpoint_path=opts.checkpoint_path, use_cs=use_cs),
        os.path.join(rc["model_dir"], "predictions"), path)
    summary.update(predictions=count, prediction_keys=sorted(keys), predictions_file=written)
  if opts.export_dir and mode in ("export", "train", "train_and_eval"):
    summary["export"] = export(est, spec, params, opts.export_dir, opts.checkpoint_path)


def require_checkpoint(what: str, rc: dict, checkpoint_path: Optional[str]) -> None:
  """The command line evaluates or predicts a trained model only: the metrics of an
  initialized one are not an answer (the Python class, as tf.estimator, runs them with a
  warning)."""
  if checkpoint_path or rc.get("warm_start") or list_checkpoints(rc["model_dir"]):
    return
  raise ConfigError(f"{what}: no checkpoint in model_dir {rc['model_dir']}: nothing trained to "
                    f"{what}; train first, or check --model_dir (or pass --checkpoint_path)")


def check_serving(spec, params: dict) -> Callable:
  """The model's serving_input_receiver_fn, built once in a scratch graph: an export it cannot
  make fails here with its own one line (before training, and before TF's export leaves a
  temp-* directory behind). TensorFlow is loaded by then (the estimator)."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  serving_fn = serving_input_fn_for(spec)
  with tf.Graph().as_default():
    serving_fn(params)
  return serving_fn


def serving_input_fn_for(spec) -> Callable:
  """The model family's `serving_input_receiver_fn(params)`: from its package's `export`
  module, else from its input_fn's module. A module that exists but fails to import raises."""
  _, input_fn = spec.resolve()
  package = registry.installed_families().get(spec.name, getattr(input_fn, "__module__", "").rpartition(".")[0])
  for module in (f"{package}.export", getattr(input_fn, "__module__", "")):
    try:
      fn = getattr(importlib.import_module(module), "serving_input_receiver_fn", None)
    except ModuleNotFoundError as e:
      if e.name != module:
        raise
      continue
    if fn is not None:
      return fn
  raise ConfigError(f"model {spec.name} has no serving_input_receiver_fn: it cannot be "
                    "exported as a SavedModel")


def export(est, spec, params: dict, export_dir: str,
           checkpoint_path: Optional[str] = None) -> str:
  """Writes a SavedModel of the latest (or the given) checkpoint; returns its directory."""
  if checkpoint_path is None and not list_checkpoints(params["runconfig"]["model_dir"]):
    raise ConfigError(f"export: no checkpoints in model_dir {params['runconfig']['model_dir']}")
  serving_fn = check_serving(spec, params)
  path = est.export_saved_model(export_dir, functools.partial(serving_fn, params),
                                checkpoint_path=checkpoint_path)
  return path.decode() if isinstance(path, bytes) else str(path)


def check_model_dir(model_dir: str) -> None:
  """Creates `model_dir` if needed; a path that cannot be a writable directory is a one-line
  ConfigError here rather than a traceback from deep inside the Estimator."""
  check_local(model_dir, "runconfig.model_dir")
  check_writable_dir(model_dir, "runconfig.model_dir", "--model_dir")


def check_compile_dir(compile_dir: Optional[str]) -> None:
  """csconfig.compile_dir (--compile_dir) must be a directory or a path that can become one."""
  if not compile_dir:
    return
  check_local(compile_dir, "csconfig.compile_dir")
  if os.path.exists(compile_dir) and not os.path.isdir(compile_dir):
    raise ConfigError(f"csconfig.compile_dir {compile_dir} is a file, not a directory; choose "
                      "a directory for the compiler's reports and cache (--compile_dir)")
  check_writable_dir(compile_dir, "csconfig.compile_dir", "--compile_dir")


def check_export_dir(export_dir: Optional[str]) -> None:
  """--export_dir must be a directory the SavedModel's timestamped subdirectory can go in."""
  if not export_dir or "://" in export_dir:
    return
  if os.path.exists(export_dir) and not os.path.isdir(export_dir):
    raise ConfigError(f"--export_dir {export_dir} is a file, not a directory; choose a "
                      f"directory for the SavedModel (--export_dir)")
  # Not kept: the export makes it when it writes, and a run refused later (an export that
  # cannot work, checked once TensorFlow is loaded) leaves no empty export_dir behind.
  check_writable_dir(export_dir, "--export_dir", "--export_dir", keep=False)


def check_writable_dir(path: str, key: str, flag: str, keep: bool = True) -> None:
  """Creates `path` if needed and checks a file can be made in it: one rule for every
  directory the framework writes. os.access does not do: root passes it on a read-only
  mount's permission bits, and it says nothing of a full disk. With keep=False the
  directories it created are removed again."""
  created = []  # the missing ancestors of path, path first
  missing = os.path.abspath(path)
  while missing and not os.path.exists(missing):
    created.append(missing)
    parent = os.path.dirname(missing)
    if parent == missing:
      break
    missing = parent
  try:
    os.makedirs(path, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path, prefix=".write-check-"):
      pass
  except OSError as e:
    raise ConfigError(f"{key} {path} cannot be {'written' if os.path.isdir(path) else 'created'}"
                      f": {e.strerror or e}; choose a writable directory ({flag})") from None
  finally:
    if not keep:
      for directory in created:
        try:
          os.rmdir(directory)
        except OSError:
          break


def check_checkpoint_path(path: str, flag: str = "--checkpoint_path",
                          dir_ok: bool = False) -> None:
  """`flag` must name a checkpoint prefix (`<dir>/model.ckpt-N`, its .index exists), or with
  `dir_ok` a directory holding checkpoints."""
  if "://" in path or os.path.exists(path + ".index"):
    return
  found = list_checkpoints(path) if os.path.isdir(path) else []
  if found and dir_ok:
    return
  hint = (f"; did you mean {found[-1]}?" if found
          else "; give a prefix such as <model_dir>/model.ckpt-1000 (its .index file must exist)")
  raise ConfigError(f"{flag} {path} is not a checkpoint{hint}")


def format_metrics(metrics: dict) -> str:
  parts = []
  for key in sorted(metrics, key=lambda k: (k != "global_step", k)):
    value = metrics[key]
    try:
      number = float(value)
    except (TypeError, ValueError):
      continue
    if key == "global_step" or (number.is_integer() and abs(number) < 1e15):
      parts.append(f"{key}={int(number)}")
    elif math.isfinite(number):
      parts.append(f"{key}={number:.4g}")
    else:
      parts.append(f"{key}={number}")
  return " ".join(parts)


def format_summary(summary: dict) -> str:
  """A few lines for the terminal."""
  lines = [f"{summary['mode']}: model {summary['model']}, model_dir {summary['model_dir']}"]
  result = summary.get("compile")
  if result is not None:
    plan, perf = getattr(result, "plan", None), getattr(result, "performance", None)
    if plan is None:
      lines.append("validation passed: every op has an engine kernel")
    else:
      lines.append(f"compiled for {plan.engine} ({plan.execution_strategy}): fits, "
                   f"{plan.num_replicas} replica(s)"
                   + (f", {perf.samples_per_sec:.1f} samples/s predicted, bottleneck "
                      f"{perf.bottleneck}" if perf is not None else ""))
      t = summary.get("engine_time")
      if t is not None:
        lines.append(f"{t.steps:,} steps ({t.samples:,} samples) would take {t.text()} on "
                     f"{plan.num_csx} x {plan.engine} (predicted engine time, from step 0)")
      report = getattr(result, "compile_dir", None)
      if report:
        lines.append(f"reports in {report}")
  for metrics in summary.get("evals", []):
    if isinstance(metrics, dict):
      lines.append(f"eval: {format_metrics(metrics)}")
  if "global_step" in summary and not summary.get("evals"):
    lines.append(f"global_step={summary['global_step']}")
  if summary.get("nothing_to_do"):
    lines.append(summary["nothing_to_do"])
  if summary.get("not_here"):
    lines.append(summary["not_here"])
  if summary.get("export"):
    lines.append(f"SavedModel: {summary['export']}")
  if "predictions" in summary:
    keys = ", ".join(summary["prediction_keys"]) or "-"
    lines.append(f"predictions: {summary['predictions']} (keys: {keys}) written to "
                 f"{summary['predictions_file']}")
  return "\n".join(lines)
