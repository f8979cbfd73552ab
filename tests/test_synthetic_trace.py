"""Tests of the seeded synthetic routing-trace generator (chipsim.tracegen.synthetic).

Every statistic is recomputed here from the generated arrays, independently of what the generator
reports in meta["measured"].
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from chipsim.errors import InputError
from chipsim.trace import format as fmt
from chipsim.trace import predictor_arrays as pa
from chipsim.tracegen.synthetic import SyntheticParams, generate, write
from chipsim.tracegen.synthetic import main as synthetic_main
from chipsim.workload.models import MODELS

REPO = Path(__file__).resolve().parents[1]
G1B = MODELS["granite-3.1-1b-a400m"]
G3B = MODELS["granite-3.1-3b-a800m"]
DSV2 = MODELS["deepseek-v2-lite"]


# ---------------------------------------------------------------------------------------------------
# helpers that recompute statistics from the arrays


def membership(ids: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros(ids.shape[:-1] + (n,), dtype=bool)
    for j in range(ids.shape[-1]):
        col = ids[..., j].astype(np.int64)
        valid = col < n
        idx = np.nonzero(valid)
        out[idx + (col[valid],)] = True
    return out


def reuse_of(arrays: dict, n: int) -> float:
    ids = arrays["routed_ids"]
    k = ids.shape[-1]
    m = membership(ids, n)
    return float((m[1:] & m[:-1]).sum(axis=-1).mean() / k)


def topk_recall(pred_ids: np.ndarray, routed_ids: np.ndarray, n: int) -> float:
    k = routed_ids.shape[-1]
    return float((membership(pred_ids, n) & membership(routed_ids, n)).sum() / (routed_ids[..., 0].size * k))


def as_trace(arrays: dict, meta: dict) -> fmt.Trace:
    return fmt.Trace(arrays=arrays, meta=dict(meta, schema_version=fmt.SCHEMA_VERSION))


def write_unvalidated(path: Path, arrays: dict, meta: dict) -> None:
    """Write an .npz trace without format.save's validation (to build deliberately broken files)."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        payload = dict(arrays, meta=np.array(json.dumps(dict(meta, schema_version=fmt.SCHEMA_VERSION))))
        for key, value in payload.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(value), allow_pickle=False)
            zf.writestr(key + ".npy", buf.getvalue())


# ---------------------------------------------------------------------------------------------------
# fixtures: each generated once per module


@pytest.fixture(scope="module")
def g1b():
    return generate(G1B, SyntheticParams(num_tokens=256, seed=3))


@pytest.fixture(scope="module")
def g3b():
    return generate(G3B, SyntheticParams(num_tokens=512, seed=0))


@pytest.fixture(scope="module")
def dsv2():
    return generate(DSV2, SyntheticParams(num_tokens=128, seed=1))


# ---------------------------------------------------------------------------------------------------
# schema and structure


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_model_gives_a_valid_trace(name):
    model = MODELS[name]
    arrays, meta = generate(model, SyntheticParams(num_tokens=24, seed=5))
    assert set(arrays) == set(fmt.CORE_ARRAYS) | set(pa.BY_NAME)
    fmt.validate(arrays, dict(meta, schema_version=fmt.SCHEMA_VERSION))
    assert arrays["routed_ids"].shape == (24, model.num_moe_layers, model.top_k)
    assert meta["synthetic"] is True
    assert meta["model"]["name"] == name
    assert meta["model"]["hf_architecture"] == model.hf_architecture
    as_trace(arrays, meta).check_matches(model)


def test_meta_marks_the_trace_synthetic_and_agrees_with_arrays(g1b):
    arrays, meta = g1b
    prov = meta["provenance"]
    assert prov["description"].startswith("SYNTHETIC")
    assert prov["generator"] == "chipsim.tracegen.synthetic"
    assert prov["params"]["num_tokens"] == 256 and prov["params"]["seed"] == 3
    assert meta["predictor_metrics"] == {} and meta["quality"] == {}
    assert "SYNTHETIC" in as_trace(arrays, meta).provenance_line()
    # the stored statistics are those of the stored arrays
    assert meta["measured"]["reuse"] == pytest.approx(reuse_of(arrays, G1B.num_experts), abs=1e-5)
    assert meta["measured"]["apex_topk_recall"] == pytest.approx(
        topk_recall(arrays["apex_rank"][..., : G1B.top_k], arrays["routed_ids"], G1B.num_experts), abs=1e-5
    )
    dstar = pa.delta_star(arrays["apex_rank"], arrays["routed_ids"])
    assert meta["measured"]["mean_delta_star"] == pytest.approx(dstar.mean(), abs=1e-5)


