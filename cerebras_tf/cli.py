"""The command line of `scripts/run.py`: absl flags over a params YAML file.

    python scripts/run.py --params configs/params_bert_tiny_msl128.yaml --mode train \\
        --model_dir runs/bert --max_steps 1000 --params_override optimizer.learning_rate=1e-4

Flags override YAML values (they go through the same schema validation as the file, so an
error names the flag). Bad input of any kind - params, flags, unknown flags - prints exactly one
line to stderr and exits 2, without a traceback. TensorFlow is imported only once the input is
known to be good, so those errors come back in a fraction of a second.
"""

import contextlib
import errno
import dataclasses
import difflib
import logging
import os
import re
import signal
import sys
import threading
from typing import List, Optional, Tuple

from absl import flags

from cerebras_tf.core import plans
from cerebras_tf.errors import (PREPARE_DATA, CerebrasTFError, ConfigError, Terminated, disk_full,
                                disk_full_path, raise_terminated, tf_error_text)
from cerebras_tf import params as params_lib
from cerebras_tf import registry
from cerebras_tf import runner
from cerebras_tf import schema
from cerebras_tf.runtime import ckpt_files, input_files, logs, tf_config

_USAGE = ("usage: run.py --params FILE.yaml [--mode {modes}] [--model_dir DIR] [flags]\n"
          "Flags override the YAML; --params_override SECTION.KEY=VALUE sets any params key.")

# Flags that set one params key, each defined from that key's declaration in schema.py. Flags
# not listed here only shape RunOptions.
FLAG_TO_KEY = {
    "model_dir": "runconfig.model_dir",
    "mode": "runconfig.mode",
    "cs_ip": "runconfig.cs_ip",
    "max_steps": "runconfig.max_steps",
    "eval_steps": "runconfig.eval_steps",
    "multireplica": "csconfig.multireplica",
    "num_csx": "csconfig.num_csx",
    "num_wgt_servers": "csconfig.max_wgt_servers",
    "execution_strategy": "csconfig.execution_strategy",
    "engine": "csconfig.engine",
    "compile_dir": "csconfig.compile_dir",
    "warm_start": "runconfig.warm_start",
    "model": "model.name",
}
_HELP_FLAGS = ("--help", "-h", "-help", "--helpshort", "--helpfull", "-?")


def define_flags(fv: flags.FlagValues) -> flags.FlagValues:
  """Defines the run flags in `fv`. Choices are checked by the params schema, not by absl,
  so a bad value gets the same message (with a did-you-mean) as in the YAML."""
  kw = {"flag_values": fv}
  flags.DEFINE_string("params", None, "params YAML file (required)", **kw)
  for name, key in FLAG_TO_KEY.items():  # help and type from the key's one declaration
    field = schema.field_of(key)
    define = {"int": flags.DEFINE_integer, "bool": flags.DEFINE_boolean}.get(field.kind,
                                                                             flags.DEFINE_string)
    define(name, False if field.kind == "bool" else None,
           f"{field.help}; {field.describe()} ({key})", **kw)
  flags.DEFINE_boolean("validate_only", False, "only check every op has an engine kernel", **kw)
  flags.DEFINE_boolean("compile_only", False, "compile for the engine and report, no training",
                       **kw)
  flags.DEFINE_integer("steps", None, "train this many more steps (instead of max_steps)", **kw)
  flags.DEFINE_string("checkpoint_path", None, "checkpoint for eval/predict/export (default: "
                      "latest)", **kw)
  flags.DEFINE_string("export_dir", None, "write a SavedModel under this directory (--mode "
                      "export, or after train / train_and_eval)", **kw)
  flags.DEFINE_boolean("no_cs", False, "run as a plain Estimator on CPU/GPU: no engine, no "
                       "compile (runconfig.use_cs=false)", **kw)
  flags.DEFINE_multi_string("params_override", [], "SECTION.KEY=VALUE (repeatable, or "
                            "comma-separated), e.g. train_input.batch_size=64; a list "
                            "entry: optimizer.learning_rate[1].steps=5000", **kw)
  return fv


