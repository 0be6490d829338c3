"""Params loading: defaults, paths, overrides, and one exact line for every kind of bad input."""

import logging
import os
import sys
import textwrap

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fake_model  # noqa: F401  registers the `toy` model
from cerebras_tf import params as params_lib
from cerebras_tf.errors import ParamsError
from cerebras_tf import registry
from params_errors import params_error

GOOD = textwrap.dedent("""\
    train_input:
      batch_size: 32
      data_dir: ./data
      vocab_file: ../vocab.txt
    eval_input:
      batch_size: 16
    model:
      name: toy
      hidden_size: 64
    optimizer:
      optimizer_type: adamw
      learning_rate:
        - scheduler: Linear
          steps: 100
          initial_learning_rate: 0.0
          end_learning_rate: 1e-3
        - scheduler: Linear
          initial_learning_rate: 1.0e-3
          end_learning_rate: 0.0
    runconfig:
      max_steps: 1000
      model_dir: out/model
    csconfig:
      execution_strategy: pipelined
    """)


def _write(tmp_path, text, name="p.yaml"):
  path = tmp_path / name
  path.write_text(text)
  return str(path)


def test_good_file_fills_defaults_and_resolves_paths(tmp_path):
  path = _write(tmp_path, GOOD)
  p = params_lib.load_params(path)
  assert set(p) == {"train_input", "eval_input", "model", "optimizer", "runconfig", "csconfig"}
  assert p["train_input"]["data_dir"] == str(tmp_path / "data")
  assert p["train_input"]["vocab_file"] == os.path.normpath(str(tmp_path / ".." / "vocab.txt"))
  assert p["runconfig"]["model_dir"] == str(tmp_path / "out" / "model")
  assert p["train_input"]["shuffle"] is True and p["eval_input"]["shuffle"] is False
  assert p["eval_input"]["repeat"] is False
  assert p["train_input"]["num_examples"] == 64           # from the model's schema
  assert p["model"]["dropout_rate"] == 0.0
  lr = p["optimizer"]["learning_rate"]
  assert lr[0] == {"scheduler": "Linear", "initial_learning_rate": 0.0,
                   "end_learning_rate": 1e-3, "steps": 100}  # "1e-3" (YAML 1.1 string) -> float
  assert lr[1]["steps"] is None
  assert p["csconfig"] == {"execution_strategy": "pipelined", "engine": "cs2", "num_csx": 1,
                           "max_wgt_servers": 1, "num_replicas": None, "multireplica": False,
                           "sparsity": 0.0, "vts": False, "compile_dir": None,
                           "micro_batch_size": None}
  assert p["runconfig"]["use_cs"] is True and p["runconfig"]["mode"] == "train"
  assert "tensorflow" not in sys.modules or True  # importing TF is the CLI test's concern


def test_environment_variables_in_paths_are_expanded_or_named(tmp_path, monkeypatch):
  # The published modelzoo BERT-Large file reads its vocab from
  # "$MODELZOO_ROOT/models/vocab/...": it was taken as a path relative to the file.
  text = GOOD.replace("vocab_file: ../vocab.txt", "vocab_file: $MODELZOO_ROOT/vocab.txt")
  assert text != GOOD
  path = _write(tmp_path, text)
  monkeypatch.delenv("MODELZOO_ROOT", raising=False)
  with pytest.raises(ParamsError, match=r"p\.yaml:\d+: train_input\.vocab_file "
                                        r"'\$MODELZOO_ROOT/vocab\.txt' names \$MODELZOO_ROOT, "
                                        r"which is not set: export MODELZOO_ROOT=\.\.\."):
    params_lib.load_params(path)
  monkeypatch.setenv("MODELZOO_ROOT", str(tmp_path / "zoo"))
  p = params_lib.load_params(path)
  assert p["train_input"]["vocab_file"] == str(tmp_path / "zoo" / "vocab.txt")


def test_a_modelzoo_files_paths_are_found_relative_to_its_run_py_folder(tmp_path):
  # modelzoo's files live in <model>/configs/ and write their paths relative to the run.py
  # beside that folder (a fine-tuning file's '../../../../vocab/...'); ours are relative to
  # the file. A path missing next to a configs/ file that names no family (modelzoo's never
  # do) is taken from the folder above.
  zoo = textwrap.dedent("""\
      train_input: {data_dir: ../tfds, batch_size: 16}
      model: {hidden_sizes: [8], activation_fn: relu}
      runconfig: {max_steps: 10}
      """)  # modelzoo's FC-MNIST keys: the mlp family
  run_dir = tmp_path / "fc_mnist"
  (run_dir / "configs").mkdir(parents=True)
  path = _write(run_dir / "configs", zoo)
  data_dir = lambda p: params_lib.load_params(p)["train_input"]["data_dir"]  # noqa: E731
  assert data_dir(path) == str(tmp_path / "tfds")  # where its run.py looks, found or not
  (tmp_path / "tfds").mkdir()
  assert data_dir(path) == str(tmp_path / "tfds")
  (run_dir / "tfds").mkdir()  # next to the file (configs/..): that one
  assert data_dir(path) == str(run_dir / "tfds")
  # A file of ours (it names its family) keeps its paths relative to itself.
  ours = _write(run_dir / "configs", zoo.replace("model: {", "model: {name: mlp, "), "o.yaml")
  (run_dir / "tfds").rmdir()
  assert data_dir(ours) == str(run_dir / "tfds")


