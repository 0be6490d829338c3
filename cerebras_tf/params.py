"""Typed YAML params: one schema, defaults, validation, one-line errors.

A params file has the sections of the Cerebras modelzoo TF configs (`train_input`, `eval_input`,
`model`, `optimizer`, `runconfig`, `csconfig`). Every key, its type, default, range or choices and
a help string is declared once, in `schema.SCHEMA`. `model.name` picks a model family from
`cerebras_tf.registry`; the family adds its own keys to `model`, `train_input` and `eval_input`
(the keys' types and the framework's sections are in `schema.py`).

`load_params(path, overrides)` returns a plain nested dict (what `model_fn` gets as `params`)
with every default filled in. Anything wrong raises `ParamsError` with one line that names the
file and line (or the override / flag), the key path and what is allowed.

Only plain YAML is read (SafeLoader): tags such as `!!python/object` are refused.
No TensorFlow import here: the CLI must fail fast on bad input.
"""

import dataclasses
import logging
import os
import re
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import yaml

from cerebras_tf import registry
from cerebras_tf.modelzoo import tf_files, trainer_files, translate
from cerebras_tf.core import plans
from cerebras_tf.cs_config import parse_cs_ip
from cerebras_tf.errors import ConfigError, ParamsError
from cerebras_tf import schema
from cerebras_tf.schema import dotted as _dotted, show as _show
from cerebras_tf.schema import (ENGINES, EVAL_INPUT_DEFAULTS, INPUT_FIELDS, MODEL_FIELDS,
                                OPTIMIZER_FIELDS, REQUIRED, REQUIRED_SECTIONS, SCHEDULERS,
                                SCHEMA, Field)

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# Overrides.

class Override(NamedTuple):
  """`key` is a dotted path (`train_input.batch_size`); `source` names it in errors."""

  key: str
  value: Any
  source: str


# optimizer key -> the optimizer_types that apply it (the others refuse it when set).
OPTIMIZER_KEYS = {"weight_decay_rate": ("adamw",), "correct_bias": ("adamw",),
                  "momentum": ("momentum",), "beta1": ("adam", "adamw"),
                  "beta2": ("adam", "adamw"), "epsilon": ("adam", "adamw")}

_NAME = r"[A-Za-z_][A-Za-z0-9_]*(\[[0-9]+\])*"
_KEY_RE = re.compile(rf"^{_NAME}(\.{_NAME})+$")


def _key_parts(key: str) -> tuple:
  """`optimizer.learning_rate[1].steps` -> ('optimizer', 'learning_rate', 1, 'steps'): the
  path form the validator and its error messages use (list entries are ints)."""
  out = []
  for name in key.split("."):
    word, *indices = re.split(r"\[", name)
    out.append(word)
    out.extend(int(i.rstrip("]")) for i in indices)
  return tuple(out)


# A comma that starts another SECTION.KEY= (Model Garden's `--params_override a.b=1,c.d=2`).
_NEXT_OVERRIDE = re.compile(rf",\s*(?={_NAME}(\.{_NAME})+=)")


def split_overrides(text: str) -> List[str]:
  """`a.b=1,c.d=x` -> ['a.b=1', 'c.d=x']: one flag may carry several overrides, as in Model
  Garden. Only a comma followed by SECTION.KEY= splits, so `train_input.file_pattern=
  d/{a,b}*` and a YAML list `[1, 2]` stay whole."""
  cuts = [(m.start(), m.end()) for m in _NEXT_OVERRIDE.finditer(text)]
  starts = [0] + [end for _, end in cuts]
  ends = [start for start, _ in cuts] + [len(text)]
  return [text[a:b] for a, b in zip(starts, ends)]


def parse_override(text: str) -> Override:
  """Parses `section.key=value`; the value is read as YAML (`3`, `true`, `null`, `'x'`)."""
  source = f"override '{text}'"
  if not isinstance(text, str) or "=" not in text:
    raise ParamsError(f"{source}: expected SECTION.KEY=VALUE, e.g. train_input.batch_size=64")
  key, _, value_text = text.partition("=")
  key = key.strip()
  if not _KEY_RE.match(key):
    raise ParamsError(f"{source}: key must be SECTION.KEY such as model.hidden_size (a list "
                      f"entry: optimizer.learning_rate[1].steps), got {key!r}")
  try:
    node = yaml.compose(value_text, Loader=yaml.SafeLoader) if value_text.strip() else None
    _check_tags(node, source, lines=False)
    _check_expansion(node, source)
    value = None if node is None else yaml.SafeLoader("").construct_document(node)
  except ParamsError:
    raise
  except yaml.MarkedYAMLError as e:
    raise ParamsError(f"{source}: value is not valid YAML: {e.problem or e.context}") from None
  except (yaml.YAMLError, RecursionError, ValueError, OverflowError) as e:
    raise ParamsError(f"{source}: value is not valid YAML: {_one_line(e)}") from None
  return Override(key, value, source)


