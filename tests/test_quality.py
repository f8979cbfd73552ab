"""Quality cost of the approximate modes (chipsim.tracegen.quality) on tiny random-init models (CPU, fast), and
how `chipsim run` and `chipsim inspect` report the measured records of the bundled real traces.

Random-init models are for tests only, never results.
"""

import json
import math
import os

import numpy as np
import pytest
from conftest import ROOT, THOR

from chipsim.cli import main
from chipsim.policies.base import quality_fields, quality_record

TRACES = os.path.join(ROOT, "traces")
DEEPSEEK_CFG = os.path.join(ROOT, "hwconfigs", "thor-deepseek-v2-lite.yaml")
GRANITE1B_CFG = os.path.join(ROOT, "hwconfigs", "thor-granite-1b.yaml")
SHORT = ["--set", "workload.max_tokens=6", "--jobs", "1"]


def _meta(name: str) -> dict:
    with open(os.path.join(TRACES, f"{name}.json")) as f:
        return json.load(f)


# ----------------------------------------------------------------------------------------------------
# tiny models (torch)

V, D, NL = 97, 32, 3
COMMON = dict(vocab_size=V, hidden_size=D, num_hidden_layers=NL, num_attention_heads=4, max_position_embeddings=64,
              experts_implementation="eager")
TINY = {
    "GraniteMoeForCausalLM": ("GraniteMoeConfig", dict(num_key_value_heads=2, intermediate_size=16, num_local_experts=8,
                                                      num_experts_per_tok=2)),
    "DeepseekV2ForCausalLM": ("DeepseekV2Config", dict(num_key_value_heads=4, intermediate_size=48, moe_intermediate_size=16,
                                                       first_k_dense_replace=1, n_routed_experts=8, n_shared_experts=2,
                                                       num_experts_per_tok=3, kv_lora_rank=16, q_lora_rank=None,
                                                       qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
                                                       topk_method="greedy", n_group=1, topk_group=1)),
}
ARCHS = list(TINY)
SEQ = 32


def _silent(*_args, **_kw):
    pass


