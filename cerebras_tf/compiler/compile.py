"""The compile pipeline: capture -> lower -> validate -> plan -> simulate -> report, cached.

`Compiler(compile_dir).compile(...)` runs it for one model; `CerebrasEstimator.compile` only
gathers what the pipeline needs (how to call the user's input_fn and model_fn, the params, the
CSConfig and the host) and hands it over.

Two cache levels, both keyed on what was traced, so that a cached plan can never belong to
another graph or input, wherever the user's code lives (a model_fn in one file, an input_fn in
another, a Keras model built by a script):
  * a trace key: the traced TRAIN graph (its GraphDef, deterministic serialization: every op,
    shape, dtype and constant), the input placeholders' shapes and dtypes, the plan options,
    the engine file and this framework's code. A hit skips lowering, planning and rendering.
    Tracing is not skipped: no key computed from source code alone can see a closure, a
    global or a file the model reads (the stale-plan bug of the source-hash key).
  * a graph key after lowering: the LayerGraph fingerprint + options + engine. A hit skips
    planning and report rendering. VTS compiles use only this one: their options hold token
    fractions measured on the data, which the trace does not see.
Entries are JSON files under `<compile_dir>/cache/`, each with its own copy of the reports
(`cache/<key>/`), which a hit copies back to `<compile_dir>/`; nothing is pickled. The same
directory keeps input timings (`input-<key>.json`, capture.measure_input_rate) for reruns.
"""

import dataclasses
import hashlib
import json
import os
import re
import shutil
import time
import uuid
from typing import Any, Callable, Dict, List, Optional

import tensorflow as tf

from cerebras_tf.compiler import capture, lower, tokens
from cerebras_tf.compiler import plan as plan_lib
from cerebras_tf.core import batching, ir, plans
from cerebras_tf.engine import perf, report
from cerebras_tf.engine import spec as spec_lib
from cerebras_tf.errors import CompileError

CACHE_VERSION = "2"


@dataclasses.dataclass
class CompileResult:
  """What `CerebrasEstimator.compile` returns.

  Attributes:
    graph: the lowered LayerGraph.
    plan: the chosen Plan.
    performance: its predicted Performance.
    report_paths: {"report": ..., "plan": ..., "wafer": ..., "timeline": ...}.
    cached: True when the result came from the compile cache.
    compile_dir: where the reports are.
    seconds: wall time of this compile call.
    validate_only: True when only capture + validation ran (plan/performance are None).
    input_signature: the traced input's names, dtypes and shapes (capture.input_signature).
    built_input: the input pipeline the capture built (capture.BuiltInput), for timing it
      without building it again; never cached (a tf.Graph of this process).
  """

  graph: Optional[ir.LayerGraph]
  plan: Optional[plans.Plan]
  performance: Optional[plans.Performance]
  report_paths: Dict[str, str]
  cached: bool
  compile_dir: str
  seconds: float
  validate_only: bool = False
  input_signature: str = ""
  built_input: Optional[capture.BuiltInput] = None

  @property
  def fits(self) -> bool:
    return bool(self.plan and self.plan.fits)


def _json_default(o):
  if dataclasses.is_dataclass(o):
    return dataclasses.asdict(o)
  if isinstance(o, (set, frozenset, tuple)):
    return list(o)
  return repr(o)


def _hash(obj) -> str:
  return hashlib.sha256(json.dumps(obj, sort_keys=True, default=_json_default).encode()).hexdigest()[:20]


_FRAMEWORK_HASH = None


def framework_source_hash() -> str:
  """Hash of the compiler and engine code: a changed planner must not hit an old entry."""
  global _FRAMEWORK_HASH  # pylint: disable=global-statement
  if _FRAMEWORK_HASH is None:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    h = hashlib.sha256()
    for sub in ("compiler", "engine"):
      for dirpath, _, files in sorted(os.walk(os.path.join(root, sub))):
        for f in sorted(files):
          if f.endswith(".py"):
            with open(os.path.join(dirpath, f), "rb") as fh:
              h.update(f.encode() + fh.read())
    _FRAMEWORK_HASH = h.hexdigest()[:20]
  return _FRAMEWORK_HASH


def _file_hash(path: str) -> str:
  with open(path, "rb") as fh:
    return hashlib.sha256(fh.read()).hexdigest()[:20]


