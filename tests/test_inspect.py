"""`chipsim inspect` and chipsim.trace.stats: every statistic checked by hand on hand-made traces, then the
CLI's text and JSON output and its one-line error on a bad file."""

import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import ROOT
from helpers import hand_trace_arrays, random_routing, write_hand_trace

from chipsim.cli import main
from chipsim.trace import format as tf
from chipsim.trace import predictor_arrays as pa
from chipsim.trace import stats
from chipsim.workload.models import ModelShape

NO = tf.NO_EXPERT


def shape(n=8, k=2, layers=2, name="tiny-inspect-test"):
    return ModelShape(
        name=name, hf_architecture="GraniteMoeForCausalLM",
        num_layers=layers, hidden_size=64, num_experts=n, top_k=k, expert_ffn=32, vocab_size=100,
        tie_embeddings=True, attention="gqa", num_heads=2, num_kv_heads=1, head_dim=32,
    )


def trace_of(model, routed, edit=None, **kw) -> tf.Trace:
    arrays, meta = hand_trace_arrays(model, np.asarray(routed, dtype=np.uint8), **kw)
    if edit:
        edit(arrays)
    tf.validate(arrays, meta)
    return tf.Trace(arrays=arrays, meta=meta, path="hand.npz")


# ----------------------------------------------------------------------------------------------------
# reuse


def test_reuse_is_one_when_every_token_repeats_the_same_routing():
    model = shape()
    routed = np.tile(np.array([[[0, 1], [5, 2]]]), (6, 1, 1))
    r = stats.reuse(routed, model.num_experts)
    assert r["per_layer"] == [1.0, 1.0] and r["mean"] == 1.0
    assert r["random_baseline"] == 2 / 8


def test_reuse_hand_case_and_its_baselines():
    routed = np.array([
        [[0, 1], [0, 1]],
        [[1, 2], [0, 1]],
        [[2, 3], [2, 3]],
        [[0, 1], [2, 3]],
    ])
    r = stats.reuse(routed, 8)
    # layer 0: overlaps 1, 1, 0 of k=2 -> 1/3; layer 1: 2, 0, 2 -> 2/3; pooled 1/2
    assert r["per_layer"] == [round(1 / 3, 6), round(2 / 3, 6)]
    assert r["mean"] == 0.5
    # popularity alone, layer 0: inclusion shares .5, .75, .5, .25 -> Σπ²/k = 1.125/2
    assert r["popularity_baseline_per_layer"][0] == 0.5625
    assert stats.reuse(routed[:1], 8)["mean"] is None  # one token: no pair


# ----------------------------------------------------------------------------------------------------
# popularity


def test_gini_zero_for_uniform_and_hand_values_for_skewed():
    uniform = np.array([[[0, 1]], [[2, 3]], [[4, 5]], [[6, 7]]])
    counts = stats.expert_counts(uniform, 8)
    assert counts.tolist() == [[1] * 8]
    pop = stats.popularity(counts)
    assert pop["gini_per_layer"] == [0.0] and pop["zipf_per_layer"] == [0.0]
    # counts 3, 2, 2, 1, 0, 0, 0, 0: Σ_i Σ_j |x_i - x_j| = 76, 2 n² mean = 128
    skewed = np.array([[[0, 1]], [[0, 2]], [[0, 3]], [[1, 2]]])
    counts = stats.expert_counts(skewed, 8)
    assert counts.tolist() == [[3, 2, 2, 1, 0, 0, 0, 0]]
    assert stats.popularity(counts)["gini_per_layer"] == [76 / 128]
    assert math.isclose(stats.gini([0, 0, 0, 5]), 0.75)  # one expert takes all: (n-1)/n
    assert stats.gini([0, 0]) is None


def test_zipf_exponent_recovers_an_exact_power_law():
    rng = np.random.default_rng(0)
    for s in (0.45, 0.8, 1.3):
        freqs = np.arange(1, 41, dtype=float) ** -s
        assert math.isclose(stats.zipf_exponent(rng.permutation(freqs)), s, rel_tol=1e-12)
    # experts that never occur are left out of the fit: 1, 1/4, 1/9 is r^-2
    assert math.isclose(stats.zipf_exponent([0, 1 / 9, 0, 1, 0.25]), 2.0, rel_tol=1e-12)
    assert stats.zipf_exponent([0, 3, 0]) is None


