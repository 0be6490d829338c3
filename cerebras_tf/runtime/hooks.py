"""Session hooks for runs on the (simulated) engine: progress, TensorBoard, NaN guard, Ctrl-C,
the weight servers' stall watch."""

import math
import os
import select
import signal
import struct
import sys
import threading
import time
from typing import List, Optional, Tuple

import tensorflow as tf
from tensorflow.python.framework import meta_graph  # create_meta_graph_def, as TF's saver hook
from tensorflow.python.lib.io import file_io  # atomic_write_string_to_file, as TF's writer
from tensorflow.python.training import training_util  # the step read TF's own hooks fetch

from cerebras_tf.core.plans import fmt_share
from cerebras_tf.errors import DataError, NonFiniteLossError, Terminated, raise_terminated
from cerebras_tf.runtime import ckpt_files

# After a stop signal, how long a step may take to finish before the run is stopped without
# it (at least; 10x the longest step so far if that is more).
STOP_GRACE_S = float(os.environ.get("CEREBRAS_TF_STOP_GRACE_S", 60))


# PNG colour type (IHDR) -> Summary.Image colorspace: grey, grey + alpha, RGB, RGBA.
_COLORSPACE = {0: 1, 4: 2, 2: 3, 6: 4}


def _png_header(png: bytes):
  """(width, height, Summary colorspace) from a PNG header."""
  width, height = struct.unpack(">II", png[16:24])
  return width, height, _COLORSPACE.get(png[25], 3)


def wafer_image_summary(png: bytes, tag: str = "cerebras/wafer_placement") -> tf.compat.v1.Summary:
  width, height, colorspace = _png_header(png)
  image = tf.compat.v1.Summary.Image(encoded_image_string=png, height=height, width=width,
                                     colorspace=colorspace)
  return tf.compat.v1.Summary(value=[tf.compat.v1.Summary.Value(tag=tag, image=image)])


def input_ran_out() -> bool:
  """Inside a hook's `end`: whether training is ending because the input_fn's data ran out.
  tf.estimator stops at the end of the input before max_steps; MonitoredSession swallows the
  OutOfRangeError and calls the hooks' `end` from its `__exit__`, where that error is still the
  one being handled. (A stop a hook requested, Ctrl-C or max_steps raise nothing.)"""
  return isinstance(sys.exc_info()[1], (tf.errors.OutOfRangeError, StopIteration))