def trace_fingerprint(captured: capture.CapturedGraph) -> str:
  """Hash of a traced graph: its GraphDef, its input placeholders and its optimizers."""
  h = hashlib.sha256(captured.graph.as_graph_def().SerializeToString(deterministic=True))
  h.update(json.dumps({"inputs": {n: [t.shape.as_list(), t.dtype.name]
                                  for n, t in sorted(captured.inputs.items())},
                       "batch": captured.batch_size, "optimizers": captured.optimizers,
                       "loss": captured.loss.name}, sort_keys=True).encode())
  return h.hexdigest()[:20]


def trace_key(captured: capture.CapturedGraph, engine_file: str, options: dict, mode: str) -> str:
  return _hash({"v": CACHE_VERSION, "fw": framework_source_hash(),
                "trace": trace_fingerprint(captured), "engine": _file_hash(engine_file),
                "options": options, "mode": mode})


def graph_key(graph: ir.LayerGraph, engine_file: str, options: plans.PlanOptions) -> str:
  return _hash({"v": CACHE_VERSION, "fw": framework_source_hash(), "graph": graph.fingerprint(),
                "engine": _file_hash(engine_file), "options": options})


# --- (de)serialization of plans and performances -------------------------------------------

def plan_from_dict(d: dict) -> plans.Plan:
  return plans.Plan.from_dict(d)


def performance_from_dict(d: dict) -> plans.Performance:
  d = dict(d)
  d["timeline"] = tuple(plans.TimelineEvent(**e) for e in d.get("timeline", ()))
  known = {f.name for f in dataclasses.fields(plans.Performance)}
  return plans.Performance(**{k: v for k, v in d.items() if k in known})


class CompileCache:
  """JSON entries under `<compile_dir>/cache/`, addressed by trace key and by graph key.

  Each entry keeps its reports in `cache/<graph key>/`; `publish` copies them to the
  compile_dir's top level, so report.txt always describes the plan just returned.
  """

  def __init__(self, compile_dir: str):
    self.compile_dir = compile_dir
    self.dir = os.path.join(compile_dir, "cache")

  def _path(self, key: str) -> str:
    return os.path.join(self.dir, key + ".json")

  def report_dir(self, key: str) -> str:
    return os.path.join(self.dir, key)

  def get(self, key: str) -> Optional[dict]:
    try:
      with open(self._path(key)) as fh:
        entry = json.load(fh)
    except (OSError, ValueError):
      return None
    kept = entry.get("report_paths", {})
    if not kept or any(not os.path.exists(p) for p in kept.values()):
      return None
    return entry

  def put(self, keys, entry: dict) -> None:
    os.makedirs(self.dir, exist_ok=True)
    blob = json.dumps(entry, default=_json_default)
    for key in keys:
      tmp = _tmp_name(self._path(key))
      with open(tmp, "w") as fh:
        fh.write(blob)
      os.replace(tmp, self._path(key))

  def get_input_rate(self, key: str) -> Optional[dict]:
    """An input timing an earlier process kept (capture.measure_input_rate), or None."""
    try:
      with open(self._path("input-" + key)) as fh:
        return json.load(fh)
    except (OSError, ValueError):
      return None

  def put_input_rate(self, key: str, entry: dict) -> None:
    """Keeps an input timing for later processes. Best effort: a read-only or full disk
    costs the next run a timing, and this one nothing."""
    path = self._path("input-" + key)
    tmp = _tmp_name(path)
    try:
      os.makedirs(self.dir, exist_ok=True)
      with open(tmp, "w") as fh:
        json.dump(entry, fh)
      os.replace(tmp, path)
    except OSError:
      if os.path.exists(tmp):
        os.remove(tmp)

  def publish(self, kept: Dict[str, str]) -> Dict[str, str]:
    """Copies an entry's reports to the compile_dir's top level; returns their paths there."""
    published = {}
    for kind, src in kept.items():
      dst = os.path.join(self.compile_dir, os.path.basename(src))
      tmp = _tmp_name(dst)
      shutil.copyfile(src, tmp)
      os.replace(tmp, dst)
      published[kind] = dst
    return published


# A temporary file is renamed into place milliseconds after it is written: one this old was
# left by a process killed in between (SIGKILL, a power cut), never one still being written.
STALE_TMP_S = 60.0
_TMP_NAME = re.compile(r"\.\d+(?:\.[0-9a-f]{8})?\.tmp$")  # _tmp_name's, report.put_input_line's


