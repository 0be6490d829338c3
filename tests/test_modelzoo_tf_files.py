"""Cerebras modelzoo's TensorFlow params files as modelzoo writes them (small snippets shaped
like its files; no modelzoo file is in the repository). No TensorFlow."""

import logging
import os
import subprocess
import sys
import textwrap

import pytest

from cerebras_tf import cli
from cerebras_tf.modelzoo import tf_files
from cerebras_tf import params as params_lib
from params_errors import params_error

# The shape of modelzoo/transformers/tf/gpt2/configs/params_gpt2_small.yaml (no model.name).
GPT2 = textwrap.dedent("""\
    train_input:
        data_processor: "GptTfRecordsProcessor"
        data_dir: "./input/train"
        vocab_size: 50257
        max_sequence_length: 128
        add_special_tokens: True
        batch_size: 8
        mixed_precision: True
    eval_input:
        data_processor: "GptTfRecordsProcessor"
        data_dir: "./input/val"
        max_sequence_length: 128
        batch_size: 8
    model:
        hidden_size: 64
        num_heads: 4
        num_hidden_layers: 2
        filter_size: 256
        max_position_embeddings: 128
        use_ffn_bias_in_attention: True
        weight_initialization_seed: 0
        mixed_precision: True
        boundary_casting: False
        tf_summary: False
        precision_opt_level: 1
    optimizer:
        optimizer_type: "adamw"
        use_bias_correction: True
        learning_rate:
            - scheduler: "Linear"
              initial_learning_rate: 0.0
              end_learning_rate: 1.0e-4
              steps: 100
            - scheduler: "Cosine"
              initial_learning_rate: 1.0e-4
              alpha: 0.1
              decay_steps: 900
    runconfig:
        max_steps: 1000
        num_wgt_servers: 4
    csconfig:
        use_cbfloat16: False
    """)


def _write(tmp_path, text, name="params.yaml"):
  path = tmp_path / name
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(text)
  return str(path)


# --- the family from the file ----------------------------------------------------------------

def test_gpt_file_without_name_runs_as_gpt(tmp_path, caplog):
  with caplog.at_level(logging.INFO, logger="cerebras_tf"):
    p = params_lib.load_params(_write(tmp_path, GPT2))
  assert p["model"]["name"] == "gpt"
  assert "model family gpt (from data_processor GptTfRecordsProcessor)" in caplog.text


@pytest.mark.parametrize("processor,family,task", [
    ("BertTfRecordsProcessor", "bert", "pretraining"),
    ("BertMlmOnlyTfRecordsDynamicMaskProcessor", "bert", "pretraining"),
    ("MnliDataProcessor", "bert", "classification"),
    ("Sst2DataProcessor", "bert", "classification"),
    ("TransformerDynamicDataProcessor", "transformer", None),
    ("GenomicDataProcessor", "gpt", None),
    ("NerDataProcessor", "bert", "token_classification"),
    ("SecondaryStructureDataProcessor", "bert", "token_classification"),
    ("QuestionAnsweringDataProcessor", "bert", "question_answering"),
    ("BertSumTfRecordsProcessor", "bert", "extractive_summarization"),
    ("FluorescenceDataProcessor", "bert", "regression"),
    ("GenomeDataProcessor", "genomic_bert", None),
    ("T5DynamicDataProcessor", "t5", None),
])
def test_family_from_data_processor(processor, family, task):
  got = tf_files.infer_family({"train_input": {"data_processor": processor}, "model": {}})
  assert (got.name, got.task) == (family, task)


def test_model_keys_beat_a_shared_processor():
  # Linformer reads BERT's MLM-only records: its projected_dims say what it is.
  raw = {"train_input": {"data_processor": "BertMlmOnlyTfRecordsDynamicMaskProcessor"},
         "model": {"projected_dims": 256}}
  assert tf_files.infer_family(raw).name == "linformer"
  assert tf_files.infer_family({"model": {"encoder_filters": [64]}}).name == "unet"
  assert tf_files.infer_family({"model": {"hidden_sizes": [5]}}).name == "mlp"
  assert tf_files.infer_family({"model": {"hidden_size": 5}}) is None