@dataclasses.dataclass(frozen=True)
class Invocation:
  """The parsed command line: where the params are and what overrides them."""

  params_path: str
  overrides: Tuple[params_lib.Override, ...]
  validate_only: bool = False
  compile_only: bool = False
  steps: Optional[int] = None
  max_steps: Optional[int] = None
  eval_steps: Optional[int] = None
  checkpoint_path: Optional[str] = None
  export_dir: Optional[str] = None


def parse_command_line(argv: List[str]) -> Invocation:
  """argv (with the program name first) -> Invocation; bad input raises ConfigError/ParamsError."""
  fv = define_flags(flags.FlagValues())
  try:
    rest = fv(list(argv))
  except flags.UnrecognizedFlagError as e:
    name = e.flagname
    match = difflib.get_close_matches(name, list(fv), n=1, cutoff=0.6)
    hint = f" (did you mean --{match[0]}?)" if match else ""
    raise ConfigError(f"unknown flag --{name}{hint}; see --help") from None
  except flags.IllegalFlagValueError as e:
    raise ConfigError(_illegal_value_message(fv, e)) from None
  except (flags.Error, ValueError) as e:  # absl raises ValueError for `--boolflag=`
    message = " ".join(str(e).split())
    m = re.match(r"Missing value for flag (--\S+)", message)
    raise ConfigError(f"flag {m.group(1)} needs a value" if m else message) from None
  if len(rest) > 1:
    raise ConfigError(f"unexpected argument {rest[1]!r}; flags take the form --name=value")
  if not fv.params:
    raise ConfigError("--params is required: the params YAML file (e.g. --params "
                      "configs/params_bert_tiny_msl128.yaml)")

  overrides = []
  for name, key in FLAG_TO_KEY.items():
    if fv[name].present:
      overrides.append(params_lib.Override(key, fv[name].value, f"--{name}"))
  if fv.multireplica and not fv["execution_strategy"].present:
    # The flag chooses the strategy over the YAML's (configs say `pipelined`); given together
    # with --execution_strategy, the two must agree (the params schema says so).
    overrides.append(params_lib.Override("csconfig.execution_strategy",
                                         plans.MULTI_REPLICA, "--multireplica"))
  if fv.no_cs:
    overrides.append(params_lib.Override("runconfig.use_cs", False, "--no_cs"))
  overrides.extend(params_lib.parse_override(one) for text in fv.params_override
                   for one in params_lib.split_overrides(text))
  for name in ("steps",):
    value = fv[name].value
    if value is not None and not 1 <= value <= schema.MAX_STEPS:
      raise ConfigError(f"--{name} must be an int in [1, {schema.MAX_STEPS}], got {value}")
  return Invocation(params_path=fv.params, overrides=tuple(overrides),
                    validate_only=fv.validate_only, compile_only=fv.compile_only,
                    steps=fv.steps, max_steps=fv.max_steps, eval_steps=fv.eval_steps,
                    checkpoint_path=fv.checkpoint_path, export_dir=fv.export_dir)


def _illegal_value_message(fv, e) -> str:
  message = " ".join(str(e).split())
  m = re.match(r"flag --(\w+)=(.*?): ", message)
  if m and m.group(1) in fv:
    kind = {"int": "an int", "bool": "true or false"}.get(fv[m.group(1)].flag_type())
    if kind:
      return f"--{m.group(1)} must be {kind}, got {m.group(2)!r}"
  return message


def load(argv: List[str]):
  """argv -> (params dict, RunOptions), everything validated; no TensorFlow import."""
  inv = parse_command_line(argv)
  params = params_lib.load_params(inv.params_path, inv.overrides)
  rc = params["runconfig"]
  opts = runner.RunOptions(mode=rc["mode"], validate_only=inv.validate_only,
                    compile_only=inv.compile_only, steps=inv.steps, max_steps=inv.max_steps,
                    eval_steps=inv.eval_steps, checkpoint_path=inv.checkpoint_path,
                    use_cs=rc["use_cs"], export_dir=inv.export_dir)
  runner.check_sections(params, opts, inv.params_path)
  return params, opts