@pytest.fixture(scope="module")
def tiny():
    """arch -> (model, held-out windows, training Recording, held-out Recording, trace arrays), built once."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from chipsim.tracegen.predictors import build_trace_arrays
    from chipsim.tracegen.recorder import find_routers, record

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread is fastest, and immune to a busy machine's oversubscription
    out = {}
    for arch, (cfg_name, kwargs) in TINY.items():
        cfg = getattr(transformers, cfg_name)(**COMMON, **kwargs)
        torch.manual_seed(0)
        model = getattr(transformers, arch)(cfg).eval()
        g = torch.Generator().manual_seed(1)
        train_seqs = torch.randint(0, V, (8, SEQ), generator=g)
        held = torch.randint(0, V, (4, SEQ), generator=g)
        rec_tr = record(model, train_seqs, batch_size=8, hidden=True)
        rec_te = record(model, held, batch_size=8, hidden=True)
        router_w = {i: r.weight.detach().float() for i, (_, r) in find_routers(model).items()}
        arrays, _ = build_trace_arrays(rec_tr, rec_te, router_w, steps=20, cdf_steps=20, log=_silent)
        out[arch] = (model, held, rec_tr, rec_te, arrays)
    yield out
    torch.set_num_threads(threads)


class CountingBaseline:
    """The identity mode, counting the MoE blocks it saw."""

    def __init__(self):
        self.calls = 0

    def modify(self, li, rows, idx, w, hidden):
        self.calls += 1
        return idx, w, None


@pytest.mark.parametrize("arch", ARCHS)
def test_identity_hooks_give_exactly_the_baseline_nll(tiny, arch):
    from chipsim.tracegen.quality import RoutingOverride, heldout_nll

    model, held, _, _, arrays = tiny[arch]
    base, count = heldout_nll(model, held, batch=2, amp=False)
    assert count == held.shape[0] * (SEQ - 1)
    mode = CountingBaseline()
    with RoutingOverride(model, mode) as ov:
        same, _ = heldout_nll(model, held, batch=2, amp=False, override=ov)
        n_moe = len(ov.moe)
    assert same == base  # bit for bit
    assert mode.calls == 2 * n_moe  # two batches, every MoE block hooked
    again, _ = heldout_nll(model, held, batch=2, amp=False)  # hooks gone after the block
    assert again == base and mode.calls == 2 * n_moe


@pytest.mark.parametrize("arch", ARCHS)
def test_apex_sf_with_every_expert_prefetched_substitutes_nothing(tiny, arch):
    from chipsim.tracegen.predictors import delta_hat
    from chipsim.tracegen.quality import ApexStallFree, RoutingOverride, heldout_nll

    model, held, _, _, arrays = tiny[arch]
    n, k = arrays["router_rank"].shape[-1], arrays["routed_ids"].shape[-1]
    theta = arrays["apex_theta"].astype(np.float64)
    score = arrays["apex_score"].astype(np.float64)
    # the largest logit any δ < N−k reaches: a τ above it leaves δ̂ = N−k (every expert prefetched) everywhere
    top = float((theta[None, :, :-1] - score[:, :, None]).max())
    tau = 1.0 / (1.0 + math.exp(-(top + 1.0)))
    assert (delta_hat(arrays["apex_score"], arrays["apex_theta"], tau) == n - k).all()
    base, _ = heldout_nll(model, held, batch=2, amp=False)
    mode = ApexStallFree(arrays, tau, "cpu")
    assert bool(mode.prefetched.all())
    with RoutingOverride(model, mode) as ov:
        nll, _ = heldout_nll(model, held, batch=2, amp=False, override=ov)
    assert (mode.substituted, mode.dropped) == (0, 0) and mode.routed == held.numel() * k * len(ov.moe)
    assert nll == base
    # the same trace at τ = 0.6 does substitute, and the model's output changes
    low = ApexStallFree(arrays, 0.6, "cpu")
    with RoutingOverride(model, low) as ov:
        nll_low, _ = heldout_nll(model, held, batch=2, amp=False, override=ov)
    assert low.substituted > 0 and nll_low != base


def test_apex_sf_modify_by_hand():
    """N = 6, k = 2, one MoE layer; δ̂ = ⌈s⌉ from θ = 0, 1, 2, 3, 4 at τ = 0.5 (logit 0)."""
    torch = pytest.importorskip("torch")
    from chipsim.tracegen.quality import ApexStallFree

    arrays = {
        "routed_ids": np.zeros((4, 1, 2), dtype=np.uint8),  # shapes only: modify reads the live routing
        "apex_theta": np.array([[0.0, 1.0, 2.0, 3.0, 4.0]], dtype=np.float32),
        "apex_score": np.array([[1.0], [0.0], [4.0], [0.0]], dtype=np.float32),
        "apex_rank": np.array([[[3, 0, 5, 1, 2, 4]],   # δ̂ 1: prefetched {3, 0, 5}
                               [[4, 2, 0, 1, 3, 5]],   # δ̂ 0: prefetched {4, 2}
                               [[0, 1, 2, 3, 4, 5]],   # δ̂ 4: all six
                               [[0, 1, 2, 3, 4, 5]]], dtype=np.uint8),  # row 3's set is written below
        "router_rank": np.array([[[1, 0, 2, 5, 3, 4]],
                                 [[2, 3, 1, 0, 4, 5]],
                                 [[5, 2, 0, 1, 3, 4]],
                                 [[2, 1, 0, 3, 4, 5]]], dtype=np.uint8),
    }
    mode = ApexStallFree(arrays, 0.5, "cpu")
    sets = [set(torch.nonzero(mode.prefetched[t, 0])[:, 0].tolist()) for t in range(4)]
    assert sets[:3] == [{0, 3, 5}, {2, 4}, set(range(6))]
    # row 3: a buffer that staged only expert 0 (cannot come from a full ranking: written by hand)
    mode.prefetched[3, 0] = torch.tensor([True, False, False, False, False, False])
    idx = torch.tensor([[0, 1], [3, 1], [5, 2], [1, 2]])
    w = torch.tensor([[0.6, 0.4], [0.55, 0.45], [0.8, 0.2], [0.7, 0.3]])
    new_idx, new_w, addend = mode.modify(0, torch.arange(4), idx, w, None)
    assert addend is None
    # row 0: expert 1 is missing; in router order 1, 0 are routed, 2 is not prefetched, 5 is: 1 -> 5
    # row 1: 3 and 1 both missing; prefetched non-routed in router order: 2, then 4: 3 -> 2, 1 -> 4
    # row 2: everything prefetched: unchanged
    # row 3: 1 and 2 missing, only 0 left: 1 -> 0 (its weight 0.7), 2 dropped (weight 0)
    assert new_idx.tolist() == [[0, 5], [2, 4], [5, 2], [0, 2]]
    assert torch.equal(new_w, torch.tensor([[0.6, 0.4], [0.55, 0.45], [0.8, 0.2], [0.7, 0.0]]))
    assert (mode.substituted, mode.dropped, mode.routed) == (4, 1, 8)
    assert mode.stats() == {"substitution_rate": 0.5, "drop_rate": 0.125}
    assert idx.tolist() == [[0, 1], [3, 1], [5, 2], [1, 2]]  # the caller's tensors are left alone


@pytest.mark.parametrize("arch", ARCHS)
def test_pregated_runs_layer_l_router_on_layer_l_minus_1_ffn_input(tiny, arch):
    torch = pytest.importorskip("torch")
    from chipsim.tracegen.quality import PreGated, RoutingOverride, heldout_nll
    from chipsim.tracegen.recorder import decoder_layers, find_ffn, parse_router_output

    model, held, _, _, arrays = tiny[arch]
    n, k = arrays["router_rank"].shape[-1], arrays["routed_ids"].shape[-1]

    class Watched(PreGated):
        def __init__(self):
            super().__init__(n)
            self.seen = []  # (MoE layer, live routed ids, pre-gate ids or None)

        def modify(self, li, rows, idx, w, hidden):
            got = self.pending.get(li)
            self.seen.append((li, idx.clone(), None if got is None else got[0].clone()))
            return super().modify(li, rows, idx, w, hidden)

    mode = Watched()
    ffn_in, executed = {}, {}
    layers = decoder_layers(model)
    with RoutingOverride(model, mode) as ov:
        handles = []
        for a, layer in enumerate(layers):
            handles.append(find_ffn(layer).register_forward_pre_hook(
                lambda mod, args, a=a: ffn_in.setdefault(a, []).append(args[0].reshape(-1, D).clone())))
        for li, a in enumerate(ov.moe):  # registered after the override's: sees what the experts really get
            handles.append(ov.blocks[a].experts.register_forward_pre_hook(
                lambda mod, args, kwargs, li=li: executed.setdefault(li, []).append(
                    (list(args) + [kwargs.get("top_k_index")])[1].clone()), with_kwargs=True))
        heldout_nll(model, held, batch=4, amp=False, override=ov)  # one batch: one call per layer
        for h in handles:
            h.remove()
        moe, routers = ov.moe, ov.routers
    rows = held.numel()
    assert [s[0] for s in mode.seen] == list(range(len(moe)))
    hand_dev = 0
    for li, live, pred in mode.seen:
        a = moe[li]
        if a == 0:  # no earlier layer: the first MoE layer runs its own router
            assert pred is None and torch.equal(executed[li][0], live)
            continue
        # the pre-gate: layer a's own router applied to layer a−1's FFN input of this very forward pass
        with torch.no_grad():
            ids, _, _ = parse_router_output(routers[a](ffn_in[a - 1][0]), n)
        assert torch.equal(pred, ids) and torch.equal(executed[li][0], ids)
        hand_dev += sum(len(set(p) - set(r)) for p, r in zip(pred.tolist(), live.tolist()))
    assert mode.deviations == hand_dev > 0
    assert mode.routed == rows * k * len(moe)
    first_own = 1 if moe[0] == 0 else 0  # Granite: MoE layer 0; DeepSeek: pre-gated from the dense layer 0
    assert mode.own_router_rows == first_own * rows
    assert mode.stats()["first_layer_own_router_share"] == pytest.approx(first_own / len(moe))


def test_lore_fit_error_in_sample_is_monotone_in_rank(tiny):
    from chipsim.tracegen.quality import fit_lore, lore_fit_error

    model, _, rec_tr, rec_te, _ = tiny["DeepseekV2ForCausalLM"]
    ranks = (4, 16, 32)
    lore = fit_lore(model, rec_tr, ranks=ranks, log=_silent)
    assert lore["A"].shape[-1] == 32 and int(lore["tokens"].sum()) == rec_tr.num_tokens * 3 * 2  # k 3, 2 MoE layers
    err = lore_fit_error(model, rec_tr, lore, ranks=ranks)  # on the training recording itself
    assert set(err) == {"shared", "4", "16", "32"}
    assert err["32"] <= err["16"] <= err["4"] <= err["shared"]
    assert err["32"] < err["shared"]
    held_err = lore_fit_error(model, rec_te, lore, ranks=ranks)  # held-out: defined, not necessarily monotone
    assert all(math.isfinite(v) and v >= 0 for v in held_err.values())


def test_measure_quality_rejects_windows_that_are_not_the_arrays_tokens(tiny):
    torch = pytest.importorskip("torch")
    from chipsim.tracegen.quality import measure_quality

    model, held, _, _, arrays = tiny["GraniteMoeForCausalLM"]
    for wrong in (torch.roll(held, 1, dims=1), held[:3], torch.cat([held, held[:1]])):
        with pytest.raises(ValueError, match="not the tokens"):
            measure_quality(model, wrong, arrays, log=_silent)


@pytest.mark.parametrize("arch", ARCHS)
def test_measure_quality_record_of_a_tiny_model(tiny, arch):
    from chipsim.tracegen.quality import measure_quality

    model, held, rec_tr, rec_te, arrays = tiny[arch]
    q = measure_quality(model, held, arrays, train_rec=rec_tr, heldout_rec=rec_te, batch=2, log=_silent)
    assert q["baseline"]["hooked_identity_nll"] == q["baseline"]["nll"]
    assert q["scored_tokens"] == held.shape[0] * (SEQ - 1) and q["heldout_windows"] == held.shape[0]
    assert sorted(q["apex_sf"]) == ["0.6", "0.75", "0.9"]
    for e in list(q["apex_sf"].values()) + [q["pregated"]]:
        assert e["baseline_ppl"] == q["baseline"]["ppl"]
        assert math.isclose(e["ppl"], math.exp(e["nll"]), rel_tol=1e-4)
    assert q["pregated"]["first_layer_own_router_share"] == (0.0 if arch.startswith("Deepseek") else round(1 / 3, 5))
    if arch.startswith("Deepseek"):  # shared experts: SPICE surrogates measured
        variants = q["spice_lore"]["variants"]
        assert sorted(variants) == ["16", "32", "drop", "shared"]
        assert "heldout_relative_sq_error" not in variants["drop"]
        assert all("heldout_relative_sq_error" in variants[v] for v in ("shared", "16", "32"))
        assert all(variants[v]["surrogate_rate"] > 0 for v in variants)
    else:
        assert "spice_lore" not in q
    assert "floe" not in q  # hidden size 32: not a multiple of FloE's INT2 group (test_quality_floe.py measures it)
    if arch.startswith("Deepseek"):  # top-3: adaptive gating measured at each threshold, dropping more the lower it is
        gated = q["adapmoe"]  # (at most one of three experts: two of near-equal weights never reach 0.8)
        assert sorted(gated) == ["0.8", "0.9", "0.95"]
        assert 0 <= gated["0.95"]["drop_rate"] <= gated["0.9"]["drop_rate"] <= gated["0.8"]["drop_rate"] <= 1 / 3 + 1e-9
        for e in gated.values():  # nothing dropped: the unmodified model's perplexity exactly
            assert e["baseline_ppl"] == q["baseline"]["ppl"]
            assert (e["nll"] == q["baseline"]["nll"]) == (e["drop_rate"] == 0)
    else:  # top-2: adaptive gating changes nothing
        assert "adapmoe" not in q


def test_adaptive_gating_keeps_what_the_policy_keeps():
    """The quality mode drops exactly the experts the simulator's AdapMoE drops (chipsim.policies.caching._keep_count):
    by hand, weights 0.5, 0.3, 0.15, 0.05 at 0.9 keep three (0.5 + 0.3 = 0.8 short of it, + 0.15 reaches it); at 0.8
    two (0.8 reaches it); top-2 keeps both; then 200 random rows of top-4 and top-6 agree with the policy's count."""
    torch = pytest.importorskip("torch")
    import numpy as np

    from chipsim.policies.caching import AdapMoE, AdapMoEParams
    from chipsim.tracegen.quality import AdaptiveGating

    def kept(threshold, w):
        w = torch.tensor(w, dtype=torch.float32)
        idx = torch.arange(w.shape[1]).expand_as(w)
        _, new_w, _ = AdaptiveGating(threshold).modify(0, None, idx, w, None)
        return (new_w > 0).sum(1).tolist(), new_w

    count, new_w = kept(0.9, [[0.15, 0.5, 0.05, 0.3]])
    assert count == [3] and torch.equal(new_w, torch.tensor([[0.15, 0.5, 0.0, 0.3]]))
    assert kept(0.8, [[0.15, 0.5, 0.05, 0.3]])[0] == [2]
    assert kept(0.5, [[0.9, 0.1]])[0] == [2]
    policy = AdapMoE.__new__(AdapMoE)
    rng = np.random.default_rng(7)
    for k in (4, 6):
        rows = rng.dirichlet(np.ones(k) * 0.7, size=200).astype(np.float32)
        for threshold in (0.8, 0.9, 0.95):
            object.__setattr__(policy, "params", AdapMoEParams(gate_threshold=threshold))
            assert kept(threshold, rows.tolist())[0] == [policy._keep_count(r.astype(np.float64)) for r in rows]