def test_router_arrays_are_consistent(g1b, dsv2):
    for (arrays, _), model in ((g1b, G1B), (dsv2, DSV2)):
        k = model.top_k
        ids, w = arrays["routed_ids"], arrays["routed_weights"].astype(np.float64)
        rank, prob = arrays["router_rank"], arrays["router_rank_prob"].astype(np.float64)
        assert (rank[..., :k] == ids).all()  # the routed experts head the router ranking, in weight order
        assert (np.diff(prob, axis=-1) <= 0).all() and (prob > 0).all()
        assert (np.diff(w, axis=-1) <= 0).all() and (w > 0).all()
        # weights proportional to the router probabilities of the routed experts
        np.testing.assert_allclose(w / w.sum(-1, keepdims=True), prob[..., :k] / prob[..., :k].sum(-1, keepdims=True), atol=4e-3)
    w1 = g1b[0]["routed_weights"].astype(np.float64).sum(-1)
    np.testing.assert_allclose(w1, 1.0, atol=1e-2)  # no shared experts: renormalised top-k
    wd = dsv2[0]["routed_weights"].astype(np.float64)
    assert (wd.sum(-1) < 0.999).all()  # shared experts: raw softmax probabilities
    np.testing.assert_allclose(wd, dsv2[0]["router_rank_prob"][..., : DSV2.top_k].astype(np.float64), rtol=1e-3)


def test_predictor_rows_are_distinct_and_undefined_entries_are_no_expert(g1b):
    arrays, _ = g1b
    n, k = G1B.num_experts, G1B.top_k
    for key in ("promoe_rank", "pregate_rank", "floe_rank"):
        r = arrays[key]
        assert r.shape[-1] == min(n, 2 * k)
        assert (r[:, 0] == fmt.NO_EXPERT).all()  # no layer before MoE layer 0
        rest = np.sort(r[:, 1:], axis=-1)
        assert (rest < n).all() and (np.diff(rest.astype(int), axis=-1) > 0).all()
    d_ids, conf = arrays["draft_ids"], arrays["draft_conf"].astype(np.float64)
    n_layers = d_ids.shape[1]
    for d in range(fmt.DRAFT_DEPTH):
        for layer in range(n_layers):
            block = d_ids[:, layer, d]
            if layer - (d + 1) < 0:
                assert (block == fmt.NO_EXPERT).all() and (conf[:, layer, d] == 0).all()
            else:
                s = np.sort(block, axis=-1).astype(int)
                assert (s < n).all() and (np.diff(s, axis=-1) > 0).all()
    assert (conf >= 0).all() and (conf <= 1).all()
    assert (arrays["token_ids"] == np.arange(256) % G1B.vocab_size).all()
    assert (arrays["moe_layers"] == np.arange(G1B.num_layers)).all()


def test_moe_layers_skip_dense_first_layers(dsv2):
    arrays, meta = dsv2
    assert arrays["moe_layers"][0] == 1 and len(arrays["moe_layers"]) == 26
    assert meta["model"]["first_dense_layers"] == 1 and meta["model"]["num_shared_experts"] == 2


# ---------------------------------------------------------------------------------------------------
# files: round trip, determinism, bad files


def test_save_load_round_trip_is_exact(g1b, tmp_path):
    arrays, meta = g1b
    path = tmp_path / "t.npz"
    fmt.save(path, arrays, meta)
    trace = fmt.load(path)
    assert set(trace.arrays) == set(arrays)
    for key, value in arrays.items():
        assert trace[key].dtype == value.dtype and trace[key].shape == value.shape
        assert np.array_equal(trace[key], value), key
    assert trace.meta == dict(meta, schema_version=fmt.SCHEMA_VERSION)
    assert trace.synthetic and trace.num_tokens == 256
    assert path.stat().st_size < fmt.SHIPPED_TRACE_MAX_BYTES


def test_same_seed_gives_identical_bytes_and_other_seed_differs(tmp_path):
    params = SyntheticParams(num_tokens=64, seed=11)
    write(tmp_path / "a.npz", "phi-mini-moe", params)
    write(tmp_path / "b.npz", "phi-mini-moe", params)
    write(tmp_path / "c.npz", "phi-mini-moe", SyntheticParams(num_tokens=64, seed=12))
    a, b, c = ((tmp_path / f"{x}.npz").read_bytes() for x in "abc")
    assert a == b
    assert a != c
    assert not np.array_equal(fmt.load(tmp_path / "a.npz")["routed_ids"], fmt.load(tmp_path / "c.npz")["routed_ids"])