def main(argv: Optional[List[str]] = None) -> int:
  """Runs the command line; returns the exit code (0, or 2 for bad input)."""
  argv = list(sys.argv if argv is None else argv)
  if any(arg in _HELP_FLAGS for arg in argv[1:]):
    print(_USAGE.format(modes="|".join(schema.MODES)))
    print(define_flags(flags.FlagValues()).get_help())
    if "--helpfull" in argv:
      print("\nparams keys (model families add their own):\n" + params_lib.help_text())
    return 0
  # TensorFlow's C++ start-up lines (CUDA factories, CPU features) are not for the user; an
  # error raised by an op reaches them as the exception. Set before TensorFlow is imported.
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  with _sigterm_as_interrupt():
    return _run(argv)


@contextlib.contextmanager
def _sigterm_as_interrupt():
  """SIGTERM raises Terminated (a KeyboardInterrupt): the one line and cleanup Ctrl-C gets,
  where its default action ended the process without a word (a compile, eval or predict)."""
  if threading.current_thread() is not threading.main_thread() \
      or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
    yield
    return
  signal.signal(signal.SIGTERM, raise_terminated)
  try:
    yield
  finally:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


class _Held(logging.Handler):
  """Keeps the records it is given (params' lines, logged before the run's logging is set)."""

  def __init__(self):
    super().__init__(logging.INFO)
    self.records: List[logging.LogRecord] = []

  def emit(self, record):
    self.records.append(record)


@contextlib.contextmanager
def _held_params_log():
  """What loading the params logs (the model family a modelzoo file is for, its keys kept
  without effect, a duplicate key) is held, to be said once the run's logging routes it."""
  logger, held = logging.getLogger(params_lib.__name__), _Held()
  saved = (logger.level, logger.propagate)
  logger.addHandler(held)
  logger.setLevel(logging.INFO)
  logger.propagate = False
  try:
    yield held
  finally:
    logger.removeHandler(held)
    logger.setLevel(saved[0])
    logger.propagate = saved[1]


def _run(argv: List[str]) -> int:
  params = opts = None
  input_files.forget()  # the files an earlier run in this process read are not this run's
  try:
    with _held_params_log() as held:
      params, opts = load(argv)
    if not flags.FLAGS.is_parsed():
      flags.FLAGS.mark_as_parsed()  # absl logging (used by TF) otherwise warns on every run
    with routed_logs(params["runconfig"]["model_dir"]), _quiet_disk_full_in_threads():
      for record in held.records:  # INFO to stdout, warnings to stderr, all to the log file
        logging.getLogger("tensorflow").handle(record)  # its own file:line (params.py)
      summary = runner.run(params, opts)
  except CerebrasTFError as e:
    print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
    return e.exit_code
  except KeyboardInterrupt as e:
    terminated = isinstance(e, Terminated)
    print(f"error: {'terminated (SIGTERM)' if terminated else 'interrupted'}"
          f"{_resume_hint(params)}", file=sys.stderr)
    return 143 if terminated else 130
  except Exception as e:  # pylint: disable=broad-except
    message = (_disk_full_message(e, params) or _unwritable_message(e, params, opts)
               or _user_facing_tf_error(e, params))
    if message is None:
      raise  # a bug: keep the traceback
    print(f"error: {message}", file=sys.stderr)
    return 2
  print(runner.format_summary(summary))
  return 0


def _resume_hint(params) -> str:
  """Where an interrupted run stands: the checkpoint the same command resumes from."""
  model_dir = params["runconfig"]["model_dir"] if params else None
  if not model_dir or params["runconfig"]["mode"] not in ("train", "train_and_eval"):
    return ""
  return ckpt_files.resume_hint(model_dir)


LOG_FILE = "cerebras_tf.log"


def log_file_name() -> str:
  """cerebras_tf.log, or cerebras_tf.<task>.log for a cluster task other than the chief (the
  tasks share the model_dir)."""
  task = tf_config.current()
  if task is None or task.task_type in (None, "chief"):
    return LOG_FILE
  return f"cerebras_tf.{task.task_type}{task.task_index}.log"


class _LogFile(logging.FileHandler):
  """A log file in the model_dir, opened once the run has created that directory. On a full
  disk it stops (once, quietly): logging would print a traceback for every line, and the
  run's own disk-full error says what happened."""

  def __init__(self, path: str):
    super().__init__(path, delay=True)
    self._failed = False

  def emit(self, record):
    if self._failed:
      return
    if self.stream is not None or os.path.isdir(os.path.dirname(self.baseFilename)):
      super().emit(record)

  def handleError(self, record):
    if isinstance(sys.exc_info()[1], OSError):
      self._failed = True
      return
    super().handleError(record)

  def close(self):
    try:
      super().close()
    except OSError:  # the last flush, on a full disk
      self.stream = None