# ----------------------------------------------------------------------------------------------------
# the shared record look-up of the policies


def test_quality_record_paths_and_reasons():
    meta = {"quality": {"apex_sf": {"0.6": {"ppl": 1.0}, "0.9": {"ppl": 2.0}},
                        "spice_lore": {"confidence": 0.7, "variants": {"16": {"ppl": 3.0}}}}}
    assert quality_record(meta, ("apex_sf", 0.9)) == ({"ppl": 2.0}, "meta['quality']['apex_sf']['0.9']")
    assert quality_record(meta, ("apex_sf", 0.9000000001))[0] == {"ppl": 2.0}
    entry, why = quality_record(meta, ("apex_sf", 0.75))
    assert entry is None and why == "not measured: the trace has no meta['quality']['apex_sf']['0.75'] record (it holds 0.6, 0.9)"
    assert quality_record(meta, ("spice_lore", "variants", "16")) == (
        {"ppl": 3.0}, "meta['quality']['spice_lore']['variants']['16']")
    assert "['spice_lore']['variants']['32']" in quality_record(meta, ("spice_lore", "variants", "32"))[1]
    assert quality_record(meta, ("spice_lore", "confidence"))[0] is None  # a number, not a record
    for empty in ({}, {"quality": {}}, {"quality": None}):
        assert quality_record(empty, ("pregated",)) == (None, "not measured: the trace has no meta['quality'] record")
    assert quality_fields(None, reason="exact") == {"quality_mode": None, "quality_cost": None, "quality_source": "exact"}
    assert quality_fields("tau 0.9", meta, ("apex_sf", 0.9), reason="capped")["quality_cost"] is None


