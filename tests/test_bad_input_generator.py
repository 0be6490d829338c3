"""A generator of bad inputs (hypothesis) for the classes of issue 40: every one gets one line on
stderr starting `error: `, exit code 2, no traceback, and fast (no count is allocated for before it
is checked: a params-level line comes before TensorFlow starts).

Classes: a count from the user (systems, servers, replicas, steps, batch, any int key) out of
range or past int64; a params file in another encoding (UTF-16/32 with and without a byte-order
mark, Latin-1); a YAML alias bomb of random depth and fan-out at a random key; an output
directory (model_dir, compile_dir, export_dir) under a regular file or on a read-only
filesystem. What it found went into docs/bad_inputs.md (rows num_csx_huge .. params_utf16_no_bom).
"""

import os
import subprocess
import time
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cerebras_tf import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MLP = "configs/params_mlp.yaml"
SETTINGS = settings(max_examples=40, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])

# Flags and params keys that are counts, with what a user may type into them.
COUNT_FLAGS = ("--num_csx", "--num_wgt_servers", "--steps", "--max_steps", "--eval_steps")
COUNT_KEYS = ("csconfig.num_csx", "csconfig.max_wgt_servers", "csconfig.num_replicas",
              "train_input.batch_size", "eval_input.batch_size", "runconfig.max_steps",
              "runconfig.eval_steps", "runconfig.save_checkpoints_steps",
              "runconfig.keep_checkpoint_max", "runconfig.log_step_count_steps",
              "optimizer.grad_accum_steps", "train_input.shuffle_buffer",
              "csconfig.micro_batch_size")
BAD_COUNTS = st.one_of(st.integers(max_value=-1), st.just(0),
                       st.integers(min_value=2 ** 63, max_value=2 ** 200),
                       st.sampled_from([10 ** 9, 2 ** 31, 2 ** 32 + 1]))


@pytest.fixture(autouse=True)
def _at_root(monkeypatch):
  monkeypatch.chdir(ROOT)
  monkeypatch.delenv("TF_CONFIG", raising=False)


def one_line(capsys, argv, limit_s=5.0):
  """Runs run.py's main on argv; asserts the one error line, exit 2, fast; returns the line."""
  capsys.readouterr()
  start = time.monotonic()
  code = cli.main(["run.py"] + argv)
  took = time.monotonic() - start
  out, err = capsys.readouterr()
  assert "Traceback" not in err, err[-2000:]
  assert code == 2 and err.count("\n") == 1 and err.startswith("error: "), (argv, out, err)
  assert took < limit_s, (argv, took)
  return err.strip()


def _too_big_for(key: str, value: int) -> bool:
  """Whether `value` is out of range for a count that takes huge values legitimately (steps
  up to int64, buffers and keep counts unbounded above): only negatives, 0 or past int64."""
  if key in ("runconfig.keep_checkpoint_max", "runconfig.eval_steps", "--eval_steps"):
    return value < 0 or value >= 2 ** 63
  if key in ("runconfig.max_steps", "runconfig.save_checkpoints_steps", "--steps",
             "--max_steps", "runconfig.log_step_count_steps", "optimizer.grad_accum_steps",
             "train_input.shuffle_buffer"):
    return value < 1 or value >= 2 ** 63
  return True  # systems, servers, replicas, batches: a billion is a typo too


@SETTINGS
@given(flag=st.sampled_from(COUNT_FLAGS), value=BAD_COUNTS)
def test_a_bad_count_flag_is_one_line(capsys, tmp_path, flag, value):
  if not _too_big_for(flag, value):
    return
  line = one_line(capsys, ["--params", MLP, "--compile_only", "--model_dir",
                           str(tmp_path / "m"), flag, str(value)])
  assert flag in line and str(value) in line


@SETTINGS
@given(key=st.sampled_from(COUNT_KEYS), value=BAD_COUNTS)
def test_a_bad_count_key_is_one_line(capsys, tmp_path, key, value):
  if not _too_big_for(key, value):
    return
  line = one_line(capsys, ["--params", MLP, "--compile_only", "--model_dir",
                           str(tmp_path / "m"), "--params_override", f"{key}={value}"])
  assert key in line


TEXT = "train_input:\n  batch_size: 8\nmodel:\n  name: mlp\n  hidden_sizes: [8]\n"