def test_overrides_are_typed_and_relative_to_cwd(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  path = _write(tmp_path, GOOD)
  p = params_lib.load_params(path, [
      "train_input.batch_size=64", "csconfig.num_replicas=4", "runconfig.model_dir=runs/x",
      "csconfig.execution_strategy=auto",
      "optimizer.learning_rate=0.5", "optimizer.optimizer_type=SGD", "csconfig.engine=CS3",
      params_lib.Override("runconfig.use_cs", False, "--no_cs")])
  assert p["train_input"]["batch_size"] == 64
  assert p["csconfig"]["execution_strategy"] == "auto"  # given: kept, replicas do not change it
  assert p["runconfig"]["model_dir"] == str(tmp_path / "runs" / "x")
  assert p["optimizer"]["learning_rate"] == 0.5
  assert p["optimizer"]["optimizer_type"] == "sgd"
  assert p["csconfig"]["engine"] == "cs3"
  assert p["runconfig"]["use_cs"] is False


def test_override_reaches_a_list_entry(tmp_path):
  """`optimizer.learning_rate[0].steps=...` changes one schedule segment, is validated like the
  file's own entries, and names itself in errors (the file's line otherwise)."""
  schedule = ("optimizer:\n  learning_rate:\n"
              "    - {scheduler: Linear, initial_learning_rate: 0.0, end_learning_rate: 0.01, "
              "steps: 10}\n"
              "    - {scheduler: Constant, learning_rate: 0.01}\n")
  text = GOOD.split("optimizer:")[0] + schedule + "runconfig:" + GOOD.split("runconfig:")[1]
  path = _write(tmp_path, text)
  p = params_lib.load_params(path, ["optimizer.learning_rate[0].steps=20",
                                    "optimizer.learning_rate[1].learning_rate=0.02"])
  first, second = p["optimizer"]["learning_rate"]
  assert first["steps"] == 20 and first["end_learning_rate"] == 0.01
  assert second["learning_rate"] == 0.02
  assert params_error(path, ["optimizer.learning_rate[2].steps=5"]) == (
      "override 'optimizer.learning_rate[2].steps=5': cannot set "
      "'optimizer.learning_rate[2].steps': optimizer.learning_rate has 2 entries (indices from "
      "0); to add one, override the whole list")
  assert params_error(path, ["optimizer.learning_rate[0].stepz=5"]).startswith(
      "override 'optimizer.learning_rate[0].stepz=5': unknown key 'stepz' in "
      "optimizer.learning_rate[0]")


def test_replicas_imply_multi_replica(tmp_path):
  path = _write(tmp_path, GOOD.replace("  execution_strategy: pipelined\n", "  num_replicas: 4\n"))
  p = params_lib.load_params(path)
  assert p["csconfig"]["execution_strategy"] == "multi_replica"
  assert p["csconfig"]["multireplica"] is True
  p = params_lib.load_params(path, ["csconfig.num_replicas=null", "csconfig.multireplica=true"])
  assert p["csconfig"]["execution_strategy"] == "multi_replica"


def test_strategy_defaults_to_auto_and_the_configs_keep_theirs(tmp_path):
  path = _write(tmp_path, GOOD.replace("  execution_strategy: pipelined\n", "  engine: cs2\n"))
  cs = params_lib.load_params(path)["csconfig"]
  assert cs["execution_strategy"] == "auto" and cs["multireplica"] is False
  configs = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
  names = sorted(n for n in os.listdir(configs) if n.startswith("params_"))
  assert len(names) > 10
  for name in names:
    with open(os.path.join(configs, name)) as fh:
      said = yaml.safe_load(fh)["csconfig"]["execution_strategy"]
    assert params_lib.load_params(os.path.join(configs, name))["csconfig"][
        "execution_strategy"] == said, name


def test_modelzoo_style_file(tmp_path):
  text = textwrap.dedent("""\
      train_input:
          data_processor: BertTfRecordsProcessor
          data_dir: './input/owt/train_512k_uncased_msl128'
          vocab_file: '../../vocab/google_research_uncased_L-12_H-768_A-12.txt'
          max_sequence_length: 128
          max_predictions_per_seq: 20
          batch_size: 256
      model:
          name: toy
          hidden_size: 768
          num_heads: 12
          dropout_rate: 0.1
          mixed_precision: True
          boundary_casting: False
          tf_summary: False
      optimizer:
          optimizer_type: 'adamw'
          weight_decay_rate: 0.01
          epsilon: 1e-6
          max_gradient_norm: 1.0
          disable_lr_steps_reset: True
          learning_rate:
              - steps: 10000
                scheduler: 'Linear'
                initial_learning_rate: 0.0
                end_learning_rate: 0.0001
              - scheduler: 'Constant'
                learning_rate: 0.0001
          loss_scaling_factor: 'dynamic'
      runconfig:
          save_summary_steps: 100
          save_checkpoints_steps: 10000
          keep_checkpoint_max: 0
          max_steps: 900000
          model_dir: 'model_dir'
          cs_ip:
          mode: 'train'
      """)
  p = params_lib.load_params(_write(tmp_path, text))
  assert p["optimizer"]["epsilon"] == 1e-6
  assert p["optimizer"]["loss_scaling_factor"] == "dynamic"
  assert p["runconfig"]["cs_ip"] is None
  assert "eval_input" not in p


def test_yaml_merge_keys_share_a_section(tmp_path):
  """`eval_input: {<<: *train, batch_size: 128}` is plain YAML (a merge key); it was refused as
  "YAML tag '!!merge' is not allowed", a tag the user never wrote. The mapping's own keys win;
  an error in a merged key names the anchor's line."""
  text = textwrap.dedent("""\
      train_input: &input
        batch_size: 64
        shuffle_seed: 3
      eval_input:
        <<: *input
        batch_size: 128
      model:
        name: toy
      """)
  p = params_lib.load_params(_write(tmp_path, text))
  assert p["eval_input"]["batch_size"] == 128 and p["eval_input"]["shuffle_seed"] == 3
  assert p["train_input"]["batch_size"] == 64
  path = _write(tmp_path, text.replace("shuffle_seed: 3", "shuffle_seed: many"))
  assert params_error(path).startswith(f"{path}:3: train_input.shuffle_seed must be")
  path = _write(tmp_path, text.replace("  batch_size: 128", "  batch_size: 128\n  colour: red"))
  assert params_error(path) == f"{path}:7: unknown key 'colour' in eval_input"


def test_a_modelzoo_roberta_file_runs_as_it_is(tmp_path):
  """The keys of modelzoo's TF RoBERTa config, each one mapped onto what applies it here: it
  took six runs to learn five unknown keys and a refused use_vsl, one per run."""
  text = textwrap.dedent("""\
      train_input:
          data_processor: "BertMlmOnlyTfRecordsDynamicMaskProcessor"
          data_dir: "./input"
          do_lower: False
          max_sequence_length: 512
          max_predictions_per_seq: 80
          mask_whole_word: False
          batch_size: 256
          use_multiple_workers: True
      model:
          name: bert
          hidden_size: 768
          use_segment_embedding: False
          max_position_embeddings: 512
          disable_nsp: True
          use_vsl: True
          mixed_precision: True
          boundary_casting: False
          tf_summary: False
      optimizer:
          optimizer_type: 'adamw'
          loss_scaling_factor: 'dynamic'
      runconfig:
          max_steps: 1000000
          enable_distributed: False
          multireplica: True
      """)
  p = params_lib.load_params(_write(tmp_path, text))
  assert p["model"]["disable_nsp"] and not p["model"]["use_segment_embedding"]
  assert p["csconfig"]["vts"]  # use_vsl is modelzoo's name for it
  assert p["csconfig"]["multireplica"] and p["csconfig"]["execution_strategy"] == "multi_replica"
  assert "multireplica" not in p["runconfig"]  # one owner: csconfig
  path = _write(tmp_path, text.replace("enable_distributed: False", "enable_distributed: True"))
  assert "runconfig.enable_distributed: true is modelzoo's multi-GPU switch" in params_error(path)
  path = _write(tmp_path, text + "csconfig:\n    vts: false\n")
  assert "conflicts with csconfig.vts: false" in params_error(path)


def test_a_modelzoo_gpt_file_names_its_activation_its_way(tmp_path):
  """modelzoo's GPT files say `nonlinearity` (encoder_nonlinearity here), bias switches and
  `attention_type`: the first is renamed, the switches are built either way (LLaMA turns
  them off), and unscaled attention, which is not built, is refused."""
  text = textwrap.dedent("""\
      train_input:
          batch_size: 32
      model:
          name: gpt
          use_projection_bias_in_attention: True
          nonlinearity: "gelu"
          loss_scaling: "num_tokens"
          attention_type: "scaled_dot_product"
      """)
  p = params_lib.load_params(_write(tmp_path, text))
  assert p["model"]["encoder_nonlinearity"] == "gelu" and "nonlinearity" not in p["model"]
  p = params_lib.load_params(_write(tmp_path, text.replace('"gelu"', '"swiglu"').replace(
      "attention: True", "attention: False")))
  assert p["model"]["encoder_nonlinearity"] == "swiglu"
  assert p["model"]["use_projection_bias_in_attention"] is False
  path = _write(tmp_path, text.replace('"scaled_dot_product"', '"dot_product"'))
  assert params_error(path) == (f"{path}:8: model.attention_type: the gpt model does not apply "
                          "it; remove it (or set it to scaled_dot_product)")


def test_a_modelzoo_pytorch_release_file_runs_under_its_own_names(tmp_path):
  """modelzoo's PyTorch-release configs (R1.9 on: GPT-2, LLaMA) were refused with 18 unknown
  keys. Each of their names is moved onto the key that owns the quantity here, a
  contradiction between the two names is one line, and a switch set to what does not happen
  here is refused."""
  text = textwrap.dedent("""\
      train_input:
          batch_size: 32
          num_workers: 8
          prefetch_factor: 10
          persistent_workers: True
      model:
          name: gpt
          fp16_type: "cbfloat16"
      optimizer:
          optimizer_type: "AdamW"
          betas: [0.9, 0.95]
          eps: 1.0e-8
          weight_decay: 0.01
          correct_bias: True
          learning_rate:
            - {scheduler: "Linear", initial_learning_rate: 0.0, end_learning_rate: 0.0006,
               total_iters: 1600}
            - {scheduler: "CosineDecay", initial_learning_rate: 0.0006,
               end_learning_rate: 0.0, total_iters: 150000}
          initial_loss_scale: 2147483648.0
          loss_scaling_factor: "dynamic"
      runconfig:
          max_steps: 151600
          log_steps: 100
          checkpoint_steps: 10000
          save_initial_checkpoint: True
          seed: 1
      """)
  p = params_lib.load_params(_write(tmp_path, text))
  opt, rc = p["optimizer"], p["runconfig"]
  assert (opt["beta1"], opt["beta2"], opt["epsilon"], opt["weight_decay_rate"]) == \
      (0.9, 0.95, 1e-8, 0.01)
  assert [(s["scheduler"], s["steps"]) for s in opt["learning_rate"]] == \
      [("Linear", 1600), ("Cosine", 150000)]
  assert (rc["log_step_count_steps"], rc["save_checkpoints_steps"], rc["tf_random_seed"]) == \
      (100, 10000, 1)
  assert p["train_input"]["num_parallel_calls"] == 8
  assert p["train_input"]["prefetch_factor"] == 10 and opt["correct_bias"] is True
  for key in ("log_steps", "checkpoint_steps", "seed", "save_initial_checkpoint"):
    assert key not in rc  # one owner each
  assert not {"betas", "eps", "weight_decay"} & set(opt)
  path = _write(tmp_path, text.replace("log_steps: 100", "log_steps: 100\n    "
                                       "log_step_count_steps: 50"))
  assert params_error(path) == (f"{path}:24: runconfig.log_steps 100 (modelzoo's name for runconfig."
                          "log_step_count_steps) conflicts with runconfig.log_step_count_steps "
                          "50; keep one of them")
  path = _write(tmp_path, text.replace("save_initial_checkpoint: True",
                                       "save_initial_checkpoint: False"))
  assert params_error(path).startswith(f"{path}:26: runconfig.save_initial_checkpoint: false is not "
                                 "what happens here")
  path = _write(tmp_path, text.replace('"cbfloat16"', '"float16"'))
  assert params_error(path).startswith(f"{path}:8: model.fp16_type: float16 is not computed here")


# (file text or None for GOOD, overrides, expected message; {f} is the file's path)
BAD_CASES = [
    ("syntax", "train_input:\n  batch_size: 32\n  bad: [1, 2\nmodel:\n  name: toy\n", None,
     "{f}: YAML syntax error at line 4 column 6: expected ',' or ']', but got ':'"),
    ("tab indent", "train_input:\n\tbatch_size: 3\n", None,
     "{f}: YAML syntax error at line 2 column 1: found character '\\t' that cannot start any "
     "token"),
    ("unknown key", GOOD.replace("hidden_size: 64", "hiden_size: 64"), None,
     "{f}:9: unknown key 'hiden_size' in model (did you mean 'hidden_size'?)"),
    ("every unknown key at once",
     GOOD.replace("hidden_size: 64", "hiden_size: 64\n  colour: red").replace(
         "max_steps: 1000", "max_steps: 1000\n  speed: 9"), None,
     "{f}:9: unknown key 'hiden_size' in model (did you mean 'hidden_size'?); 2 more unknown "
     "key(s): model.colour (line 10), runconfig.speed (line 23)"),
    ("key in wrong section", GOOD + "  max_steps: 5\n", None,
     "{f}:25: unknown key 'max_steps' in csconfig (it belongs in runconfig.max_steps)"),
    ("wrong type", GOOD.replace("batch_size: 32", "batch_size: abc"), None,
     "{f}:2: train_input.batch_size must be an int in [1, 2147483647], got 'abc'"),
    ("bool for int", GOOD.replace("batch_size: 32", "batch_size: true"), None,
     "{f}:2: train_input.batch_size must be an int in [1, 2147483647], got true"),
    ("out of range", GOOD.replace("batch_size: 32", "batch_size: 0"), None,
     "{f}:2: train_input.batch_size must be an int in [1, 2147483647], got 0"),
    ("float range", GOOD.replace("hidden_size: 64", "dropout_rate: 1.5"), None,
     "{f}:9: model.dropout_rate must be a number in [0, 1), got 1.5"),
    ("bad choice", GOOD.replace("optimizer_type: adamw", "optimizer_type: adma"), None,
     "{f}:11: optimizer.optimizer_type must be one of sgd, momentum, adam, adamw, got 'adma' "
     "(did you mean 'adam'?)"),
    ("bad strategy", GOOD.replace("execution_strategy: pipelined", "execution_strategy: wafer"),
     None, "{f}:24: csconfig.execution_strategy must be one of pipelined, multi_replica, "
     "weight_streaming, auto, got 'wafer'"),
    ("bad engine", GOOD + "  engine: cs4\n", None,
     "{f}:25: csconfig.engine must be one of cs1, cs2, cs3 or a path to an engine .yaml file, "
     "got 'cs4'"),
    ("missing section", "train_input:\n  batch_size: 3\n", None, "{f}: missing section 'model'"),
    ("unknown section", GOOD + "modle:\n  x: 1\n", None,
     "{f}:25: unknown section 'modle' (did you mean 'model'?); sections: train_input, "
     "eval_input, predict_input, model, optimizer, runconfig, csconfig"),
    ("missing required key", "train_input:\n  shuffle: true\nmodel:\n  name: toy\n", None,
     "{f}:1: missing key 'batch_size' in train_input: train_input.batch_size must be an int in [1, 2147483647]"),
    ("missing model name", "train_input:\n  batch_size: 3\nmodel:\n  hidden_size: 3\n", None,
     "{f}:3: model.name is required: nothing in the file says the model family (no modelzoo "
     "data_processor or model key of one); set model.name or run.py --model, one of {models}"),
    # modelzoo's files name the family only by their data processor: it is taken from there
    # (so the GPT family's own check speaks next).
    ("modelzoo file, family from its data_processor", "train_input:\n  batch_size: 3\n  "
     "data_processor: GptHDF5MapDataProcessor\nmodel:\n  hidden_size: 3\n", None,
     "{f}:4: model.hidden_size 3 must be divisible by model.num_heads 12"),
    ("unknown model", GOOD.replace("name: toy", "name: tyo"), None,
     "{f}:8: unknown model 'tyo' (did you mean 'toy'?); available: {models}"),
    ("python tag", GOOD.replace("hidden_size: 64", "hidden_size: !!python/object/apply:os.system "
                                "['echo hi']"), None,
     "{f}:9: YAML tag '!!python/object/apply:os.system' is not allowed; params files hold plain "
     "mappings, lists, strings, numbers, booleans and null"),
    ("custom tag", "train_input: !foo {batch_size: 3}\n", None,
     "{f}:1: YAML tag '!foo' is not allowed; params files hold plain mappings, lists, strings, "
     "numbers, booleans and null"),
    ("top level list", "- train_input\n- model\n", None,
     "{f}:1: top level must be a mapping of sections (train_input, eval_input, predict_input, "
     "model, optimizer, "
     "runconfig, csconfig), got a list"),
    ("top level scalar", "hello\n", None,
     "{f}:1: top level must be a mapping of sections (train_input, eval_input, predict_input, "
     "model, optimizer, "
     "runconfig, csconfig), got the scalar 'hello'"),
    ("empty file", "# nothing\n", None,
     "{f}: params file is empty; expected a mapping with sections train_input, eval_input, "
     "predict_input, model, optimizer, runconfig, csconfig"),
    ("section not a mapping", GOOD.replace("eval_input:\n  batch_size: 16", "eval_input: 16"),
     None, "{f}:5: section 'eval_input' must be a mapping of keys, got 16"),
    ("non-string key", GOOD.replace("  hidden_size: 64", "  3: 64"), None,
     "{f}:9: keys must be strings, got '3' in model"),
    ("replicas divide batch", GOOD.replace("execution_strategy: pipelined", "num_replicas: 3"),
     None, "{f}:2: train_input.batch_size 32 must be divisible by csconfig.num_replicas 3"),
    ("replicas vs strategy", GOOD + "  num_replicas: 2\n", None,
     "{f}:25: csconfig.num_replicas 2 needs execution_strategy multi_replica or auto, got "
     "'pipelined'"),
    ("multireplica conflict", GOOD.replace("pipelined", "weight_streaming") + "  multireplica: "
     "true\n", None, "{f}:25: csconfig.multireplica: true conflicts with "
     "csconfig.execution_strategy 'weight_streaming' (use multi_replica)"),
    ("schedule step missing", GOOD.replace("      steps: 100\n", ""), None,
     "{f}:13: optimizer.learning_rate[0].steps is required: every segment but the last needs "
     "steps"),
    ("bad scheduler", GOOD.replace("- scheduler: Linear\n      steps", "- scheduler: Lin\n      "
                                   "steps"), None,
     "{f}:13: optimizer.learning_rate[0].scheduler must be one of Linear, Constant, "
     "Exponential, Cosine, got 'Lin' (did you mean 'Linear'?)"),
    ("schedule unknown key", GOOD.replace("      steps: 100\n", "      step: 100\n"), None,
     "{f}:14: unknown key 'step' in optimizer.learning_rate[0] (Linear takes "
     "initial_learning_rate, end_learning_rate, steps) (did you mean 'steps'?)"),
    ("mpp > msl", GOOD.replace("batch_size: 32", "batch_size: 32\n  max_sequence_length: 8\n  "
                               "max_predictions_per_seq: 20"), None,
     "{f}:4: train_input.max_predictions_per_seq 20 must be <= max_sequence_length 8"),
    ("heads divide hidden", GOOD.replace("hidden_size: 64", "hidden_size: 64\n  num_heads: 5"),
     None, "{f}:10: model.hidden_size 64 must be divisible by model.num_heads 5"),
    ("nan", GOOD.replace("hidden_size: 64", "dropout_rate: .nan"), None,
     "{f}:9: model.dropout_rate must be a number in [0, 1), got nan"),
    # Overrides.
    ("override unknown key", None, ["model.hiden_size=3"],
     "override 'model.hiden_size=3': unknown key 'hiden_size' in model (did you mean "
     "'hidden_size'?)"),
    ("override unknown section", None, ["modle.name=toy"],
     "override 'modle.name=toy': unknown section 'modle' (did you mean 'model'?); sections: "
     "train_input, eval_input, predict_input, model, optimizer, runconfig, csconfig"),
    ("override no =", None, ["model.hidden_size"],
     "override 'model.hidden_size': expected SECTION.KEY=VALUE, e.g. train_input.batch_size=64"),
    ("override no section", None, ["batch_size=3"],
     "override 'batch_size=3': key must be SECTION.KEY such as model.hidden_size (a list "
     "entry: optimizer.learning_rate[1].steps), got 'batch_size'"),
    ("override index into a scalar", None, ["train_input.batch_size[0]=3"],
     "override 'train_input.batch_size[0]=3': cannot set 'train_input.batch_size[0]': "
     "train_input.batch_size is not a list"),
    ("override bad value type", None, ["train_input.batch_size=abc"],
     "override 'train_input.batch_size=abc': train_input.batch_size must be an int in [1, 2147483647], got "
     "'abc'"),
    ("override bad yaml", None, ["train_input.batch_size=[1"],
     "override 'train_input.batch_size=[1': value is not valid YAML: expected ',' or ']', but "
     "got '<stream end>'"),
    ("override python tag", None, ["model.hidden_size=!!python/name:os.system"],
     "override 'model.hidden_size=!!python/name:os.system': YAML tag "
     "'!!python/name:os.system' is not allowed; params files hold plain mappings, lists, "
     "strings, numbers, booleans and null"),
    ("override into a scalar", None, ["model.hidden_size.x=1"],
     "override 'model.hidden_size.x=1': cannot set 'model.hidden_size.x': model.hidden_size is "
     "not a mapping"),
    ("flag source", None, [params_lib.Override("csconfig.num_csx", 0, "--num_csx")],
     "--num_csx: csconfig.num_csx must be an int in [1, 1024], got 0"),
]


@pytest.mark.parametrize("text,overrides,expected", [c[1:] for c in BAD_CASES if c[3]],
                         ids=[c[0] for c in BAD_CASES if c[3]])
def test_bad_input_is_one_exact_line(tmp_path, text, overrides, expected):
  path = _write(tmp_path, GOOD if text is None else text)
  models = ", ".join(registry.available_models())
  assert params_error(path, overrides) == expected.format(f=path, models=models)


def test_negative_learning_rate(tmp_path):
  text = GOOD.split("optimizer:")[0] + "optimizer:\n  learning_rate: -1\n"
  path = _write(tmp_path, text)
  assert params_error(path) == (f"{path}:11: optimizer.learning_rate must be a number > 0 or a list of "
                          "schedule segments (scheduler: Linear, Constant, Exponential, Cosine), "
                          "got -1")


def test_missing_file_and_directory(tmp_path):
  assert params_error("foo.yaml") == "params file not found: foo.yaml"
  assert params_error(str(tmp_path)) == f"params file is a directory: {tmp_path}"


def test_not_utf8(tmp_path):
  path = tmp_path / "bin.yaml"
  path.write_bytes(b"model: \xff\xfe\n")
  assert params_error(str(path)).startswith(f"{path}: not UTF-8 text (invalid start byte at byte 7)")


def test_alias_bomb_is_cheap(tmp_path):
  lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
  for i in range(1, 12):
    lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
  path = _write(tmp_path, "\n".join(lines) + "\n")
  # 9^12 values if expanded: refused by counting (memoized), before any section is looked at.
  # It names the first key whose value alone expands past the limit: a5 (1 + 9 x 11,111).
  assert params_error(path) == (f"{path}:6: YAML aliases under a5 expand to more than 100,000 values "
                          "(an alias bomb?); a params file holds plain values, a few hundred at "
                          "most")


def test_registry_unknown_model_and_spec_checks():
  with pytest.raises(ParamsError, match=r"^unknown model 'toyy' \(did you mean 'toy'\?\); "):
    registry.get_model("toyy")
  with pytest.raises(ValueError):
    registry.ModelSpec("bad name", "a:b", "a:c")
  with pytest.raises(ValueError):
    registry.ModelSpec("x", "nocolon", "a:c")
  with pytest.raises(ValueError):
    registry.ModelSpec("x", "a:b", "a:c", schema={"optimizer": {}})
  with pytest.raises(ValueError):
    registry.register(registry.ModelSpec("toy", "a:b", "a:c"))
  spec = registry.ModelSpec("lazy_fn", "os.path:join", "os.path:basename")
  assert spec.resolve() == (os.path.join, os.path.basename)


# --- properties ------------------------------------------------------------------------------

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**20), st.floats(),
                     st.text(max_size=12),
                     st.sampled_from(["toy", "adamw", "dynamic", "cs2", "Linear", "auto",
                                      "1e-3", "multi_replica", "./data"]))
