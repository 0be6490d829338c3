"""Cerebras modelzoo's trainer-format params (R2.3 on) read as the flat sections here.

modelzoo moved its YAML under `trainer: {init: ..., fit: ...}`: the model, optimizer (a
mapping named by its class, `AdamW: {...}`), schedulers (`LinearLR`, `SequentialLR`),
precision, loop, checkpoint, logging and callbacks in `init`; the dataloaders in `fit`. This
module moves each value onto the flat key that owns it here (`train_input`, `eval_input`,
`model`, `optimizer`, `runconfig`, `csconfig`), keeping the line it came from, before the
params are validated; the validator then applies or refuses every value as for a flat file.
A trainer key with no owner here is named, with its line, in one error. No TensorFlow.
"""

from typing import Any, Dict, List, Optional, Tuple

from cerebras_tf.errors import ParamsError
from cerebras_tf.schema import dotted as _dotted

Path = Tuple[Any, ...]

# trainer.init.<key> -> its flat place (a mapping is moved whole).
_INIT = {"model": ("model",), "model_dir": ("runconfig", "model_dir"),
         "seed": ("runconfig", "seed")}
_LOOP = {"max_steps": ("runconfig", "max_steps"), "eval_steps": ("runconfig", "eval_steps"),
         "eval_frequency": ("runconfig", "eval_frequency")}
_CHECKPOINT = {"steps": ("runconfig", "checkpoint_steps"),
               "save_initial_checkpoint": ("runconfig", "save_initial_checkpoint")}
_LOGGING = {"log_steps": ("runconfig", "log_steps")}
_PRECISION = {"enabled": ("model", "mixed_precision"), "fp16_type": ("model", "fp16_type"),
              "loss_scaling_factor": ("optimizer", "loss_scaling_factor"),
              "max_gradient_norm": ("optimizer", "max_gradient_norm"),
              "initial_loss_scale": ("optimizer", "initial_loss_scale"),
              "max_loss_scale": ("optimizer", "max_loss_scale"),
              # a loss scale to log: bfloat16 has none (optimizer.loss_scaling_factor)
              "log_loss_scale": None}
# The optimizer's class -> optimizer_type; its arguments keep their names (betas, eps,
# weight_decay, correct_bias: params.py moves them) but `lr`, a constant rate.
_OPTIMIZERS = {"adamw": "adamw", "adam": "adam", "sgd": "sgd"}
_MICRO_BATCH_FLAG = "csx.performance.micro_batch_size"


def is_trainer_format(raw: Any) -> bool:
  return isinstance(raw, dict) and isinstance(raw.get("trainer"), dict)


class _Mover:
  def __init__(self, raw: dict, origins: Dict[Path, str], filename: str):
    self.raw, self.origins, self.filename = raw, origins, filename
    self.out: Dict[str, Dict[str, Any]] = {}
    self.new_origins: Dict[Path, str] = {}
    self.unread: List[Path] = []

  def value_at(self, path: Path):
    value = self.raw
    for key in path:
      value = value[key]
    return value

  def line(self, path: Path) -> str:
    for i in range(len(path), 0, -1):
      if path[:i] in self.origins:
        return self.origins[path[:i]]
    return self.filename

  def put(self, old: Path, new: Path, value) -> None:
    """value (from trainer path `old`) at flat path `new`, its lines kept."""
    section, *keys = new
    target = self.out.setdefault(section, {})
    if not keys:  # a whole section
      if not isinstance(value, dict):
        raise ParamsError(f"{self.line(old)}: {_dotted(old)} must be a mapping of keys")
      for key, v in value.items():
        self.put(old + (key,), (section, key), v)
      return
    key = keys[0]
    if key in target and target[key] != value:
      raise ParamsError(f"{self.line(old)}: {_dotted(old)} {value!r} conflicts with "
                        f"{target[key]!r} given for {section}.{key} elsewhere in the trainer "
                        f"section; keep one of them")
    target[key] = value
    self.new_origins[(section, key)] = self.line(old)
    self._copy_lines(old, (section, key))

  def _copy_lines(self, old: Path, new: Path) -> None:
    for path, where in self.origins.items():
      if path[:len(old)] == old and len(path) > len(old):
        self.new_origins[new + path[len(old):]] = where

  def table(self, base: Path, mapping: Dict[str, Optional[Path]], value) -> None:
    if not isinstance(value, dict):
      raise ParamsError(f"{self.line(base)}: {_dotted(base)} must be a mapping of keys")
    for key, v in value.items():
      if key not in mapping:
        self.unread.append(base + (key,))
      elif mapping[key] is not None:
        self.put(base + (key,), mapping[key], v)