# ----------------------------------------------------------------------------------------------------
# `chipsim run`: one quality line per policy that changes the computation


def _measured_line(label, mode, entry, source, rate_text):
    return (f"quality: {label} ({mode}): held-out perplexity {entry['baseline_ppl']:.2f} -> {entry['ppl']:.2f} "
            f"({entry['delta_ppl_pct']:+.2f} %), {rate_text}; measured on the trace's model ({source})")


def _quality_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("quality:")]


def test_run_prints_the_measured_quality_of_apex_sf_and_pregated(capsys):
    q = _meta("real-granite-3b")["quality"]
    policies = ["no-prefetch", "apex-sf", "oracle", "pregated", "apex", "static-4", "promoe", "lru", "lfu",
                "fiddler", "spice", "apex-sf:tau=0.6"]
    args = ["run", THOR, *sum((["--policy", p] for p in policies), []), *SHORT]
    assert main(args) == 0
    out = capsys.readouterr().out
    sf, pg, sf6 = q["apex_sf"]["0.9"], q["pregated"], q["apex_sf"]["0.6"]
    expected = [
        _measured_line("apex-sf", "tau 0.9", sf, "meta['quality']['apex_sf']['0.9']",
                       f"{100 * sf['substitution_rate']:.2f} % of routed experts substituted"),
        _measured_line("pregated", "pre-gated routing", pg, "meta['quality']['pregated']",
                       f"{100 * pg['deviation_rate']:.2f} % of routed experts replaced by the pre-gate's choice"),
        _measured_line("apex-sf:tau=0.6", "tau 0.6", sf6, "meta['quality']['apex_sf']['0.6']",
                       f"{100 * sf6['substitution_rate']:.2f} % of routed experts substituted"),
    ]
    # the exact policies (and SPICE on a model without shared experts, which computes every expert) print nothing
    assert _quality_lines(out) == expected
    assert expected[0] == ("quality: apex-sf (tau 0.9): held-out perplexity 91.36 -> 91.57 (+0.23 %), 1.17 % of routed "
                           "experts substituted; measured on the trace's model (meta['quality']['apex_sf']['0.9'])")
    assert out.index("-----") < out.index(expected[0])  # after the table
    assert main(args) == 0
    assert capsys.readouterr().out == out  # byte-identical run to run