# ---------------------------------------------------------------------------------------------
# Loading.

def load_params(path: str, overrides: Optional[Sequence[Union[str, Override]]] = None) -> dict:
  """Reads, merges overrides into, fills and validates a params YAML file."""
  if not isinstance(path, str) or not path:
    raise ParamsError(f"params file path must be a non-empty string, got {path!r}")
  if not os.path.exists(path):
    raise ParamsError(f"params file not found: {path}")
  if os.path.isdir(path):
    raise ParamsError(f"params file is a directory: {path}")
  try:
    with open(path, "rb") as f:
      data = f.read()
  except OSError as e:
    raise ParamsError(f"{path}: cannot read params file: {e.strerror}") from None
  other = _other_unicode(data)  # UTF-16 of ASCII without a byte-order mark is valid UTF-8
  if other:
    raise ParamsError(f"{path}: {other} text, not UTF-8; save it as UTF-8 (e.g. iconv -f "
                      f"{other} -t UTF-8)")
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:
    raise ParamsError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
  return parse_params(text, path, overrides)


def _other_unicode(data: bytes) -> Optional[str]:
  """"UTF-16" or "UTF-32" when the bytes are one of them (a byte-order mark, as Windows
  editors write, or the zero bytes of ASCII text in those encodings), else None."""
  for mark, name in ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"),
                     (b"\xff\xfe", "UTF-16"), (b"\xfe\xff", "UTF-16")):
    if data.startswith(mark):
      return name
  head = data[:400]
  if len(head) < 4:
    return None
  # Mostly ASCII in UTF-16 puts a zero in most bytes of one parity and almost none in the
  # other; UTF-32 makes three bytes in four zero. UTF-8 text holds no zero bytes at all.
  if len(head) >= 8 and head.count(0) >= 0.6 * len(head):
    return "UTF-32"
  for zeros, other in ((head[1::2], head[0::2]), (head[0::2], head[1::2])):
    if zeros.count(0) >= 0.6 * len(zeros) and other.count(0) <= 0.1 * len(other):
      return "UTF-16"
  return None


def parse_params(text: str, filename: str = "<params>",
                 overrides: Optional[Sequence[Union[str, Override]]] = None) -> dict:
  """`load_params` on text already read; `filename` names it in errors and anchors paths."""
  raw, origins = _read_yaml(text, filename)
  if trainer_files.is_trainer_format(raw):  # modelzoo R2.3 on: trainer.init / trainer.fit
    raw, origins = trainer_files.flatten(raw, origins, filename)
  base_dir = os.path.dirname(os.path.abspath(filename))
  for item in overrides or ():
    ov = parse_override(item) if isinstance(item, str) else item
    if not isinstance(ov, Override):
      raise ParamsError(f"override must be a 'SECTION.KEY=VALUE' string, got {item!r}")
    _apply_override(raw, origins, ov)
  return _Validator(filename, base_dir, origins).validate(raw)