def remove_stale_tmp(compile_dir: str, now: Optional[float] = None) -> List[str]:
  """Deletes the temporary files a killed compile left in compile_dir and its cache (only
  names `_tmp_name` and the report's input line give, older than STALE_TMP_S); returns them."""
  now = time.time() if now is None else now
  removed = []
  for root, _, files in os.walk(compile_dir):
    for name in files:
      path = os.path.join(root, name)
      try:
        if _TMP_NAME.search(name) and now - os.path.getmtime(path) > STALE_TMP_S:
          os.remove(path)
          removed.append(path)
      except OSError:
        continue  # gone already (another process cleaned it), or not ours to remove
  return sorted(removed)


def _tmp_name(path: str) -> str:
  """A temporary name beside `path` that no other process uses: the chief and the workers of
  a multi-worker run share the model_dir's compile_dir and publish the same reports at once
  (one fixed `.tmp` name let one process rename away the other's file)."""
  return f"{path}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"


def result_from_entry(entry: dict, cache: CompileCache, seconds: float) -> CompileResult:
  return CompileResult(
      graph=ir.LayerGraph.from_dict(entry["graph"]), plan=plan_from_dict(entry["plan"]),
      performance=performance_from_dict(entry["performance"]),
      report_paths=cache.publish(entry["report_paths"]), cached=True,
      compile_dir=cache.compile_dir, seconds=seconds)


def plan_and_report(graph: ir.LayerGraph, engine, options: plans.PlanOptions,
                    compile_dir: str):
  """Plans, simulates and writes the reports. Pure Python: no TensorFlow below this line."""
  if not graph.layers:
    the_plan, performance = plan_lib.trivial(engine, options)
    the_plan = with_host(the_plan, dataclasses.replace(options, num_replicas=1))
  else:
    planner = plan_lib.get_planner(options.execution_strategy)
    the_plan = with_host(planner.plan(graph, engine, options), options)
    performance = perf.simulate(the_plan, graph, engine, options)
  paths = report.write_reports(compile_dir, graph, the_plan, performance, engine)
  return the_plan, performance, paths


def now() -> float:
  return time.perf_counter()


def with_host(plan: plans.Plan, options: plans.PlanOptions) -> plans.Plan:
  """The plan with its batch split over the host replicas and workers that will train it."""
  b = plan.batching
  hosts = batching.host_replicas(
      b.engine_replicas if plan.mode.replicates else 1,
      b.num_systems, b.global_batch, forced=options.num_replicas is not None,
      devices_per_worker=options.host_devices, num_workers=options.num_workers)
  return dataclasses.replace(plan, batching=batching.split(
      b.global_batch, engine_replicas=b.engine_replicas, num_systems=b.num_systems,
      host_replicas=hosts, num_workers=options.num_workers, micro_batches=b.micro_batches))