def test_run_prints_spice_surrogate_quality_for_its_rank_only(capsys):
    q = _meta("real-deepseek-v2-lite")["quality"]
    policies = ["spice", "spice:lore_rank=32", "spice:surrogate=false", "spice:lore_rank=8", "spice:confidence=0.5",
                "spice:lore_form=factored", "pregated"]
    assert main(["run", DEEPSEEK_CFG, *sum((["--policy", p] for p in policies), []), *SHORT]) == 0
    lines = _quality_lines(capsys.readouterr().out)
    v = q["spice_lore"]["variants"]

    def spice(label, rank):
        e = v[str(rank)]
        return _measured_line(label, f"shared expert + LoRE rank {rank} surrogates", e,
                              f"meta['quality']['spice_lore']['variants']['{rank}']",
                              f"{100 * e['surrogate_rate']:.2f} % of routed experts replaced by surrogates (every "
                              "low-confidence draft miss, SPICE cache ignored: an upper bound), LoRE held-out relative "
                              f"squared error {e['heldout_relative_sq_error']:.3f}")

    pg = q["pregated"]
    assert lines == [
        spice("spice", 16),
        spice("spice:lore_rank=32", 32),
        # surrogate=false computes every routed expert: no line
        "quality: spice:lore_rank=8 (shared expert + LoRE rank 8 surrogates): not measured: the trace has no "
        "meta['quality']['spice_lore']['variants']['8'] record (it holds 16, 32, drop, shared)",
        "quality: spice:confidence=0.5 (shared expert + LoRE rank 16 surrogates): not measured: "
        "meta['quality']['spice_lore'] was measured at confidence 0.7, this run uses 0.5",
        "quality: spice:lore_form=factored (shared expert + LoRE rank 16 surrogates, factored form): not measured: "
        "meta['quality']['spice_lore'] holds the residual LoRE form (y_shared + B·A·h) only, this run uses "
        "lore_form factored",
        _measured_line("pregated", "pre-gated routing", pg, "meta['quality']['pregated']",
                       f"{100 * pg['deviation_rate']:.2f} % of routed experts replaced by the pre-gate's choice"),
    ]


