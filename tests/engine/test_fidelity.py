"""The honest error table (validation/published.yaml vs the simulator) stays within its bands.

The bands are the measured errors of the VALIDATION set (figures never used to fit a constant;
the split is the registry's, written before fitting), each with a little headroom, so a change
that makes the simulator worse on figures it was not fitted to fails here. Calibration figures
are not asserted one by one: a constant fitted to them reproduces them by construction.
Pure Python, about a second.
"""

import math

import pytest

from validation import fidelity

# Measured at this commit (benchmarks/bench_fidelity.py; BENCHMARKS.md), rounded up. Before
# issue 16's model changes (validation/baseline_09edcf7.csv): median 23.6%, mean 131.5%,
# worst 9.80x; ratios worst 15.8%; 8 of 12 verdicts.
# Session 30 (weight streaming's fixed cost fitted on the batch sweeps, no token floor, R1.x's
# own efficiency) moved them from median 16.6% / mean 20.8% / worst 2.00x / ratios 52.9%.
# Session 31 (R1.8 and R1.9 stepped between R1.7.1's and R2.0's efficiencies) from 12.9% /
# 21.3% / 1.80x / 45.3%: the mean band is now issue 16's goal itself, 20%.
VALIDATION_WAFER_MEDIAN_ABS = 0.12      # measured 10.9% (26 figures)
VALIDATION_WAFER_MEAN_ABS = 0.20        # measured 19.1%
VALIDATION_WAFER_MAX_FACTOR = 1.80      # measured 1.78x: DiT-2B on CS-2 (+78%)
UNSEEN_WAFER_MEAN_ABS = 0.20            # measured 19.1% (21 figures no choice was made seeing)
RATIO_MAX_ABS = 0.40                    # measured 38.4% (ESM-2, CS-3 over CS-2)
# Verdicts the simulator gets wrong, each named; the list may only shrink.
KNOWN_DISAGREEMENTS = set()


@pytest.fixture(scope="module")
def rows():
  return fidelity.evaluate()


def test_registry_is_split_and_complete(rows):
  assert len(rows) >= 40
  assert {r.set for r in rows} == {"calibration", "validation"}
  assert sum(1 for r in rows if r.set == "validation" and r.kind == "throughput") >= 20


def test_every_throughput_is_predicted(rows):
  for r in rows:
    if r.kind == "throughput":
      assert r.predicted is not None and math.isfinite(r.error), r.id


def test_validation_errors_stay_in_their_bands(rows):
  s = fidelity.summary(rows)["validation"]
  assert s["throughput_wafer"]["median_abs"] <= VALIDATION_WAFER_MEDIAN_ABS
  assert s["throughput_wafer"]["mean_abs"] <= VALIDATION_WAFER_MEAN_ABS
  assert s["throughput_wafer"]["max_factor"] <= VALIDATION_WAFER_MAX_FACTOR
  assert s["ratio"]["max_abs"] <= RATIO_MAX_ABS
  assert s["throughput_wafer_unseen"]["n"] == s["throughput_wafer"]["n"] - 5
  assert s["throughput_wafer_unseen"]["mean_abs"] <= UNSEEN_WAFER_MEAN_ABS


def test_choices_seen_name_validation_figures():
  # A typo in fidelity.CHOICES_SEEN would silently keep a seen figure in the untouched subset.
  figs = {f["id"]: f for f in fidelity.load()}
  for fid, why in fidelity.CHOICES_SEEN.items():
    assert fid in figs and figs[fid]["set"] == "validation", fid
    assert why