@contextlib.contextmanager
def routed_logs(model_dir: str):
  """TensorFlow's Python log (INFO and up, and Python warnings) goes to
  `<model_dir>/cerebras_tf.log`; the terminal gets only this framework's lines: INFO
  (compile summary, progress) on stdout, warnings on stderr. So an error is the one line on
  stderr, and nothing TensorFlow said is lost. The previous logging setup is restored after.
  """
  tf_logger = logging.getLogger("tensorflow")
  warn_logger = logging.getLogger("py.warnings")
  saved = (list(tf_logger.handlers), tf_logger.propagate, tf_logger.level,
           list(logging.root.handlers), list(warn_logger.handlers), warn_logger.propagate)
  to_file = _LogFile(os.path.join(model_dir, log_file_name()))
  to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
  handlers = [to_file]
  out = logging.StreamHandler(sys.stdout)
  out.addFilter(lambda r: logs.ours(r) and r.levelno < logging.WARNING)
  err = logging.StreamHandler(sys.stderr)
  err.addFilter(lambda r: logs.ours(r) and r.levelno >= logging.WARNING)
  for h in (out, err):
    h.setFormatter(logging.Formatter("%(message)s"))
  tf_logger.handlers = handlers + [out, err]
  tf_logger.propagate = False
  tf_logger.setLevel(logging.INFO)
  # TensorFlow adds its own stderr handler on first use unless the root logger has one.
  logging.root.addHandler(logging.NullHandler())
  logging.captureWarnings(True)
  warn_logger.handlers, warn_logger.propagate = list(handlers), False
  try:
    yield
  finally:
    logging.captureWarnings(False)
    for h in handlers:
      h.close()
    (tf_logger.handlers, tf_logger.propagate, level, logging.root.handlers,
     warn_logger.handlers, warn_logger.propagate) = saved
    tf_logger.setLevel(level)


@contextlib.contextmanager
def _quiet_disk_full_in_threads():
  """TensorFlow's event-writer thread prints a traceback when the disk fills; the same error
  reaches the main thread at the writer's flush, and becomes the run's one error line."""
  saved = threading.excepthook

  def hook(args):
    if not disk_full(args.exc_value):
      saved(args)
  threading.excepthook = hook
  try:
    yield
  finally:
    threading.excepthook = saved


def _disk_full_message(e: BaseException, params) -> Optional[str]:
  """A full disk outside a training step (those say which checkpoint is intact themselves):
  the model_dir's lock or log, a compile report, eval summaries, predictions, an export."""
  if not disk_full(e):
    return None
  mode = params["runconfig"]["mode"] if params else "run"
  model_dir = params["runconfig"]["model_dir"] if params else None
  where = disk_full_path(e) or model_dir or "a file"
  return (f"disk full while writing {where}: {mode} stopped, and what was written before it is "
          f"intact; free some space (or choose another --model_dir) and rerun the same command")


# What a write that the filesystem refuses says: Python's errno, TensorFlow's message.
_WRITE_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EISDIR,
                 errno.EEXIST, errno.EDQUOT, errno.EFBIG, errno.ENAMETOOLONG)
_TF_WRITE_REFUSED = re.compile(r"^(?P<path>/\S*?):? (?:is not a directory|Not a directory|"
                               r"Read-only file system|Permission denied|Is a directory)|"
                               r"(?P<path2>/\S*?); (?P<why>Read-only file system|Permission "
                               r"denied|Not a directory|Is a directory)")


def output_dirs(params, opts) -> List[Tuple[str, str]]:
  """(directory, the key or flag that names it) of everything a run writes."""
  if not params:
    return []
  model_dir = params["runconfig"]["model_dir"]
  out = [(params["csconfig"].get("compile_dir") or os.path.join(model_dir, "cs_compile"),
          "csconfig.compile_dir (--compile_dir)"),
         (model_dir, "runconfig.model_dir (--model_dir)")]
  if opts is not None and opts.export_dir:
    out.insert(0, (opts.export_dir, "--export_dir"))
  return out