def test_classifier_file_gets_the_classification_task(tmp_path):
  text = textwrap.dedent("""\
      train_input:
        data_processor: Sst2DataProcessor
        batch_size: 4
        max_sequence_length: 32
      model:
        num_cls_classes: 2
        cls_dropout_rate: 0.1
        hidden_size: 32
        num_heads: 2
        max_position_embeddings: 64
      """)
  p = params_lib.load_params(_write(tmp_path, text))
  assert (p["model"]["name"], p["model"]["task"]) == ("bert", "classification")
  assert (p["model"]["num_classes"], p["model"]["cls_dropout_rate"]) == (2, 0.1)


def test_name_overrides_and_model_flag(tmp_path):
  path = _write(tmp_path, GPT2)
  # model.name (or --model) wins over what the file holds; a wrong one is refused by its own
  # checks, not silently replaced.
  assert "unknown model 'bart'" in params_error(path, ["model.name=bart"])
  inv = cli.parse_command_line(["run.py", "--params", path, "--model", "gpt2"])
  p = params_lib.load_params(inv.params_path, inv.overrides)
  assert p["model"]["name"] == "gpt"  # modelzoo's model name -> the family here


@pytest.mark.parametrize("text,expected", [
    ("train_input:\n  data_processor: STFDataProcessor\n  batch_size: 2\nmodel:\n"
     "  hidden_size: 8\n", "{f}:4: this is a modelzoo Spacetimeformer (time-series "
     "forecasting) config (data_processor STFDataProcessor): it needs the 'spacetimeformer' "
     "model family, which is not built here"),
    ("base:\n  train_input: {batch_size: 2}\n  model: {encoder_output_sizes: [4]}\n",
     "{f}: this is a modelzoo LLNL's CRETIN surrogate (several named configs in one file) config "
     "(several named configs (base, ...)): it needs the 'cretin' model family, which is not "
     "built here"),
    ("- name: variant_1\n  scenario: emission\n  n_towers: 1\n",
     "{f}:1: this is a modelzoo LLNL's CRETIN surrogate (several named configs in one file) "
     "config (a list of variants (scenario, n_towers)): it needs the 'cretin' model family, "
     "which is not built here"),
])
def test_unbuilt_family_is_one_line_naming_it(tmp_path, text, expected):
  path = _write(tmp_path, text)
  assert params_error(path) == expected.format(f=path)


def test_unbuilt_family_by_name(tmp_path):
  path = _write(tmp_path, "train_input:\n  batch_size: 2\nmodel:\n  name: spacetimeformer\n")
  assert params_error(path).startswith(f"{path}:4: model.name spacetimeformer: the "
                                       f"Spacetimeformer (time-series forecasting) family is "
                                       f"not built here")


# --- YAML as modelzoo writes it --------------------------------------------------------------

def test_tf_cosine_alpha_and_decay_steps(tmp_path):
  lr = params_lib.load_params(_write(tmp_path, GPT2))["optimizer"]["learning_rate"]
  # TF's cosine_decay floor is alpha * initial: 0.1 * 1e-4 = 1e-5; it falls over decay_steps.
  assert lr[1]["scheduler"] == "Cosine"
  assert lr[1]["end_learning_rate"] == pytest.approx(1e-5)
  assert lr[1]["steps"] == 900
  conflict = GPT2.replace("alpha: 0.1", "alpha: 0.1\n          end_learning_rate: 0.0")
  assert "alpha 0.1 (end rate 1e-05) conflicts with end_learning_rate 0.0; keep one of them" \
      in params_error(_write(tmp_path, conflict))