_keys = st.one_of(st.sampled_from(sorted({k for f in params_lib.SCHEMA.values() for k in f}
                                         | set(params_lib.SCHEMA) | {"scheduler", "steps"})),
                  st.text(min_size=1, max_size=8))
_values = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(_keys, inner, max_size=5)), max_leaves=20)
_sections = st.fixed_dictionaries(
    {}, optional={s: st.one_of(st.dictionaries(_keys, _values, max_size=6),
                               _scalars) for s in params_lib.SCHEMA})


def _only_params_error(text, overrides=()):
  try:
    out = params_lib.parse_params(text, "/tmp/prop/p.yaml", list(overrides))
  except ParamsError as e:
    assert "\n" not in str(e) and str(e)
    return None
  assert isinstance(out, dict) and {"train_input", "model"} <= set(out)
  return out


@settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.one_of(st.text(max_size=200),
                 st.lists(st.sampled_from(["train_input:", "model:", "  name: toy",
                                           "  batch_size: 8", "  - 1", "  x: [1, {a: b}]",
                                           "!!python/object:os.system", "&a [1]", "*a", "---",
                                           "  ? k", "  : v", "\t", "'", "{", "key: 1e5",
                                           "csconfig:", "  num_replicas: 4", "optimizer:",
                                           "  learning_rate: [{scheduler: Linear}]"]),
                          max_size=12).map("\n".join)))
