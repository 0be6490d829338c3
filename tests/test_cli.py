"""scripts/run.py: flags over YAML, one-line errors with exit code 2, and runner dispatch."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fake_model  # registers `toy` in this process
from cerebras_tf import cli, runner
from cerebras_tf.errors import CerebrasTFError, ConfigError, FitError, ParamsError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")
PY = sys.executable

YAML = textwrap.dedent("""\
    train_input:
      batch_size: 8
    eval_input:
      batch_size: 8
    model:
      name: toy
    runconfig:
      max_steps: 10
      save_checkpoints_steps: 4
      eval_steps: 2
    """)


@pytest.fixture
def params_file(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  (tmp_path / "p.yaml").write_text(YAML)
  return "p.yaml"


def _main(argv, capsys):
  code = cli.main(["run.py"] + argv)
  out, err = capsys.readouterr()
  return code, out, err


# (argv after --params p.yaml, the stderr line)
FLAG_CASES = [
    (["--foo"], "error: unknown flag --foo; see --help"),
    (["--num_cs=3"], "error: unknown flag --num_cs (did you mean --num_csx?); see --help"),
    (["--mode=trian"], "error: --mode: runconfig.mode must be one of train, eval, eval_all, "
     "train_and_eval, predict, export, got 'trian' (did you mean 'train'?)"),
    (["--execution_strategy=pipelind"], "error: --execution_strategy: "
     "csconfig.execution_strategy must be one of pipelined, multi_replica, weight_streaming, "
     "auto, got 'pipelind' (did you mean 'pipelined'?)"),
    (["--engine=cs9"], "error: --engine: csconfig.engine must be one of cs1, cs2, cs3 or a path "
     "to an engine .yaml file, got 'cs9'"),
    (["--num_csx=0"], "error: --num_csx: csconfig.num_csx must be an int in [1, 1024], got 0"),
    (["--num_csx=abc"], "error: --num_csx must be an int, got 'abc'"),
    (["--num_wgt_servers=-1"], "error: --num_wgt_servers: csconfig.max_wgt_servers must be an "
     "int in [1, 64], got -1"),
    (["--num_csx"], "error: flag --num_csx needs a value"),
    (["--no_cs=maybe"], "error: --no_cs must be true or false, got 'maybe'"),
    (["--max_steps=0"], "error: --max_steps: runconfig.max_steps must be an int in [1, 9223372036854775807] or null, got 0"),
    (["--steps=0"], "error: --steps must be an int in [1, 9223372036854775807], got 0"),
    (["--steps=3", "--max_steps=5"], "error: --steps and --max_steps are exclusive: --steps "
     "trains that many more steps, --max_steps trains up to that global step"),
    (["--no_cs", "--compile_only"], "error: --compile_only compiles for the engine; it cannot "
     "be combined with --no_cs"),
    (["--params_override=model.hiden_size=3"], "error: override 'model.hiden_size=3': unknown "
     "key 'hiden_size' in model (did you mean 'hidden_size'?)"),
    (["--params_override=model.hidden_size"], "error: override 'model.hidden_size': expected "
     "SECTION.KEY=VALUE, e.g. train_input.batch_size=64"),
    (["--multireplica", "--execution_strategy=weight_streaming"], "error: --multireplica: "
     "csconfig.multireplica: true conflicts with csconfig.execution_strategy "
     "'weight_streaming' (use multi_replica)"),
    (["--params_override=csconfig.num_replicas=3"], "error: p.yaml:2: train_input.batch_size 8 "
     "must be divisible by csconfig.num_replicas 3"),
    (["extra"], "error: unexpected argument 'extra'; flags take the form --name=value"),
    (["--mode=eval", "--params_override=runconfig.eval_steps=null",
      "--params_override=eval_input.repeat=true"],
     "error: mode 'eval' with eval_input.repeat: true never ends: set runconfig.eval_steps (or "
     "--eval_steps)"),
]


@pytest.mark.parametrize("argv,line", FLAG_CASES, ids=[" ".join(c[0]) for c in FLAG_CASES])
def test_bad_flags_one_line_exit_2(params_file, capsys, argv, line):
  code, out, err = _main(["--params", params_file] + argv, capsys)
  assert (code, err, out) == (2, line + "\n", "")


def test_missing_params_flag_and_file(tmp_path, capsys, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert _main([], capsys)[:3:2] == (2, "error: --params is required: the params YAML file "
                                        "(e.g. --params configs/params_bert_tiny_msl128.yaml)\n")
  assert _main(["--params", "foo.yaml"], capsys)[:3:2] == (
      2, "error: params file not found: foo.yaml\n")


def _subprocess(args, cwd):
  env = dict(os.environ, PYTHONPATH=TESTS, CEREBRAS_TF_MODEL_MODULES="fake_model")
  return subprocess.run([PY, os.path.join(ROOT, "scripts", "run.py")] + args, cwd=cwd, env=env,
                        capture_output=True, text=True, timeout=60)


SUBPROCESS_CASES = [
    (["--params", "p.yaml", "--bogus"], "error: unknown flag --bogus; see --help"),
    (["--params", "p.yaml", "--mode", "dance"], "error: --mode: runconfig.mode must be one of "
     "train, eval, eval_all, train_and_eval, predict, export, got 'dance'"),
    (["--params", "p.yaml", "--num_csx", "0"], "error: --num_csx: csconfig.num_csx must be an "
     "int in [1, 1024], got 0"),
    (["--params", "bad.yaml"], "error: bad.yaml: YAML syntax error at line 3 column 3: "
     "expected <block end>, but found '<block mapping start>'"),
    (["--params", "evil.yaml"], "error: evil.yaml:1: YAML tag '!!python/object/apply:os.system' "
     "is not allowed; params files hold plain mappings, lists, strings, numbers, booleans and "
     "null"),
    (["--params", "p.yaml", "--params_override", "train_input.batch_size=abc"],
     "error: override 'train_input.batch_size=abc': train_input.batch_size must be an int in [1, 2147483647], "
     "got 'abc'"),
]


def test_script_bad_input_exit_2_no_traceback_no_tensorflow(tmp_path):
  (tmp_path / "p.yaml").write_text(YAML)
  (tmp_path / "bad.yaml").write_text("model:\n    name: toy\n  x: 1\n")
  (tmp_path / "evil.yaml").write_text("model: !!python/object/apply:os.system ['touch pwned']\n")
  for args, line in SUBPROCESS_CASES:
    proc = _subprocess(args, tmp_path)
    assert (proc.returncode, proc.stderr, proc.stdout) == (2, line + "\n", ""), args
  assert not (tmp_path / "pwned").exists()


def test_cli_import_does_not_import_tensorflow():
  code = ("import sys; from cerebras_tf import cli, params, runner; from cerebras_tf import registry; "
          "assert 'tensorflow' not in sys.modules, 'tensorflow imported'")
  proc = subprocess.run([PY, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
  assert proc.returncode == 0, proc.stderr


def test_sigterm_outside_training_is_one_line_and_leaves_no_partial_file(params_file, capsys,
                                                                         monkeypatch):
  """SIGTERM's default action ended a compile, an eval or a predict without a word (exit
  -15), and a predict's temporary file stayed behind. Now it is Ctrl-C's line, with exit
  143 and the cleanup; the default handler is back once main returns."""
  def run(params, opts):
    def predictions():
      yield {"x": 1}
      os.kill(os.getpid(), signal.SIGTERM)  # mid-way, as a scheduler's stop would land
      time.sleep(5)
      yield {"x": 2}
    runner.write_predictions(predictions(), "preds", lambda: "preds/p.jsonl")
  monkeypatch.setattr(runner, "run", run)
  code, _, err = _main(["--params", params_file, "--mode", "predict"], capsys)
  assert (code, err.strip().splitlines()[-1]) == (143, "error: terminated (SIGTERM)")
  assert os.listdir("preds") == []
  assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_help_exits_0(capsys):
  code, out, _ = _main(["--helpfull"], capsys)
  assert code == 0 and "--params_override" in out and "max_wgt_servers" in out


def test_flags_override_yaml(params_file):
  params, opts = cli.load(["run.py", "--params", params_file, "--mode", "train_and_eval",
                           "--model_dir", "m", "--num_csx", "2", "--num_wgt_servers", "3",
                           "--execution_strategy", "weight_streaming", "--engine", "cs3",
                           "--compile_dir", "c", "--no_cs", "--max_steps", "20",
                           "--eval_steps", "0", "--cs_ip", "10.0.0.5",
                           "--params_override", "model.hidden_size=32",
                           "--params_override", "train_input.batch_size=4"])
  cwd = os.getcwd()
  assert params["runconfig"]["model_dir"] == os.path.join(cwd, "m")
  assert params["runconfig"]["mode"] == "train_and_eval" and params["runconfig"]["max_steps"] == 20
  assert params["runconfig"]["cs_ip"] == "10.0.0.5:9000" and params["runconfig"]["use_cs"] is False
  cs = params["csconfig"]
  assert (cs["num_csx"], cs["max_wgt_servers"], cs["execution_strategy"], cs["engine"]) == (
      2, 3, "weight_streaming", "cs3")
  assert cs["compile_dir"] == os.path.join(cwd, "c")
  assert params["model"]["hidden_size"] == 32 and params["train_input"]["batch_size"] == 4
  assert opts == runner.RunOptions(mode="train_and_eval", max_steps=20, eval_steps=0,
                                   use_cs=False)


def test_one_params_override_flag_may_carry_several(params_file):
  """Model Garden's `--params_override a.b=1,c.d=2` was one override whose value swallowed
  the rest ("train_input.data_dir=/x,eval_input.data_dir=/y" set one path with a comma in
  it). A comma splits only where SECTION.KEY= follows it: a glob's {a,b} and a YAML list
  keep theirs."""
  params, _ = cli.load(["run.py", "--params", params_file, "--params_override",
                        "model.hidden_size=32, train_input.batch_size=4,"
                        "train_input.vocab_file=d/{a,b}.txt,optimizer.learning_rate="
                        "[{scheduler: Linear, steps: 5, initial_learning_rate: 0.0, "
                        "end_learning_rate: 0.1}, {scheduler: Constant, learning_rate: 0.1}]"])
  assert params["model"]["hidden_size"] == 32 and params["train_input"]["batch_size"] == 4
  assert params["train_input"]["vocab_file"].endswith("d/{a,b}.txt")
  assert [seg["scheduler"] for seg in params["optimizer"]["learning_rate"]] == \
      ["Linear", "Constant"]


def test_multireplica_flag_overrides_the_yaml_strategy(params_file):
  with open(params_file, "a") as fh:
    fh.write("csconfig:\n  execution_strategy: pipelined\n")
  params, _ = cli.load(["run.py", "--params", params_file, "--multireplica"])
  assert params["csconfig"]["execution_strategy"] == "multi_replica"
  assert params["csconfig"]["multireplica"] is True


# --- runner dispatch with a fake estimator -------------------------------------------------

class FakeEstimator:
  """Records calls; writes checkpoint index files the way TF names them."""

  def __init__(self, model_dir, fits=True):
    self.model_dir, self.fits, self.calls, self.step = model_dir, fits, [], 0
    self.last_predict_checkpoint = None
    os.makedirs(model_dir, exist_ok=True)

  def _ckpt(self):
    open(os.path.join(self.model_dir, f"model.ckpt-{self.step}.index"), "w").close()

  def compile(self, input_fn, validate_only=False, mode="train"):
    self.calls.append(("compile", input_fn(params={"train_input": {"batch_size": 8}}),
                       validate_only, mode))
    plan = type("Plan", (), {"fits": self.fits, "engine": "cs2", "num_replicas": 1,
                             "execution_strategy": "pipelined", "reason": "needs 9 GB > 4 GB"})
    return type("Result", (), {"plan": None if validate_only else plan, "performance": None,
                               "compile_dir": "/c"})

  def train(self, input_fn, steps=None, max_steps=None, use_cs=None, run_max_steps=None):
    self.calls.append(("train", input_fn.keywords["mode"], steps, max_steps, use_cs))
    self.run_max_steps = run_max_steps
    self.step = max_steps if max_steps is not None else self.step + steps
    self._ckpt()

  def evaluate(self, input_fn, steps=None, checkpoint_path=None, use_cs=None):
    self.calls.append(("evaluate", input_fn.keywords["mode"], steps, checkpoint_path, use_cs))
    return {"loss": 0.5, "accuracy": 0.75, "global_step": self.step}

  def predict(self, input_fn, checkpoint_path=None, use_cs=None):
    self.calls.append(("predict", input_fn.keywords["mode"], checkpoint_path, use_cs))
    return iter([{"class": 1, "probabilities": [0.1, 0.9]}] * 3)


def _run(params_file, argv, fits=True):
  params, opts = cli.load(["run.py", "--params", params_file] + argv)
  made = []

  def factory(model_fn, p, o):
    assert model_fn is fake_model.model_fn and p is params and o is opts
    made.append(FakeEstimator(p["runconfig"]["model_dir"], fits))
    return made[0]

  summary = runner.run(params, opts, estimator_factory=factory)
  return summary, made[0].calls


def test_runner_train(params_file):
  summary, calls = _run(params_file, [])
  assert calls == [("train", "train", None, 10, True)]
  assert summary["global_step"] == 10
  summary, calls = _run(params_file, ["--steps", "3", "--no_cs"])
  assert calls == [("train", "train", 3, None, False)]


def test_runner_eval_eval_all_predict(params_file):
  _, calls = _run(params_file, ["--mode", "eval", "--checkpoint_path", "ck"])
  assert calls == [("evaluate", "eval", 2, "ck", True)]
  with pytest.raises(ConfigError, match="eval_all: no checkpoints in model_dir"):
    _run(params_file, ["--mode", "eval_all", "--model_dir", "empty"])
  for step in (4, 12, 8):
    os.makedirs("m", exist_ok=True)
    open(f"m/model.ckpt-{step}.index", "w").close()
  summary, calls = _run(params_file, ["--mode", "eval_all", "--model_dir", "m",
                                      "--eval_steps", "0"])
  cwd = os.getcwd()
  assert [c[3] for c in calls] == [f"{cwd}/m/model.ckpt-{s}" for s in (4, 8, 12)]
  assert all(c[2] is None for c in calls)  # eval_steps 0: all the eval data
  # The command line predicts from a checkpoint (runner.require_checkpoint): model_dir m has
  # some; the estimator picks the latest.
  summary, calls = _run(params_file, ["--mode", "predict", "--model_dir", "m"])
  assert calls == [("predict", "infer", None, True)]
  assert summary["predictions"] == 3
  # The predictions were counted and thrown away; they are kept, one JSON line each.
  path = summary["predictions_file"]
  assert (f"predictions: 3 (keys: class, probabilities) written to {path}"
          in runner.format_summary(summary))
  with open(path) as fh:
    assert [json.loads(line) for line in fh] == [{"class": 1, "probabilities": [0.1, 0.9]}] * 3
  assert os.listdir(os.path.dirname(path)) == [os.path.basename(path)]  # no partial file


def test_eval_all_skips_a_checkpoint_a_training_run_deleted(params_file, monkeypatch, caplog):
  """eval_all beside a running training: model.ckpt-8 is deleted (keep_checkpoint_max) while
  model.ckpt-4 is evaluated. It is skipped with a warning; the others are evaluated. An error
  on a checkpoint still on disk is raised as it is."""
  for step in (4, 8, 12):
    os.makedirs("m", exist_ok=True)
    open(f"m/model.ckpt-{step}.index", "w").close()

  def evaluate(self, input_fn, steps=None, checkpoint_path=None, use_cs=None):
    if checkpoint_path.endswith("-4"):
      os.remove("m/model.ckpt-8.index")
    if not os.path.exists(checkpoint_path + ".index"):
      raise ValueError(f"The passed save_path is not a valid checkpoint: {checkpoint_path}")
    self.calls.append(("evaluate", checkpoint_path))
    return {"loss": 0.5, "global_step": int(checkpoint_path.rsplit("-", 1)[1])}
  monkeypatch.setattr(FakeEstimator, "evaluate", evaluate)
  summary, calls = _run(params_file, ["--mode", "eval_all", "--model_dir", "m"])
  assert [e["global_step"] for e in summary["evals"]] == [4, 12]
  assert "eval_all: model.ckpt-8 was deleted" in caplog.text

  def broken(self, input_fn, steps=None, checkpoint_path=None, use_cs=None):
    raise ValueError("a real failure")
  monkeypatch.setattr(FakeEstimator, "evaluate", broken)
  with pytest.raises(ValueError, match="a real failure"):
    _run(params_file, ["--mode", "eval_all", "--model_dir", "m"])


def test_runner_train_and_eval_alternates(params_file):
  summary, calls = _run(params_file, ["--mode", "train_and_eval"])
  assert [c[:4] for c in calls] == [
      ("train", "train", None, 4), ("evaluate", "eval", 2, None),
      ("train", "train", None, 8), ("evaluate", "eval", 2, None),
      ("train", "train", None, 10), ("evaluate", "eval", 2, None)]
  assert summary["global_step"] == 10
  text = runner.format_summary(summary)
  assert "eval: global_step=10 accuracy=0.75 loss=0.5" in text
  # runconfig.throttle_secs was validated and ignored: an hour between evaluations leaves
  # the first round's and the last one's.
  _, calls = _run(params_file, ["--mode", "train_and_eval", "--model_dir", "throttled",
                                "--params_override", "runconfig.throttle_secs=3600"])
  assert [c[:4] for c in calls] == [
      ("train", "train", None, 4), ("evaluate", "eval", 2, None),
      ("train", "train", None, 8), ("train", "train", None, 10), ("evaluate", "eval", 2, None)]


def test_train_and_eval_on_a_finished_model_dir_says_there_is_nothing_to_do(params_file):
  """`python3 dev.py demo` run a second time printed "global_step=3600" and nothing else:
  train_and_eval trains and evaluates nothing once the model_dir is at max_steps (as
  tf.estimator.train_and_evaluate). It now says so, and what to run instead."""
  os.makedirs("done", exist_ok=True)
  open("done/model.ckpt-10.index", "w").close()
  summary, calls = _run(params_file, ["--mode", "train_and_eval", "--model_dir", "done"])
  assert calls == []
  assert (f"{os.getcwd()}/done is at step 10 already, max_steps is 10: nothing to train or "
          "evaluate; --mode eval evaluates it again") in runner.format_summary(summary)
  summary, calls = _run(params_file, ["--mode", "train_and_eval", "--model_dir", "done",
                                      "--max_steps", "12"])
  assert [c[0] for c in calls] == ["train", "evaluate"] and "nothing_to_do" not in summary


def test_runner_compile_and_validate(params_file):
  summary, calls = _run(params_file, ["--validate_only"])
  assert calls == [("compile", {"mode": "train", "batch_size": 8}, True, "train")]
  assert "validation passed" in runner.format_summary(summary)
  with pytest.raises(FitError, match="does not fit cs2 in pipelined mode: needs 9 GB > 4 GB"):
    _run(params_file, ["--compile_only"], fits=False)


def test_runner_needs_eval_input(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  (tmp_path / "p.yaml").write_text(YAML.split("eval_input")[0] + YAML.split("batch_size: 8\n", 2)[2])
  with pytest.raises(ParamsError, match="mode 'eval' needs an eval_input section"):
    _run("p.yaml", ["--mode", "eval"])
  # train_and_eval: refused while the flags are read (naming the file), not after the training;
  # and by runner.run itself, for a caller of its own
  with pytest.raises(ParamsError, match="mode 'train_and_eval' needs an eval_input section in "
                     "the params file p.yaml; --mode train trains without one"):
    cli.load(["run.py", "--params", "p.yaml", "--mode", "train_and_eval"])
  params, opts = cli.load(["run.py", "--params", "p.yaml"])
  opts = dataclasses.replace(opts, mode="train_and_eval")
  with pytest.raises(ParamsError, match="mode 'train_and_eval' needs an eval_input section in "
                     "the params file; --mode train"):
    runner.run(params, opts, estimator_factory=lambda *a: pytest.fail("an estimator was made"))


def test_run_options_validate():
  with pytest.raises(ConfigError, match="--mode must be one of"):
    runner.RunOptions(mode="fit")
  with pytest.raises(ConfigError, match=r"--eval_steps must be an int in \[0, 9223372036854775807\] \(TensorFlow counts steps in int64\), got -1"):
    runner.RunOptions(eval_steps=-1)


# --- property: any argv gives (params, opts) or a CerebrasTFError ---------------------------

_FLAG_NAMES = ["params", "model_dir", "mode", "validate_only", "compile_only", "cs_ip", "steps",
               "max_steps", "eval_steps", "checkpoint_path", "multireplica", "num_csx",
               "num_wgt_servers", "execution_strategy", "engine", "compile_dir", "no_cs",
               "params_override", "nomultireplica", "bogus"]
_VALUES = st.one_of(st.text(max_size=10), st.integers(-3, 20).map(str),
                    st.sampled_from(["p.yaml", "train", "eval_all", "auto", "cs3", "true",
                                     "model.hidden_size=8", "train_input.batch_size=x",
                                     "csconfig.num_replicas=2", "a.b=c", "=", "x.y.z=[1",
                                     "model.name=!!python/name:os.system", "runconfig.mode=eval"]))
_ARG = st.one_of(
    st.builds(lambda n, v: f"--{n}={v}", st.sampled_from(_FLAG_NAMES), _VALUES),
    st.builds(lambda n: f"--{n}", st.sampled_from(_FLAG_NAMES)),
    st.text(max_size=8))


@settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(_ARG, max_size=6), st.booleans())
def test_property_any_argv_gives_params_or_one_line_error(tmp_path_factory, args, with_params):
  directory = tmp_path_factory.getbasetemp()
  path = directory / "prop.yaml"
  if not path.exists():
    path.write_text(YAML)
  argv = ["run.py"] + (["--params", str(path)] if with_params else []) + args
  try:
    params, opts = cli.load(argv)
  except CerebrasTFError as e:
    assert str(e) and "\n" not in str(e)
    return
  assert isinstance(params, dict) and isinstance(opts, runner.RunOptions)
  assert opts.mode == params["runconfig"]["mode"]


def test_export_mode_needs_export_dir(params_file):
  with pytest.raises(ConfigError, match="--mode export needs --export_dir"):
    cli.load(["run.py", "--params", params_file, "--mode", "export"])
  _, opts = cli.load(["run.py", "--params", params_file, "--mode", "export", "--export_dir", "x"])
  assert (opts.mode, opts.export_dir) == ("export", "x")


def test_an_export_that_cannot_work_fails_before_training(tmp_path, monkeypatch, capsys):
  """BERT pretraining with --export_dir: the serving input (raw sentences) exists only for a
  classifier. It used to train all of max_steps, then end in a ValueError traceback and leave
  <export_dir>/temp-* behind."""
  monkeypatch.chdir(ROOT)
  model_dir, export_dir = tmp_path / "m", tmp_path / "exp"
  code = cli.main(["run.py", "--params", "configs/params_bert_tiny_msl128.yaml", "--no_cs",
                   "--max_steps", "200", "--model_dir", str(model_dir),
                   "--export_dir", str(export_dir)])
  assert code == 2
  err = capsys.readouterr().err.strip().splitlines()[-1]
  assert err == ("error: export: BERT serves raw sentences as a classifier (model.task: "
                 "classification), this model is 'pretraining'; export a fine-tuned "
                 "classifier, or drop --export_dir"), err
  assert not list(model_dir.glob("model.ckpt-*")) and not export_dir.exists()


def test_a_model_module_in_the_working_directory_is_pointed_at(tmp_path):
  """A user writes my_model.py beside their YAML and runs scripts/run.py, whose import path
  has scripts/ and not the working directory: "no module named 'my_model'" alone left them
  guessing. (`python -m cerebras_tf` imports from the working directory.)"""
  (tmp_path / "my_model.py").write_text("raise SystemExit('not imported in this test')\n")
  (tmp_path / "p.yaml").write_text("model: {name: mine}\ntrain_input: {batch_size: 8}\n")
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  env["CEREBRAS_TF_MODEL_MODULES"] = "my_model"
  proc = subprocess.run([PY, os.path.join(ROOT, "scripts", "run.py"), "--params", "p.yaml"],
                        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
  assert proc.returncode == 2
  assert proc.stderr.strip() == (
      f"error: CEREBRAS_TF_MODEL_MODULES: no module named 'my_model' on the import path, "
      f"though it is in the working directory {tmp_path} (scripts/run.py does not import from "
      f"there): run with PYTHONPATH=. or as python -m cerebras_tf"), proc.stderr


def test_a_model_module_fixed_after_its_import_failed_is_imported_again(tmp_path, monkeypatch):
  """A notebook: the module fails its import (one line naming its file:line), the user fixes
  it and asks again. The failed name was remembered as imported, and the second ask said only
  "unknown model 'mine'"."""
  from cerebras_tf import registry  # pylint: disable=import-outside-toplevel
  module = f"fixme_{uuid.uuid4().hex[:8]}"
  path = tmp_path / f"{module}.py"
  path.write_text("import os\nraise RuntimeError('not yet')\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.setenv(registry.MODULES_ENV, module)
  with pytest.raises(ConfigError, match=rf"importing '{module}' failed at .*{module}.py:2: "
                                        r"RuntimeError: not yet"):
    registry.get_model("mine")
  path.write_text("from cerebras_models import mlp\nfrom cerebras_tf.registry import "
                  "ModelSpec, register\nregister(ModelSpec('mine', mlp.SPEC.model_fn, "
                  "mlp.SPEC.input_fn))\n")
  try:
    assert registry.get_model("mine").model_fn == "cerebras_models.mlp.model:model_fn"
  finally:
    registry.unregister("mine")


def test_predict_reads_predict_input(params_file):
  """modelzoo's fine-tuning files have a predict_input section: --mode predict reads it where
  the family's input reads eval_input; the other modes keep eval_input."""
  with open(params_file, "a") as fh:
    fh.write("predict_input:\n  batch_size: 5\n")
  params, opts = cli.load(["run.py", "--params", params_file, "--mode", "predict"])
  given = []

  class Recording(FakeEstimator):
    def predict(self, input_fn, checkpoint_path=None, use_cs=None):
      given.append(input_fn)
      return super().predict(input_fn, checkpoint_path, use_cs)

  # The command line predicts from a checkpoint only (runner.require_checkpoint).
  os.makedirs(params["runconfig"]["model_dir"], exist_ok=True)
  open(os.path.join(params["runconfig"]["model_dir"], "model.ckpt-1.index"), "w").close()
  summary = runner.run(params, opts, estimator_factory=lambda *a: Recording("m"))
  assert summary["predictions"] == 3
  fn = given[0]
  assert (fn.func, fn.keywords["mode"]) == (runner.with_predict_input, "infer")
  read_eval_input = lambda p, mode: (p["eval_input"]["batch_size"], mode)  # noqa: E731
  assert runner.with_predict_input(params, read_eval_input, "infer") == (5, "infer")
  assert params["eval_input"]["batch_size"] != 5  # the params themselves are unchanged


def test_params_lines_reach_the_terminal(params_file, capsys, monkeypatch):
  """The model family a modelzoo file is for and its keys kept without effect were logged
  at INFO before the run's logging was set: no one saw them. They are said once, INFO on
  stdout and a duplicate key's warning on stderr."""
  text = open(params_file).read().replace("  name: toy\n", "  name: toy\n  boundary_casting: "
                                           "False\n  name: toy\n")
  open(params_file, "w").write(text)
  monkeypatch.setattr(runner, "run", lambda params, opts: {"mode": "train", "model": "toy",
                                                          "model_dir": "m"})
  monkeypatch.setattr(runner, "format_summary", lambda summary: "done")
  code, out, err = _main(["--params", params_file], capsys)
  assert code == 0
  assert out.count("modelzoo keys kept without effect here: model.boundary_casting") == 1
  assert "duplicate key 'name' in model (also at line 6): the last one, line 8, is used" in err