def test_warmup_longer_than_the_run_warns_and_runs(tmp_path, caplog):
  text = GPT2.replace("max_steps: 1000", "max_steps: 50")
  with caplog.at_level(logging.WARNING, logger="cerebras_tf.params"):
    p = params_lib.load_params(_write(tmp_path, text))
  assert p["runconfig"]["max_steps"] == 50
  assert "the warm-up (100 updates) is longer than runconfig.max_steps 50: the learning rate " \
         "never reaches its peak" in caplog.text


def test_duplicate_key_last_wins_and_both_lines_are_named(tmp_path, caplog):
  # modelzoo's gpt3_6p7b file gives model.precision_opt_level twice; PyYAML keeps the last.
  text = GPT2.replace("    num_heads: 4\n", "    num_heads: 4\n    num_heads: 8\n")
  path = _write(tmp_path, text)
  with caplog.at_level(logging.WARNING, logger="cerebras_tf.params"):
    p = params_lib.load_params(path)
  assert p["model"]["num_heads"] == 8
  assert f"{path}:17: duplicate key 'num_heads' in model (also at line 16): the last one, " \
         f"line 17, is used" in caplog.text
  # An error about the key names the line of the value used.
  bad = text.replace("    num_heads: 8\n", "    num_heads: 7\n")
  assert params_error(_write(tmp_path, bad)).startswith(f"{path}:17: model.hidden_size 64 must be "
                                                  f"divisible by model.num_heads 7")


def test_list_valued_data_dir(tmp_path):
  text = GPT2.replace('    data_dir: "./input/train"\n',
                      '    data_dir:\n      - "./a/0/"\n      - "./a/1/"\n')
  p = params_lib.load_params(_write(tmp_path, text))
  assert p["train_input"]["data_dir"] == [str(tmp_path / "a" / "0"), str(tmp_path / "a" / "1")]
  assert p["eval_input"]["data_dir"] == str(tmp_path / "input" / "val")  # one stays a string
  assert tf_files.data_dirs(p["eval_input"]["data_dir"]) == [str(tmp_path / "input" / "val")]
  bad = text.replace('      - "./a/1/"\n', "      - 3\n")
  assert "train_input.data_dir must be a path (string) or a list of paths" in \
      params_error(_write(tmp_path, bad))


def test_predict_input_and_description_sections(tmp_path):
  text = 'description: "GPT-2 small"\n' + GPT2 + textwrap.dedent("""\
      predict_input:
          data_processor: "GptTfRecordsProcessor"
          data_dir: "./input/test"
          batch_size: 2
      """)
  p = params_lib.load_params(_write(tmp_path, text))
  assert p["description"] == "GPT-2 small"
  assert p["predict_input"]["batch_size"] == 2
  assert p["predict_input"]["shuffle"] is False  # eval_input's defaults
  assert p["predict_input"]["data_dir"] == str(tmp_path / "input" / "test")
  assert "predict_input.batch_size must be" in params_error(
      _write(tmp_path, text.replace("batch_size: 2", "batch_size: 0")))


# --- keys ------------------------------------------------------------------------------------

def test_compiler_only_keys_are_named_once_in_the_log(tmp_path, caplog):
  with caplog.at_level(logging.INFO, logger="cerebras_tf.params"):
    p = params_lib.load_params(_write(tmp_path, GPT2))
  lines = [r.getMessage() for r in caplog.records if "kept without effect" in r.getMessage()]
  assert len(lines) == 1
  for key in ("model.precision_opt_level", "model.boundary_casting", "csconfig.use_cbfloat16",
              "train_input.add_special_tokens", "train_input.mixed_precision"):
    assert key in lines[0]
  assert "precision_opt_level" not in p["model"]