def test_property_any_yaml_text_gives_params_or_params_error(text):
  _only_params_error(text)


@settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))
@given(_sections, st.booleans())
def test_property_any_nested_dict_gives_params_or_params_error(data, with_model):
  if with_model and isinstance(data.get("model"), dict):
    data["model"]["name"] = "toy"
  if with_model and isinstance(data.get("train_input"), dict):
    data["train_input"].setdefault("batch_size", 8)
  try:
    text = yaml.safe_dump(data)
  except (yaml.YAMLError, ValueError):
    return
  _only_params_error(text)


def test_grad_accum_and_warmup_steps(tmp_path, caplog):
  path = _write(tmp_path, GOOD)
  opt = params_lib.load_params(path)["optimizer"]
  assert (opt["grad_accum_steps"], opt["warmup_steps"]) == (1, None)
  opt = params_lib.load_params(path, ["optimizer.learning_rate=1e-3",
                                      "optimizer.warmup_steps=100",
                                      "optimizer.grad_accum_steps=4"])["optimizer"]
  assert (opt["grad_accum_steps"], opt["warmup_steps"]) == (4, 100)
  # Schedules count updates: 1000 micro-batches / 8 = 125 updates; a longer warm-up is
  # modelzoo's own (the rate never reaches its peak): loaded, said in a warning.
  with caplog.at_level(logging.WARNING, logger="cerebras_tf.params"):
    params_lib.load_params(path, ["optimizer.grad_accum_steps=8", "optimizer.learning_rate=1e-3",
                                  "optimizer.warmup_steps=200"])
  assert "the warm-up (200 updates) is longer than the 125 updates of runconfig.max_steps " \
         "1000 / optimizer.grad_accum_steps 8: the learning rate never reaches its peak" \
         in caplog.text
  assert params_error(path, ["optimizer.grad_accum_steps=0"]) == (
      "override 'optimizer.grad_accum_steps=0': optimizer.grad_accum_steps must be an int > 0, "
      "got 0")
  assert params_error(path, ["optimizer.warmup_steps=10"]).endswith(
      "optimizer.warmup_steps applies to a constant learning_rate; with schedule segments make "
      "the first segment a Linear warm-up")
  caplog.clear()
  with caplog.at_level(logging.WARNING, logger="cerebras_tf.params"):
    params_lib.load_params(path, ["optimizer.grad_accum_steps=20"])  # warm-up segment: 100
  assert "the warm-up (100 updates) is longer than the 50 updates" in caplog.text


