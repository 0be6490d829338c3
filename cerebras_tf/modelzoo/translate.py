"""The steps the params validator runs on a modelzoo file before validating it: the model
family (from `model.name`, `--model`, or what the file holds), the model keys of a fine-tuning
file's `pretrain_params_path`, and modelzoo's TF keys (those that steer only the CS compiler
taken out to be logged once, the renamed ones moved onto their owner, the ones built one way
checked, the seeds moved to `runconfig.tf_random_seed`).

Each step takes the validator as `v` (`Source`: the file name, the key origins, `where` and
`fail`), so a refusal names the key's file:line like every other. No TensorFlow.
"""

import logging
import os
from typing import Callable, Dict, Optional, Protocol

from cerebras_tf import registry
from cerebras_tf.modelzoo import tf_files
from cerebras_tf.schema import show

log = logging.getLogger(__name__)


class Source(Protocol):
  """What a step needs of the validator."""

  filename: str
  origins: Dict[tuple, str]

  def where(self, path: tuple) -> str: ...

  def fail(self, path: tuple, message: str): ...


def family_of(v: Source, raw: dict) -> Optional[tf_files.Family]:
  """model.name (or --model), else the family modelzoo's file is for (its data_processor,
  its model keys), written into raw's model.name (and BERT's model.task); a family not
  built here is refused by name."""
  model = raw.get("model")
  if model is not None and not isinstance(model, dict):
    return None  # refused as a section that is not a mapping
  model = {} if model is None else model
  name = model.get("name")
  if isinstance(name, str):
    plain = name.strip().lower()
    if plain in tf_files.UNBUILT:
      v.fail(("model", "name"), f"model.name {name}: the "
                f"{tf_files.UNBUILT[plain]} family is not built here; available: "
                + ", ".join(registry.available_models()))
    # Named (--model bert on an MNLI file, say): what the file holds still gives the task
    # and the defaults of that family's modelzoo model.
    family = tf_files.infer_family(raw)
    if family is None or tf_files.MODEL_NAMES.get(plain, plain) != family.name:
      return None
  elif "name" in model:
    return None  # model.name: null and the like: refused as the value it is
  else:
    family = tf_files.infer_family(raw)
    if family is None:
      return None  # "model.name is required" says what to do
    if family.name in tf_files.UNBUILT:
      v.fail(("model",) if "model" in v.origins or ("model",) in v.origins else (),
                tf_files.refusal(family))
    model["name"] = family.name
  where = v.where(("model",))
  raw["model"] = model
  v.origins.setdefault(("model", "name"), where)
  if family.task and "task" not in model and family.name == "bert":
    model["task"] = family.task
    v.origins.setdefault(("model", "task"), where)
  for (section, key), value in tf_files.family_defaults(family, model).items():
    target = raw.setdefault(section, {}) if raw.get(section) is None else raw[section]
    if isinstance(target, dict) and key not in target:
      target[key] = value
      v.origins.setdefault((section, key), where)
  log.info("%s: model family %s (from %s)", v.filename, family.name, family.why)
  return family


def pretrain_params(v: Source, raw: dict, read_yaml: Callable) -> None:
  """modelzoo's fine-tuning `model.pretrain_params_path`: the model keys of the pretraining
  params file it names, under this file's own (which win), as modelzoo's set_defaults."""
  model = raw.get("model")
  if not isinstance(model, dict) or "pretrain_params_path" not in model:
    return
  value = model.pop("pretrain_params_path")
  path = ("model", "pretrain_params_path")
  if value is None:
    return
  if not isinstance(value, str) or not value.strip():
    v.fail(path, f"model.pretrain_params_path must be a path to a params file, got "
              f"{show(value)}")
  found = tf_files.resolve_pretrain_params(value, v.filename, os.path.isfile)
  if found is None:
    v.fail(path, f"model.pretrain_params_path {value}: no such file next to this one or "
              f"its run.py folder; point it at the pretraining params file (or remove it "
              f"and give the model keys here)")
  try:
    with open(found, "rb") as f:
      other, other_origins = read_yaml(f.read().decode("utf-8"), found)
  except (OSError, UnicodeDecodeError) as e:
    v.fail(path, f"model.pretrain_params_path {found}: cannot read it: {e}")
  base = other.get("model") if isinstance(other, dict) else None
  if not isinstance(base, dict):
    v.fail(path, f"model.pretrain_params_path {found} has no model section")
  for key, value in base.items():
    if key not in model:
      model[key] = value
      v.origins[("model", key)] = other_origins.get(("model", key), found)


def modelzoo_keys(v: Source, raw: dict) -> list:
  """modelzoo TF keys: those that steer only the CS compiler are taken out (returned, to be
  logged once); those with another name here are moved onto it."""
  kept = []
  for (section, key) in tf_files.COMPILER_ONLY:
    if isinstance(raw.get(section), dict) and key in raw[section]:
      raw[section].pop(key)
      kept.append((section, key))
  for (section, key), (to_section, to_key) in tf_files.RENAMED.items():
    if not isinstance(raw.get(section), dict) or key not in raw[section]:
      continue
    value = raw[section].pop(key)
    target = raw.setdefault(to_section, {})
    if not isinstance(target, dict):
      continue  # refused as a section that is not a mapping
    if to_key in target and target[to_key] != value:
      v.fail((section, key), f"{section}.{key} {show(value)} (modelzoo TF's name for "
                f"{to_section}.{to_key}) conflicts with {to_section}.{to_key} "
                f"{show(target[to_key])}; keep one of them")
    target[to_key] = value
    v.origins[(to_section, to_key)] = v.where((section, key))
  for (section, key), built in tf_files.BUILT_AS.items():
    if not isinstance(raw.get(section), dict) or key not in raw[section]:
      continue
    value = raw[section][key]
    if value != built and not (key == "embedding_size"):
      v.fail((section, key), f"{section}.{key} {show(value)}: not built here (the "
                f"models build {show(built)}, modelzoo's default); remove the key")
    raw[section].pop(key)
  model = raw.get("model") if isinstance(raw.get("model"), dict) else {}
  if "embedding_size" in model:  # modelzoo: the embeddings' width, hidden_size unless given
    if model["embedding_size"] not in (None, model.get("hidden_size")):
      v.fail(("model", "embedding_size"), f"model.embedding_size "
                f"{show(model['embedding_size'])}: embeddings as wide as hidden_size are "
                f"built here (no projection); remove the key or set it to hidden_size")
    model.pop("embedding_size")
  runconfig = raw.setdefault("runconfig", {}) if raw.get("runconfig") is None else \
      raw["runconfig"]
  for section, key in tf_files.SEEDS:
    if key in model:
      seed = model.pop(key)
      if seed is not None and isinstance(runconfig, dict) and \
          runconfig.get("tf_random_seed") is None:
        runconfig["tf_random_seed"] = seed
        v.origins[("runconfig", "tf_random_seed")] = v.where((section, key))
  return kept