def test_modelzoo_tf_names_move_onto_their_owner(tmp_path):
  p = params_lib.load_params(_write(tmp_path, GPT2))
  assert p["optimizer"]["correct_bias"] is True          # use_bias_correction
  assert p["csconfig"]["max_wgt_servers"] == 4           # runconfig.num_wgt_servers
  assert p["runconfig"]["tf_random_seed"] == 0           # weight_initialization_seed
  both = GPT2.replace("  optimizer_type", "  correct_bias: false\n    optimizer_type")
  assert "optimizer.use_bias_correction true (modelzoo TF's name for optimizer.correct_bias) " \
         "conflicts with optimizer.correct_bias false; keep one of them" in \
      params_error(_write(tmp_path, both))
  seeded = GPT2.replace("    num_wgt_servers: 4", "    num_wgt_servers: 4\n    tf_random_seed: 7")
  assert params_lib.load_params(_write(tmp_path, seeded))["runconfig"]["tf_random_seed"] == 7


def test_keys_built_one_way(tmp_path):
  ok = GPT2.replace("    weight_initialization_seed: 0", "    use_pre_normalization: True")
  params_lib.load_params(_write(tmp_path, ok))
  bad = GPT2.replace("    weight_initialization_seed: 0", "    use_pre_normalization: False")
  assert params_error(_write(tmp_path, bad)).endswith(
      "model.use_pre_normalization false: not built here (the models build true, modelzoo's "
      "default); remove the key")


def test_initializer_specs(tmp_path):
  spec = textwrap.indent(textwrap.dedent("""\
      initializer:
          name: "truncated_normal"
          mean: 0.0
          stddev: 0.02
      output_layer_initializer:
          - name: "variance_scaling"
            scale_type: "wang_init"
            distribution: "untruncated_normal"
      embedding_initializer:
          - name: "scaled_init_normal"
            key: "vocab_size"
      """), "    ")
  text = GPT2.replace("    weight_initialization_seed: 0\n", spec)
  model = params_lib.load_params(_write(tmp_path, text))["model"]
  assert "initializer" not in model and "output_layer_initializer" not in model
  specs = model["initializer_specs"]
  assert specs["layers"] == {"name": "truncated_normal", "mean": 0.0, "stddev": 0.02}
  # GPT-J's wang_init: scale 4 / layers^2 = 4 / 2^2 = 1.0; mode fan_in by default.
  assert specs["output"] == {"name": "variance_scaling", "scale": 1.0, "mode": "fan_in",
                             "distribution": "untruncated_normal"}
  # scaled_init_normal on vocab_size: sigma 1 / sqrt(50257) = 0.004460...
  assert specs["embedding"]["name"] == "normal"
  assert specs["embedding"]["stddev"] == pytest.approx(1 / 50257 ** 0.5)
  bad = GPT2.replace("    weight_initialization_seed: 0\n",
                     '    initializer:\n      - name: "orthogonal"\n')
  assert params_error(_write(tmp_path, bad)).endswith(
      "model.initializer: orthogonal is not an initializer modelzoo builds (truncated_normal, "
      "normal, uniform, constant, glorot_uniform, glorot_normal, variance_scaling, "
      "scaled_init_normal)")
  bad = GPT2.replace("    weight_initialization_seed: 0\n",
                     '    initializer:\n      name: "normal"\n      sigma: 2\n')
  assert params_error(_write(tmp_path, bad)).endswith(
      "model.initializer: sigma is not a normal argument (mean, stddev)")


def test_pretrain_params_path_brings_the_model_keys(tmp_path):
  # modelzoo: fine_tuning/classifier/configs/X.yaml names ../../configs/pretrain.yaml, relative
  # to its run.py (fine_tuning/classifier).
  _write(tmp_path, "model:\n  hidden_size: 32\n  num_heads: 2\n  max_position_embeddings: 64\n"
                   "  mlm_nonlinearity: gelu\n", "bert/configs/pretrain.yaml")
  text = textwrap.dedent("""\
      train_input:
        data_processor: MnliDataProcessor
        batch_size: 4
        max_sequence_length: 32
      model:
        pretrain_params_path: "../../configs/pretrain.yaml"
        num_heads: 4
      """)
  path = _write(tmp_path, text, "bert/fine_tuning/classifier/configs/mnli.yaml")
  model = params_lib.load_params(path)["model"]
  assert (model["hidden_size"], model["num_heads"], model["max_position_embeddings"]) == \
      (32, 4, 64)  # the fine-tuning file's own keys win
  missing = _write(tmp_path, text.replace("pretrain.yaml", "nope.yaml"), "other/x.yaml")
  assert "model.pretrain_params_path ../../configs/nope.yaml: no such file" in params_error(missing)