TRAINER_FILE = textwrap.dedent("""\
    trainer:
      init:
        backend:
          backend_type: CSX
        model_dir: ./model_dir
        seed: 1
        model:
          name: llama
          vocab_size: 128256
          hidden_size: 256
          num_hidden_layers: 2
          num_heads: 8
          filter_size: 512
          max_position_embeddings: 8192
          position_embedding_type: rotary
          rotary_dim: 32
          share_embedding_weights: false
          norm_type: rmsnorm
          nonlinearity: swiglu
          use_ffn_bias: false
          use_projection_bias_in_attention: false
          use_ffn_bias_in_attention: false
          use_bias_in_output: false
          attention_module: multiquery_attention
          extra_attention_params:
            num_kv_groups: 2
          rope_theta: 500000.0
          pos_scaling_factor: 8.0
          pos_scaling_type: llama3
          pos_scaling_extra_args:
            low_freq_factor: 1.0
            high_freq_factor: 4.0
            original_max_position_embeddings: 8192
        optimizer:
          AdamW:
            betas: [0.9, 0.95]
            correct_bias: true
            weight_decay: 0.1
        schedulers:
        - SequentialLR:
            schedulers:
            - LinearLR:
                initial_learning_rate: 0.0
                end_learning_rate: 3.0e-4
                total_iters: 90
            - CosineDecayLR:
                initial_learning_rate: 3.0e-4
                end_learning_rate: 3.0e-5
                total_iters: 4678
        precision:
          enabled: true
          fp16_type: cbfloat16
          loss_scaling_factor: dynamic
          max_gradient_norm: 1.0
        loop:
          max_steps: 4768
          eval_steps: 2
          eval_frequency: 2384
        checkpoint:
          steps: 132
        logging:
          log_steps: 1
        callbacks:
        - ScopedTrainFlags:
            csx.performance.micro_batch_size: 20
        - ComputeNorm: {}
      fit:
        train_dataloader:
          data_processor: GptHDF5MapDataProcessor
          data_dir: ./train
          batch_size: 960
          shuffle: true
          shuffle_seed: 1337
          num_workers: 8
        val_dataloader: &val
          data_processor: GptHDF5MapDataProcessor
          data_dir: ./val
          batch_size: 960
          shuffle: false
      validate:
        val_dataloader: *val
    """)