def _read_yaml(text: str, filename: str) -> Tuple[dict, Dict[tuple, str]]:
  """Plain YAML -> (dict, {key path: 'file:line'}); every failure is one ParamsError line."""
  try:
    node = yaml.compose(text, Loader=yaml.SafeLoader)
  except yaml.MarkedYAMLError as e:
    mark = e.problem_mark or e.context_mark
    where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
    problem = e.problem or e.context or "malformed YAML"
    raise ParamsError(f"{filename}: YAML syntax error{where}: {problem}") from None
  except yaml.YAMLError as e:
    raise ParamsError(f"{filename}: YAML syntax error: {_one_line(e)}") from None
  except RecursionError:
    raise ParamsError(f"{filename}: YAML nested too deeply") from None
  if node is None:
    raise ParamsError(f"{filename}: params file is empty; expected a mapping with sections "
                      + ", ".join(SCHEMA))
  origins: Dict[tuple, str] = {}
  _check_tags(node, filename, lines=True)
  _check_expansion(node, filename)
  if isinstance(node, yaml.SequenceNode) and node.value and \
      isinstance(node.value[0], yaml.MappingNode):  # LLNL's list of configs
    try:
      family = tf_files.infer_family(yaml.SafeLoader("").construct_document(node.value[0]))
    except (yaml.YAMLError, RecursionError, ValueError, OverflowError):
      family = None
    if family is not None and family.name in tf_files.UNBUILT:
      raise ParamsError(f"{filename}:1: {tf_files.refusal(family)}")
  if not isinstance(node, yaml.MappingNode):
    raise ParamsError(f"{filename}:{node.start_mark.line + 1}: top level must be a mapping of "
                      f"sections ({', '.join(SCHEMA)}), got {_node_kind(node)}")
  try:
    _record_lines(node, (), filename, origins, set())
  except RecursionError:
    raise ParamsError(f"{filename}: YAML nested too deeply") from None
  try:
    data = yaml.SafeLoader("").construct_document(node)
  except yaml.YAMLError as e:
    raise ParamsError(f"{filename}: {_one_line(e)}") from None
  except (RecursionError, ValueError, OverflowError) as e:
    raise ParamsError(f"{filename}: cannot read a value: {_one_line(e)}") from None
  return data, origins


# Standard tags only: anything else (!!python/object, custom !tags) is refused.
_SAFE_TAGS = {"tag:yaml.org,2002:" + t for t in
              ("str", "int", "float", "bool", "null", "map", "seq", "timestamp", "merge")}
_MERGE = "tag:yaml.org,2002:merge"  # `<<: *anchor`, a mapping's shared keys


# A params file holds hundreds of values; aliases that expand past this are an alias bomb
# ("billion laughs"): cheap to parse, exponential to walk.
MAX_EXPANDED_VALUES = 100_000


def _check_expansion(node, where: str) -> None:
  """Refuses YAML whose aliases expand to more than MAX_EXPANDED_VALUES nodes (counted
  without expanding: each node's size is memoized), naming the key and line where they do."""
  size = _expanded_sizes(node)
  if size.get(id(node), 1) <= MAX_EXPANDED_VALUES:
    return
  path, at = [], node
  while True:  # down to the innermost key whose value alone expands past the limit
    step = next(((label, child) for label, child in _children(at)
                 if size.get(id(child), 1) > MAX_EXPANDED_VALUES), None)
    if step is None:
      break
    path.append(step[0])
    at = step[1]
  key = "".join(p if p.startswith("[") else f".{p}" for p in path).lstrip(".")
  line = f":{at.start_mark.line + 1}" if path else ""
  under = f" under {key}" if key else ""
  raise ParamsError(f"{where}{line}: YAML aliases{under} expand to more than "
                    f"{MAX_EXPANDED_VALUES:,} values (an alias bomb?); a params file holds plain "
                    f"values, a few hundred at most")


def _children(n):
  """(label, child node) of a mapping (by key) or sequence (by [index])."""
  if isinstance(n, yaml.MappingNode):
    return [(str(k.value) if isinstance(k, yaml.ScalarNode) else "?", v) for k, v in n.value]
  if isinstance(n, yaml.SequenceNode):
    return [(f"[{i}]", v) for i, v in enumerate(n.value)]
  return []


def _expanded_sizes(node) -> Dict[int, int]:
  """{id(node): values it expands to}, each node once (aliases share their node)."""
  size: Dict[int, int] = {}
  stack = [(node, False)]
  while stack:
    n, children_done = stack.pop()
    if n is None or (id(n) in size and not children_done):
      continue
    kids = ([x for kv in n.value for x in kv] if isinstance(n, yaml.MappingNode)
            else list(n.value) if isinstance(n, yaml.SequenceNode) else [])
    if not children_done:
      stack.append((n, True))
      stack.extend((k, False) for k in kids if id(k) not in size)
      continue
    size[id(n)] = 1 + sum(size.get(id(k), 1) for k in kids)
  return size


def _check_tags(node, where: str, lines: bool):
  stack, seen = [node], set()
  while stack:
    n = stack.pop()
    if n is None or id(n) in seen:
      continue
    seen.add(id(n))
    if n.tag not in _SAFE_TAGS:
      tag = n.tag.replace("tag:yaml.org,2002:", "!!")
      at = f"{where}:{n.start_mark.line + 1}" if lines else where
      raise ParamsError(f"{at}: YAML tag '{tag}' is not allowed; params files hold plain "
                        "mappings, lists, strings, numbers, booleans and null")
    if isinstance(n, yaml.MappingNode):
      for k, v in n.value:
        stack.extend((k, v))
    elif isinstance(n, yaml.SequenceNode):
      stack.extend(n.value)


