"""Every fit verdict and throughput of validation/published.yaml whose model a params file can
express compiles through the real path: scripts/run.py's command line, the TensorFlow graph of
the reference model, the compiler (compile only; nothing trains).

bench_fidelity predicts these figures from analytic graphs and never builds the TensorFlow
graph, so Llama-3.1-8B at 131,072 tokens passed there while run.py crashed ("Unable to allocate
64.0 GiB" for a numpy causal mask). Here each figure maps to run.py flags (`figure_flags`).

To keep the suite's budget, figures share a compile when their graphs differ only in what
repeats or what the planner alone reads: depth (one layer is built: each layer's tensors are
the figure's, more layers repeat them), and the execution mode, system and number of systems
(the plan, not the graph). Within a shape the largest batch is compiled: every size that can
overflow grows with it. The compile must succeed, or be the one-line "does not fit" verdict;
any other error or a traceback fails. The verdicts themselves are bench_fidelity's to check
(tests/engine/test_fidelity.py): at one layer they are not the figure's.

Not expressible as a params file here (no reference model): ESM-2, ViT, DiT, U-Net, the
"any model up to 1B" claim; T5 and the WMT Transformer need the en_es data and a learned
vocabulary (13 s of a core once per machine, a minute before), so they are left out too.
"""

import collections
import os

import pytest

from cerebras_tf import cli
from validation import fidelity

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DECODERS = ("gpt", "gptj", "llama")


def figure_flags(fig):
  """(params file, run.py flags) for a figure, or None when no params file expresses it."""
  m = fidelity._shape(fig)  # pylint: disable=protected-access  # the registry's shape + ASSUMED
  family, seq = m.get("family"), m.get("seq_len")
  if family == "bert" and seq:
    base = "configs/params_bert_large_msl128.yaml"
    model = {"max_position_embeddings": max(512, seq)}
  elif family in DECODERS and seq:
    base = "configs/params_gpt_tiny.yaml"
    model = {"max_position_embeddings": seq, "mixed_precision": "true"}
    if m.get("position") == "rotary":
      model.update(position_embedding_type="rotary",
                   rotary_dim=m.get("rotary_dim") or m["hidden"] // m["heads"])
    if family == "gptj":
      model.update(parallel_attention="true", share_embedding_weights="false")
    if family == "llama":
      model.update(norm_type="rmsnorm", encoder_nonlinearity="swiglu",
                   num_kv_groups=m.get("kv_heads") or m["heads"], rope_theta=500000.0,
                   share_embedding_weights="false")
  else:
    return None
  model.update(hidden_size=m["hidden"], num_heads=m["heads"], filter_size=m["ffn"],
               vocab_size=m["vocab"], num_hidden_layers=1)
  batch = fidelity._batch(fig) or 1  # pylint: disable=protected-access
  inputs = {"max_sequence_length": seq, "batch_size": batch}
  if family in DECODERS:
    inputs["synthetic"] = "true"
  flags = [f"model.{k}={v}" for k, v in sorted(model.items())]
  flags += [f"{s}.{k}={v}" for s in ("train_input", "eval_input") for k, v in inputs.items()]
  return base, flags


def _shape_key(base, flags):
  return (base, tuple(f for f in flags if ".batch_size=" not in f))


def compile_groups():
  """{shape: (params file, flags at the largest batch, [figure ids])} over the registry."""
  groups = collections.OrderedDict()
  for fig in fidelity.load():
    if fig["kind"] not in ("throughput", "fit"):
      continue
    mapped = figure_flags(fig)
    if mapped is None:
      continue
    key = _shape_key(*mapped)
    batch = next(int(f.split("=")[1]) for f in mapped[1] if f.startswith("train_input.batch_"))
    have = groups.get(key)
    if have is None or batch > have[2]:
      groups[key] = (mapped[0], mapped[1], batch, (have[3] if have else []) + [fig["id"]])
    else:
      have[3].append(fig["id"])
  return {k: (base, flags, ids) for k, (base, flags, _, ids) in groups.items()}


GROUPS = compile_groups()


def test_the_registry_maps_to_params_files():
  """The figures the issue named are among those compiled, each in exactly one group."""
  ids = [i for _, _, group in GROUPS.values() for i in group]
  assert len(ids) == len(set(ids))
  for must in ("modelzoo-r24-llama3p1-8b-msl128k-fits", "seed004-gptj-6b-weight-streaming-single-cs2",
               "seed003-bert-large-fits-on-wafer", "genslm-25b-seq10240-single-cs2"):
    assert must in ids, must
  assert len(ids) >= 60 and len(GROUPS) <= 16, (len(ids), len(GROUPS))


@pytest.mark.slow
@pytest.mark.parametrize("key", list(GROUPS), ids=[g[2][0] for g in GROUPS.values()])
def test_figure_compiles_through_run_py(key, tmp_path, capsys, monkeypatch):
  base, flags, ids = GROUPS[key]
  monkeypatch.chdir(ROOT)
  monkeypatch.delenv("TF_CONFIG", raising=False)
  argv = ["run.py", "--params", base, "--compile_only", "--execution_strategy",
          "weight_streaming", "--model_dir", str(tmp_path / "m")]
  for flag in flags:
    argv += ["--params_override", flag]
  code = cli.main(argv)
  out, err = capsys.readouterr()
  assert "Traceback" not in err
  if code == 2:  # a verdict is an answer; anything else is a failure of the real path
    assert err.startswith("error: model does not fit") and err.count("\n") == 1, (ids, err)
  else:
    assert code == 0 and "compiled for cs2 (weight_streaming)" in out, (ids, err[-2000:])
