"""FloE's compressed experts as a quality mode (chipsim.tracegen.quality_floe), on tiny random-init models (CPU).

Random-init models are for tests only, never results.
"""

import math

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from chipsim.tracegen.quality import RoutingOverride, heldout_nll  # noqa: E402
from chipsim.tracegen.quality_floe import (ExpertWeights, FloeCompressed, FloeLayer, fit_thresholds, floe_layers,  # noqa: E402
                                           hqq_dequantised, moe_ffn_inputs)
from chipsim.tracegen.recorder import decoder_layers, find_ffn, find_routers, record  # noqa: E402

V, D, SEQ = 97, 64, 32  # D a multiple of the INT2 group (64)
COMMON = dict(vocab_size=V, hidden_size=D, num_hidden_layers=3, num_attention_heads=4, max_position_embeddings=64,
              experts_implementation="eager")
TINY = {
    "MixtralForCausalLM": ("MixtralConfig", dict(num_key_value_heads=2, intermediate_size=32, num_local_experts=8,
                                                 num_experts_per_tok=2)),
    "Qwen2MoeForCausalLM": ("Qwen2MoeConfig", dict(num_key_value_heads=2, intermediate_size=64, moe_intermediate_size=32,
                                                   shared_expert_intermediate_size=64, num_experts=8, num_experts_per_tok=4)),
    "GptOssForCausalLM": ("GptOssConfig", dict(num_key_value_heads=2, head_dim=16, intermediate_size=32, num_local_experts=8,
                                               num_experts_per_tok=2, layer_types=["sliding_attention", "full_attention"] * 1
                                               + ["full_attention"], sliding_window=16)),
}


@pytest.fixture(scope="module")
def tiny():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out = {}
    for arch, (cfg_name, kwargs) in TINY.items():
        torch.manual_seed(0)
        model = getattr(transformers, arch)(getattr(transformers, cfg_name)(**COMMON, **kwargs)).eval()
        if arch == "GptOssForCausalLM":  # random-init biases are empty tensors: give them values
            for p in model.parameters():
                if not torch.isfinite(p).all():
                    torch.nn.init.normal_(p, std=0.02)
        g = torch.Generator().manual_seed(1)
        train = torch.randint(0, V, (8, SEQ), generator=g)
        held = torch.randint(0, V, (4, SEQ), generator=g)
        out[arch] = (model, held, record(model, train, batch_size=8, hidden=True))
    yield out
    torch.set_num_threads(threads)


def test_hqq_int2_takes_four_levels_per_group_and_is_no_worse_than_min_max_rounding():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(8, 128, generator=g)
    deq = hqq_dequantised(w)
    for group in deq.reshape(-1, 64):
        assert len(torch.unique(group)) <= 4
    wg = w.reshape(-1, 64)
    lo, hi = wg.min(1, keepdim=True).values, wg.max(1, keepdim=True).values
    rtn = ((wg - lo) / (hi - lo) * 3).round() / 3 * (hi - lo) + lo  # plain min-max rounding
    assert float((deq.reshape(-1, 64) - wg).abs().mean()) <= float((rtn - wg).abs().mean()) + 1e-7
    exact = torch.tensor([[0.0, 1.0, 2.0, 3.0] * 16])  # four levels: representable exactly
    assert torch.allclose(hqq_dequantised(exact), exact, atol=1e-6)
    with pytest.raises(ValueError, match="multiple of the group"):
        hqq_dequantised(torch.zeros(2, 48))


@pytest.mark.parametrize("arch", list(TINY))
def test_a_floe_expert_keeping_every_channel_at_bf16_is_the_expert_itself(tiny, arch):
    model, _, _ = tiny[arch]
    block = find_ffn(decoder_layers(model)[sorted(find_routers(model))[0]])
    layer = FloeLayer(ExpertWeights(block.experts), int2_up=False)
    x = torch.randn(5, D, generator=torch.Generator().manual_seed(2))
    for e in (0, 3, 7):
        want = block.experts(x, torch.full((5, 1), e), torch.ones(5, 1))
        got, keep = layer.expert(e, x, -1.0)
        assert bool(keep.all())
        assert torch.allclose(got, want, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("arch", list(TINY))
def test_keeping_every_channel_at_bf16_leaves_the_held_out_nll_unchanged(tiny, arch):
    model, held, _ = tiny[arch]
    base, _ = heldout_nll(model, held, batch=2, amp=False)
    layers = floe_layers(model, int2_up=False)
    mode = FloeCompressed(layers, torch.full((len(layers), 8), -1.0))
    with RoutingOverride(model, mode) as ov:
        nll, _ = heldout_nll(model, held, batch=2, amp=False, override=ov)
    assert math.isclose(nll, base, rel_tol=1e-5)
    assert mode.stats()["kept_channel_share"] == 1.0
    assert mode.stats()["intra_predictor_recall"] == 1.0  # every channel predicted, every channel kept


@pytest.mark.parametrize("sparsity", [0.5, 0.9])
def test_thresholds_keep_one_minus_the_sparsity_of_the_calibration_channels(tiny, sparsity):
    model, _, rec = tiny["MixtralForCausalLM"]
    layers = floe_layers(model, int2_up=True)
    xs = moe_ffn_inputs(model, rec)
    thr = fit_thresholds(layers, xs, rec.routed_ids, sparsity)
    for li, layer in enumerate(layers):
        for e in range(8):
            sel = (rec.routed_ids[:, li] == e).any(-1).nonzero()[:, 0]
            if sel.numel() < 8:
                continue
            kept = float((layer.w.up_factor(layer.up_out(e, xs[li][sel])).abs() >= thr[li, e]).float().mean())
            assert abs(kept - (1 - sparsity)) <= 1.5 / (sel.numel() * 32) + 1e-6  # quantile of sel x 32 channels


def test_compression_raises_the_held_out_nll_and_sparsity_drops_channels(tiny):
    from chipsim.tracegen.quality import measure_floe

    model, held, rec = tiny["Qwen2MoeForCausalLM"]
    base, _ = heldout_nll(model, held, batch=2, amp=False)
    q = measure_floe(model, held, base, rec, batch=2, amp=False, log=lambda *_: None)
    assert sorted(k for k in q if k[0].isdigit()) == ["0.5", "0.7", "0.9"]
    assert q["up_bits"] == 2 and q["up_group"] == 64
    for s in ("0.5", "0.7", "0.9"):
        for e in (q[s], q["sparse_bf16_up"][s]):
            assert abs(e["kept_channel_share"] - (1 - float(s))) < 0.2  # held-out tokens, thresholds from training ones
            assert 0 <= e["intra_predictor_recall"] <= 1
            assert math.isclose(e["ppl"], math.exp(e["nll"]), rel_tol=1e-4) and e["baseline_ppl"] == round(math.exp(base), 4)
    assert q["int2_up_dense"]["kept_channel_share"] == 1.0
    assert q["int2_up_dense"]["nll"] != round(base, 5)  # INT2 changes the numbers


def test_spice_surrogates_use_qwen2s_gated_shared_expert(tiny):
    from chipsim.tracegen.quality import shared_path

    model, _, _ = tiny["Qwen2MoeForCausalLM"]
    block = find_ffn(decoder_layers(model)[0])
    x = torch.randn(3, D, generator=torch.Generator().manual_seed(3))
    want = torch.sigmoid(block.shared_expert_gate(x)) * block.shared_expert(x)
    assert torch.equal(shared_path(block)(x), want)
    assert shared_path(find_ffn(decoder_layers(tiny["MixtralForCausalLM"][0])[0])) is None