def _fmt_eta(seconds: float) -> str:
  if not math.isfinite(seconds) or seconds < 0:
    return "?"
  seconds = int(seconds)
  return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class CSProgressHook(tf.compat.v1.train.SessionRunHook):
  """Logs step, loss, host examples/s, simulated engine samples/s and ETA; guards against NaN.

  Every `every_n_steps` it also writes TensorBoard scalars `cerebras/*` into `summary_dir`, and
  once, at the first step, the wafer placement picture.
  """

  def __init__(self, loss: tf.Tensor, batch_size: int, simulated_samples_per_sec: float,
               utilization: float, summary_dir: Optional[str], last_step: Optional[int],
               every_n_steps: int = 100, wafer_png: Optional[bytes] = None,
               model_dir: Optional[str] = None, log_fn=None,
               input_samples_per_sec: Optional[float] = None):
    self._loss = loss
    self._batch = batch_size
    self._sim_sps = simulated_samples_per_sec
    self._util = utilization
    self._summary_dir = summary_dir
    self._last_step = last_step
    self._every = max(1, int(every_n_steps))
    self._wafer_png = wafer_png
    self._model_dir = model_dir
    self._log = log_fn or tf.compat.v1.logging.info
    self._input_sps = input_samples_per_sec

  def begin(self):
    # The read of the step TF's hooks fetch (the saver's, the step counter's), not the
    # variable: a run's fetches are then those of the runs between logging steps, and TF
    # prunes and optimizes one graph fewer (a new set of fetches is a new executor: Grappler
    # and first-run cost again, ~0.4 s for BERT-tiny on the AVX2 host).
    self._global_step = training_util._get_or_create_global_step_read()  # pylint: disable=protected-access
    self._writer = (tf.compat.v1.summary.FileWriterCache.get(self._summary_dir)
                    if self._summary_dir else None)
    self._t0 = None
    self._step0 = None
    self._since_t = None
    self._since_step = None
    self._runs = 0
    self._start = None

  def after_create_session(self, session, coord):
    # The step before the first run, read while nothing trains; runs count on from it. Read
    # in the same run as the train_op, the global step may be taken before or after that
    # run's increment (under MirroredStrategy it was, now and then: "step 2" printed twice,
    # "step 1" never), so that read only corrects a count other workers have moved.
    del coord
    self._start = int(session.run(self._global_step))

  def before_run(self, run_context):
    # Fetch only on logging steps: tf.estimator's NanTensorHook already checks every step
    # (CerebrasEstimator turns its error into ours), and a fetch per step costs throughput.
    self._runs += 1
    if self._t0 is not None and self._runs % self._every:
      return None
    return tf.compat.v1.train.SessionRunArgs({"loss": self._loss, "step": self._global_step})

  def after_run(self, run_context, run_values):
    if run_values.results is None:
      return
    loss = float(run_values.results["loss"])
    step = self._start + self._runs  # the step just taken: each run advances it by one
    read = int(run_values.results["step"]) + 1
    if abs(read - step) > 1:  # other workers advance it too (between-graph weight servers)
      self._start, step = read - self._runs, read
    now = time.perf_counter()
    if not math.isfinite(loss):
      raise NonFiniteLossError(loss, step)
    total = f"/{self._last_step}" if self._last_step else ""
    if self._t0 is None:
      self._t0, self._step0 = now, step
      self._since_t, self._since_step = now, step
      if self._writer is not None and self._wafer_png:
        self._writer.add_summary(wafer_image_summary(self._wafer_png), step)
      self._log(f"step {step}{total}  loss {loss:.6g}  (rates from the next line on)")
      return
    host_eps = (step - self._since_step) * self._batch / max(now - self._since_t, 1e-9)
    overall = (step - self._step0) / max(now - self._t0, 1e-9)
    eta = (self._last_step - step) / overall if self._last_step and overall > 0 else float("nan")
    self._log(f"step {step}{total}  loss {loss:.6g}  host {host_eps:,.1f} examples/s  "
              f"engine (simulated) {self._sim_sps:,.0f} samples/s  "
              f"util {fmt_share(self._util)}  ETA {_fmt_eta(eta)}")
    if self._writer is not None:
      summary = tf.compat.v1.Summary(value=[
          tf.compat.v1.Summary.Value(tag="cerebras/simulated_samples_per_sec", simple_value=self._sim_sps),
          tf.compat.v1.Summary.Value(tag="cerebras/simulated_utilization", simple_value=self._util),
          tf.compat.v1.Summary.Value(tag="cerebras/host_examples_per_sec", simple_value=host_eps),
      ] + ([tf.compat.v1.Summary.Value(tag="cerebras/host_input_samples_per_sec",
                                       simple_value=self._input_sps)] if self._input_sps else []))
      self._writer.add_summary(summary, step)
    self._since_t, self._since_step = now, step

  def last_run_step(self) -> Optional[int]:
    """The global step the last session run took (counted from the session's start)."""
    return None if self._start is None or not self._runs else self._start + self._runs

  def end(self, session):
    if self._writer is not None:
      self._writer.flush()
    if input_ran_out():
      step = int(session.run(self._global_step))
      if self._t0 is None:  # not one batch: the run would "succeed" at the step it began
        raise DataError(
            f"the input_fn gave no batch at all: its data is empty or smaller than one "
            f"batch of {self._batch:,} examples (batches are dropped when partial, as the "
            f"engine's static shapes need); add data, or lower the batch size")
      if self._last_step is None or step < self._last_step:
        of = f" of {self._last_step}" if self._last_step else ""
        tf.compat.v1.logging.warning(
            f"cerebras_tf: the input_fn's data ran out at step {step}{of}: training stopped "
            f"there (tf.estimator stops at the end of the input); .repeat() the dataset to "
            f"train to max_steps, or call train again for another pass over the data")