def test_trace_for_another_model_is_rejected(g3b):
    trace = as_trace(*g3b)
    trace.check_matches(G3B)
    with pytest.raises(InputError, match="num_layers"):
        trace.check_matches(G1B)


def test_truncated_file_gives_input_error(g1b, tmp_path):
    path = tmp_path / "t.npz"
    fmt.save(path, *g1b)
    raw = path.read_bytes()
    cut = tmp_path / "cut.npz"
    cut.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(InputError, match="not a readable chipsim trace"):
        fmt.load(cut)


@pytest.mark.parametrize("key", ["routed_ids", "promoe_rank", "draft_ids"])
def test_out_of_range_expert_id_gives_input_error(g1b, tmp_path, key):
    arrays, meta = g1b
    broken = {k: v.copy() for k, v in arrays.items()}
    broken[key].reshape(-1)[-1] = G1B.num_experts  # one past the last expert, and not NO_EXPERT
    path = tmp_path / "bad.npz"
    write_unvalidated(path, broken, meta)
    message = f"{key} holds expert id {G1B.num_experts} out of range"
    if key in fmt.CORE_ARRAYS:  # the core schema: the loader refuses the file
        with pytest.raises(InputError, match=message):
            fmt.load(path)
    else:  # a predictor output: refused once a policy that reads it is prepared (runner.prepare checks this)
        with pytest.raises(InputError, match=message):
            fmt.check_arrays(fmt.load(path), [pa.BY_NAME[key]], "policy reading it")
    with pytest.raises(InputError, match=message):  # the recorder's save checks every output it writes
        fmt.save(tmp_path / "bad2.npz", broken, meta, specs=pa.RECORDED)
    assert not (tmp_path / "bad2.npz").exists()


def test_malformed_model_counts_in_meta_give_input_error(g1b, tmp_path):
    arrays, meta = g1b
    bad = json.loads(json.dumps(meta))
    bad["model"]["num_experts"] = "many"
    path = tmp_path / "bad.npz"
    write_unvalidated(path, arrays, bad)
    with pytest.raises(InputError, match="whole numbers"):
        fmt.load(path)


def test_bad_parameters_are_input_errors():
    for bad in (dict(reuse=1.2), dict(apex_accuracy=0.0), dict(num_tokens=0), dict(draft_accuracy_decay=1.5), dict(seed=-1)):
        with pytest.raises(InputError):
            generate(G1B, SyntheticParams(**bad))
    with pytest.raises(InputError, match="unknown model"):
        generate("granite-9000", SyntheticParams(num_tokens=8))


def test_a_trace_too_large_to_generate_is_refused_before_any_array(tmp_path):
    """OLMoE's 16 MoE layers of 64 experts: 2^28 / 1,024 = 262,144 tokens at most; one more is one line, exit 2,
    and no file (it asked for hundreds of GiB before)."""
    assert (1 << 28) // (16 * 64) == 262_144
    out = tmp_path / "x.npz"
    assert synthetic_main(["--model", "olmoe-1b-7b", "--tokens", "262145", "--out", str(out)]) == 2
    assert not out.exists()
    with pytest.raises(InputError, match="at most 262,144 tokens of olmoe-1b-7b"):
        generate("olmoe-1b-7b", SyntheticParams(num_tokens=262_145))


# ---------------------------------------------------------------------------------------------------
# statistics track their parameters


@pytest.mark.parametrize("target", [0.40, 0.65])
def test_reuse_tracks_target(target):
    arrays, meta = generate(G1B, SyntheticParams(num_tokens=256, seed=7, reuse=target))
    measured = reuse_of(arrays, G1B.num_experts)
    assert abs(measured - target) <= 0.05
    assert measured > G1B.top_k / G1B.num_experts  # above the uniform-random baseline


def test_reuse_is_monotone_in_target():
    low = reuse_of(generate(G1B, SyntheticParams(num_tokens=96, seed=2, reuse=0.3))[0], G1B.num_experts)
    high = reuse_of(generate(G1B, SyntheticParams(num_tokens=96, seed=2, reuse=0.7))[0], G1B.num_experts)
    assert high > low + 0.25


