"""The compile pipeline: capture -> lower -> validate -> plan -> simulate -> report, cached.

Two cache levels, both keyed so that a changed model, params or engine can never hit:
  * a fast key computed WITHOUT tracing: the model code (source of the model_fn's module and of
    the modules of its package that are loaded), the params, the engine file, the plan options
    and this framework's version. A hit returns in milliseconds.
  * a graph key after tracing: the LayerGraph fingerprint + options + engine. A hit skips
    planning and report rendering (e.g. a comment changed in the model file).
Entries are JSON files under `<compile_dir>/cache/`; nothing is pickled.
"""

import dataclasses
import hashlib
import inspect
import json
import os
import sys
import time
from typing import Any, Callable, Dict, Optional

from cerebras_tf.compiler import ir
from cerebras_tf.compiler.plan import base as plan_base

CACHE_VERSION = "1"


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
  """

  graph: Optional[ir.LayerGraph]
  plan: Optional[plan_base.Plan]
  performance: Optional[plan_base.Performance]
  report_paths: Dict[str, str]
  cached: bool
  compile_dir: str
  seconds: float
  validate_only: bool = False

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


def model_source_hash(model_fn: Callable) -> str:
  """Hash of the model's code: its own file plus loaded modules of the same top-level package."""
  fn = inspect.unwrap(getattr(model_fn, "func", model_fn))
  files = set()
  try:
    files.add(os.path.abspath(inspect.getsourcefile(fn)))
  except (TypeError, OSError):
    pass
  top = (getattr(fn, "__module__", "") or "").split(".")[0]
  if top and top != "__main__":
    for name, mod in list(sys.modules.items()):
      if (name == top or name.startswith(top + ".")) and getattr(mod, "__file__", None):
        files.add(os.path.abspath(mod.__file__))
  h = hashlib.sha256()
  for f in sorted(files):
    try:
      with open(f, "rb") as fh:
        h.update(f.encode() + b"\0" + fh.read())
    except OSError:
      h.update(f.encode())
  h.update(getattr(fn, "__qualname__", repr(fn)).encode())
  return h.hexdigest()[:20]


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


def fast_key(model_fn, params, engine_file: str, options, mode: str) -> str:
  return _hash({"v": CACHE_VERSION, "fw": framework_source_hash(),
                "model": model_source_hash(model_fn), "params": params,
                "engine": _file_hash(engine_file), "options": options, "mode": mode})


def graph_key(graph: ir.LayerGraph, engine_file: str, options: plan_base.PlanOptions) -> str:
  return _hash({"v": CACHE_VERSION, "fw": framework_source_hash(), "graph": graph.fingerprint(),
                "engine": _file_hash(engine_file), "options": options})


# --- (de)serialization of plans and performances -------------------------------------------

def plan_from_dict(d: dict) -> plan_base.Plan:
  d = dict(d)
  layers = []
  for l in d["layers"]:
    l = dict(l)
    if l.get("region") is not None:
      l["region"] = plan_base.Region(**l["region"])
    layers.append(plan_base.LayerPlacement(**l))
  d["layers"] = tuple(layers)
  d["notes"] = tuple(d.get("notes", ()))
  known = {f.name for f in dataclasses.fields(plan_base.Plan)}
  return plan_base.Plan(**{k: v for k, v in d.items() if k in known})


def performance_from_dict(d: dict) -> plan_base.Performance:
  d = dict(d)
  d["timeline"] = tuple(plan_base.TimelineEvent(**e) for e in d.get("timeline", ()))
  known = {f.name for f in dataclasses.fields(plan_base.Performance)}
  return plan_base.Performance(**{k: v for k, v in d.items() if k in known})


class CompileCache:
  """JSON entries under `<compile_dir>/cache/`, addressed by fast key and by graph key."""

  def __init__(self, compile_dir: str):
    self.dir = os.path.join(compile_dir, "cache")

  def _path(self, key: str) -> str:
    return os.path.join(self.dir, key + ".json")

  def get(self, key: str) -> Optional[dict]:
    try:
      with open(self._path(key)) as fh:
        entry = json.load(fh)
    except (OSError, ValueError):
      return None
    if any(not os.path.exists(p) for p in entry.get("report_paths", {}).values()):
      return None
    return entry

  def put(self, keys, entry: dict) -> None:
    os.makedirs(self.dir, exist_ok=True)
    blob = json.dumps(entry, default=_json_default)
    for key in keys:
      tmp = self._path(key) + ".tmp"
      with open(tmp, "w") as fh:
        fh.write(blob)
      os.replace(tmp, self._path(key))


def result_from_entry(entry: dict, compile_dir: str, seconds: float) -> CompileResult:
  return CompileResult(
      graph=ir.LayerGraph.from_dict(entry["graph"]), plan=plan_from_dict(entry["plan"]),
      performance=performance_from_dict(entry["performance"]),
      report_paths=dict(entry["report_paths"]), cached=True, compile_dir=compile_dir,
      seconds=seconds)


def plan_and_report(graph: ir.LayerGraph, engine, options: plan_base.PlanOptions,
                    compile_dir: str):
  """Plans, simulates and writes the reports. Pure Python: no TensorFlow below this line."""
  from cerebras_tf.compiler import plan as plan_lib  # pylint: disable=import-outside-toplevel
  from cerebras_tf.engine import perf, report  # pylint: disable=import-outside-toplevel
  planner = plan_lib.get_planner(options.execution_strategy)
  the_plan = planner.plan(graph, engine, options)
  performance = perf.simulate(the_plan, graph, engine, options)
  paths = report.write_reports(compile_dir, graph, the_plan, performance, engine)
  return the_plan, performance, paths


def now() -> float:
  return time.perf_counter()
