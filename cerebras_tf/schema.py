"""The params schema's types and the framework's own sections.

`Field` declares one key (type, default, range or choices, help). The framework's sections
(`train_input`, `eval_input`, `model`, `optimizer`, `runconfig`, `csconfig`) are declared here;
a model family adds its own keys to `model`, `train_input` and `eval_input` through its
`registry.ModelSpec.schema` (reference models: `models/*/__init__.py`).
Loading and validation are in `params.py`. No TensorFlow.
"""

import dataclasses
import difflib
import math
import re
from typing import Any, Optional, Sequence, Tuple

from cerebras_tf.core import plans


def dotted(path: Sequence) -> str:
  """A key path as an error message names it: ('optimizer', 'learning_rate', 1, 'steps') ->
  optimizer.learning_rate[1].steps."""
  out = ""
  for p in path:
    out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
  return out


def show(value) -> str:
  """A value as an error message quotes it: YAML's words for null and booleans, at most 60
  characters."""
  if value is None:
    return "null"
  if isinstance(value, bool):
    return "true" if value else "false"
  if isinstance(value, dict):
    return "a mapping"
  text = repr(value)
  return text if len(text) <= 60 else text[:57] + "..."


def suggest(word, candidates) -> str:
  """' (did you mean 'x'?)' for the candidate closest to a mistyped word, else ''."""
  if not isinstance(word, str):
    return ""
  match = difflib.get_close_matches(word, [str(c) for c in candidates], n=1, cutoff=0.6)
  return f" (did you mean '{match[0]}'?)" if match else ""


# Field kinds. "path" is a string resolved relative to the YAML file's directory.
_KINDS = ("int", "float", "bool", "str", "path", "paths", "spec", "int_list", "float_pair",
          "numbers", "mapping", "learning_rate", "loss_scale",
          "engine")
REQUIRED = object()  # a Field default that means: the key must be given

MODES = ("train", "eval", "eval_all", "train_and_eval", "predict", "export")
OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")
ENGINES = ("cs1", "cs2", "cs3")


class PastInt64(ValueError):
  """An int key's value past int64, TensorFlow's widest int (the message says so)."""