def _record_lines(node, path, filename, origins, seen):
  """Notes the line of every key; refuses duplicate keys (PyYAML silently keeps the last)."""
  if id(node) in seen:  # an alias: already walked (and keeps billion-laughs files cheap)
    return
  seen.add(id(node))
  if isinstance(node, yaml.MappingNode):
    keys: Dict[str, int] = {}
    merged = []
    for k, v in node.value:
      line = k.start_mark.line + 1
      if isinstance(k, yaml.ScalarNode) and k.tag == _MERGE:
        merged.extend(v.value if isinstance(v, yaml.SequenceNode) else [v])
        continue
      if not isinstance(k, yaml.ScalarNode) or k.tag != "tag:yaml.org,2002:str":
        shown = k.value if isinstance(k, yaml.ScalarNode) else _node_kind(k)
        where = _dotted(path) or "the top level"
        raise ParamsError(f"{filename}:{line}: keys must be strings, got {shown!r} in {where}")
      if k.value in keys:
        # PyYAML keeps the last; modelzoo's own files have such a key (gpt3_6p7b), so it runs
        # as there, said once with both lines.
        log.warning("%s:%d: duplicate key '%s' in %s (also at line %d): the last one, line "
                    "%d, is used", filename, line, k.value, _dotted(path) or "the top level",
                    keys[k.value], line)
        for p in [p for p in origins if p[:len(path) + 1] == path + (k.value,)]:
          del origins[p]  # the first value's lines: replaced
      keys[k.value] = line
      origins[path + (k.value,)] = f"{filename}:{line}"
      _record_lines(v, path + (k.value,), filename, origins, seen)
    # Keys a `<<:` merge brings in are where the anchor wrote them (this mapping's own win).
    for source in merged:
      for k, _ in source.value if isinstance(source, yaml.MappingNode) else ():
        if isinstance(k, yaml.ScalarNode) and k.value not in keys:
          keys[k.value] = k.start_mark.line + 1
          origins[path + (k.value,)] = f"{filename}:{k.start_mark.line + 1}"
  elif isinstance(node, yaml.SequenceNode):
    for i, item in enumerate(node.value):
      origins[path + (i,)] = f"{filename}:{item.start_mark.line + 1}"
      _record_lines(item, path + (i,), filename, origins, seen)


def _node_kind(node) -> str:
  if isinstance(node, yaml.SequenceNode):
    return "a list"
  if isinstance(node, yaml.MappingNode):
    return "a mapping"
  return f"the scalar {node.value!r}"


def _apply_override(raw: dict, origins: Dict[tuple, str], ov: Override):
  parts = _key_parts(ov.key)
  if parts[0] not in SCHEMA:
    raise ParamsError(f"{ov.source}: unknown section '{parts[0]}'{schema.suggest(parts[0], SCHEMA)}; "
                      f"sections: {', '.join(SCHEMA)}")
  node = raw
  for i, part in enumerate(parts):
    last = i == len(parts) - 1
    if isinstance(part, int):
      if not isinstance(node, list):
        raise ParamsError(f"{ov.source}: cannot set '{ov.key}': {_dotted(parts[:i])} is not a "
                          f"list")
      if part >= len(node):
        raise ParamsError(f"{ov.source}: cannot set '{ov.key}': {_dotted(parts[:i])} has "
                          f"{len(node)} entr{'y' if len(node) == 1 else 'ies'} (indices from 0); "
                          f"to add one, override the whole list")
    elif not isinstance(node, dict):
      raise ParamsError(f"{ov.source}: cannot set '{ov.key}': {_dotted(parts[:i])} is not a "
                        "mapping")
    if last:
      node[part] = ov.value
      break
    child = node[part] if isinstance(part, int) else node.get(part)
    if child is None:
      child = node[part] = {}
      origins.setdefault(parts[:i + 1], ov.source)
    node = child
  origins[parts] = ov.source
  # Anything below the replaced value no longer comes from the file.
  for p in [p for p in origins if len(p) > len(parts) and p[:len(parts)] == parts]:
    origins[p] = ov.source


# ---------------------------------------------------------------------------------------------
# Validation.