class BatchProgressHook(tf.compat.v1.train.SessionRunHook):
  """Evaluation or prediction progress (`what`): batches, examples, examples/s and (when the
  number of batches is known) ETA, at most every `every_s` seconds, then the total.
  tf.estimator's own "Evaluation [n/N]" lines are INFO, hidden at TensorFlow's default
  verbosity, and absent when the eval runs to the end of its data; predict has none.
  Examples are counted from the rows each batch really had (a last batch may be partial),
  read off the input iterator; `batch_size` is the count when there is none to read."""

  def __init__(self, batch_size: Optional[int], total_batches: Optional[int],
               what: str = "eval", every_s: float = 10.0, log_fn=None, clock=time.monotonic):
    self._what = what
    self._batch = batch_size
    self._total = total_batches
    self._every = every_s
    self._log = log_fn or tf.compat.v1.logging.info
    self._clock = clock

  def begin(self):
    self._n, self._rows, self._t0, self._last = 0, 0, None, None
    self._started = self._clock()  # the total counts session start-up and restore too
    self._rows_tensor = _batch_rows(tf.compat.v1.get_default_graph())

  def before_run(self, run_context):
    if self._rows_tensor is None:
      return None
    return tf.compat.v1.train.SessionRunArgs(self._rows_tensor)

  def after_run(self, run_context, run_values):
    self._n += 1
    self._rows += (int(run_values.results) if self._rows_tensor is not None
                   else (self._batch or 0))
    now = self._clock()
    if self._t0 is None:
      self._t0, self._last, self._rows0 = now, now, self._rows
    elif now - self._last >= self._every:
      self._last = now
      seconds = max(now - self._t0, 1e-9)
      eta = (f"  ETA {_fmt_eta((self._total - self._n) * seconds / (self._n - 1))}"
             if self._total else "")
      self._log(f"{self._what} batch {self._n}{f'/{self._total}' if self._total else ''}"
                f"{self._examples()}  {self._rate(self._n - 1, self._rows - self._rows0, seconds)}"
                f"{eta}")

  def end(self, session):
    if self._n:
      seconds = self._clock() - self._started
      self._log(f"{self._what} done: {self._n} batch(es){self._examples()} in {seconds:.1f} s")

  @property
  def batches(self) -> int:
    """Batches the last evaluation or prediction ran."""
    return self._n

  def _examples(self) -> str:
    return f" ({self._rows:,} examples)" if self._rows else ""

  def _rate(self, batches: int, rows: int, seconds: float) -> str:
    if rows:
      return f"{rows / seconds:,.1f} examples/s"
    return f"{batches / seconds:,.2f} batches/s"


def _batch_rows(graph) -> Optional[tf.Tensor]:
  """Rows of the batch the input iterator yields each step: the leading dimension of its
  first output, when the graph has one iterator and that output has a batch dimension."""
  nexts = [op for op in graph.get_operations() if op.type == "IteratorGetNext"]
  if len(nexts) != 1 or not nexts[0].outputs or nexts[0].outputs[0].shape.rank in (None, 0):
    return None
  with graph.as_default(), tf.name_scope("progress"):
    return tf.shape(nexts[0].outputs[0], out_type=tf.int64)[0]


class GracefulInterrupt:
  """Ctrl-C (or SIGTERM) during training stops it at the end of the step it is in, so that the
  session's end() hooks save the model and the input pipeline's position at that same step (a
  KeyboardInterrupt raised mid-step skips them, and one that falls between the two saves
  leaves the pair torn; SIGTERM's default action saved nothing at all). A second signal
  interrupts at once.

  Around Estimator.train, with `.hook` among its hooks; on a clean exit after a signal it
  raises KeyboardInterrupt (Terminated for SIGTERM), so callers still see an interrupted run.
  Only in the main thread, and only for a signal with Python's default handling (a launcher or
  a notebook keeps its own).
  """

  # The handlers it takes over: Python's own, and the CLI's SIGTERM one (errors.raise_terminated).
  _DEFAULTS = {signal.SIGINT: (signal.default_int_handler,),
               signal.SIGTERM: (signal.SIG_DFL, raise_terminated)}

  def __init__(self, model_dir: Optional[str] = None, grace_s: float = STOP_GRACE_S):
    self.requested = False
    self.hook = _StopWhenRequested(self)
    self._previous = {}
    self._by = None
    self._model_dir = model_dir
    self._grace_s = grace_s
    self._watch: Optional[_StuckStepWatch] = None
    self.step_started: Optional[float] = None  # set by the hook
    self.step_ended = time.monotonic()
    self.longest_step = 0.0
    self.handled = 0  # signals the main thread's handler took

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      for signum, defaults in self._DEFAULTS.items():
        if signal.getsignal(signum) in defaults:
          self._previous[signum] = signal.signal(signum, self._on_signal)
      if self._previous:
        self._watch = _StuckStepWatch(self, set(self._previous)).start()
    return self

  def _on_signal(self, signum, frame):
    del frame
    self.handled += 1
    stop = Terminated if signum == signal.SIGTERM else KeyboardInterrupt
    if self.requested:
      raise stop
    self.requested, self._by = True, stop
    what = "SIGTERM" if stop is Terminated else "Ctrl-C"
    tf.compat.v1.logging.info("cerebras_tf: %s: stopping after this step and saving a "
                              "checkpoint there (%s again to stop at once)", what, what)

  def __exit__(self, exc_type, exc, tb):
    if self._watch is not None:
      self._watch.stop()
    for signum, previous in self._previous.items():
      signal.signal(signum, previous)
    if exc_type is None and self.requested:
      raise self._by("stopped at a step boundary after a signal; checkpoint saved")
    return False

  def grace(self) -> float:
    return max(self._grace_s, 10 * self.longest_step)

  def stop_now(self, why: str, signum: int) -> None:
    """Ends the process from the watch thread: the main thread is stuck in TensorFlow."""
    hint = ckpt_files.resume_hint(self._model_dir) if self._model_dir else ""
    print(f"error: {why}{hint}", file=sys.stderr, flush=True)
    os._exit(128 + signum)  # pylint: disable=protected-access