def test_run_on_a_trace_without_quality_says_not_measured(capsys):
    synthetic = os.path.join(TRACES, "synthetic-granite-1b.npz")  # no model was run: no quality record
    assert main(["run", GRANITE1B_CFG, "--set", f"workload.trace={synthetic}", "--policy", "apex-sf",
                 "--policy", "pregated", "--policy", "apex", *SHORT]) == 0
    assert _quality_lines(capsys.readouterr().out) == [
        "quality: apex-sf (tau 0.9): not measured: the trace has no meta['quality'] record",
        "quality: pregated (pre-gated routing): not measured: the trace has no meta['quality'] record",
    ]


def test_run_names_other_computation_changes_and_a_binding_delta_cap(capsys):
    assert main(["run", THOR, "--policy", "floe", "--policy", "adapmoe", "--policy", "apex-sf:max_extra=1",
                 "--policy", "apex-sf:max_extra=32", *SHORT]) == 0
    lines = _quality_lines(capsys.readouterr().out)
    assert lines[0] == ("quality: floe (sparsity 0.9, INT2 up, compression 9.3): not measured: the trace has no "
                        "meta['quality']['floe'] record")
    assert lines[1] == ("quality: adapmoe (gate threshold 0.9): not measured: the trace has no "
                        "meta['quality']['adapmoe'] record")
    assert lines[2] == ("quality: apex-sf:max_extra=1 (tau 0.9): not measured: max_extra = 1 caps δ̂ on this run, and "
                        "meta['quality']['apex_sf'] was measured with the uncapped δ̂")
    assert lines[3].startswith("quality: apex-sf:max_extra=32 (tau 0.9): held-out perplexity ")  # N−k = 32: no cap
    assert len(lines) == 4