def test_release_over_release_speedup_is_options_and_release_efficiency(rows):
  # Cerebras's R2.0 blog: "boosting performance by 50% on large GPT models" over R1.9, from
  # "dynamic memory offload". Here a release differs by R1.x's execution options (no
  # automatic micro-batching: the whole per-system batch at once, activations recomputed or
  # held off the wafer) and by its weight-streaming efficiency. R1.7.1's (0.1787, GPT-J TF on
  # 2 CS-2) and R2.0's (0.412) are fitted; R1.9, two of the three releases between them, takes
  # 0.1787 x (0.412 / 0.1787)^(2/3) = 0.1787 x 1.745 = 0.312 by hand, R1.8 0.1787 x 1.321 =
  # 0.236. GPT-J is compute-bound (over 90% of its step), so R2.0 over R1.9 comes out near
  # 0.412 / 0.312 = 1.32, a little under the published 1.5: the vendor calls R2.0 the largest
  # of its release steps, and equal steps cannot show that.
  e = fidelity.engine("cs2")
  assert e.weight_streaming_efficiency_r1 == pytest.approx(0.1787)
  assert e.weight_streaming_efficiency == pytest.approx(0.412)
  assert fidelity.release_efficiency(e, "R1.9.2") == pytest.approx(0.312, rel=2e-3)
  assert fidelity.release_efficiency(e, "R1.8.0") == pytest.approx(0.236, rel=2e-3)
  assert fidelity.release_efficiency(e, "R1.7.1") == pytest.approx(0.1787)
  assert fidelity.release_efficiency(e, "R1.5") == pytest.approx(0.1787)
  assert fidelity.release_efficiency(e, "R2.4.0") == pytest.approx(0.412)
  (r,) = [r for r in rows if r.kind == "release_ratio"]
  assert r.set == "validation" and 1.25 <= r.predicted <= 1.35, (r.predicted, r.detail)
  fig = {f["id"]: f for f in fidelity.load()}[r.id]
  r1 = fidelity._release_options(dict(fig, release="R1.9"))
  r2 = fidelity._release_options(dict(fig, release="R2.0"))
  assert r1["micro_batching"] is False and r2["micro_batching"] is True


def test_fit_verdicts_agree(rows):
  wrong = {r.id for r in rows if r.kind == "fit" and r.agree is False}
  assert wrong <= KNOWN_DISAGREEMENTS, sorted(wrong - KNOWN_DISAGREEMENTS)


def test_bench_prints_the_table(capsys):
  import importlib.util  # pylint: disable=import-outside-toplevel
  import os  # pylint: disable=import-outside-toplevel
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  spec = importlib.util.spec_from_file_location(
      "bench_fidelity", os.path.join(root, "benchmarks", "bench_fidelity.py"))
  import sys  # pylint: disable=import-outside-toplevel
  sys.path.insert(0, os.path.join(root, "benchmarks"))
  try:
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main([]) == 0
  finally:
    sys.path.pop(0)
  out = capsys.readouterr().out
  assert "Error by set" in out and "alcf-esm2-35m-pt-r230-cs2-ws" in out


def test_report_bands_are_the_current_validation_errors(rows):
  # report.txt quotes engine/specs/fidelity_bands.yaml; it must be today's validation errors
  # (refresh with `python benchmarks/bench_fidelity.py --write-bands`).
  from cerebras_tf.engine import report  # pylint: disable=import-outside-toplevel
  stored = report.load_bands()
  fresh = fidelity.bands(rows)
  assert [b["class"] for b in stored] == [b["class"] for b in fresh]
  for a, b in zip(stored, fresh):
    assert a["figures"] == b["figures"] and a["families"] == b["families"]
    for k in ("lowest", "highest", "median_abs"):
      assert a[k] == pytest.approx(b[k], abs=1e-3), (a["class"], k)


def test_attention_probabilities_are_held_one_key_block_at_a_time():
  """Weight streaming refused modelzoo's Llama-3.1-8B at 131,072 tokens in micro-batches of
  one (a shipped config): every head's probabilities, 32 x 131,072^2 x 2 bytes = 1.1 TB, were
  one layer's working set. Held one key block at a time (perf.ATTENTION_KEY_BLOCK = 512), the
  same layer needs 32 x 131,072 x 512 x 2 = 4.3 GB, and the config fits a CS-3."""
  from cerebras_tf.engine import perf  # pylint: disable=import-outside-toplevel
  fig = {f["id"]: f for f in fidelity.load()}["modelzoo-r24-llama3p1-8b-msl128k-fits"]
  g = fidelity.graph_for(fidelity._shape(fig), 4)  # pylint: disable=protected-access
  core = max(g.layers, key=lambda l: l.work_bytes)
  assert core.work_bytes == pytest.approx(32 * 131072 ** 2 * 2)
  assert perf.layer_work_bytes(core, 2, g.seq_len) == pytest.approx(32 * 131072 * 512 * 2)
  assert perf.layer_work_bytes(core, 2, 512) == core.work_bytes  # short: the whole matrix
  ok, why = fidelity.predict_fit(fig)
  assert ok, why