@pytest.mark.parametrize("key,line", [
    ("src_vocab_file: x.txt", "model.src_vocab_file is a modelzoo key that the gpt model here "
     "does not build (docs/modelzoo_migration.md); remove it"),
    ("embedding_initializer: {name: he_normal}", "model.embedding_initializer: he_normal is "
     "not an initializer modelzoo builds"),
])
def test_hints_point_the_right_way(tmp_path, key, line):
  # These once said "did you mean 'embedding_layer_norm'?": a key of another meaning.
  message = params_error(_write(tmp_path, GPT2.replace("    weight_initialization_seed: 0",
                                                 "    " + key)))
  assert line in message and "did you mean" not in message


def test_bert_attention_type_is_its_own_key(tmp_path):
  text = GPT2.replace("GptTfRecordsProcessor", "BertTfRecordsProcessor").replace(
      "    weight_initialization_seed: 0", "    attention_type: dot_product")
  message = params_error(_write(tmp_path, text))
  assert "model.attention_type: the bert model does not apply it" in message
  assert "attention_dropout_rate" not in message


def test_fc_mnist_file(tmp_path):
  text = textwrap.dedent("""\
      description: "FC-MNIST base model params"
      train_input:
          shuffle: True
          data_dir: './tfds'
          batch_size: 256
          num_parallel_calls: 0   # 0 means AUTOTUNE
      model:
          hidden_sizes: [500, 300]
          dropout: 0.2
          activation_fn: 'relu'
      optimizer:
          learning_rate: 0.001
      runconfig:
          max_steps: 100
      """)
  p = params_lib.load_params(_write(tmp_path, text))
  assert (p["model"]["name"], p["model"]["input_dim"], p["model"]["num_classes"]) == \
      ("mlp", 784, 10)  # MNIST's shapes
  assert (p["model"]["dropout"], p["model"]["activation_fn"]) == (0.2, "relu")
  assert p["optimizer"]["optimizer_type"] == "adam"  # modelzoo FC-MNIST's, unless given
  assert p["train_input"]["num_parallel_calls"] == 0


# --- the benchmark's collection --------------------------------------------------------------

def test_benchmark_collects_distinct_tf_yaml_across_history(tmp_path):
  sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
  import bench_modelzoo_configs as bench  # pylint: disable=import-outside-toplevel
  repo = tmp_path / "repo"
  env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
             GIT_COMMITTER_EMAIL="t@t")

  def commit(files, message):
    for name, text in files.items():
      (repo / name).parent.mkdir(parents=True, exist_ok=True)
      (repo / name).write_text(text)
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True, env=env)
    subprocess.run(["git", "-C", str(repo), "commit", "-qm", message], check=True, env=env)

  repo.mkdir()
  subprocess.run(["git", "init", "-q", str(repo)], check=True)
  commit({"m/tf/gpt2/configs/a.yaml": "x: 1\n", "m/pytorch/configs/b.yaml": "y: 1\n",
          "m/tf/README.md": "no"}, "one")
  commit({"m/tf/gpt2/configs/a.yaml": "x: 2\n", "m/tf/bert/configs/c.yaml": "x: 1\n"}, "two")
  found = bench.collect(str(repo))
  # Three tf/ yaml versions, two contents: c.yaml (newest) holds a.yaml's first content, so
  # that one is listed once, by the newest path; nothing outside a tf/ folder.
  assert sorted(path for path, _, _ in found) == ["m/tf/bert/configs/c.yaml",
                                                  "m/tf/gpt2/configs/a.yaml"]
  assert len({blob for _, blob, _ in found}) == 2