class _StuckStepWatch:
  """Stops the run from a thread when the main thread cannot take the signal.

  Python runs a signal handler in the main thread between bytecodes; a main thread blocked in
  a TensorFlow step (a collective waiting on a peer that stopped answering, a weight server
  that hangs) runs none, so Ctrl-C, SIGTERM and `timeout` did nothing, however often sent.
  The C-level handler still writes each signal to the wakeup fd, which this thread reads: a
  second signal the main thread has not taken within 2 s, or a first one whose step has not
  finished within the grace period, ends the process with one line naming the checkpoint it
  resumes from.
  """

  _SECOND_S = 2.0

  def __init__(self, owner: GracefulInterrupt, watched):
    self._owner = owner
    self._watched = watched  # the signals the owner took over
    self._read, self._write = os.pipe()
    os.set_blocking(self._write, False)
    self._previous_fd = -1
    self._signals: List[Tuple[int, float]] = []
    self._done = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True,
                                    name="cerebras_tf-stuck-step")

  def start(self) -> "_StuckStepWatch":
    self._previous_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
    self._thread.start()
    return self

  def stop(self) -> None:
    self._done.set()
    signal.set_wakeup_fd(self._previous_fd)
    self._thread.join(5)
    os.close(self._read)
    os.close(self._write)

  def _run(self) -> None:
    while not self._done.is_set():
      if select.select([self._read], [], [], 0.25)[0]:
        now = time.monotonic()
        self._signals += [(b, now) for b in os.read(self._read, 64) if b in self._watched]
      if not self._signals or self._done.is_set():
        continue
      signum, first = self._signals[0]
      what = "SIGTERM" if signum == signal.SIGTERM else "Ctrl-C"
      now = time.monotonic()
      if (len(self._signals) > 1 and now - self._signals[1][1] > self._SECOND_S
          and self._owner.handled < 2):
        self._owner.stop_now(f"{what} again, and the step in progress has not returned (a "
                             f"peer or weight server that stopped answering?): stopped at "
                             f"once, without a checkpoint at this step", self._signals[1][0])
      if self._owner.step_ended < first and now - first > self._owner.grace():
        self._owner.stop_now(f"{what} {now - first:.0f}s ago, and the step in progress has "
                             f"not finished (a peer or weight server that stopped "
                             f"answering?): stopped without it", signum)


class _StopWhenRequested(tf.compat.v1.train.SessionRunHook):
  def __init__(self, owner: GracefulInterrupt):
    self._owner = owner

  def before_run(self, run_context):
    self._owner.step_started = time.monotonic()

  def after_run(self, run_context, run_values):
    now = time.monotonic()
    if self._owner.step_started is not None:
      self._owner.longest_step = max(self._owner.longest_step, now - self._owner.step_started)
    self._owner.step_ended = now
    if self._owner.requested:
      run_context.request_stop()


class StepWatchHook(tf.compat.v1.train.SessionRunHook):
  """Tells `watch` (runtime/cluster.LocalCluster) when each step starts and finishes, so a
  step stalled on the weight servers is noticed."""

  def __init__(self, watch):
    self._watch = watch

  def before_run(self, run_context):
    self._watch.step_started()

  def after_run(self, run_context, run_values):
    self._watch.step_finished()

  def end(self, session):
    self._watch.step_finished()