def _named(value) -> Optional[Tuple[str, Any]]:
  """A one-key mapping `{Name: {...}}` (how the trainer names classes) -> (Name, args)."""
  if isinstance(value, dict) and len(value) == 1:
    (name, args), = value.items()
    return str(name), args if args is not None else {}
  return None


def flatten(raw: dict, origins: Dict[Path, str], filename: str
            ) -> Tuple[dict, Dict[Path, str]]:
  """A trainer-format file's values in the flat sections, and the lines they came from."""
  m = _Mover(raw, origins, filename)
  trainer = raw["trainer"]
  for key in raw:
    if key != "trainer":
      m.unread.append((key,))
  for key, value in trainer.items():
    base = ("trainer", key)
    if key == "init":
      _init(m, base, value)
    elif key == "fit":
      _fit(m, base, value)
    elif key in ("validate", "validate_all"):
      _validate(m, base, value)
    else:
      m.unread.append(base)
  if m.unread:
    first, rest = m.unread[0], m.unread[1:]
    more = (f"; {len(rest)} more: " + ", ".join(f"{_dotted(p)} ({m.line(p).rsplit(':', 1)[-1]})"
                                                 for p in rest)) if rest else ""
    raise ParamsError(f"{m.line(first)}: {_dotted(first)} (modelzoo trainer format) has no "
                      f"counterpart here; remove it{more}")
  return m.out, m.new_origins


def _init(m: _Mover, base: Path, init) -> None:
  if not isinstance(init, dict):
    raise ParamsError(f"{m.line(base)}: trainer.init must be a mapping of keys")
  for key, value in init.items():
    path = base + (key,)
    if key in _INIT:
      m.put(path, _INIT[key], value)
    elif key == "backend":
      _backend(m, path, value)
    elif key == "optimizer":
      _optimizer(m, path, value)
    elif key == "schedulers":
      _schedulers(m, path, value)
    elif key == "precision":
      m.table(path, _PRECISION, value)
    elif key == "loop":
      m.table(path, _LOOP, value)
    elif key == "checkpoint":
      m.table(path, _CHECKPOINT, value)
    elif key == "logging":
      m.table(path, _LOGGING, value)
    elif key == "callbacks":
      _callbacks(m, path, value)
    else:
      m.unread.append(path)


def _backend(m: _Mover, path: Path, value) -> None:
  if not isinstance(value, dict):
    m.unread.append(path)
    return
  for key, v in value.items():
    if key == "backend_type":
      kind = str(v).upper()
      if kind not in ("CSX", "CPU", "GPU"):
        raise ParamsError(f"{m.line(path + (key,))}: trainer.init.backend.backend_type must be "
                          f"CSX, CPU or GPU, got {v!r}")
      m.put(path + (key,), ("runconfig", "use_cs"), kind == "CSX")
    elif key == "cluster_config" and isinstance(v, dict):
      for ck, cv in v.items():
        if ck == "num_csx":
          m.put(path + (key, ck), ("csconfig", "num_csx"), cv)
        else:
          m.unread.append(path + (key, ck))
    else:
      m.unread.append(path + (key,))