def test_classifier_head_keys(tmp_path):
  # TAPE's remote homology classifier: cls_nonlinearity relu, use_cls_bias, 1195 classes.
  text = textwrap.dedent("""\
      train_input:
        data_processor: RemoteHomologyDataProcessor
        batch_size: 4
        max_sequence_length: 32
      model:
        hidden_size: 32
        num_heads: 2
        max_position_embeddings: 64
        num_cls_classes: 1195
        use_cls_bias: True
        cls_nonlinearity: relu
      """)
  model = params_lib.load_params(_write(tmp_path, text))["model"]
  assert (model["task"], model["num_classes"], model["pooler_nonlinearity"]) == \
      ("classification", 1195, "relu")
  assert "use_cls_bias false: not built here" in params_error(
      _write(tmp_path, text.replace("use_cls_bias: True", "use_cls_bias: False")))


def test_gptj_file_builds_gptj(tmp_path):
  # modelzoo's gptj/ files never say rotary or parallel: its GPT-J model always is. NeoX's
  # untied norms, a tied head with a bias and no learned positions are built as written.
  text = GPT2.replace("    weight_initialization_seed: 0", textwrap.indent(textwrap.dedent("""\
      rotary_dim: 8
      use_untied_layer_norm: True
      use_position_embeddings: False
      share_embedding_weights: True
      use_bias_in_output: True"""), "    "))
  model = params_lib.load_params(_write(tmp_path, text))["model"]
  assert (model["position_embedding_type"], model["parallel_attention"]) == ("rotary", True)
  assert (model["use_untied_layer_norm"], model["use_position_embedding"],
          model["use_bias_in_output"]) == (True, False, True)
  explicit = text.replace("    rotary_dim: 8", "    rotary_dim: 8\n    parallel_attention: False")
  assert "model.use_untied_layer_norm: true is GPT-NeoX's second norm" in \
      params_error(_write(tmp_path, explicit))


def test_gptj_residual_dropout(tmp_path):
  text = GPT2.replace("    weight_initialization_seed: 0",
                      "    rotary_dim: 8\n    residual_dropout_rate: 0.1")
  model = params_lib.load_params(_write(tmp_path, text))["model"]
  # GPT-J's residual dropout is dropout_rate here; its embeddings' dropout stays its 0.
  assert (model["dropout_rate"], model["embedding_dropout_rate"]) == (0.1, 0.0)
  both = text.replace("residual_dropout_rate: 0.1", "residual_dropout_rate: 0.1\n    "
                      "dropout_rate: 0.2")
  assert "model.residual_dropout_rate 0.1 (modelzoo TF's name for model.dropout_rate) " \
         "conflicts with model.dropout_rate 0.2" in params_error(_write(tmp_path, both))


@pytest.mark.parametrize("scaling,weight,expected", [
    ("batch_size", None, 1.0),          # sum / batch size (modelzoo's weight 1)
    ("batch_size", 0.05, 0.05),         # sum / batch size * 0.05
    ("num_masked", None, None),         # the mean over the masked positions
    ("precomputed_num_masked", 1.0, None),
])
def test_mlm_loss_scaling(tmp_path, scaling, weight, expected):
  text = GPT2.replace("GptTfRecordsProcessor", "BertTfRecordsProcessor").replace(
      "    weight_initialization_seed: 0", f"    mlm_loss_scaling: {scaling}" + (
          f"\n    mlm_loss_weight: {weight}" if weight is not None else ""))
  assert params_lib.load_params(_write(tmp_path, text))["model"]["mlm_loss_weight"] == expected


