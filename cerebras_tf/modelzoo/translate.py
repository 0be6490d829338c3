"""The params validator's modelzoo steps: every translation of a modelzoo file into the keys
here, so params.py validates only its own schema.

Before validation, on the raw file: the model family (from `model.name`, `--model`, or what
the file holds: `family_of`), the model keys of a fine-tuning file's `pretrain_params_path`,
and modelzoo's TF keys (`modelzoo_keys`: those that steer only the CS compiler taken out to
be logged once, the renamed ones moved onto their owner, the ones built one way checked, the
seeds moved to `runconfig.tf_random_seed`). While validating: a modelzoo model name's family
(`family_name`), PyTorch schedule names (`pytorch_segment`), the line for a modelzoo key not
built (`unbuilt_key`). After validation: PyTorch-release and TF names moved onto the key that
owns the quantity here (`owned_keys`, `MODELZOO_NAMES`), switches that cannot hold refused.

Each step takes the validator as `v` (`Source`: the file name, the key origins, `where` and
`fail`), so a refusal names the key's file:line like every other. No TensorFlow.
"""

import logging
import os
import re
from typing import Callable, Dict, Optional, Protocol

from cerebras_tf import registry
from cerebras_tf.modelzoo import tf_files
from cerebras_tf.schema import SCHEDULERS, SCHEMA, dotted, show

log = logging.getLogger(__name__)

# modelzoo's name -> the key here that owns the quantity (same section): GPT's nonlinearity,
# and the PyTorch releases' names.
MODELZOO_NAMES = {("model", "nonlinearity"): "encoder_nonlinearity",
                  ("runconfig", "log_steps"): "log_step_count_steps",
                  ("runconfig", "checkpoint_steps"): "save_checkpoints_steps",
                  ("runconfig", "seed"): "tf_random_seed",
                  ("optimizer", "eps"): "epsilon",
                  ("optimizer", "weight_decay"): "weight_decay_rate",
                  ("train_input", "num_workers"): "num_parallel_calls",
                  ("eval_input", "num_workers"): "num_parallel_calls"}


class Source(Protocol):
  """What a step needs of the validator."""

  filename: str
  origins: Dict[tuple, str]
  moved: Dict[tuple, tuple]  # a key here -> the modelzoo-named key moved onto it

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


# ---------------------------------------------------------------------------------------------
# After validation: modelzoo-named values (the validated sections hold every key, defaults
# filled) moved onto the key that owns them here.

def unbuilt_key(section: str, key, family: str) -> Optional[str]:
  """Why an unknown key is a modelzoo key `family` does not build (one line), else None."""
  if key in tf_files.NOT_BUILT:
    return (f"{section}.{key} ({tf_files.NOT_BUILT[key]}) is not built by the {family} "
            f"model here; remove it")
  if key in tf_files.MODELZOO_KEYS and not any(key in f for f in SCHEMA.values()):
    return (f"{section}.{key} is a modelzoo key that the {family} model here does not build "
            f"(docs/modelzoo_migration.md); remove it")
  return None


def family_name(name: str) -> str:
  """A modelzoo model name (gpt2, llama, ...) as the family here that builds it (GPT builds
  LLaMA's shape from its keys: norm_type, nonlinearity, num_kv_groups, the bias switches);
  a family of ours keeps its name."""
  plain = name.lower()
  if plain in tf_files.MODEL_NAMES and name not in registry.available_models():
    return tf_files.MODEL_NAMES[plain]
  return name


def pytorch_segment(v: Source, spath: tuple, seg: dict) -> dict:
  """A schedule segment in modelzoo's PyTorch-release names (`total_iters`, `CosineDecay`,
  `LinearLR`) in the names here (`steps`, `Cosine`, `Linear`)."""
  seg = dict(seg)
  if "total_iters" in seg:
    if "steps" in seg and seg["steps"] != seg["total_iters"]:
      v.fail(spath + ("total_iters",), f"{dotted(spath)}: total_iters (modelzoo's name "
             f"for steps) {show(seg['total_iters'])} conflicts with steps "
             f"{show(seg['steps'])}; keep one of them")
    seg["steps"] = seg.pop("total_iters")
    v.origins.setdefault(spath + ("steps",), v.where(spath + ("total_iters",)))
  name = seg["scheduler"]
  if isinstance(name, str) and name.strip().lower() in ("cosine", "cosinedecay") and (
      "alpha" in seg or "decay_steps" in seg):
    seg, conflict = tf_files.as_segment_of_tf_cosine(seg)
    if conflict:
      v.fail(spath + ("alpha",), f"{dotted(spath)}: {conflict}")
    for key, source in (("end_learning_rate", "alpha"), ("steps", "decay_steps")):
      if (spath + (source,)) in v.origins:
        v.origins.setdefault(spath + (key,), v.origins[spath + (source,)])
  if isinstance(name, str):
    plain = re.sub(r"(?i)lr$", "", name.strip())
    plain = {"cosinedecay": "Cosine"}.get(plain.lower(), plain)
    if plain.lower() in {k.lower() for k in SCHEDULERS}:
      seg["scheduler"] = plain
  return seg