@dataclasses.dataclass(frozen=True)
class Field:
  """One params key. `low`/`high` bound numbers (inclusive unless `*_open`)."""

  kind: str
  default: Any = REQUIRED
  help: str = ""
  low: Optional[float] = None
  high: Optional[float] = None
  low_open: bool = False
  high_open: bool = False
  choices: Optional[Tuple[str, ...]] = None
  nullable: bool = False

  def __post_init__(self):
    if self.kind not in _KINDS:
      raise ValueError(f"Field kind {self.kind!r} is not one of {_KINDS}")
    if self.default is None and not self.nullable:
      object.__setattr__(self, "nullable", True)

  @property
  def required(self) -> bool:
    return self.default is REQUIRED

  def describe(self) -> str:
    """What is allowed, as it reads after 'must be'."""
    if self.choices:
      text = "one of " + ", ".join(self.choices)
    elif self.kind == "int":
      text = "an int" + self._range()
    elif self.kind == "float":
      text = "a number" + self._range()
    elif self.kind == "bool":
      text = "a bool (true/false)"
    elif self.kind == "str":
      text = "a string"
    elif self.kind == "path":
      text = "a path (string)"
    elif self.kind == "paths":
      text = "a path (string) or a list of paths"
    elif self.kind == "spec":
      text = "a name or a mapping (modelzoo's form; the model family checks it)"
    elif self.kind == "int_list":
      text = "a list of ints"
    elif self.kind == "numbers":
      text = "a mapping of names to numbers"
    elif self.kind == "mapping":
      text = "a mapping of names to numbers, booleans or strings"
    elif self.kind == "float_pair":
      text = "a list of two numbers" + self._range()
    elif self.kind == "learning_rate":
      text = ("a number > 0 or a list of schedule segments "
              "(scheduler: " + ", ".join(SCHEDULERS) + ")")
    elif self.kind == "loss_scale":
      text = "a number > 0 or 'dynamic'"
    else:  # engine
      text = "one of " + ", ".join(ENGINES) + " or a path to an engine .yaml file"
    return text + (" or null" if self.nullable else "")

  def check(self, value):
    """The value normalized (e.g. `'1e-5'` -> 1e-05), or ValueError('must be ...').

    The one rule for a key of a scalar kind or an int_list: the params validator, CSConfig
    and the model families' config dataclasses all apply it.
    """
    if value is None and self.nullable:
      return None
    ok = None
    if self.kind == "bool" and isinstance(value, bool):
      ok = value
    elif self.kind == "int":
      n = as_int(value)
      ok = n if n is not None and in_range(n, self) else None
    elif self.kind == "float":
      n = as_float(value)
      ok = n if n is not None and in_range(n, self) else None
    elif self.kind == "str" and isinstance(value, str):
      ok = value if not self.choices else next(
          (c for c in self.choices if value.strip().lower() == c.lower()), None)
    elif self.kind == "engine" and isinstance(value, str) and value.strip():
      v = value.strip()
      ok = v.lower() if v.lower() in ENGINES else v
    elif self.kind == "int_list" and isinstance(value, (list, tuple)):
      ints = [as_int(v) for v in value]  # a Python config may hold a tuple
      ok = ints if None not in ints else None
    if ok is None:
      raise ValueError(f"must be {self.describe()}, got {value!r}")
    if self.kind == "int" and self.high is None and not -INT64_MAX - 1 <= ok <= INT64_MAX:
      # Every int reaches TensorFlow as an int64 at most: a count past it is a typo.
      raise PastInt64(f"must be {self.describe()} and at most {INT64_MAX}, got {value!r}")
    return ok

  def _range(self) -> str:
    lo, hi = self.low, self.high
    if self.kind == "int" and lo is not None and hi is not None and self.low_open:
      return f" in [{_num(lo + 1)}, {_num(hi)}]"  # (0, N] reads better as [1, N] for ints
    if lo is not None and hi is not None:
      return f" in {'(' if self.low_open else '['}{_num(lo)}, {_num(hi)}{')' if self.high_open else ']'}"
    if lo is not None:
      return f" {'>' if self.low_open else '>='} {_num(lo)}"
    if hi is not None:
      return f" {'<' if self.high_open else '<='} {_num(hi)}"
    return ""


def _num(x) -> str:
  return str(int(x)) if float(x).is_integer() else str(x)


def pos_int(default, help_text, nullable=False, high=None):
  return Field("int", default, help_text, low=0, low_open=True, high=high, nullable=nullable)


# TensorFlow holds shapes in int32 in places (a reshape's shape tensor) and steps in int64.
MAX_BATCH = 2**31 - 1
INT64_MAX = 2**63 - 1
MAX_STEPS = INT64_MAX
# Counts the run allocates something for before any plan checks them: a host device per system
# or replica, a process per weight server. Bounded in the schema (before TensorFlow starts), far
# above any cluster built (CS-2's SwarmX: 192 systems), so a typo's 10^9 is one line, not a
# process that builds 10^9 device configs. The planner then checks the engine's own limit.
MAX_SYSTEMS = 1024
MAX_REPLICAS = 1024
# Each weight server is a local process (runtime/cluster.py); modelzoo configs use up to 24.
MAX_WGT_SERVERS = 64


# ---------------------------------------------------------------------------------------------
# The schema. Key names follow the public Cerebras modelzoo TF configs (e.g.
# modelzoo/transformers/tf/bert/configs/params_bert_base_msl128.yaml).