def test_modelzoo_key_a_family_lacks_gets_no_wrong_hint(tmp_path):
  # BERT's cls_dropout_rate in a Transformer file: not "did you mean 'dropout_rate'?" (the
  # Transformer's attention_type once got 'attention_dropout_rate'; it is applied now).
  text = textwrap.dedent("""\
      train_input:
        data_processor: TransformerDynamicDataProcessor
        batch_size: 4
      model:
        cls_dropout_rate: 0.1
      """)
  path = _write(tmp_path, text)
  assert params_error(path) == (f"{path}:5: model.cls_dropout_rate is a modelzoo key that the "
                          f"transformer model here does not build (docs/modelzoo_migration.md);"
                          f" remove it")
  # A typo of a key is still a typo.
  assert "did you mean 'hidden_size'" in params_error(_write(tmp_path, text.replace(
      "cls_dropout_rate: 0.1", "hiden_size: 8")))


def test_model_flag_keeps_what_the_file_says(tmp_path):
  # --model bert on modelzoo's SST-2 file: still the classification task it is for.
  text = textwrap.dedent("""\
      train_input:
        data_processor: Sst2DataProcessor
        batch_size: 4
        max_sequence_length: 32
      model:
        hidden_size: 32
        num_heads: 2
        max_position_embeddings: 64
      """)
  path = _write(tmp_path, text)
  inv = cli.parse_command_line(["run.py", "--params", path, "--model", "bert"])
  model = params_lib.load_params(inv.params_path, inv.overrides)["model"]
  assert (model["name"], model["task"]) == ("bert", "classification")
  inv = cli.parse_command_line(["run.py", "--params", path, "--model", "bert",
                                "--params_override", "model.task=pretraining"])
  assert params_lib.load_params(inv.params_path, inv.overrides)["model"]["task"] == \
      "pretraining"


def test_benchmark_rows_without_compiling(tmp_path):
  sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
  import bench_modelzoo_configs as bench  # pylint: disable=import-outside-toplevel
  gpt = _write(tmp_path, GPT2, "gpt2.yaml")
  t5 = _write(tmp_path, "train_input:\n  batch_size: 2\nmodel:\n  d_kv: 64\n", "t5.yaml")
  # Data paths (only the keys the file sets) point at ours.
  assert bench.data_overrides(gpt, "/data") == ["train_input.data_dir=/data",
                                                "eval_input.data_dir=/data"]
  assert bench.family_of(gpt) == "gpt" and bench.family_of(t5) == "t5"
  status, text, rate = bench.compile_one(gpt, str(tmp_path), str(tmp_path), no_compile=True)
  assert (status, rate) == ("not run", None)
  status, text, _ = bench.compile_one(t5, str(tmp_path), str(tmp_path), no_compile=True)
  assert status == "not run", text  # T5 is built (models/t5)
  # Two files whose validated params are the same compile the same graph: one key.
  copy = _write(tmp_path, "# a comment\n" + GPT2, "copy.yaml")
  keys = {bench._key(params_lib.load_params(f, [f"runconfig.model_dir={tmp_path / f[-9:]}"]))
          for f in (gpt, copy)}
  assert len(keys) == 1


def test_rotary_dim_beyond_the_head_rotates_the_whole_head(tmp_path):
  # ANL's gene_gptj_2B: hidden 3968 / 64 heads = 62 features a head, rotary_dim 64. modelzoo's
  # GPT-J rotates key[..., :rotary_dim], i.e. the whole 62-feature head: built so here.
  text = GPT2.replace("    weight_initialization_seed: 0", "    rotary_dim: 32").replace(
      "hidden_size: 64", "hidden_size: 120")
  path = _write(tmp_path, text)
  assert params_lib.load_params(path)["model"]["rotary_dim"] == 30  # 120 / 4 heads
  # An odd head cannot be rotated in pairs: one line.
  odd = _write(tmp_path, text.replace("hidden_size: 120", "hidden_size: 124"), "odd.yaml")
  assert params_error(odd) == (f"{odd}:21: model.rotary_dim 32 covers the whole head, "
                               f"hidden_size 124 / num_heads 4 = 31 features, an odd number "
                               f"rotary cannot rotate in pairs; set rotary_dim to an even "
                               f"number <= 31")