def test_run_json_rows_carry_the_quality_fields(capsys):
    q = _meta("real-deepseek-v2-lite")["quality"]
    assert main(["run", DEEPSEEK_CFG, "--json", "--policy", "apex-sf", "--policy", "spice", "--policy",
                 "spice:surrogate=false", "--policy", "no-prefetch", *SHORT]) == 0
    rows = {r["policy"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["apex-sf"]["quality_cost"] == q["apex_sf"]["0.9"]
    assert rows["apex-sf"]["quality_source"] == "meta['quality']['apex_sf']['0.9']"
    assert rows["apex-sf"]["quality_mode"] == "tau 0.9"
    assert rows["spice"]["quality_cost"] == q["spice_lore"]["variants"]["16"]
    assert rows["spice"]["spice_surrogate"] == ("shared expert + LoRE rank 16 (residual); quality cost measured, "
                                                "meta['quality']['spice_lore']['variants']['16']")
    off = rows["spice:surrogate=false"]
    assert off["quality_mode"] is None and off["quality_cost"] is None and off["quality_source"].startswith("exact")
    assert not any(key.startswith("quality") for key in rows["no-prefetch"])


# ----------------------------------------------------------------------------------------------------
# `chipsim inspect`: the quality section


def test_inspect_prints_the_quality_section(capsys):
    q = _meta("real-deepseek-v2-lite")["quality"]
    path = os.path.join(TRACES, "real-deepseek-v2-lite.npz")
    assert main(["inspect", path]) == 0
    out = capsys.readouterr().out
    assert "Quality cost (chipsim.tracegen.quality)" in out and "quality: not measured" not in out
    assert f"baseline ppl {q['baseline']['ppl']:.3f} (nll {q['baseline']['nll']:.5f}" in out
    start = out.index("Quality cost")
    table = [line.split() for line in out[start:].splitlines()
             if line.startswith(("  apex-sf ", "  pregated ", "  spice  "))]

    def cells(e, *rates):
        return [f"{e['ppl']:.3f}", f"{e['delta_ppl_pct']:+.3f}"] + [f"{r:.4f}" if r is not None else "-" for r in rates]

    v = q["spice_lore"]["variants"]
    expected = [["apex-sf", "τ", tau] + cells(q["apex_sf"][tau], q["apex_sf"][tau]["substitution_rate"],
                                               q["apex_sf"][tau]["drop_rate"], None, None, None)
                for tau in ("0.6", "0.75", "0.9")]
    expected.append(["pregated"] + cells(q["pregated"], None, None, q["pregated"]["deviation_rate"], None, None))
    expected.append(["spice", "drop"] + cells(v["drop"], None, None, None, v["drop"]["surrogate_rate"], None))
    expected += [["spice", *name] + cells(v[key], None, None, None, v[key]["surrogate_rate"],
                                          v[key]["heldout_relative_sq_error"])
                 for key, name in (("shared", ["shared"]), ("16", ["LoRE", "rank", "16"]), ("32", ["LoRE", "rank", "32"]))]
    assert table == expected
    assert main(["inspect", path, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)["quality"]
    assert doc["baseline_ppl"] == q["baseline"]["ppl"] and doc["scored_tokens"] == q["scored_tokens"]
    got = [(m["mode"], m["setting"]) for m in doc["modes"]]
    assert got == [("apex_sf", "0.6"), ("apex_sf", "0.75"), ("apex_sf", "0.9"), ("pregated", None),
                   ("spice_lore", "drop"), ("spice_lore", "shared"), ("spice_lore", "16"), ("spice_lore", "32")]
    spice16 = doc["modes"][6]
    assert spice16["record"] == "meta['quality']['spice_lore']['variants']['16']"
    assert {k: val for k, val in spice16.items() if k not in ("mode", "setting", "record")} == v["16"]
    assert doc["settings"]["spice_lore"]["confidence"] == q["spice_lore"]["confidence"]


def test_inspect_without_quality_says_not_measured(capsys):
    path = os.path.join(TRACES, "synthetic-granite-1b.npz")
    assert main(["inspect", path]) == 0
    out = capsys.readouterr().out
    assert "quality: not measured" in out and "Quality cost" not in out
    assert main(["inspect", path, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["quality"] is None


SHARED_EXPERT_TRACES = ("real-deepseek-v2-lite", "real-deepseek-v2-lite-retrain", "real-qwen2-57b-a14b",
                        "real-qwen2-57b-a14b-retrain")


@pytest.mark.parametrize("name", ["real-granite-1b", "real-granite-3b", "real-phi-mini-moe", "real-deepseek-v2-lite",
                                  "real-deepseek-v2-lite-retrain", "real-gpt-oss-20b", "real-mixtral-8x7b",
                                  "real-qwen2-57b-a14b", "real-qwen2-57b-a14b-retrain"])
def test_every_shipped_real_trace_carries_its_quality_record(name):
    """Each trained model's held-out perplexity under the approximate modes was measured and stored (issue 3)."""
    from chipsim.trace.format import load

    q = load(os.path.join(TRACES, f"{name}.npz")).meta["quality"]
    assert q["scored_tokens"] >= 2048
    for rec in [q["apex_sf"][tau] for tau in ("0.6", "0.75", "0.9")] + [q["pregated"]]:
        base = rec["baseline_ppl"]
        assert base > 1 and rec["ppl"] == pytest.approx(base + rec["delta_ppl"], abs=2e-3)
        assert rec["delta_ppl_pct"] == pytest.approx(100 * rec["delta_ppl"] / base, abs=6e-3)
    assert all(0 < q["apex_sf"][tau]["substitution_rate"] < 1 for tau in ("0.6", "0.75", "0.9"))
    assert 0 < q["pregated"]["deviation_rate"] < 1
    assert ("spice_lore" in q) == (name in SHARED_EXPERT_TRACES)


@pytest.mark.parametrize("name", ["real-mixtral-8x7b", "real-qwen2-57b-a14b", "real-deepseek-v2-lite-retrain",
                                  "real-qwen2-57b-a14b-retrain"])
def test_floes_quality_is_recorded_at_each_sparsity(name):
    """FloE's record: each sparsity's perplexity consistent with its change, the held-out share of channels kept near
    1 − s (thresholds calibrated on training tokens), and sparsity costing more as it grows on this model."""
    from chipsim.trace.format import load

    q = load(os.path.join(TRACES, f"{name}.npz")).meta["quality"]["floe"]
    assert q["up_bits"] == 2 and q["up_group"] == 64
    costs = []
    for s in ("0.5", "0.7", "0.9"):
        for rec in (q[s], q["sparse_bf16_up"][s]):
            assert rec["ppl"] == pytest.approx(rec["baseline_ppl"] + rec["delta_ppl"], abs=2e-3)
            assert abs(rec["kept_channel_share"] - (1 - float(s))) < 0.02
            assert 0.5 < rec["intra_predictor_recall"] <= 1
        costs.append(q[s]["delta_ppl_pct"])
    assert costs == sorted(costs)
    assert q["int2_up_dense"]["kept_channel_share"] == 1.0


@pytest.mark.parametrize("name", ["real-deepseek-v2-lite-retrain", "real-qwen2-57b-a14b-retrain"])
def test_adapmoes_quality_is_recorded_at_each_threshold(name):
    """AdapMoE's record on the two retrains: each threshold's perplexity consistent with its change, and a lower
    gate threshold leaving out more of the routed experts (at most all but the first of each token-layer's)."""
    from chipsim.trace.format import load

    trace = load(os.path.join(TRACES, f"{name}.npz"))
    q = trace.meta["quality"]["adapmoe"]
    k = trace["routed_ids"].shape[-1]
    drops = []
    for t in ("0.8", "0.9", "0.95"):
        rec = q[t]
        assert rec["ppl"] == pytest.approx(rec["baseline_ppl"] + rec["delta_ppl"], abs=2e-3)
        assert rec["delta_ppl_pct"] == pytest.approx(100 * rec["delta_ppl"] / rec["baseline_ppl"], abs=6e-3)
        assert 0 < rec["drop_rate"] <= (k - 1) / k
        drops.append(rec["drop_rate"])
    assert drops == sorted(drops, reverse=True)