INPUT_FIELDS = {
    "data_processor": Field("str", None, "name of the data processor class (informational)"),
    "data_dir": Field("paths", None, "directory (or file) with the input data; a list: "
                      "several, read in turn (modelzoo)"),
    "batch_size": pos_int(REQUIRED, "global batch size (all replicas, all systems)",
                          high=MAX_BATCH),
    "shuffle": Field("bool", True, "shuffle the input"),
    "shuffle_seed": Field("int", None, "seed for shuffling (null: nondeterministic)", low=0),
    "shuffle_buffer": pos_int(10000, "elements in the shuffle buffer"),
    "repeat": Field("bool", True, "repeat the data forever (steps bound the run)"),
    "num_parallel_calls": Field("int", None, "parallel map calls (null or 0, modelzoo's "
                                "form: tf.data.AUTOTUNE)", low=0),
    "use_multiple_workers": Field("bool", None, "modelzoo key: each worker of a cluster reads "
                                  "its own shard (what happens here); false is refused when "
                                  "TF_CONFIG has several workers"),
    # modelzoo's PyTorch-release configs (R1.9 on) carry DataLoader keys; params.py maps them.
    "num_workers": Field("int", None, "modelzoo (PyTorch DataLoader) key: input map calls run "
                         "in parallel (num_parallel_calls; 0 is one)", low=0),
    "prefetch_factor": pos_int(None, "batches the input prepares ahead (null: tf.data "
                               "AUTOTUNE)"),
    "micro_batch_size": pos_int(None, "modelzoo's place for csconfig.micro_batch_size",
                                high=MAX_BATCH),
    "persistent_workers": Field("bool", None, "modelzoo (PyTorch DataLoader) key: the input "
                                "pipeline lives for the whole run (what happens here); false "
                                "is refused"),
}
EVAL_INPUT_DEFAULTS = {"shuffle": False, "repeat": False}

MODEL_FIELDS = {
    "name": Field("str", REQUIRED, "model family (cerebras_tf.registry; e.g. bert, mlp)"),
    "mixed_precision": Field("bool", False, "compute in bfloat16, keep fp32 weights (float32 "
                             "on a CPU without bf16 math, said once)"),
    "boundary_casting": Field("bool", False, "cast at layer boundaries only (modelzoo compat)"),
    "fp16_type": Field("str", None, "the 16-bit type of mixed precision (modelzoo): bfloat16 "
                       "here; cbfloat16, Cerebras's own, runs as bfloat16; float16 is refused",
                       choices=("bfloat16", "cbfloat16", "float16")),
    "tf_summary": Field("bool", False, "write activation summaries"),
}

OPTIMIZER_FIELDS = {
    "optimizer_type": Field("str", "adamw", "optimizer", choices=OPTIMIZERS),
    "learning_rate": Field("learning_rate", 1e-4, "a constant or a list of schedule segments"),
    "momentum": Field("float", 0.9, "momentum (momentum optimizer)", low=0, high=1,
                      high_open=True),
    "beta1": Field("float", 0.9, "Adam beta1", low=0, high=1, high_open=True),
    "beta2": Field("float", 0.999, "Adam beta2", low=0, high=1, high_open=True),
    "epsilon": Field("float", 1e-6, "Adam epsilon", low=0, low_open=True),
    "weight_decay_rate": Field("float", 0.0, "decoupled weight decay (adamw)", low=0),
    "max_gradient_norm": Field("float", None, "clip gradients to this global norm (null: off)",
                               low=0, low_open=True),
    "loss_scaling_factor": Field("loss_scale", 1.0, "static loss scale or 'dynamic'"),
    "log_summaries": Field("bool", False, "write learning-rate/gradient summaries"),
    "disable_lr_steps_reset": Field("bool", False, "modelzoo compat: segments count global steps"),
    "grad_accum_steps": pos_int(1, "micro-batches per optimizer update; the schedule counts "
                                 "updates (global_step // grad_accum_steps)"),
    "warmup_steps": Field("int", None, "linear warm-up from 0 over this many updates, then "
                          "linear decay to 0 (a constant learning_rate only)", low=0),
    "correct_bias": Field("bool", False, "AdamW bias correction (PyTorch's AdamW has it; "
                          "google-bert's, the default here, has not)"),
    # modelzoo's PyTorch-release names; params.py maps each onto the key above it names.
    "betas": Field("float_pair", None, "modelzoo (PyTorch) name for [beta1, beta2]", low=0,
                   high=1, high_open=True),
    "eps": Field("float", None, "modelzoo (PyTorch) name for epsilon", low=0, low_open=True),
    "weight_decay": Field("float", None, "modelzoo (PyTorch) name for weight_decay_rate",
                          low=0),
    "initial_loss_scale": Field("float", None, "dynamic loss scaling's first scale (modelzoo); "
                                "bfloat16 needs no loss scaling, so 'dynamic' is none here",
                                low=0, low_open=True),
    "max_loss_scale": Field("float", None, "dynamic loss scaling's ceiling (modelzoo); see "
                            "initial_loss_scale", low=0, low_open=True),
}