def write_graph_text(graph_def, directory: str, name: str = "graph.pbtxt") -> None:
  """Writes `graph_def` as a text proto, as tf.io.write_graph(as_text=True) does, but with the
  protobuf runtime's own encoder (`str`: upb's C one in TF 2.15's protobuf) instead of the
  pure-Python text_format: the same GraphDef when parsed back (map entries may come in another
  order), ~8x faster (BERT-tiny's 4.1 MB graph: 0.45 -> 0.05 s, paid at every train call)."""
  tf.io.gfile.makedirs(directory)
  file_io.atomic_write_string_to_file(os.path.join(directory, name), str(graph_def))


class CheckpointSaverHook(tf.compat.v1.train.CheckpointSaverHook):
  """tf.estimator's checkpoint saver, the same in all but how graph.pbtxt is encoded
  (write_graph_text): the checkpoints, their .meta files and the graph in the events are TF's.

  `after_create_session` is TF 2.15's, step for step, with the one write swapped and the
  GraphDef built once for it and the meta graph (TF builds it twice, ~36 ms each for the BERT
  demo's graph). (Turning TF's `save_graph_def` off instead would also drop every
  checkpoint's .meta file.)

  `single_writer`: this session's train_op is the only writer of the global step (one
  process; host replicas step it once). TF's hook reads the step again after every run unless
  told how far a run can move it (`_set_steps_per_run`, which only TPUEstimator calls): a
  second session.run a step, 0.15-0.25 ms of a 0.9-1.1 ms MLP step. Here the bound is the
  largest advance seen between two runs' reads (the first run keeps TF's read), so a save is
  checked at the steps TF's hook checks it whenever a run moves the step by no more than an
  earlier one did (tests/test_estimator_train.py compares the checkpoints with TF's)."""

  def __init__(self, *args, single_writer: bool = False, **kwargs):
    super().__init__(*args, **kwargs)
    self._single_writer = single_writer
    self._last_read, self._advance = None, 1

  def after_run(self, run_context, run_values):
    if self._single_writer:
      read = run_values.results  # read during the run, before or after its own update
      if self._last_read is not None:
        self._advance = max(self._advance, read - self._last_read)
        self._set_steps_per_run(self._advance)
      self._last_read = read
    super().after_run(run_context, run_values)

  def after_create_session(self, session, coord):
    global_step = session.run(self._global_step_tensor)
    graph = tf.compat.v1.get_default_graph()
    graph_def = graph.as_graph_def(add_shapes=True)  # the graph is final by now
    if self._save_graph_def:  # where TF's hook writes it
      write_graph_text(graph_def, self._checkpoint_dir)
    saver = self._get_saver()
    meta_graph_def = meta_graph.create_meta_graph_def(
        graph_def=graph_def, saver_def=saver.saver_def if saver else None)
    self._summary_writer.add_graph(graph)
    self._summary_writer.add_meta_graph(meta_graph_def)
    self._save(session, global_step)  # the state at `global_step`
    self._timer.update_last_triggered_step(global_step)


def with_checkpoint_saver(spec, hooks, config, model_dir: str):
  """`spec` with our CheckpointSaverHook first among its chief hooks, where tf.estimator's
  training loop (Estimator._train_with_estimator_spec) would add its own: same arguments,
  same place in the hook order, so saving listeners attach to it as they would to TF's.
  A saver among `hooks` (the worker and the caller's hooks) or the spec's, or a config that
  saves nothing, leaves the spec as it is, as it leaves TF's loop without a saver of its own."""
  hooks = list(hooks) + list(spec.training_hooks) + list(spec.training_chief_hooks)
  if (any(isinstance(h, tf.compat.v1.train.CheckpointSaverHook) for h in hooks)
      or not (config.save_checkpoints_secs or config.save_checkpoints_steps)):
    return spec
  saver = CheckpointSaverHook(model_dir, save_secs=config.save_checkpoints_secs,
                              save_steps=config.save_checkpoints_steps, scaffold=spec.scaffold,
                              save_graph_def=config.checkpoint_save_graph_def,
                              single_writer=config.num_worker_replicas <= 1)
  return spec._replace(training_chief_hooks=(saver,) + tuple(spec.training_chief_hooks))