def _unwritable_message(e: BaseException, params, opts) -> Optional[str]:
  """One line for a write the filesystem refused (read-only, not a directory, permission,
  quota) anywhere under a directory the run writes, in Python or in TensorFlow's C++: the
  path and the key or flag that chose it. A check before the run catches most; this is the
  rule for every write after it (a report, a checkpoint, an export)."""
  path = why = None
  if isinstance(e, OSError) and e.errno in _WRITE_ERRNOS and e.filename:
    path, why = str(e.filename), e.strerror or str(e)
  elif "tensorflow" in sys.modules and isinstance(e, sys.modules["tensorflow"].errors.OpError):
    m = _TF_WRITE_REFUSED.search(tf_error_text(e))
    if m:
      path = m.group("path") or m.group("path2")
      why = m.group("why") or m.group(0)[len(path):].strip(" :")
  if path is None:
    return None
  for directory, key in output_dirs(params, opts):
    top = os.path.abspath(directory)
    here = os.path.abspath(path)
    if here == top or here.startswith(top + os.sep) or top.startswith(here + os.sep):
      return (f"cannot write {path}: {why}; {key} must name a writable directory: make it "
              f"writable or choose another, and rerun (nothing written before is lost)")
  if isinstance(e, OSError) and e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
    return f"cannot write {path}: {why}; make it writable or choose another path"
  return None