@SETTINGS
@given(encoding=st.sampled_from(["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le",
                                 "latin-1"]),
       extra=st.text(alphabet="éàüñß中文", min_size=0, max_size=5))
def test_a_params_file_in_another_encoding_is_one_line(capsys, tmp_path, encoding, extra):
  path = tmp_path / f"{uuid.uuid4().hex}.yaml"
  body = TEXT + (f"# {extra}\n" if extra else "")
  try:
    path.write_bytes(body.encode(encoding))
  except UnicodeEncodeError:
    return  # Latin-1 cannot hold the CJK characters
  if encoding == "latin-1" and not any(ord(c) > 127 for c in body):
    return  # plain ASCII: valid UTF-8 too
  line = one_line(capsys, ["--params", str(path)])
  family = encoding.split("-")[0] + "-" + encoding.split("-")[1]
  assert str(path) in line
  assert (family.upper() in line) if encoding != "latin-1" else "not UTF-8" in line


@SETTINGS
@given(fanout=st.integers(2, 12), depth=st.integers(3, 14),
       at=st.sampled_from(["train_input.batch_size", "model.hidden_sizes", "optimizer.extra",
                           "runconfig.x"]))
def test_an_alias_bomb_names_its_key(capsys, tmp_path, fanout, depth, at):
  if fanout ** depth <= 200_000:
    return  # not a bomb
  section, key = at.split(".")
  anchors = [f"&a0 [{', '.join(['x'] * fanout)}]"]
  anchors += [f"&a{i} [{', '.join([f'*a{i - 1}'] * fanout)}]" for i in range(1, depth)]
  bomb = f"[{', '.join(anchors)}]"
  sections = {"train_input": "  batch_size: 8\n", "model": "  name: mlp\n",
              "optimizer": "  learning_rate: 0.1\n", "runconfig": "  max_steps: 2\n"}
  sections[section] = f"  {key}: {bomb}\n" + "".join(
      line for line in sections[section].splitlines(True) if not line.startswith(f"  {key}:"))
  path = tmp_path / f"{uuid.uuid4().hex}.yaml"
  path.write_text("".join(f"{s}:\n{body}" for s, body in sections.items()))
  line = one_line(capsys, ["--params", str(path)], limit_s=2.0)
  assert f"YAML aliases under {section}.{key}[" in line and "alias bomb" in line, line


@SETTINGS
@given(which=st.sampled_from(["--model_dir", "--compile_dir", "--export_dir"]),
       below=st.sampled_from(["", "sub", "sub/deeper"]))
def test_an_output_directory_under_a_file_is_one_line(capsys, tmp_path, which, below):
  afile = tmp_path / f"{uuid.uuid4().hex}"
  afile.write_text("a regular file\n")
  target = os.path.join(str(afile), below) if below else str(afile)
  argv = ["--params", MLP, "--model_dir", str(tmp_path / "m"), "--compile_only"]
  if which == "--export_dir":
    argv = ["--params", MLP, "--model_dir", str(tmp_path / "m"), "--mode", "export"]
  argv += [which, target]
  line = one_line(capsys, argv, limit_s=60.0)  # the run imports the model family (TF) first
  assert target in line and which.strip("-") in line
  assert afile.read_text() == "a regular file\n"


@pytest.fixture(scope="module")
def read_only(tmp_path_factory):
  path = tmp_path_factory.mktemp("ro")
  proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)],
                        capture_output=True, text=True, check=False)
  if proc.returncode:
    pytest.skip(f"cannot mount a read-only tmpfs here (needs root): {proc.stderr.strip()}")
  yield path
  subprocess.run(["umount", "-l", str(path)], check=False)


@SETTINGS
@given(which=st.sampled_from(["--model_dir", "--compile_dir", "--export_dir"]),
       below=st.sampled_from(["", "sub", "sub/deeper"]))
def test_an_output_directory_on_a_read_only_filesystem_is_one_line(capsys, tmp_path, read_only,
                                                                   which, below):
  target = os.path.join(str(read_only), below) if below else str(read_only)
  argv = ["--params", MLP, "--model_dir", str(tmp_path / "m"), "--compile_only"]
  if which == "--export_dir":
    argv = ["--params", MLP, "--model_dir", str(tmp_path / "m"), "--mode", "export"]
  argv += [which, target]
  line = one_line(capsys, argv, limit_s=60.0)
  assert target in line and "Read-only file system" in line