RUNCONFIG_FIELDS = {
    "mode": Field("str", "train", "what scripts/run.py does", choices=MODES),
    "model_dir": Field("path", "model_dir", "checkpoints and summaries"),
    "max_steps": pos_int(None, "train until this global step", high=MAX_STEPS),
    "eval_steps": Field("int", None, "eval batches (null or 0: all the eval data)", low=0),
    "save_checkpoints_steps": pos_int(1000, "checkpoint (and train_and_eval) interval"),
    "keep_checkpoint_max": Field("int", 5, "checkpoints kept (0: all)", low=0),
    "log_step_count_steps": pos_int(100, "log loss and steps/s every N steps"),
    "save_summary_steps": pos_int(100, "write summaries every N steps"),
    "tf_random_seed": Field("int", None, "graph-level random seed", low=0),
    "throttle_secs": Field("int", 0, "train_and_eval: min seconds between evals", low=0),
    "eval_frequency": pos_int(None, "train_and_eval: steps between evaluations (null: at "
                              "each checkpoint, save_checkpoints_steps)", high=MAX_STEPS),
    "cs_ip": Field("str", None, "host[:port] of the CS system (null: embedded simulator)"),
    "use_cs": Field("bool", True, "false: plain Estimator on CPU/GPU, no compile"),
    "warm_start": Field("path", None, "checkpoint (or model_dir) whose variables of the same "
                        "name and shape start a new run; the others are initialized"),
    "op_determinism": Field("bool", False, "deterministic TF ops: a resumed run ends with the "
                            "weights of an uninterrupted one (slower)"),
    # modelzoo's PyTorch-release names; params.py maps each onto the key it names.
    "log_steps": pos_int(None, "modelzoo (PyTorch) name for log_step_count_steps"),
    "checkpoint_steps": pos_int(None, "modelzoo (PyTorch) name for save_checkpoints_steps"),
    "seed": Field("int", None, "modelzoo (PyTorch) name for tf_random_seed", low=0),
    "save_initial_checkpoint": Field("bool", None, "modelzoo key: a checkpoint of the initial "
                                     "weights is written when training starts (what happens "
                                     "here); false is refused"),
    # modelzoo configs carry these two here; params.py maps them onto their owners.
    "multireplica": Field("bool", False, "modelzoo's place for csconfig.multireplica"),
    "enable_distributed": Field("bool", False, "modelzoo's multi-GPU switch: true is refused "
                                "(a cluster is TF_CONFIG here)"),
    "num_wgt_servers": pos_int(None, "modelzoo's place for csconfig.max_wgt_servers"),
    "num_workers_per_csx": pos_int(None, "modelzoo key: input workers per CS system; here "
                                   "they are the TF_CONFIG cluster's workers (read, not "
                                   "applied)"),
}

CSCONFIG_FIELDS = {
    "execution_strategy": Field("str", plans.AUTO, "how the model maps to the wafer "
                                "(auto: the compiler plans each and keeps the fastest that fits)",
                                choices=plans.STRATEGIES),
    "engine": Field("engine", "cs2", "engine model or an engine YAML"),
    "num_csx": pos_int(1, "CS systems (weight streaming)", high=MAX_SYSTEMS),
    "max_wgt_servers": pos_int(1, "MemoryX weight servers (weight streaming)",
                               high=MAX_WGT_SERVERS),
    "num_replicas": pos_int(None, "multi_replica copies (null: compiler picks)",
                            high=MAX_REPLICAS),
    "multireplica": Field("bool", False, "modelzoo switch: true means execution_strategy "
                          "multi_replica"),
    "sparsity": Field("float", 0.0, "unstructured weight sparsity (weight streaming)", low=0,
                      high=1, high_open=True),
    "vts": Field("bool", False, "variable tensor shape: cost only real tokens"),
    "micro_batch_size": pos_int(None, "weight streaming: samples per micro-batch (null: the "
                                "compiler picks the fastest that fits; modelzoo's "
                                "train_input.micro_batch_size)", high=MAX_BATCH),
    "compile_dir": Field("path", None, "compiler output (null: <model_dir>/cs_compile)"),
}