def _optimizer(m: _Mover, path: Path, value) -> None:
  named = _named(value)
  if named is None or named[0].lower() not in _OPTIMIZERS:
    raise ParamsError(f"{m.line(path)}: trainer.init.optimizer must name one optimizer class "
                      f"({', '.join(('AdamW', 'Adam', 'SGD'))}) with its arguments, got "
                      f"{value!r}")
  name, args = named
  kind = _OPTIMIZERS[name.lower()]
  if kind == "sgd" and isinstance(args, dict) and args.get("momentum"):
    kind = "momentum"
  m.put(path + (name,), ("optimizer", "optimizer_type"), kind)
  if not isinstance(args, dict):
    raise ParamsError(f"{m.line(path)}: trainer.init.optimizer.{name} must be a mapping of its "
                      f"arguments")
  for key, v in args.items():
    m.put(path + (name, key), ("optimizer", "learning_rate" if key == "lr" else key), v)


def _schedulers(m: _Mover, path: Path, value) -> None:
  """[{LinearLR: {...}}, ...] or [{SequentialLR: {schedulers: [...]}}] -> segments, each
  argument keeping its line."""
  items = value if isinstance(value, list) else [value]
  places = []  # the trainer path of each segment
  for i, item in enumerate(items):
    named = _named(item)
    if named and named[0] == "SequentialLR" and isinstance(named[1], dict):
      places += [path + (i, "SequentialLR", "schedulers", j)
                 for j in range(len(named[1].get("schedulers") or []))]
      m.unread += [path + (i, "SequentialLR", k) for k in named[1] if k != "schedulers"]
    else:
      places.append(path + (i,))
  segments = []
  for k, old in enumerate(places):
    item = m.value_at(old)
    named = _named(item)
    if named is None or not isinstance(named[1], dict):
      raise ParamsError(f"{m.line(old)}: {_dotted(old)} must name one scheduler class with "
                        f"its arguments (LinearLR: {{...}}), got {item!r}")
    name, args = named
    segments.append({"scheduler": name, **args})
    m.new_origins[("optimizer", "learning_rate", k)] = m.line(old)
    for key in args:
      m.new_origins[("optimizer", "learning_rate", k, key)] = m.line(old + (name, key))
  if segments:
    m.out.setdefault("optimizer", {})["learning_rate"] = segments
    m.new_origins[("optimizer", "learning_rate")] = m.line(path)


def _callbacks(m: _Mover, path: Path, value) -> None:
  for i, item in enumerate(value if isinstance(value, list) else [value]):
    named = _named(item)
    if named is None:
      m.unread.append(path + (i,))
      continue
    name, args = named
    at = path + (i, name)
    if name in ("ScopedTrainFlags", "ScopedValidateFlags") and isinstance(args, dict):
      for flag, v in args.items():
        if flag == _MICRO_BATCH_FLAG:
          m.put(at + (flag,), ("csconfig", "micro_batch_size"), v)
        else:
          m.unread.append(at + (flag,))
    elif name == "ComputeNorm":  # logs the gradient norm: optimizer/gradient_norm here
      m.put(at, ("optimizer", "log_summaries"), True)
    else:
      m.unread.append(at)


def _fit(m: _Mover, base: Path, fit) -> None:
  if not isinstance(fit, dict):
    raise ParamsError(f"{m.line(base)}: trainer.fit must be a mapping of keys")
  for key, value in fit.items():
    path = base + (key,)
    if key == "train_dataloader":
      m.put(path, ("train_input",), value)
    elif key == "val_dataloader":
      loaders = value if isinstance(value, list) else [value]
      m.put(path + ((0,) if isinstance(value, list) else ()), ("eval_input",), loaders[0])
      for j in range(1, len(loaders)):
        m.unread.append(path + (j,))
    else:
      m.unread.append(path)


def _validate(m: _Mover, base: Path, value) -> None:
  """`validate` / `validate_all` runs name their dataloader; here that is eval_input (the one
  --mode eval reads): taken when trainer.fit gave none, else it must be the same."""
  if not isinstance(value, dict):
    m.unread.append(base)
    return
  for key, loader in value.items():
    if key not in ("val_dataloader", "val_dataloaders"):
      m.unread.append(base + (key,))
      continue
    first = loader[0] if isinstance(loader, list) and loader else loader
    if "eval_input" not in m.out:
      m.put(base + (key,), ("eval_input",), first)
    elif first != {k: v for k, v in m.out["eval_input"].items()}:
      m.unread.append(base + (key,))