class _Validator:

  def __init__(self, filename: str, base_dir: str, origins: Dict[tuple, str]):
    self.filename = filename
    self.base_dir = base_dir
    self.origins = origins
    self.spec = None  # the model family's registry.ModelSpec, once model.name is read
    self.moved: Dict[tuple, tuple] = {}  # a key here -> the modelzoo-named key moved onto it
    # modelzoo's files never name their family (their run.py's folder does); ours must
    self.names_no_family = not origins.get(("model", "name"), "").startswith(filename + ":")

  def where(self, path: tuple) -> str:
    """The closest known origin of `path` (itself, else its parents), else the file name."""
    for i in range(len(path), 0, -1):
      if path[:i] in self.origins:
        return self.origins[path[:i]]
    return self.filename

  def fail(self, path: tuple, message: str):
    raise ParamsError(f"{self.where(path)}: {message}")

  def from_override(self, path: tuple) -> bool:
    return not self.where(path).startswith(self.filename + ":")

  def validate(self, raw: Any) -> dict:
    if not isinstance(raw, dict):
      self.fail((), f"top level must be a mapping of sections ({', '.join(SCHEMA)})")
    if "model_type" in raw and not isinstance(raw.get("model"), dict):
      self.fail((), f"this is a Hugging Face config (model_type {raw['model_type']!r}), not a "
                f"params file: to see how the model fits and scales, run "
                f"`python scripts/scaling_report.py --params {self.filename} --batch N`; to "
                f"train it, write a params YAML (configs/params_gpt3_xl.yaml shows the keys)")
    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    description = raw.pop("description", None)  # modelzoo's line about the file
    if description is not None and not isinstance(description, str):
      self.fail(("description",), f"description must be a string, got {_show(description)}")
    translate.family_of(self, raw)
    translate.pretrain_params(self, raw, _read_yaml)
    for section in raw:
      if section not in SCHEMA:
        self.fail((section,), f"unknown section '{section}'{schema.suggest(section, SCHEMA)}; "
                  f"sections: {', '.join(SCHEMA)}")
    for section in REQUIRED_SECTIONS:
      if section not in raw:
        self.fail((), f"missing section '{section}'")
    for section, value in raw.items():
      if value is not None and not isinstance(value, dict):
        self.fail((section,), f"section '{section}' must be a mapping of keys, got "
                  f"{_show(value)}")

    kept = translate.modelzoo_keys(self, raw)
    schemas = self.section_schemas(raw)
    self.refuse_unknown_keys(raw, schemas)
    out = {}
    for section, fields in schemas.items():
      if section in ("eval_input", "predict_input") and section not in raw:
        continue  # optional: modes that evaluate (predict) check for it
      out[section] = self.section(section, raw.get(section) or {}, fields)
    self.cross_checks(out, raw)
    if description is not None:
      out["description"] = description
    if kept:
      log.info("%s: %s", self.filename, tf_files.kept_without_effect_line(kept))
    return out

  def section_schemas(self, raw: dict) -> Dict[str, Mapping[str, Field]]:
    """Base sections plus what the model family (`model.name`) registers."""
    schemas = {s: dict(f) for s, f in SCHEMA.items()}
    schemas["eval_input"].update({k: dataclasses.replace(f, default=EVAL_INPUT_DEFAULTS[k])
                                  for k, f in INPUT_FIELDS.items() if k in EVAL_INPUT_DEFAULTS})
    schemas["predict_input"] = dict(schemas["eval_input"])
    model = raw.get("model") or {}
    name = model.get("name", None)
    path = ("model", "name")
    if "name" not in model:
      self.fail(("model",), "model.name is required: nothing in the file says the model "
                "family (no modelzoo data_processor or model key of one); set model.name or "
                "run.py --model, one of " + ", ".join(_available_models()))
    name = self.value(path, name, MODEL_FIELDS["name"])
    if translate.family_name(name) != name:  # modelzoo's model name: our family's
      name = model["name"] = translate.family_name(name)
    try:
      spec = registry.get_model(name)
    except ParamsError as e:
      self.fail(path, str(e))
    self.spec = spec
    for section, fields in spec.schema.items():
      schemas[section].update(fields)
      if section == "eval_input":
        schemas["predict_input"].update(fields)
    for key, field in schemas["predict_input"].items():
      if key in EVAL_INPUT_DEFAULTS:
        schemas["predict_input"][key] = dataclasses.replace(field,
                                                            default=EVAL_INPUT_DEFAULTS[key])
    return schemas

  def section(self, section: str, raw: dict, fields: Mapping[str, Field]) -> dict:
    """The section's values, defaults filled in (its unknown keys were refused already)."""
    return {key: self.value((section, key), raw[key], field) if key in raw
            else self.default((section, key), field)
            for key, field in fields.items()}

  def refuse_unknown_keys(self, raw: dict, schemas: Mapping[str, Mapping[str, Field]]) -> None:
    """Every unknown key of the file in one error, so a file brought from elsewhere (a
    modelzoo config) is fixed in one pass, not one run per key."""
    unknown = [(section, key) for section, fields in schemas.items()
               for key in (raw.get(section) or {}) if key not in fields]
    if not unknown:
      return
    section, key = unknown[0]
    message = self.unknown_key(section, key, schemas[section])
    if len(unknown) > 1:
      more = [f"{_dotted(p)} ({self.where(p).replace(self.filename + ':', 'line ')})"
              for p in unknown[1:]]
      message += f"; {len(more)} more unknown key(s): {', '.join(more)}"
    self.fail((section, key), message)

  def unknown_key(self, section: str, key, fields) -> str:
    unbuilt = translate.unbuilt_key(section, key, self.spec.name if self.spec else "this")
    if unbuilt:
      return unbuilt
    hint = schema.suggest(key, fields)
    if not hint:  # a key that belongs to another section (modelzoo moved some around)
      homes = [s for s, f in SCHEMA.items() if key in f and s != section]
      if homes:
        hint = f" (it belongs in {homes[0]}.{key})"
    return f"unknown key {_show(key)} in {section}{hint}"

  def default(self, path: tuple, field: Field):
    if field.required:
      self.fail(path, f"missing key '{path[-1]}' in {_dotted(path[:-1])}: "
                f"{_dotted(path)} must be {field.describe()}")
    if field.kind == "path" and field.default is not None:
      # A default was not written in the file: relative to the working directory.
      return os.path.abspath(os.path.expanduser(field.default))
    if field.kind == "learning_rate":
      return self.value(path, field.default, field)
    return field.default

  def bad(self, path: tuple, field: Field, value):
    self.fail(path, f"{_dotted(path)} must be {field.describe()}, got {_show(value)}")

  def value(self, path: tuple, value, field: Field):
    if value is None:
      if field.nullable:
        return None
      if field.required:
        self.bad(path, field, value)
      return self.default(path, field)  # `key:` with no value keeps the default
    kind = field.kind
    if kind in ("bool", "int", "float", "int_list"):
      try:
        return field.check(value)  # the one rule of the key (CSConfig, configs apply it too)
      except schema.PastInt64 as e:
        self.fail(path, f"{_dotted(path)} {e}")
      except ValueError:
        self.bad(path, field, value)
    if kind == "spec":  # modelzoo's initializer specs: plain YAML, the family checks them
      if not isinstance(value, (str, dict, list)):
        self.bad(path, field, value)
      return value
    if kind == "paths" and isinstance(value, list):
      if not value or not all(isinstance(v, str) and v.strip() for v in value):
        self.bad(path, field, value)
      return [self.resolve_path(path + (i,), v) for i, v in enumerate(value)]
    if kind == "paths":
      kind = "path"
    if kind in ("str", "path"):
      if not isinstance(value, str) or (kind == "path" and not value.strip()):
        self.bad(path, field, value)
      if field.choices:
        return self.choice(path, value, field)
      return self.resolve_path(path, value) if kind == "path" else value
    if kind == "numbers":  # a small mapping of named numbers (modelzoo's extra_*_params)
      if not isinstance(value, dict) or not all(
          isinstance(k, str) and schema.as_float(v) is not None and not isinstance(v, bool)
          for k, v in value.items()):
        self.bad(path, field, value)
      return {k: schema.as_float(v) for k, v in value.items()}
    if kind == "mapping":  # a nested block of scalars (modelzoo's model.moe); its family checks it
      if not isinstance(value, dict) or not all(
          isinstance(k, str) and (v is None or isinstance(v, (bool, int, float, str)))
          for k, v in value.items()):
        self.bad(path, field, value)
      return dict(value)
    if kind == "float_pair":
      numbers = [schema.as_float(v) for v in value] if isinstance(value, list) else []
      if len(numbers) != 2 or any(n is None or not schema.in_range(n, field) for n in numbers):
        self.bad(path, field, value)
      return numbers
    if kind == "loss_scale":
      if isinstance(value, str) and value.strip().lower() == "dynamic":
        return "dynamic"
      number = schema.as_float(value)
      if number is None or number <= 0:
        self.bad(path, field, value)
      return number
    if kind == "engine":
      if isinstance(value, str) and value.strip().lower() in ENGINES:
        return value.strip().lower()
      if isinstance(value, str) and value.strip().endswith((".yaml", ".yml")):
        return self.resolve_path(path, value.strip())
      self.bad(path, field, value)
    if kind == "learning_rate":
      return self.learning_rate(path, value, field)
    raise AssertionError(kind)

  def choice(self, path: tuple, value: str, field: Field) -> str:
    for c in field.choices:
      if value.strip().lower() == c.lower():
        return c
    self.fail(path, f"{_dotted(path)} must be {field.describe()}, got {_show(value)}"
              f"{schema.suggest(value, field.choices)}")

  def resolve_path(self, path: tuple, value: str) -> str:
    # Modelzoo's files write "$MODELZOO_ROOT/models/vocab/..."; expanded as a shell would.
    unset = [v for v in re.findall(r"\$\{?(\w+)\}?", value) if v not in os.environ]
    if unset:
      self.fail(path, f"{_dotted(path)} {_show(value)} names ${unset[0]}, which is not set: "
                      f"export {unset[0]}=... (modelzoo's files mean their checkout by "
                      f"MODELZOO_ROOT) or write the path itself")
    value = os.path.expanduser(os.path.expandvars(value))
    if "://" in value or os.path.isabs(value):
      return value
    # Flags and overrides come from the shell: relative to the working directory.
    base = os.getcwd() if self.from_override(path) else self.base_dir
    resolved = os.path.normpath(os.path.join(base, value))
    if base == self.base_dir and self.names_no_family and os.path.basename(base) == "configs" \
        and not os.path.exists(resolved):
      # A modelzoo file's paths are relative to its run.py, the folder above its configs/
      # (a fine-tuning file's '../../../../vocab/...'), as its pretrain_params_path is: a path
      # not next to the file is that one, found or not (so an error names where modelzoo
      # looks). Not ours: configs/params_*.yaml's '../data_cache' is relative to the file.
      return os.path.normpath(os.path.join(os.path.dirname(base), value))
    return resolved

  def learning_rate(self, path: tuple, value, field: Field):
    if isinstance(value, dict):
      value = [value]
    if not isinstance(value, list):
      number = schema.as_float(value)
      if number is None or number <= 0:
        self.bad(path, field, value)
      return number
    if not value:
      self.bad(path, field, value)
    segments = []
    for i, seg in enumerate(value):
      spath = path + (i,)
      if not isinstance(seg, dict):
        self.fail(spath, f"{_dotted(spath)} must be a mapping with a scheduler, got {_show(seg)}")
      if "scheduler" not in seg:
        self.fail(spath, f"{_dotted(spath)} needs a scheduler: one of {', '.join(SCHEDULERS)}")
      seg = translate.pytorch_segment(self, spath, seg)
      sched_field = Field("str", REQUIRED, "", choices=tuple(SCHEDULERS))
      sched = self.value(spath + ("scheduler",), seg["scheduler"], sched_field)
      fields = SCHEDULERS[sched]
      for key in seg:
        if key != "scheduler" and key not in fields:
          self.fail(spath + (key,), f"unknown key {_show(key)} in {_dotted(spath)} "
                    f"({sched} takes {', '.join(fields)}){schema.suggest(key, fields)}")
      out = {"scheduler": sched}
      for key, f in fields.items():
        out[key] = self.value(spath + (key,), seg[key], f) if key in seg \
            else self.default(spath + (key,), f)
      if out.get("steps") is None and i < len(value) - 1:
        self.fail(spath, f"{_dotted(spath + ('steps',))} is required: every segment but the last "
                  "needs steps")
      segments.append(out)
    return segments

  def optimizer_applies(self, opt: dict, raw: dict) -> None:
    """An optimizer key the chosen optimizer_type does not apply, given anyway, is refused
    (modelzoo's `Adam: {weight_decay: 0.1}` is L2 decay, which `adam` here does not have)."""
    kind = opt["optimizer_type"]
    given = set((raw.get("optimizer") or {})) | {k for s, k in self.moved if s == "optimizer"}
    for key, kinds in OPTIMIZER_KEYS.items():
      # What the other types do: the key's default, except that Adam always corrects its bias.
      done = True if (key, kind) == ("correct_bias", "adam") else OPTIMIZER_FIELDS[key].default
      if key in given and kind not in kinds and opt[key] != done:
        self.fail(("optimizer", key), f"optimizer.{key} {_show(opt[key])} is not applied by "
                  f"optimizer_type {kind} (it is by {', '.join(kinds)}): change the type or "
                  f"remove the key")

  def cross_checks(self, out: dict, raw: dict):
    translate.owned_keys(self, out, raw)
    cs, rc = out["csconfig"], out["runconfig"]
    strategy_given = "execution_strategy" in (raw.get("csconfig") or {})
    replicas = cs["num_replicas"]
    if replicas is not None and replicas > 1 and not strategy_given:
      cs["multireplica"] = True  # asking for replicas means multi_replica
    modes = plans.modes_of(cs["execution_strategy"])
    if cs["multireplica"]:
      if strategy_given and not any(m.replicates for m in modes):
        self.fail(("csconfig", "multireplica"), "csconfig.multireplica: true conflicts with "
                  f"csconfig.execution_strategy '{cs['execution_strategy']}' (use multi_replica)")
      if not strategy_given:
        cs["execution_strategy"] = plans.MULTI_REPLICA
    if all(m.replicates for m in plans.modes_of(cs["execution_strategy"])):
      cs["multireplica"] = True
    conflict = plans.option_conflict(cs["execution_strategy"], cs["num_csx"], replicas,
                                     cs["max_wgt_servers"], cs["sparsity"],
                                     cs["micro_batch_size"])
    if conflict:
      self.fail(("csconfig", conflict[0]), f"csconfig.{conflict[1]}")
    if replicas is not None and replicas > 1:
      for section in ("train_input", "eval_input"):
        if section in out and out[section]["batch_size"] % replicas:
          self.fail((section, "batch_size"), f"{section}.batch_size {out[section]['batch_size']} "
                    f"must be divisible by csconfig.num_replicas {replicas}")
    opt = out["optimizer"]
    self.optimizer_applies(opt, raw)
    lr = opt["learning_rate"]
    max_steps = rc["max_steps"]
    accum = opt["grad_accum_steps"]
    # Schedules count optimizer updates: max_steps micro-batches are max_steps // accum updates.
    updates, limit = (max_steps, f"runconfig.max_steps {max_steps}") if accum == 1 else (
        None if max_steps is None else max_steps // accum,
        f"the {max_steps // accum if max_steps else 0} updates of runconfig.max_steps "
        f"{max_steps} / optimizer.grad_accum_steps {accum}")
    # A warm-up longer than the run is modelzoo's own (a run cut short of its plan): the rate
    # just never reaches its peak. Said once, not refused.
    first = lr[0] if isinstance(lr, list) else None
    warmup = (first["steps"] if first and first["scheduler"] == "Linear" and first["steps"]
              and first["end_learning_rate"] > first["initial_learning_rate"]
              else opt["warmup_steps"])
    if opt["warmup_steps"] and isinstance(lr, list):
      self.fail(("optimizer", "warmup_steps"), "optimizer.warmup_steps applies to a constant "
                "learning_rate; with schedule segments make the first segment a Linear "
                "warm-up")
    if warmup and updates is not None and warmup > updates:
      log.warning("%s: the warm-up (%d updates) is longer than %s: the learning rate never "
                  "reaches its peak", self.filename, warmup, limit)
    if max_steps is not None and accum > max_steps:
      self.fail(("optimizer", "grad_accum_steps"), f"optimizer.grad_accum_steps {accum} must "
                f"be <= runconfig.max_steps {max_steps}: no update would ever be applied")
    if rc.get("cs_ip"):
      try:
        rc["cs_ip"] = parse_cs_ip(rc["cs_ip"])
      except ConfigError as e:
        self.fail(("runconfig", "cs_ip"), f"runconfig.{e}")
    # The model family's own cross-checks (e.g. shapes a transformer needs).
    self.spec.check_params(out, self.fail)


# ---------------------------------------------------------------------------------------------
# Helpers.





def _one_line(e: BaseException) -> str:
  return " ".join(str(e).split())


def _available_models() -> List[str]:
  return registry.available_models()


def help_text() -> str:
  """Every base key with its default and help, for `--helpfull`-style listings and docs."""
  lines = []
  for section, fields in SCHEMA.items():
    lines.append(f"{section}:")
    for key, f in fields.items():
      default = "required" if f.required else f"default {_show(f.default)}"
      lines.append(f"  {key}: {f.describe()}; {default}. {f.help}")
  return "\n".join(lines)