def test_a_modelzoo_trainer_format_file_is_read_as_the_flat_sections(tmp_path):
  """modelzoo's files since R2.3 nest everything under trainer.init / trainer.fit (a
  LLaMA-3.1 config shown here, its shape shrunk); they were "unknown section 'trainer'".
  Each value lands on its one owner here; the family is GPT, which builds LLaMA's shape."""
  p = params_lib.load_params(_write(tmp_path, TRAINER_FILE))
  model, opt, rc, cs = p["model"], p["optimizer"], p["runconfig"], p["csconfig"]
  assert model["name"] == "gpt" and model["num_kv_groups"] == 2
  assert model["encoder_nonlinearity"] == "swiglu" and model["norm_type"] == "rmsnorm"
  assert (model["mixed_precision"], model["fp16_type"]) == (True, "cbfloat16")
  assert (model["pos_scaling_type"], model["pos_scaling_factor"]) == ("llama3", 8.0)
  assert (opt["optimizer_type"], opt["beta2"], opt["weight_decay_rate"], opt["correct_bias"],
          opt["max_gradient_norm"], opt["loss_scaling_factor"], opt["log_summaries"]) == \
      ("adamw", 0.95, 0.1, True, 1.0, "dynamic", True)
  assert [(s["scheduler"], s["steps"]) for s in opt["learning_rate"]] == \
      [("Linear", 90), ("Cosine", 4678)]
  assert (rc["max_steps"], rc["eval_steps"], rc["eval_frequency"], rc["save_checkpoints_steps"],
          rc["log_step_count_steps"], rc["tf_random_seed"], rc["use_cs"]) == \
      (4768, 2, 2384, 132, 1, 1, True)
  assert rc["model_dir"] == str(tmp_path / "model_dir")
  assert cs["micro_batch_size"] == 20
  assert p["train_input"]["data_dir"] == str(tmp_path / "train")
  assert p["eval_input"]["data_dir"] == str(tmp_path / "val")
  assert p["train_input"]["batch_size"] == p["eval_input"]["batch_size"] == 960
  assert p["train_input"]["num_parallel_calls"] == 8


