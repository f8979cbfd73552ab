"""Predictor training (chipsim.tracegen.predictors) on tiny data, CPU, fast."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from chipsim.errors import InputError  # noqa: E402
from chipsim.trace import format as tformat  # noqa: E402
from chipsim.tracegen.predictors import (  # noqa: E402
    TAUS,
    build_trace_arrays,
    delta_hat,
    delta_star,
    fit_cdf,
    fit_head,
    predict_probs,
)


def _teacher_data(g=2, t=1024, d=16, n=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(g, t, d, generator=gen)
    w = torch.randn(g, d, n, generator=gen)
    return x, torch.softmax(torch.bmm(x, w), -1)


@pytest.mark.parametrize("hidden", [0, 32])
def test_fit_head_lowers_its_loss(hidden):
    x, target = _teacher_data()
    head, info = fit_head(x, target, hidden=hidden, steps=150, lr=3e-2 if not hidden else 1e-2, batch_tokens=256)
    ent = float(-(target * target.log()).sum(-1).mean())
    assert info["loss_last"] < info["loss_first"] - 0.5 * (info["loss_first"] - ent)
    # it learned the teacher's favourite expert most of the time
    q = predict_probs(head, x)
    assert (q.argmax(-1) == target.argmax(-1)).float().mean() > 0.7


def _ordinal_data(t=6000, d=6, c=9, seed=1):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(1, t, d, generator=gen)
    w = torch.randn(d, generator=gen)
    theta = torch.linspace(-2.5, 3.5, c)
    s = x[0] @ w
    cdf = torch.sigmoid(theta[None, :] - s[:, None])  # P(δ* ≤ j)
    cdf[:, -1] = 1.0
    u = torch.rand(t, 1, generator=gen)
    dstar = (u > cdf).sum(-1)  # first j with u ≤ F(j)
    return x, dstar[None, :].long(), c


def test_cdf_is_monotone_and_meets_tau_on_its_own_data():
    x, dstar, c = _ordinal_data()
    cdf, info = fit_cdf(x, dstar, c, steps=300, lr=5e-2, batch_tokens=2048)
    assert info["loss_last"] < info["loss_first"]
    with torch.no_grad():
        theta = cdf.theta().numpy()
        score = cdf.score(x).T.numpy()  # (T, 1)
    assert np.isfinite(theta).all() and (np.diff(theta, axis=-1) >= 0).all()
    p = 1 / (1 + np.exp(-(theta[None, :, :] - score[:, :, None])))  # p_δ for every token: monotone in δ
    assert (np.diff(p, axis=-1) >= -1e-7).all()
    ds = dstar.T.numpy()
    previous = -1.0
    for tau in TAUS:
        dh = delta_hat(score, theta, tau)
        coverage = float((ds <= dh).mean())
        assert coverage >= tau, (tau, coverage)
        assert dh.mean() >= previous  # a higher τ never asks for fewer experts
        previous = dh.mean()


def test_delta_star_and_delta_hat_agree_with_the_format():
    rank = np.array([[[3, 1, 0, 2], [0, 1, 2, 3]]], dtype=np.uint8)  # (T=1, L=2, N=4)
    routed = np.array([[[1, 3], [2, 0]]], dtype=np.uint8)
    assert delta_star(rank, routed).tolist() == [[0, 1]]
    theta = np.array([[-1.0, 0.0, 2.0], [0.5, 0.5, 3.0]], dtype=np.float32)
    score = np.array([[0.0, 1.0]], dtype=np.float32)
    # σ(θ − s) ≥ 0.6 ⇔ θ − s ≥ 0.405: layer 0 first at δ=2, layer 1 at δ=2
    assert delta_hat(score, theta, 0.6).tolist() == [[2, 2]]
    assert delta_hat(score, theta, 0.999).tolist() == [[2, 2]]  # none reaches τ: the largest δ


@pytest.fixture(scope="module")
def tiny_trace(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    from chipsim.tracegen.recorder import find_routers, model_counts, record

    cfg = transformers.DeepseekV2Config(vocab_size=97, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                                        num_key_value_heads=4, intermediate_size=48, moe_intermediate_size=16,
                                        first_k_dense_replace=1, n_routed_experts=8, n_shared_experts=2, num_experts_per_tok=2,
                                        kv_lora_rank=16, q_lora_rank=None, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
                                        topk_method="greedy", n_group=1, topk_group=1, experts_implementation="eager")
    torch.manual_seed(0)
    model = transformers.DeepseekV2ForCausalLM(cfg).eval()
    gen = torch.Generator().manual_seed(0)
    tr = record(model, torch.randint(0, 97, (8, 32), generator=gen))
    te = record(model, torch.randint(0, 97, (2, 32), generator=gen))
    rw = {i: r.weight.detach() for i, (_, r) in find_routers(model).items()}
    arrays, metrics = build_trace_arrays(tr, te, rw, steps=20, cdf_steps=30, batch_tokens=128, log=lambda *_: None)
    counts = model_counts(model)
    meta = {"synthetic": False, "model": {k: counts[k] for k in tformat.META_MODEL_KEYS},
            "provenance": {"description": "random-init test model, never a result"}, "predictor_metrics": metrics, "quality": {}}
    path = tmp_path_factory.mktemp("trace") / "tiny.npz"
    tformat.save(path, arrays, meta)
    return path, arrays, metrics, tr


def test_trace_round_trip(tiny_trace):
    path, arrays, metrics, tr = tiny_trace
    t = tformat.load(path)
    assert t.num_tokens == 64 and t.num_moe_layers == 3 and t.top_k == 2
    for k, v in arrays.items():
        assert np.array_equal(t[k], v), k
    assert t["moe_layers"].tolist() == [1, 2, 3]
    assert t["train_expert_counts"].sum() == tr.num_tokens * 3 * 2
    # the first MoE layer (absolute 1) has a predecessor (dense layer 0): next-layer predictions exist;
    # a draft from d layers back exists only where 1 + l - d >= 0
    assert (t["promoe_rank"] != tformat.NO_EXPERT).all() and (t["pregate_rank"] != tformat.NO_EXPERT).all()
    for d in range(1, tformat.DRAFT_DEPTH + 1):
        for li in range(3):
            made = bool((t["draft_ids"][:, li, d - 1] != tformat.NO_EXPERT).all())
            assert made == (1 + li - d >= 0), (li, d)
            if not made:
                assert (t["draft_conf"][:, li, d - 1] == 0).all()
    json.dumps(metrics)
    assert set(metrics["apex"]["tau"]) == {str(x) for x in TAUS}
    assert metrics["router_topk_is_routed"] == 1.0


def test_trace_for_another_model_is_rejected(tiny_trace):
    from chipsim.workload.models import get_model

    t = tformat.load(tiny_trace[0])
    with pytest.raises(InputError, match="num_layers"):
        t.check_matches(get_model("deepseek-v2-lite"))
