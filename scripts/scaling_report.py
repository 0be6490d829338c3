#!/usr/bin/env python
"""Weight-streaming scaling report for a params YAML, without TensorFlow.

  python scripts/scaling_report.py --params configs/params_gpt3_xl.yaml --systems 1,2,4,8,16 \
      [--engine cs2] [--batch 512] [--sparsity 0.9] [--out DIR]
  python scripts/scaling_report.py --params path/to/config.json --batch 1024 [--seq 2048] ...

A Hugging Face config.json (llama, mistral, qwen2, gemma, gpt2, gptj, gpt_neox, bert, roberta,
t5) is read as its model (cerebras_tf/analysis/hf_config.py); it names no batch (--batch is
needed) and the sequence length defaults to the model's context (--seq sets it).

The graph is NOT traced from the model code: it is built by cerebras_tf/analysis/analytic.py
from the params' `model` section (hidden_size, num_hidden_layers, num_heads, filter_size;
max_sequence_length (or max_source_length), vocab_size and batch_size from `model` or else
`train_input`; and the shape keys analytic.graph_from_params reads: num_kv_heads, head_dim,
ffn_type / nonlinearity, norm_type, position_embedding_type, rotary_dim,
share_embedding_weights, parallel_attention, use_bias): `model.name: gpt...` / `llama...`
gives a decoder-only LM, `bert...` an encoder with MLM/NSP heads (`esm...` MLM only),
`transformer...` / `t5...` an encoder-decoder. So it runs in a second and needs no TensorFlow. The global batch stays fixed and is split across systems
(see cerebras_tf/analysis/scaling.py). Writes scaling.txt, scaling.json, scaling.png and a
TensorBoard event file (tensorboard/) to --out (default: the current directory) and prints the
table. Errors: one line, exit 2.
"""

import argparse
import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import yaml  # noqa: E402

from cerebras_tf.analysis import analytic, hf_config  # noqa: E402
from cerebras_tf.core import plans  # noqa: E402
from cerebras_tf.analysis import scaling  # noqa: E402
from cerebras_tf.engine import spec  # noqa: E402
from cerebras_tf.errors import CerebrasTFError  # noqa: E402


def graph_for(params, batch=None, name=None):
  """The analytic LayerGraph of a params dict (the repo's YAML layout: the sequence length, and
  for the Transformer the vocabulary, live in train_input)."""
  if not isinstance(params, dict) or not isinstance(params.get("model"), dict):
    raise CerebrasTFError("params: missing 'model' section")
  model = dict(params["model"])
  train = params.get("train_input") if isinstance(params.get("train_input"), dict) else {}
  for key, alts in (("max_sequence_length", ("max_sequence_length", "max_source_length")),
                    ("vocab_size", ("vocab_size",))):  # the Transformer keeps both in the input
    found = next((train[a] for a in alts if a in train), None)
    if key not in model and found is not None:
      model[key] = found
  if model.get("max_sequence_length") is None and str(model.get("name", "")).lower().startswith(
      ("gpt", "llama")):  # GPT's own rule: the data's length, else the position table's
    model["max_sequence_length"] = model.get("max_position_embeddings")
  graph = analytic.graph_from_params(dict(params, model=model), batch=batch)  # checks the keys
  return dataclasses.replace(graph, name=name) if name else graph


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--params", required=True, help="params YAML with a `model` section")
  ap.add_argument("--systems", default="1,2,4,8,16", help="comma-separated system counts")
  ap.add_argument("--engine", default="cs2")
  ap.add_argument("--batch", type=int, default=None, help="global batch (default: the params')")
  ap.add_argument("--seq", type=int, default=None,
                  help="sequence length for a Hugging Face config (default: its context)")
  ap.add_argument("--sparsity", type=float, default=0.0)
  ap.add_argument("--out", default=".")
  a = ap.parse_args(argv)
  try:
    try:
      systems = tuple(int(x) for x in a.systems.split(",") if x.strip())
    except ValueError:
      raise CerebrasTFError(f"--systems must be comma-separated integers, got {a.systems!r}")
    if not systems or min(systems) < 1:
      raise CerebrasTFError(f"--systems must be positive, got {a.systems!r}")
    try:
      with open(a.params) as fh:
        params = yaml.safe_load(fh)
    except (OSError, yaml.YAMLError) as e:
      raise CerebrasTFError(f"{a.params}: {str(e).splitlines()[0]}") from None
    if hf_config.is_hf_config(params):
      if not a.batch:
        raise CerebrasTFError(f"{a.params} is a Hugging Face config, which names no batch: "
                              f"give the global batch with --batch N")
      params = hf_config.params_from_hf_config(params, seq=a.seq, batch=a.batch)
      print(f"scaling_report: {a.params} read as a Hugging Face config: "
            f"{params['model']['name']}, sequence {params['model']['max_sequence_length']:,}"
            f"{'' if a.seq else ' (its context; --seq sets it)'}, batch {a.batch:,}",
            file=sys.stderr)
    elif a.seq:
      raise CerebrasTFError("--seq is for a Hugging Face config; a params YAML sets "
                            "train_input.max_sequence_length")
    stem = os.path.splitext(os.path.basename(a.params))[0]
    graph = graph_for(params, a.batch, stem[len("params_"):] if stem.startswith("params_") else stem)
    engine = spec.load_engine(a.engine)
    opts = plans.PlanOptions(batch_size=a.batch or graph.captured_batch_size,
                            execution_strategy=plans.WEIGHT_STREAMING, sparsity=a.sparsity)
    paths = scaling.write_scaling_report(a.out, graph, engine, opts, sorted(systems))
  except CerebrasTFError as e:
    print(f"scaling_report: {e}", file=sys.stderr)
    return 2
  print(open(paths["txt"]).read(), end="")
  print(f"wrote {', '.join(paths.values())}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