def _user_facing_tf_error(e: BaseException, params=None) -> Optional[str]:
  """One line for TensorFlow errors that are the user's to fix (a missing or corrupt data
  file, an unwritable model_dir), else None."""
  if isinstance(e, (FileNotFoundError, NotADirectoryError, IsADirectoryError)):
    what = " ".join((e.strerror or str(e)).split())
    where = f": {e.filename}" if e.filename else ""
    return f"{what}{where}; fix the path in the params file (or run `{PREPARE_DATA}`)"
  if "tensorflow" not in sys.modules:
    return None
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  first = tf_error_text(e)
  raised = re.search(r"^\s*(?:[\w.]+\.)?DataError: (.+)$", str(getattr(e, "message", e)), re.M)
  if isinstance(e, tf.errors.OpError) and raised:
    return raised.group(1)  # the input pipeline's Python (a numpy_function) said what is wrong
  if isinstance(e, tf.compat.v1.train.NanLossDuringTrainingError):
    # The plain-Estimator path (--no_cs); with the engine the runtime names the step itself.
    return ("loss is NaN: training stopped (tf.estimator's NanTensorHook; checkpoints in "
            "model_dir are intact); lower optimizer.learning_rate, set "
            "optimizer.max_gradient_norm, or enable loss scaling")
  key = re.search(r"Key (\S+) not found in checkpoint", str(getattr(e, "message", e)))
  if isinstance(e, tf.errors.NotFoundError) and key:
    return ("the checkpoint in model_dir does not match this model"
            + f" (no variable {key.group(1)} in it)"
            + "; use a fresh runconfig.model_dir (--model_dir) or the params it was trained with")
  if isinstance(e, tf.errors.FailedPreconditionError) and re.search(
      r"Is a directory|Not a directory", first):
    return f"cannot read data: {first}; fix the data path in the params file"
  gone = re.search(r"(\S+\.ckpt-\d+)", first)
  if isinstance(e, (tf.errors.NotFoundError, ValueError)) and gone and re.search(
      r"Failed to find any matching files|not a valid checkpoint", first):
    return (f"checkpoint {gone.group(1)} is gone: a training run on this model_dir deletes all "
            f"but its newest keep_checkpoint_max checkpoints; rerun (the newest is read), or "
            f"name one that is kept (--checkpoint_path)")
  if isinstance(e, tf.errors.NotFoundError):
    return (f"file not found: {first}; run `{PREPARE_DATA}` to fetch the "
            f"datasets, or fix the path in the params file")
  if isinstance(e, tf.errors.PermissionDeniedError):
    return (f"permission denied: {first}; make that path writable, or choose another "
            f"(runconfig.model_dir / --model_dir, or the data paths in the params file)")
  missing = re.search(r"Feature: (\S+) \(data type: (\w+)\) is required but could not be found",
                      str(getattr(e, "message", e)))
  if isinstance(e, tf.errors.InvalidArgumentError) and missing:
    where = _input_fn_name(params)
    where = f" ({where} names them)" if where else ""
    return (f"the input records have no feature '{missing.group(1)}' ({missing.group(2)}), "
            f"which this model's input_fn reads; write them with the feature names it "
            f"parses{where}, or point the data paths in the params file at data from "
            f"`{PREPARE_DATA}`")
  if isinstance(e, tf.errors.InvalidArgumentError) and first.startswith("assertion failed: ["):
    # A tf.debugging.assert_* in an input_fn or model_fn (ours or the user's): its message,
    # then TF's "[Condition ...] [x (name) = ] [values] [y (name) = ] [values]".
    parts = first[len("assertion failed: ["):].rstrip("]").replace("\\'", "'").split("] [")
    said = f"assertion failed: {parts[0]}"
    if len(parts) >= 6 and parts[1].startswith("Condition "):
      said += f" ({parts[1][len('Condition '):]} x = {parts[3]}, y = {parts[5]})"
    return said
  outside = re.search(r"indices\[[\d,]+\] = (-?\d+) is not in \[0, (\d+)\)", first)
  if isinstance(e, tf.errors.InvalidArgumentError) and outside:
    # An embedding or softmax table indexed by an id the data holds: most often data written
    # with another tokenizer (GPT-2's 50,257 ids into a 30,522-row WordPiece table).
    node = re.search(r"\{\{node ([^}]+)\}\}", str(getattr(e, "message", e)))
    layer = node.group(1).replace("gradients/", "").rsplit("/", 1)[0] if node else "the model"
    layer = re.sub(r"/[^/]*_grad$", "", layer)
    return (f"the data holds id {outside.group(1)}, outside the {int(outside.group(2)):,} rows "
            f"of the table {layer} indexes: it was written with a larger vocab than the "
            f"model's; set model.vocab_size (or your table's size) above the data's largest "
            f"id, or write the data with the model's vocab")
  if isinstance(e, tf.errors.DataLossError) and "Is this even a TFRecord file?" in first:
    # Its first record is already wrong: a text file (CSV, TSV) given where records go.
    where = _input_fn_name(params)
    return (f"the data is not a TFRecord file (its first record is unreadable): this input "
            f"reads TFRecords of "
            f"tf.train.Example{f' ({where})' if where else ''}; convert your data (a CSV or "
            f"TSV) to them, or point the data paths in the params file at data from "
            f"`{PREPARE_DATA}`")
  if isinstance(e, tf.errors.DataLossError):
    at = re.search(r"corrupted record at (\d+)", first)
    damaged = _damaged_record_file(tf, int(at.group(1)) if at else None)
    where = f" in {damaged}" if damaged else ""
    return (f"corrupt data{where}: {first}; re-create it with `{PREPARE_DATA} --force` "
            f"or remove the damaged file")
  return None


def _damaged_record_file(tf, offset: Optional[int]) -> Optional[str]:
  """The first TFRecord file the inputs read (runtime/input_files.py) whose records do not all
  read back: a checksum fails, or it ends mid-record. Only files longer than `offset`, the
  position TensorFlow's message gives. Reads them: called once a read has failed."""
  for path, compression in input_files.tfrecords():
    try:
      if offset is not None and not compression and os.path.getsize(path) <= offset:
        continue
      for _ in tf.data.TFRecordDataset(path, compression_type=compression):
        pass
    except tf.errors.DataLossError:
      return path
    except (tf.errors.OpError, OSError):
      continue
  return None


def _input_fn_name(params) -> Optional[str]:
  """`module:function` of the model family's input_fn, for a message about its data."""
  family = ((params or {}).get("model") or {}).get("name")
  if not family:
    return None
  ref = registry.get_model(family).input_fn
  if isinstance(ref, str):
    return ref
  return f"{getattr(ref, '__module__', '?')}:{getattr(ref, '__qualname__', '?')}"


def run_main():
  """Console-script entry point (`cerebras-run`)."""
  sys.exit(main())