def test_popularity_is_skewed_and_train_counts_follow_it(g1b):
    arrays, _ = g1b
    n, k = G1B.num_experts, G1B.top_k
    counts = arrays["train_expert_counts"]
    assert (counts.sum(axis=1) == 20 * 256 * k).all()  # train_tokens_factor × tokens × k per layer
    share = np.sort(counts, axis=1)[:, ::-1] / counts.sum(axis=1, keepdims=True)
    assert (share[:, 0] > 2.0 * share[:, -1]).all()  # skewed, not uniform
    test_counts = membership(arrays["routed_ids"], n).sum(axis=0)  # (L, N)
    corr = [np.corrcoef(counts[layer], test_counts[layer])[0, 1] for layer in range(counts.shape[0])]
    assert np.median(corr) > 0.7  # the held-out routing follows the training split's popularity


def test_apex_recall_tracks_accuracy():
    recalls = []
    for acc in (0.70, 0.93):
        arrays, _ = generate(G1B, SyntheticParams(num_tokens=192, seed=4, apex_accuracy=acc))
        r = topk_recall(arrays["apex_rank"][..., : G1B.top_k], arrays["routed_ids"], G1B.num_experts)
        assert abs(r - acc) <= 0.04
        recalls.append(r)
    assert recalls[1] > recalls[0] + 0.15


def test_next_layer_predictors_track_accuracy(g1b):
    arrays, _ = g1b
    n, k = G1B.num_experts, G1B.top_k
    for key, target in (("promoe_rank", 0.75), ("pregate_rank", 0.80), ("floe_rank", 0.80)):
        r = topk_recall(arrays[key][:, 1:, :k], arrays["routed_ids"][:, 1:], n)
        assert abs(r - target) <= 0.04, (key, r)
    # an inaccurate predictor is measurably worse
    worse, _ = generate(G1B, SyntheticParams(num_tokens=128, seed=3, promoe_accuracy=0.5))
    assert topk_recall(worse["promoe_rank"][:, 1:, :k], worse["routed_ids"][:, 1:], n) < 0.55


def test_draft_accuracy_decays_with_depth_and_confidence_tracks_correctness(g3b):
    arrays, _ = g3b
    n, k = G3B.num_experts, G3B.top_k
    recalls, confs = [], []
    for d in range(fmt.DRAFT_DEPTH):
        ids = arrays["draft_ids"][:, d + 1 :, d]
        routed = arrays["routed_ids"][:, d + 1 :]
        correct = (membership(ids, n) & membership(routed, n)).sum(-1) / k
        conf = arrays["draft_conf"][:, d + 1 :, d].astype(np.float64)
        recalls.append(correct.mean())
        confs.append(conf.mean())
        assert np.corrcoef(conf.ravel(), correct.ravel())[0, 1] > 0.3
        # token-layers with above-median confidence are right more often
        assert correct[conf > np.median(conf)].mean() > correct[conf <= np.median(conf)].mean() + 0.05
    assert abs(recalls[0] - 0.85) <= 0.04
    assert all(b < a for a, b in zip(recalls, recalls[1:]))
    assert all(b < a for a, b in zip(confs, confs[1:]))
    expected_last = 0.85 * 0.92**7
    assert abs(recalls[-1] - expected_last) <= 0.05
    np.testing.assert_allclose(confs, recalls, atol=0.03)  # confidence is calibrated in the mean


# ---------------------------------------------------------------------------------------------------
# APEX CDF


def test_apex_cdf_is_calibrated_and_delta_hat_grows_with_tau(g3b):
    trace = as_trace(*g3b)
    theta = trace["apex_theta"]
    assert theta.shape == (G3B.num_moe_layers, G3B.num_experts - G3B.top_k + 1)
    assert np.isfinite(theta).all() and (np.diff(theta, axis=1) >= 0).all()
    dstar = pa.delta_star(trace["apex_rank"], trace["routed_ids"])
    means = []
    for tau in (0.6, 0.75, 0.9):
        dhat = pa.delta_hat(trace["apex_score"], trace["apex_theta"], tau)
        coverage = (dstar <= dhat).mean()
        assert coverage >= tau - 0.03, (tau, coverage)
        means.append(dhat.mean())
    assert means[0] < means[1] < means[2]
    # marginal calibration per δ: mean predicted P(δ* ≤ δ) equals the observed share
    score = trace["apex_score"].astype(np.float64)
    for delta in (0, 1, 2, 4, 8):
        predicted = 1.0 / (1.0 + np.exp(-(theta[None, :, delta].astype(np.float64) - score)))
        assert abs(predicted.mean() - (dstar <= delta).mean()) <= 0.02