def test_the_loss_layer_holds_one_token_block_of_logits():
  """modelzoo R2.4's Llama-3.1-8B at 8,192 tokens runs micro-batches of 20; the LM head's
  logits, 8,192 x 128,256 x 2 B = 2.1 GB a sample, were its working set (20 x 2.1 GB > the
  43.9 GB wafer). The loss (folded into the head, so the logits are the head's transient
  work, handed to no other layer) reduces them token block by token block: 512 / 8,192 of
  them, 131 MB, beside its 67 MB input; an FFN is now the largest."""
  from cerebras_tf.engine import perf  # pylint: disable=import-outside-toplevel
  fig = {f["id"]: f for f in fidelity.load()}["modelzoo-r24-llama3p1-8b-msl8k-microbatch20-fits"]
  g = fidelity.graph_for(fidelity._shape(fig), 960)  # pylint: disable=protected-access
  head = g.layers[-1]
  assert head.activation_bytes == 0 and head.work_bytes == pytest.approx(8192 * 128256 * 2)
  assert perf.layer_work_bytes(head, 2, 8192) == pytest.approx(512 * 128256 * 2)
  act = perf.ws_activations(g)
  # The largest is SwiGLU's up projection: the gate's 8,192 x 14,336 x 2 B in, as much out.
  assert act.working == pytest.approx(2 * 8192 * 14336 * 2)
  ok, why = fidelity.predict_fit(fig)
  assert ok, why


def test_report_sweeps_are_the_current_ones(rows):
  # report.txt's "batch effect" line quotes engine/specs/fidelity_bands.yaml's sweeps; they must
  # be today's (refresh with `python benchmarks/bench_fidelity.py --write-bands`).
  from cerebras_tf.engine import report  # pylint: disable=import-outside-toplevel
  stored, fresh = report.load_sweeps(), fidelity.batch_sweeps(rows)
  assert [(w["model"], w["system"], w["batches"], w["runs"]) for w in stored] == \
      [(w["model"], w["system"], w["batches"], w["runs"]) for w in fresh]
  for a, b in zip(stored, fresh):
    for k in ("published_gain", "predicted_gain"):
      assert a[k] == pytest.approx(b[k], abs=1e-3), (a["model"], k)


def test_a_sweep_is_steady_runs_of_one_configuration_at_two_or_more_batches():
  # Hand-built rows: two batches of one configuration (the 512 one has two runs, median 2,900),
  # one unsteady run left out, and a configuration seen at a single batch (no sweep).
  def fig(i, batch, value, release="R2.1.1"):
    return dict(id=i, kind="throughput", unit="samples_per_sec", system="cs2",
                mode="weight_streaming", framework="pytorch", release=release, num_systems=1,
                batch_size=batch, value=value, model=dict(name="BERT-Large"))
  figs = [fig("a", 512, 2800.0), fig("b", 512, 3000.0), fig("c", 2048, 6700.0),
          fig("d", 2048, 9000.0), fig("e", 1024, 4000.0, release="R2.0.3")]
  rows = [fidelity.Row(f["id"], "throughput", "calibration", "cs2", "weight_streaming",
                       "bert", f["value"], predicted=3300.0,
                       host_bound="UNSTEADY" if f["id"] == "d" else "") for f in figs]
  (w,) = fidelity.batch_sweeps(rows, figs)
  assert w["batches"] == [512, 2048] and w["runs"] == [2, 1]
  assert w["published"] == [2900.0, 6700.0]
  assert w["published_gain"] == pytest.approx(6700.0 / 2900.0, abs=1e-4)
  assert w["predicted_gain"] == pytest.approx(1.0)