def renamed(v: Source, out: dict, raw: dict, old: tuple, new: tuple, value) -> None:
  """Moves a modelzoo-named value onto the key that owns it here; both given and different
  is one error."""
  section, key = new
  other = v.moved.get(new) or (new if key in (raw.get(section) or {}) else None)
  if other is not None and out[section][key] != value:
    v.fail(old, f"{dotted(old)} {show(value)} (modelzoo's name for {section}.{key}) "
           f"conflicts with {dotted(other)} {show(out[section][key])}; keep one of them")
  out[section][key] = value
  v.moved[new] = old
  v.origins[new] = v.where(old)


def pytorch_keys(v: Source, out: dict, raw: dict) -> None:
  """modelzoo's configs (the PyTorch releases, R1.9 on, most of all) name some quantities
  differently; each is moved onto its one owner here, and a switch set to what does not
  happen here is refused."""
  for (section, old), new in MODELZOO_NAMES.items():
    value = out.get(section, {}).pop(old, None)
    if value is not None:
      if old == "num_workers":
        value = max(value, 1)  # PyTorch's 0: loaded in the main process, one at a time
      renamed(v, out, raw, (section, old), (section, new), value)
  micro = [(s, out[s].pop("micro_batch_size")) for s in ("train_input", "eval_input")
           if s in out]
  for section, value in micro:  # modelzoo's place for it; one value for the run here
    if value is not None:
      renamed(v, out, raw, (section, "micro_batch_size"), ("csconfig", "micro_batch_size"),
              value)
  betas = out["optimizer"].pop("betas")
  if betas is not None:
    for key, value in zip(("beta1", "beta2"), betas):
      renamed(v, out, raw, ("optimizer", "betas"), ("optimizer", key), value)
  for section, key, what in (
      ("train_input", "persistent_workers", "the input pipeline lives for the whole run"),
      ("eval_input", "persistent_workers", "the input pipeline lives for the whole run"),
      ("runconfig", "save_initial_checkpoint", "a checkpoint of the initial weights is "
       "written when training starts (tf.estimator's CheckpointSaverHook)")):
    if out.get(section, {}).pop(key, None) is False:
      v.fail((section, key), f"{section}.{key}: false is not what happens here: {what}; "
             f"remove the key")
  if out["model"].get("fp16_type") == "float16":
    v.fail(("model", "fp16_type"), "model.fp16_type: float16 is not computed here: "
           "mixed precision is bfloat16 (float32's exponent range, no loss scaling); set "
           "bfloat16 or cbfloat16")
  opt = out["optimizer"]
  for key in ("initial_loss_scale", "max_loss_scale"):
    if opt[key] is not None and opt["loss_scaling_factor"] != "dynamic":
      v.fail(("optimizer", key), f"optimizer.{key} sets dynamic loss scaling, but "
             f"optimizer.loss_scaling_factor is {show(opt['loss_scaling_factor'])}: set "
             f"it to dynamic or remove the key")


def owned_keys(v: Source, out: dict, raw: dict) -> None:
  """Keys modelzoo configs carry elsewhere or under older names, mapped onto their one owner
  here, so a modelzoo file runs as it is."""
  pytorch_keys(v, out, raw)
  cs, rc = out["csconfig"], out["runconfig"]
  if rc.pop("multireplica"):
    cs["multireplica"] = True
  rc.pop("num_workers_per_csx", None)
  servers = rc.pop("num_wgt_servers", None)
  if servers is not None:
    renamed(v, out, raw, ("runconfig", "num_wgt_servers"), ("csconfig", "max_wgt_servers"),
            servers)
  if rc.pop("enable_distributed"):
    v.fail(("runconfig", "enable_distributed"), "runconfig.enable_distributed: true is "
           "modelzoo's multi-GPU switch; a cluster here is the TF_CONFIG environment "
           "variable (docs/distributed.md): remove the key")
  model = out["model"]
  if model.get("use_vsl"):  # modelzoo's variable sequence length is VTS here
    if (raw.get("csconfig") or {}).get("vts") is False:
      v.fail(("model", "use_vsl"), "model.use_vsl: true (modelzoo's name for csconfig.vts) "
             "conflicts with csconfig.vts: false; keep one of them")
    cs["vts"] = True