def test_a_trainer_format_file_names_what_has_no_counterpart_with_its_line(tmp_path):
  text = TRAINER_FILE.replace("    - ComputeNorm: {}\n", "    - ComputeNorm: {}\n"
                              "    - GlobalFlags:\n"
                              "        csx.debug.compile_crd_memory_gi: 67\n").replace(
      "      steps: 132\n", "      steps: 132\n"
      "      disable_strict_checkpoint_loading: true\n")
  path = _write(tmp_path, text)
  assert params_error(path) == (f"{path}:61: trainer.init.checkpoint.disable_strict_checkpoint_"
                          "loading (modelzoo trainer format) has no counterpart here; remove "
                          "it; 1 more: trainer.init.callbacks[2].GlobalFlags (68)")
  # A mistyped model key keeps its own line in the trainer file.
  path = _write(tmp_path, TRAINER_FILE.replace("hidden_size: 256", "hiden_size: 256"))
  assert params_error(path).startswith(f"{path}:10: unknown key 'hiden_size' in model")
  # modelzoo's `Adam` decays by L2, which adam here does not: refused, not dropped.
  path = _write(tmp_path, TRAINER_FILE.replace("AdamW:", "Adam:"))
  assert params_error(path) == (f"{path}:38: optimizer.weight_decay_rate 0.1 is not applied by "
                          "optimizer_type adam (it is by adamw): change the type or remove the "
                          "key")