class Compiler:
  """Compiles models into one compile_dir, with an in-memory memo over the on-disk cache."""

  def __init__(self, compile_dir: str):
    self.compile_dir = compile_dir
    self.cache = CompileCache(compile_dir)
    self.memo: Dict[str, CompileResult] = {}  # trace key -> result, this process
    self._kept: Dict[str, Dict[str, str]] = {}  # trace key -> its reports in the cache

  def compile(self, *, model_fn: Callable, call_input_fn: Callable[[], Any],
              call_model_fn: Callable[[Any, Any], Any], params: dict, cs_config,
              global_batch: Optional[int], host: dict, seed: Optional[int] = None,
              validate_only: bool = False) -> CompileResult:
    """capture -> lower -> validate -> plan -> simulate -> report, or a cache hit.

    Args:
      model_fn: the user's model_fn (the report names it).
      call_input_fn: calls the TRAIN input_fn in the current graph.
      call_model_fn: calls the model_fn in TRAIN mode on (features, labels).
      params: the params the model gets (they reach the cache key through the trace).
      cs_config: the CSConfig (strategy, engine, systems, replicas, sparsity, vts).
      global_batch: the global batch the params name (None: the dataset's static batch).
      host: {"num_workers": ..., "host_devices": ...}: what the host runtime can run.
      seed: graph-level seed for the VTS sample and the input pipeline the capture builds.
      validate_only: stop after checking every op against the engine's kernels.

    Raises:
      UnsupportedOpError: an op has no engine kernel (names op, type and source line).
      CompileError: the graph cannot be captured with static shapes.
      BatchError: the global batch does not split over the plan's replicas and systems.
    """
    t0 = now()
    remove_stale_tmp(self.compile_dir)
    engine = spec_lib.load_engine(cs_config.engine)
    captured = capture.capture(call_input_fn, call_model_fn, global_batch or 0, seed)
    if not captured.batch_size:
      raise CompileError("cannot tell the batch size: batch the dataset with drop_remainder=True, "
                         "or name the global batch in params (params={'batch_size': N} in "
                         "Python, train_input.batch_size in a params file)")
    signature = capture.input_signature(captured)
    mode = "validate" if validate_only else "train"
    key = trace_key(captured, engine.source_path, {**cs_config._asdict(), **host}, mode)
    hit = self.memo.get(key)
    if hit is not None:
      self.cache.publish(self._kept.get(key, {}))
    elif not (validate_only or cs_config.vts):
      entry = self.cache.get(key)
      if entry is not None:
        hit = self.memo[key] = result_from_entry(entry, self.cache, 0.0)
        self._kept[key] = entry["report_paths"]
    if hit is not None:
      return dataclasses.replace(hit, cached=True, seconds=now() - t0, input_signature=signature,
                                 built_input=captured.built_input)

    fwd = lower.forward_ops(captured)
    listing = os.path.join(self.compile_dir, "unsupported_ops.tsv")
    lower.validate(captured, fwd, listing=listing)
    if os.path.exists(listing):  # an earlier failure's list no longer holds
      os.remove(listing)
    if validate_only:
      result = CompileResult(None, None, None, {}, False, self.compile_dir, now() - t0,
                             validate_only=True, input_signature=signature)
      self.memo[key] = result
      return result
    name = (getattr(model_fn, "model_name", None) or getattr(model_fn, "__module__", "model")
            or "model")
    seq_len = sequence_length(captured)
    sources = length_sources(captured, seq_len)
    graph = lower.lower(captured, name=name, fwd=fwd, seq_len=seq_len,
                        token_lengths=sorted({s.seq_len for s in sources}))
    cs = cs_config
    options = plans.PlanOptions(
        batch_size=captured.batch_size,
        **{key: getattr(cs, key) for key in cs._fields if key != "engine"},
        num_workers=host["num_workers"],
        host_devices=host["host_devices"],
        **(token_fractions(call_input_fn, captured, sources, seed) if cs.vts else {}))
    gkey = graph_key(graph, engine.source_path, options)
    entry = self.cache.get(gkey)
    if entry is not None:
      result = result_from_entry(entry, self.cache, now() - t0)
      kept = entry["report_paths"]
    else:
      the_plan, performance, kept = plan_and_report(graph, engine, options,
                                                    self.cache.report_dir(gkey))
      result = CompileResult(graph, the_plan, performance, self.cache.publish(kept), False,
                             self.compile_dir, now() - t0)
      keys = [gkey] if cs.vts else [key, gkey]
      self.cache.put(keys, {"graph": graph.to_dict(), "plan": the_plan.to_dict(),
                            "performance": performance.to_dict(), "report_paths": kept})
    result = dataclasses.replace(result, input_signature=signature)
    if not cs.vts:
      self.memo[key] = result
      self._kept[key] = kept
    return dataclasses.replace(result, built_input=captured.built_input)


def token_fractions(call_input_fn, captured, sources, seed) -> dict:
  """VTS: token_fraction / token_sq_fraction measured on a sample of the training input.

  The lengths are relative to the captured (compiled) static shapes. The fractions go into
  PlanOptions, hence into the graph cache key: a VTS compile never reuses a padded entry.
  """
  if not sources:
    names = ", ".join(f"{n}{t.shape.as_list()}"
                      for n, t in sorted(captured.inputs.items())) or "none"
    raise CompileError(f"csconfig.vts is true but the training input says no sequence lengths: "
                       f"looked for {tokens.LOOKED_FOR} among the inputs ({names}); add a "
                       f"padding mask or a length feature to the input_fn, or set "
                       f"csconfig.vts false")
  stats = capture.measure_tokens(call_input_fn, sources, seed=seed, built=captured.built_input)
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


def sequence_length(captured) -> int:
  """The sequence length: the longest 2nd dim of the rank-2 integer features, else 0.

  The longest, not the first: BERT's `masked_lm_ids` [batch, max_predictions] sorts before
  `token_ids` [batch, max_seq_length].
  """
  lengths = [int(t.shape[1]) for name, t in captured.inputs.items()
             if name.startswith("features") and t.dtype.is_integer and t.shape.rank == 2
             and t.shape[1] is not None]
  return max(lengths, default=0)


def length_sources(captured, seq_len: int):
  """Where VTS reads sequence lengths from (compiler/tokens.py), from the captured inputs."""
  return tokens.find_length_sources(
      {n: (t.shape.as_list(), t.dtype.name) for n, t in captured.inputs.items()}, seq_len)