# csconfig keys that only a params file has: `multireplica` folds into execution_strategy and
# `compile_dir` is where a run writes. Every other csconfig key is a CSConfig field, in order.
CSCONFIG_FILE_ONLY = ("multireplica", "compile_dir")
ENGINE_KEYS = tuple(k for k in CSCONFIG_FIELDS if k not in CSCONFIG_FILE_ONLY)

SCHEMA = {
    "train_input": INPUT_FIELDS,
    "eval_input": INPUT_FIELDS,
    # modelzoo's fine-tuning files: the input of --mode predict (eval_input's keys).
    "predict_input": INPUT_FIELDS,
    "model": MODEL_FIELDS,
    "optimizer": OPTIMIZER_FIELDS,
    "runconfig": RUNCONFIG_FIELDS,
    "csconfig": CSCONFIG_FIELDS,
}
REQUIRED_SECTIONS = ("train_input", "model")


def field_of(key: str) -> Field:
  """The declaration of a framework key, "section.name" (e.g. "runconfig.model_dir")."""
  section, _, name = key.partition(".")
  return SCHEMA[section][name]


EXTENSIBLE_SECTIONS = ("model", "train_input", "eval_input")

# Learning-rate schedule segments (modelzoo form: a list, each with `scheduler` and `steps`).
_LR = dict(low=0)
SCHEDULERS = {
    "Linear": {
        "initial_learning_rate": Field("float", REQUIRED, "rate at the segment start", **_LR),
        "end_learning_rate": Field("float", REQUIRED, "rate at the segment end", **_LR),
        "steps": pos_int(None, "segment length (only the last segment may omit it)"),
    },
    "Constant": {
        "learning_rate": Field("float", REQUIRED, "the rate", **_LR),
        "steps": pos_int(None, "segment length (only the last segment may omit it)"),
    },
    "Exponential": {
        "initial_learning_rate": Field("float", REQUIRED, "rate at the segment start", **_LR),
        "decay_steps": pos_int(REQUIRED, "steps per decay_rate factor"),
        "decay_rate": Field("float", REQUIRED, "decay factor", low=0, low_open=True),
        "staircase": Field("bool", False, "decay in whole steps of decay_steps"),
        "steps": pos_int(None, "segment length (only the last segment may omit it)"),
    },
    "Cosine": {
        "initial_learning_rate": Field("float", REQUIRED, "rate at the segment start", **_LR),
        "end_learning_rate": Field("float", 0.0, "rate at the segment end (modelzoo TF's "
                                   "alpha is it as a fraction of initial_learning_rate)", **_LR),
        "steps": pos_int(None, "segment length (only the last segment may omit it; "
                         "decay_steps when that is given alone)"),
        "decay_steps": pos_int(None, "steps over which the rate falls to end_learning_rate, "
                               "then holds (TF's cosine_decay; null: steps)"),
    },
}


# PyYAML (YAML 1.1) reads `1e-5` (no dot) as a string; modelzoo configs use that form.
_EXP_RE = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")


def as_float(value) -> Optional[float]:
  if isinstance(value, bool):
    return None
  if isinstance(value, int):
    try:
      return float(value)
    except OverflowError:
      return None
  if isinstance(value, float):
    return value if math.isfinite(value) else None
  if isinstance(value, str) and _EXP_RE.match(value.strip()):
    number = float(value.strip())
    return number if math.isfinite(number) else None
  return None


def as_int(value) -> Optional[int]:
  if isinstance(value, bool):
    return None
  if isinstance(value, int):
    return value
  number = as_float(value) if isinstance(value, (float, str)) else None
  if number is not None and number.is_integer():
    return int(number)
  return None


def in_range(x, field: Field) -> bool:
  if field.low is not None and (x < field.low or (field.low_open and x == field.low)):
    return False
  if field.high is not None and (x > field.high or (field.high_open and x == field.high)):
    return False
  return True