def test_zipf_on_a_trace_whose_counts_follow_a_power_law():
    # top-1 of 8: expert r-1 routed 840/r times (exact integers: Zipf 1); then 3600/r² for r ≤ 6 (Zipf 2,
    # with experts 6 and 7 never routed and so left out of the fit)
    model = shape(n=8, k=1, layers=1)
    for s, counts in ((1.0, [840 // r for r in range(1, 9)]), (2.0, [3600 // r ** 2 for r in range(1, 7)])):
        routed = np.repeat(np.arange(len(counts)), counts)[:, None, None]
        pop = stats.trace_stats(trace_of(model, routed))["popularity"]
        assert math.isclose(pop["zipf_per_layer"][0], s, abs_tol=1e-6)
        assert math.isclose(pop["zipf_overall"], s, abs_tol=1e-6)


# ----------------------------------------------------------------------------------------------------
# predictability, δ*, APEX CDF


ROUTED = [
    [[0, 1], [2, 3]],
    [[4, 5], [4, 6]],
]


def _predictions(arrays):
    arrays["pregate_rank"][0, 1] = [2, 7, 0, 1]  # 1 of {2, 3}
    arrays["pregate_rank"][1, 1] = [6, 4, 0, 1]  # 2 of {4, 6}
    arrays["draft_ids"][0, 1, 0] = [3, NO]  # 1 of {2, 3}; the NO_EXPERT slot is a miss
    arrays["apex_rank"][0, 0] = [0, 2, 3, 1, 4, 5, 6, 7]  # top-2 {0, 2}: 1 hit; expert 1 at position 3: δ* 2
    arrays["apex_rank"][1, 1] = [4, 0, 1, 2, 3, 5, 6, 7]  # top-2 {4, 0}: 1 hit; expert 6 at position 6: δ* 5


def test_predictor_recall_by_hand():
    model = shape()
    out = stats.trace_stats(trace_of(model, ROUTED, edit=_predictions))
    pr = out["predictability"]
    assert pr["apex"] == {"recall_per_layer": [0.75, 0.75], "recall": 0.75, "overlap": 0.5}
    assert pr["pregate"] == {"recall_per_layer": [None, 0.75], "recall": 0.75, "overlap": 0.5}
    assert pr["promoe"] == {"recall_per_layer": [None, None], "recall": None, "overlap": None}
    assert pr["draft"][0] == {"depth": 1, "recall_per_layer": [None, 0.5], "recall": 0.5, "overlap": 0.0}
    assert pr["draft"][1]["recall"] is None and len(pr["draft"]) == tf.DRAFT_DEPTH
    # previous layer's experts: {0,1} vs {2,3} -> 0, {4,5} vs {4,6} -> 1
    assert pr["previous_layer"] == {"recall_per_layer": [None, 0.25], "recall": 0.25, "overlap": 0.0}
    assert pr["random_baseline"] == 0.25


def test_delta_star_and_apex_coverage_by_hand():
    out = stats.trace_stats(trace_of(shape(), ROUTED, edit=_predictions))
    ds = out["delta_star"]  # δ* = [[2, 0], [0, 5]]
    assert (ds["mean"], ds["median"], ds["p90"], ds["p99"], ds["max"]) == (1.75, 0, 5, 5, 5)
    assert ds["shares"] == {"0": 0.5, "1": 0.0, "2": 0.25, "3-4": 0.0, "5-7": 0.25, "8+": 0.0}
    assert ds["mean_per_layer"] == [1.0, 2.5]
    # θ_δ = 0, 5/6, …, 5 and score 0: δ̂ = 1, 2, 3, 5 at τ = .6, .75, .9, .97
    got = [(a["tau"], a["mean_delta_hat"], a["coverage"]) for a in out["apex_cdf"]]
    assert got == [(0.6, 1.0, 0.5), (0.75, 2.0, 0.75), (0.9, 3.0, 0.75), (0.97, 5.0, 1.0)]


def test_delta_star_histogram_bins_by_hand():
    model = shape(n=12, k=1, layers=1)
    positions = [0, 1, 2, 4, 8, 11]  # where expert 0 sits in the APEX ranking: δ* = position
    rank = np.array([[[*range(1, p + 1), 0, *range(p + 1, 12)]] for p in positions], dtype=np.uint8)
    ds = stats.delta_star_summary(pa.delta_star(rank, trace_of(model, np.zeros((6, 1, 1)), apex_rank=rank)["routed_ids"]))
    assert ds["shares"] == {"0": round(1 / 6, 6), "1": round(1 / 6, 6), "2": round(1 / 6, 6), "3-4": round(1 / 6, 6),
                            "5-7": 0.0, "8+": round(2 / 6, 6)}
    assert (ds["mean"], ds["median"], ds["p90"], ds["max"]) == (round(26 / 6, 6), 2, 11, 11)


# ----------------------------------------------------------------------------------------------------
# the command


def test_cli_prints_provenance_and_tables_and_json_round_trips(tmp_path, capsys):
    model = shape(layers=3)
    path = write_hand_trace(tmp_path / "h.npz", model, random_routing(model, 40, seed=1))
    assert main(["inspect", path]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("SYNTHETIC trace h.npz (40 tokens, 3 MoE layers")
    assert "Per MoE layer" in out and "Summary:" in out and "δ* (oracle)" in out and "APEX CDF" in out
    assert sum(1 for line in lines if line[:5].strip() in {"0", "1", "2"}) == 3  # one row per MoE layer
    assert main(["inspect", path, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc == json.loads(json.dumps(stats.trace_stats(tf.load(path))))
    assert doc["trace"]["tokens"] == 40 and doc["trace"]["synthetic"] is True


def test_real_trace_provenance_and_speed(capsys):
    path = os.path.join(ROOT, "traces", "real-granite-3b.npz")
    if not os.path.exists(path):
        pytest.skip("real trace not present")
    trace = tf.load(path)
    t0 = time.perf_counter()
    stats.trace_stats(trace)
    assert time.perf_counter() - t0 < 2.0  # 2,560 tokens × 32 layers
    assert main(["inspect", path]) == 0
    out = capsys.readouterr().out
    for fragment in ("architecture: GraniteMoeForCausalLM", "parameters:", "training:", "held-out", "text:",
                     "command: python -m chipsim.trace.train"):  # as recorded then (now chipsim.tracegen)
        assert fragment in out, fragment
    assert "SYNTHETIC" not in out


@pytest.mark.parametrize("content", [None, b"not a trace at all\n", "truncated"])
def test_bad_file_gives_one_line_and_exit_2(tmp_path, capsys, content):
    path = tmp_path / "bad.npz"
    if content == "truncated":
        model = shape()
        good = write_hand_trace(tmp_path / "good.npz", model, random_routing(model, 20))
        path.write_bytes(open(good, "rb").read()[:300])
    elif content is not None:
        path.write_bytes(content)
    assert main(["inspect", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("chipsim: error: trace ")


def test_bad_file_exit_status_from_the_shell(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "chipsim.cli", "inspect", str(tmp_path / "missing.npz")],
                          capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and "file not found" in proc.stderr