def test_apex_score_ranks_difficulty_and_delta_star_has_a_long_tail(g3b):
    trace = as_trace(*g3b)
    dstar = pa.delta_star(trace["apex_rank"], trace["routed_ids"])
    score = trace["apex_score"]
    # a higher score means a harder token-layer: larger δ*, so a larger δ̂
    hard = dstar >= 4
    assert score[hard].mean() > score[~hard].mean()
    assert np.corrcoef(score.ravel(), dstar.ravel())[0, 1] > 0.2
    dhat = pa.delta_hat(trace["apex_score"], trace["apex_theta"], 0.9)
    assert np.corrcoef(dhat.ravel(), dstar.ravel())[0, 1] > 0.2
    # most token-layers need few extra experts, a few need many
    assert (dstar <= 4).mean() >= 0.75
    assert np.quantile(dstar, 0.5) <= 2
    assert dstar.max() >= 3 * max(1, np.quantile(dstar, 0.75))


# ---------------------------------------------------------------------------------------------------
# command line


def test_cli_writes_a_trace_and_prints_one_line(tmp_path):
    out = tmp_path / "cli.npz"
    run = subprocess.run(
        [sys.executable, "-m", "chipsim.tracegen.synthetic", "--model", "phi-mini-moe", "--tokens", "32", "--seed", "2", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.strip().splitlines()
    assert len(lines) == 1 and "KiB" in lines[0] and "reuse" in lines[0]
    trace = fmt.load(out)
    assert trace.num_tokens == 32 and trace.meta["provenance"]["params"]["seed"] == 2
    trace.check_matches(MODELS["phi-mini-moe"])
    bad = subprocess.run(
        [sys.executable, "-m", "chipsim.tracegen.synthetic", "--model", "nope", "--tokens", "8", "--out", str(tmp_path / "x.npz")],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert bad.returncode == 2 and "unknown model" in bad.stderr and not (tmp_path / "x.npz").exists()


TINY_QWEN3 = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_hidden_layers": 4,
              "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
              "moe_intermediate_size": 32, "num_experts": 16, "num_experts_per_tok": 4, "vocab_size": 97}


def test_cli_model_config_writes_a_trace_of_that_shape(tmp_path, capsys):
    """--model-config: any config.json's shape, not only a bundled one; the trace's counts are the file's."""
    from chipsim.tracegen.synthetic import main
    from chipsim.workload.hf_config import read_config_file

    cfg = tmp_path / "tiny-qwen3" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps(TINY_QWEN3))
    out = tmp_path / "q.npz"
    assert main(["--model-config", str(cfg), "--tokens", "16", "--out", str(out)]) == 0
    trace = fmt.load(out)
    assert {k: trace.meta["model"][k] for k in fmt.META_MODEL_KEYS} == {
        "num_layers": 4, "first_dense_layers": 0, "num_experts": 16, "top_k": 4, "num_shared_experts": 0}
    assert trace.meta["model"]["name"] == "tiny-qwen3"
    assert trace.meta["model"]["hf_architecture"] == "Qwen3MoeForCausalLM"
    assert trace.arrays["routed_ids"].shape == (16, 4, 4) and trace.arrays["routed_ids"].max() < 16
    trace.check_matches(read_config_file(str(cfg), "config"))
    assert len(capsys.readouterr().out.strip().splitlines()) == 1


def test_cli_model_and_model_config_together_or_a_bad_config_are_refused(tmp_path, capsys):
    from chipsim.tracegen.synthetic import main

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY_QWEN3))
    out = tmp_path / "x.npz"
    with pytest.raises(SystemExit) as exc:
        main(["--model", "qwen3-30b-a3b", "--model-config", str(cfg), "--out", str(out)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1 and "not allowed with" in err
    with pytest.raises(SystemExit) as exc:  # neither
        main(["--out", str(out)])
    assert exc.value.code == 2 and "one of the arguments --model --model-config is required" in capsys.readouterr().err
    cfg.write_text(json.dumps(dict(TINY_QWEN3, num_experts_per_tok=32)))  # top-k above the 16 experts
    assert main(["--model-config", str(cfg), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("chipsim: error: --model-config") and len(err.strip().splitlines()) == 1
    assert "top-k 32 exceeds" in err and not out.exists()


def test_load_returns_the_same_read_only_trace_until_the_file_changes(tmp_path):
    import os

    from chipsim.trace import format as tf
    from chipsim.tracegen.synthetic import SyntheticParams, write

    path = tmp_path / "t.npz"
    write(path, "granite-3.1-1b-a400m", SyntheticParams(num_tokens=8, seed=1))
    a, b = tf.load(path), tf.load(path)
    assert a is b
    assert not a["routed_ids"].flags.writeable
    write(path, "granite-3.1-1b-a400m", SyntheticParams(num_tokens=8, seed=2))
    os.utime(path, ns=(1, 1))  # a new mtime even on a coarse clock
    c = tf.load(path)
    assert c is not a and c.sha256 != a.sha256


def test_every_shipped_trace_stays_below_16_mib():
    """The limit belongs to what this repository carries, not to the format (a user's trace may be longer)."""
    import glob

    shipped = glob.glob(str(Path(__file__).resolve().parent.parent / "traces" / "*.npz"))
    assert len(shipped) == 22  # 9 real, 13 synthetic (traces/README.md lists each)
    for path in shipped:
        assert Path(path).stat().st_size <= fmt.SHIPPED_TRACE_MAX_BYTES, path


@pytest.mark.parametrize("name", ["granite-3.1-1b-a400m", "deepseek-v2-lite"])
def test_chunked_generation_gives_the_same_arrays_and_meta(name, monkeypatch):
    """Every (T, L, N) step works through the tokens in chunks (bounded memory for long traces); with chunks
    of a handful of tokens (calibration subsample, reductions over tokens, the random streams split at odd
    places) the trace must be exactly the one made in a single chunk."""
    from chipsim.tracegen import synthetic

    params = SyntheticParams(num_tokens=300, seed=5)
    monkeypatch.setattr(synthetic, "CHUNK_ELEMENTS", 1 << 40)  # one chunk: every array whole
    whole_arrays, whole_meta = generate(name, params)
    monkeypatch.setattr(synthetic, "CHUNK_ELEMENTS", 7 * MODELS[name].num_moe_layers * 33)  # 7 tokens of the CDF fit
    chunked_arrays, chunked_meta = generate(name, params)
    assert sorted(whole_arrays) == sorted(chunked_arrays)
    for key, array in whole_arrays.items():
        assert array.dtype == chunked_arrays[key].dtype and array.tobytes() == chunked_arrays[key].tobytes(), key
    assert json.dumps(whole_meta, sort_keys=True) == json.dumps(chunked_meta, sort_keys=True)


def test_chunked_cdf_fit_is_the_same_float64_fit(monkeypatch):
    """The APEX CDF fit sums (T, L, C) terms over tokens chunk by chunk; the float64 θ and w must be bit-equal
    to the fit over the whole array (rounded float32 outputs alone would hide a reordered sum)."""
    from chipsim.tracegen import synthetic

    rng = np.random.default_rng(2)
    x = rng.standard_normal((500, 3))
    dstar = np.minimum(rng.geometric(0.4, size=(500, 3)) - 1 + (x > 0.5), 9)
    fits = []
    for chunk in (1 << 40, 13 * 3 * 10):  # one chunk; chunks of 13 tokens
        monkeypatch.setattr(synthetic, "CHUNK_ELEMENTS", chunk)
        fits.append(synthetic._fit_cdf(x, dstar, 10, fit_slope=True))
    (theta_whole, w_whole), (theta_chunked, w_chunked) = fits
    assert np.abs(w_whole).min() > 0.1  # a real slope was fitted
    assert theta_whole.tobytes() == theta_chunked.tobytes() and w_whole.tobytes() == w_chunked.tobytes()


def test_trace_over_its_size_limit_is_refused_and_leaves_nothing(g1b, tmp_path):
    """save streams the zip into a temporary file beside the target; over max_bytes it is removed whole."""
    arrays, meta = g1b
    out = tmp_path / "big.npz"
    fmt.save(out, arrays, meta, specs=pa.RECORDED)
    size = out.stat().st_size
    with pytest.raises(InputError, match=r"big2\.npz: trace would be .* MiB, over the .* MiB asked for"):
        fmt.save(tmp_path / "big2.npz", arrays, meta, specs=pa.RECORDED, max_bytes=size - 1)
    fmt.save(tmp_path / "fits.npz", arrays, meta, specs=pa.RECORDED, max_bytes=size)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.npz", "fits.npz"]
    assert (tmp_path / "fits.npz").read_bytes() == out.read_bytes()
