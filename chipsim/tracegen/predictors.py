"""Expert-prefetch predictors, trained on a training split's Recording and run on a held-out one.

Each predictor is fitted for all MoE layers at once (G independent heads trained together with batched
matrix products, minibatch Adam for a few hundred steps: seconds on a GPU), and its held-out outputs are
stored in the trace (chipsim.trace.format) so that replay needs no torch. For target MoE layer l at
absolute layer a (a = first_dense_layers + l):

| predictor | input (recorded hidden state) | model, loss | trace arrays |
| --- | --- | --- | --- |
| APEX prefetch router | entering layer a (pre-attention) | linear + softmax, KL to the frozen router's softmax | apex_rank |
| APEX CDF | same | ordinal logistic p_δ = σ(θ_δ − wᵀx), θ ordered, cumulative BCE on δ* from the prefetch router's ranking on the training split | apex_score, apex_theta |
| ProMoE | FFN input of layer a-1 (its gate's input) | linear + softmax, cross-entropy to the routed set | promoe_rank |
| Pre-gate | FFN input of layer a-1 | layer a's own frozen router weights, no training | pregate_rank |
| SPICE draft, depth d = 1..8 | entering layer a-d | linear + softmax, cross-entropy to the routed set; confidence = its mass on its top-k | draft_ids, draft_conf |
| FloE inter-expert | FFN input of layer a-1 | MLP (one hidden layer of 128, GELU), cross-entropy to the routed set | floe_rank |

Inputs are RMS-normalised per token (x / rms(x)), then an affine head. Predictions that need a layer
before layer 0 hold NO_EXPERT (and confidence 0).

Needs torch; the simulator never imports this module.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from chipsim.trace.format import DRAFT_DEPTH, NO_EXPERT
from chipsim.trace.predictor_arrays import delta_hat, delta_star
from chipsim.tracegen.recorder import Recording

TAUS = (0.6, 0.75, 0.9, 0.97)
FLOE_HIDDEN = 128


def rms_features(x: torch.Tensor) -> torch.Tensor:
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class GroupedHead(torch.nn.Module):
    """G independent softmax classifiers (linear, or MLP with one hidden layer) evaluated with bmm."""

    def __init__(self, groups: int, d: int, n: int, hidden: int = 0, generator: torch.Generator | None = None):
        super().__init__()
        self.hidden = hidden
        if hidden:
            self.w1 = torch.nn.Parameter(torch.randn(groups, d, hidden, generator=generator) / math.sqrt(d))
            self.b1 = torch.nn.Parameter(torch.zeros(groups, 1, hidden))
            self.w2 = torch.nn.Parameter(torch.zeros(groups, hidden, n))
        else:
            self.w2 = torch.nn.Parameter(torch.zeros(groups, d, n))
        self.b2 = torch.nn.Parameter(torch.zeros(groups, 1, n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (G, T, d) -> logits (G, T, N)
        if self.hidden:
            x = F.gelu(torch.baddbmm(self.b1, x, self.w1))
        return torch.baddbmm(self.b2, x, self.w2)

    def num_parameters_per_group(self) -> int:
        return sum(p[0].numel() for p in self.parameters())


def _soft_ce(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return -(target * F.log_softmax(logits, -1)).sum(-1).mean()


def _lr_at(step: int, steps: int, lr: float) -> float:
    warm = max(1, steps // 20)
    if step < warm:
        return lr * (step + 1) / warm
    return lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm))))


def fit_head(x: torch.Tensor, target: torch.Tensor, hidden: int = 0, steps: int = 300, lr: float = 1e-2,
             batch_tokens: int = 8192, seed: int = 0, weight_decay: float = 0.0) -> tuple[GroupedHead, dict]:
    """Fit G heads: x (G, T, d) features, target (G, T, N) probabilities (rows sum to 1).

    Returns the head and {"loss_first", "loss_last", "seconds"}: the full-data soft cross-entropy before and after.
    """
    g, t, d = x.shape
    n = target.shape[-1]
    gen = torch.Generator(device="cpu").manual_seed(seed)
    head = GroupedHead(g, d, n, hidden, gen).to(x.device)
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=weight_decay)
    t0 = time.perf_counter()
    with torch.no_grad():
        first = float(full_loss(head, x, target))
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, steps, lr)
        if t > batch_tokens:
            idx = torch.randint(0, t, (batch_tokens,), generator=gen).to(x.device)
            xb, yb = x[:, idx], target[:, idx]
        else:
            xb, yb = x, target
        loss = _soft_ce(head(xb), yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    with torch.no_grad():
        last = float(full_loss(head, x, target))
    return head, {"loss_first": first, "loss_last": last, "seconds": time.perf_counter() - t0}


@torch.no_grad()
def full_loss(head: GroupedHead, x: torch.Tensor, target: torch.Tensor, chunk: int = 16384) -> torch.Tensor:
    total = 0.0
    for s in range(0, x.shape[1], chunk):
        total = total + _soft_ce(head(x[:, s:s + chunk]), target[:, s:s + chunk]) * x[:, s:s + chunk].shape[1]
    return total / x.shape[1]


@torch.no_grad()
def predict_probs(head: GroupedHead, x: torch.Tensor, chunk: int = 16384) -> torch.Tensor:
    return torch.cat([torch.softmax(head(x[:, s:s + chunk]), -1) for s in range(0, x.shape[1], chunk)], 1)


class OrdinalCDF(torch.nn.Module):
    """Per group: score s = wᵀx, thresholds θ_0 ≤ … ≤ θ_{C-1} (θ_j = a + Σ_{i<j} softplus(u_i)), p_j = σ(θ_j − s)."""

    def __init__(self, groups: int, d: int, c: int, init_theta: torch.Tensor | None = None):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(groups, d))
        a = torch.zeros(groups)
        u = torch.zeros(groups, max(c - 1, 0))
        if init_theta is not None:
            a = init_theta[:, 0].clone()
            diffs = (init_theta[:, 1:] - init_theta[:, :-1]).clamp_min(1e-3)
            u = torch.log(torch.expm1(diffs))  # softplus⁻¹
        self.a = torch.nn.Parameter(a)
        self.u = torch.nn.Parameter(u)

    def theta(self) -> torch.Tensor:
        inc = F.softplus(self.u)
        return self.a[:, None] + torch.cat([torch.zeros_like(self.a)[:, None], torch.cumsum(inc, -1)], -1)

    def score(self, x: torch.Tensor) -> torch.Tensor:  # (G, T, d) -> (G, T)
        return torch.einsum("gtd,gd->gt", x, self.w)

    def loss(self, x: torch.Tensor, dstar: torch.Tensor) -> torch.Tensor:
        theta = self.theta()
        c = theta.shape[1]
        y = (dstar[:, :, None] <= torch.arange(c, device=x.device)).float()
        return F.binary_cross_entropy_with_logits(theta[:, None, :] - self.score(x)[:, :, None], y)


def fit_cdf(x: torch.Tensor, dstar: torch.Tensor, c: int, steps: int = 400, lr: float = 2e-2, batch_tokens: int = 8192,
            seed: int = 0) -> tuple[OrdinalCDF, dict]:
    """x (G, T, d), dstar (G, T) integer δ* in 0..c-1."""
    g, t, d = x.shape
    emp = torch.stack([(dstar <= j).float().mean(1) for j in range(c)], 1).clamp(1e-3, 1 - 1e-3)  # (G, C)
    init = torch.log(emp / (1 - emp))
    init = torch.cummax(init, 1).values
    cdf = OrdinalCDF(g, d, c, init.cpu()).to(x.device)
    opt = torch.optim.Adam(cdf.parameters(), lr=lr)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    t0 = time.perf_counter()
    with torch.no_grad():
        first = float(cdf.loss(x, dstar))
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, steps, lr)
        if t > batch_tokens:
            idx = torch.randint(0, t, (batch_tokens,), generator=gen).to(x.device)
            loss = cdf.loss(x[:, idx], dstar[:, idx])
        else:
            loss = cdf.loss(x, dstar)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    with torch.no_grad():
        last = float(cdf.loss(x, dstar))
    return cdf, {"loss_first": first, "loss_last": last, "seconds": time.perf_counter() - t0}


# ---------------------------------------------------------------------------------------------------------
# ranking helpers and metrics (numpy)


def rank_desc(probs: torch.Tensor, m: int | None = None) -> torch.Tensor:
    """(…, N) → expert ids by descending probability (stable: ties by lower id), first m."""
    order = torch.sort(probs, dim=-1, descending=True, stable=True).indices
    return order if m is None else order[..., :m]


def hits(pred: np.ndarray, routed: np.ndarray) -> np.ndarray:
    """(T, L) number of routed experts among pred[..., :] (NO_EXPERT entries never hit)."""
    p = pred.astype(np.int64)
    return (p[..., :, None] == routed.astype(np.int64)[..., None, :]).any(-2).sum(-1)


def recall_overlap(pred: np.ndarray, routed: np.ndarray, valid: np.ndarray | None = None) -> dict:
    """Per-layer recall (|pred[:k] ∩ routed| / k) and strict overlap (all k inside) over valid layers."""
    k = routed.shape[-1]
    h = hits(pred[..., :k], routed)
    per_layer_recall = (h / k).mean(0)
    per_layer_overlap = (h == k).mean(0)
    v = np.ones(per_layer_recall.shape, bool) if valid is None else valid
    return {
        "recall_mean": float(per_layer_recall[v].mean()) if v.any() else None,
        "overlap_mean": float(per_layer_overlap[v].mean()) if v.any() else None,
        "recall_per_layer": [round(float(x), 4) if ok else None for x, ok in zip(per_layer_recall, v)],
        "overlap_per_layer": [round(float(x), 4) if ok else None for x, ok in zip(per_layer_overlap, v)],
    }


def apex_metrics(rank: np.ndarray, score: np.ndarray, theta: np.ndarray, routed: np.ndarray) -> dict:
    k = routed.shape[-1]
    ds = delta_star(rank, routed)
    out = {"mean_delta_star": float(ds.mean()), "recall_at_k": float((hits(rank[..., :k], routed) / k).mean()), "tau": {}}
    for tau in TAUS:
        dh = delta_hat(score, theta, tau)
        cov = ds <= dh
        out["tau"][str(tau)] = {
            "coverage": round(float(cov.mean()), 4),
            "mean_delta_hat": round(float(dh.mean()), 3),
            "coverage_per_layer": [round(float(x), 4) for x in cov.mean(0)],
            "mean_delta_hat_per_layer": [round(float(x), 3) for x in dh.mean(0)],
        }
    return out


# ---------------------------------------------------------------------------------------------------------


def _gather(src: torch.Tensor, idx: list[int], device) -> torch.Tensor:
    """src (T, A, d) recorded states → RMS-normalised features (G, T, d) for absolute layers idx (float32)."""
    return torch.stack([rms_features(src[:, i].to(device)) for i in idx], 0)


def _routed_target(rec: Recording, n: int, device) -> torch.Tensor:
    """(L, T, N): 1/k on each routed expert."""
    ids = rec.routed_ids.to(device)
    k = ids.shape[-1]
    y = torch.zeros(*ids.shape[:2], n, device=device)
    y.scatter_(-1, ids, 1.0 / k)
    return y.permute(1, 0, 2).contiguous()


@dataclass(frozen=True)
class _Fit:
    """How every predictor head is fitted: where, how long, on how large batches, from which seed."""

    device: torch.device
    steps: int
    cdf_steps: int
    batch_tokens: int
    seed: int


def build_trace_arrays(train: Recording, test: Recording, router_weights: dict[int, torch.Tensor], *, device=None,
                       steps: int = 300, cdf_steps: int = 400, batch_tokens: int = 8192, seed: int = 0,
                       log=print) -> tuple[dict[str, np.ndarray], dict]:
    """Fit every predictor on `train`, run it on `test`, and return (trace arrays, predictor_metrics).

    router_weights: absolute layer -> the frozen router's (N, d) weight (for the pre-gate).
    The arrays are chipsim.trace.format's core arrays and every predictor output of
    chipsim.trace.predictor_arrays.RECORDED, for test's tokens.
    """
    if train.layer_inputs is None or test.layer_inputs is None:
        raise ValueError("predictor training needs recordings with hidden states (record(..., hidden=True))")
    fit = _Fit(device or train.routed_ids.device, steps, cdf_steps, batch_tokens, seed)
    moe = list(train.moe_layers)
    k = int(train.routed_ids.shape[-1])
    n = int(train.router_logits.shape[-1])
    m = min(n, 2 * k)
    routed_te = test.routed_ids.cpu().numpy()
    metrics: dict = {"train_tokens": train.num_tokens, "heldout_tokens": test.num_tokens,
                     "inputs": "RMS-normalised hidden states"}
    arrays: dict[str, np.ndarray] = {}
    t_all = time.perf_counter()
    _router_outputs(train, test, m, arrays, metrics)
    apex_rank_tr, apex_rank_te, x_tr, x_te = _apex_router(train, test, fit, arrays, metrics, log)
    _apex_cdf((apex_rank_tr, apex_rank_te), (train.routed_ids.cpu().numpy(), routed_te), x_tr, x_te, n - k + 1, fit,
              arrays, metrics, log)
    del x_tr, x_te
    have = [i for i, a in enumerate(moe) if a - 1 >= 0]  # the MoE layers whose layer a-1 exists (indices)
    routed_tr_target = _routed_target(train, n, fit.device)
    _next_layer_heads(train, test, have, routed_tr_target, m, fit, arrays, metrics, log)
    _pregate(test, moe, have, router_weights, m, fit.device, arrays, metrics, log)
    _drafts(train, test, routed_tr_target, k, fit, arrays, metrics, log)
    metrics["seconds"] = round(time.perf_counter() - t_all, 1)
    return arrays, metrics


def _router_outputs(train: Recording, test: Recording, m: int, arrays: dict, metrics: dict) -> None:
    """The original router's arrays (routed ids and weights, ranking and its probabilities), the training split's
    expert counts, the MoE layers and the token ids."""
    routed_te = test.routed_ids.cpu().numpy()
    n_layers_moe = len(train.moe_layers)
    n = int(train.router_logits.shape[-1])
    p_te = torch.softmax(test.router_logits.float(), -1)
    rr = rank_desc(p_te)
    arrays["routed_ids"] = routed_te.astype(np.uint8)
    arrays["routed_weights"] = test.routed_weights.float().cpu().numpy().astype(np.float16)
    arrays["router_rank"] = rr.cpu().numpy().astype(np.uint8)
    arrays["router_rank_prob"] = torch.gather(p_te, -1, rr[..., :m]).cpu().numpy().astype(np.float16)
    metrics["router_topk_is_routed"] = recall_overlap(arrays["router_rank"], routed_te)["recall_mean"]
    counts = torch.zeros(n_layers_moe, n, dtype=torch.int64)
    ids_tr = train.routed_ids.cpu()
    for li in range(n_layers_moe):
        counts[li] = torch.bincount(ids_tr[:, li].reshape(-1), minlength=n)
    arrays["train_expert_counts"] = counts.numpy().astype(np.int64)
    arrays["moe_layers"] = np.asarray(list(train.moe_layers), dtype=np.int16)
    arrays["token_ids"] = test.token_ids.cpu().numpy().astype(np.int32)


def _apex_router(train: Recording, test: Recording, fit: _Fit, arrays: dict, metrics: dict,
                 log) -> tuple[np.ndarray, np.ndarray, torch.Tensor, torch.Tensor]:
    """APEX prefetch router: KL to the frozen router, on the state entering the layer. Returns its ranking of the
    training and the held-out split (T, L, N) and the gathered layer inputs of both (the CDF reads them too)."""
    moe, device = list(train.moe_layers), fit.device
    x_tr = _gather(train.layer_inputs, moe, device)
    x_te = _gather(test.layer_inputs, moe, device)
    target = torch.softmax(train.router_logits.to(device).float(), -1).permute(1, 0, 2).contiguous()
    ent = float(-(target * torch.log(target.clamp_min(1e-12))).sum(-1).mean())
    head, info = fit_head(x_tr, target, steps=fit.steps, batch_tokens=fit.batch_tokens, seed=fit.seed)
    q_tr = predict_probs(head, x_tr)
    q_te = predict_probs(head, x_te)
    apex_rank_tr = rank_desc(q_tr).permute(1, 0, 2).cpu().numpy()
    apex_rank_te = rank_desc(q_te).permute(1, 0, 2).cpu().numpy()
    arrays["apex_rank"] = apex_rank_te.astype(np.uint8)
    held_kl = float(full_loss(head, x_te, torch.softmax(test.router_logits.to(device).float(), -1).permute(1, 0, 2).contiguous()))
    ent_te = torch.softmax(test.router_logits.float(), -1)
    ent_te = float(-(ent_te * torch.log(ent_te.clamp_min(1e-12))).sum(-1).mean())
    metrics["apex_router"] = {"train_kl_first": info["loss_first"] - ent, "train_kl_last": info["loss_last"] - ent,
                              "heldout_kl": held_kl - ent_te, "seconds": round(info["seconds"], 2),
                              "params_per_layer": head.num_parameters_per_group()}
    del q_tr, q_te, target
    log(f"  apex router: KL {info['loss_first'] - ent:.3f} -> {info['loss_last'] - ent:.3f} (held-out {held_kl - ent_te:.3f}), {info['seconds']:.1f}s")
    return apex_rank_tr, apex_rank_te, x_tr, x_te


def _apex_cdf(apex_ranks: tuple[np.ndarray, np.ndarray], routed: tuple[np.ndarray, np.ndarray], x_tr: torch.Tensor,
              x_te: torch.Tensor, c: int, fit: _Fit, arrays: dict, metrics: dict, log) -> None:
    """APEX CDF on δ* of the prefetch router's own training-split ranking: apex_score and apex_theta. apex_ranks and
    routed: the prefetch router's ranking and the routed ids of the training and the held-out split."""
    apex_rank_tr, apex_rank_te = apex_ranks
    ids_tr, routed_te = routed
    ds_tr = torch.from_numpy(delta_star(apex_rank_tr, ids_tr)).T.contiguous().to(fit.device)  # (L, T)
    cdf, cinfo = fit_cdf(x_tr, ds_tr, c, steps=fit.cdf_steps, batch_tokens=fit.batch_tokens, seed=fit.seed + 1)
    with torch.no_grad():
        theta = cdf.theta().float().cpu().numpy()
        score_te = cdf.score(x_te).T.float().cpu().numpy()
        score_tr = cdf.score(x_tr).T.float().cpu().numpy()
    theta = np.maximum.accumulate(theta.astype(np.float32), axis=1)  # exact monotonicity after float rounding
    arrays["apex_score"] = np.ascontiguousarray(score_te.astype(np.float32))
    arrays["apex_theta"] = np.ascontiguousarray(theta)
    metrics["apex"] = apex_metrics(apex_rank_te, score_te, theta, routed_te)
    metrics["apex"]["recall_at_k_per_layer"] = recall_overlap(apex_rank_te, routed_te)["recall_per_layer"]
    metrics["apex_calibration_train"] = {
        str(tau): round(float((delta_star(apex_rank_tr, ids_tr) <= delta_hat(score_tr, theta, tau)).mean()), 4) for tau in TAUS
    }
    metrics["apex_cdf"] = {"train_bce_first": cinfo["loss_first"], "train_bce_last": cinfo["loss_last"], "seconds": round(cinfo["seconds"], 2)}
    log("  apex: " + ", ".join(f"τ={t}: coverage {v['coverage']:.3f} δ̂ {v['mean_delta_hat']:.2f}" for t, v in metrics["apex"]["tau"].items())
        + f" (recall@k {metrics['apex']['recall_at_k']:.3f}; train coverage {metrics['apex_calibration_train']})")


def _next_layer_heads(train: Recording, test: Recording, have: list[int], routed_tr_target: torch.Tensor, m: int,
                      fit: _Fit, arrays: dict, metrics: dict, log) -> None:
    """ProMoE (linear) and FloE (one hidden layer) heads predicting layer a's routing from layer a-1's FFN input,
    for the MoE layers `have` (indices) whose a-1 exists."""
    moe = list(train.moe_layers)
    routed_te = test.routed_ids.cpu().numpy()
    valid = np.isin(np.arange(len(moe)), have)
    src = [moe[i] - 1 for i in have]
    for name, hidden in (("promoe", 0), ("floe", FLOE_HIDDEN)):
        out = np.full((test.num_tokens, len(moe), m), NO_EXPERT, dtype=np.uint8)
        if have:
            xs_tr = _gather(train.ffn_inputs, src, fit.device)
            xs_te = _gather(test.ffn_inputs, src, fit.device)
            head, info = fit_head(xs_tr, routed_tr_target[have], hidden=hidden, steps=fit.steps, batch_tokens=fit.batch_tokens,
                                  seed=fit.seed + (2 if hidden else 3), lr=(3e-3 if hidden else 1e-2))
            q = predict_probs(head, xs_te)
            out[:, have] = rank_desc(q, m).permute(1, 0, 2).cpu().numpy().astype(np.uint8)
            del xs_tr, xs_te, q
        arrays[f"{name}_rank"] = out
        metrics[name] = recall_overlap(out, routed_te, valid)
        if have:
            metrics[name].update({"train_ce_first": info["loss_first"], "train_ce_last": info["loss_last"], "seconds": round(info["seconds"], 2),
                                  "params_per_layer": head.num_parameters_per_group()})
        log(f"  {name}: held-out recall {metrics[name]['recall_mean']}, overlap {metrics[name]['overlap_mean']}")


def _pregate(test: Recording, moe: list[int], have: list[int], router_weights: dict[int, torch.Tensor], m: int, device,
             arrays: dict, metrics: dict, log) -> None:
    """Pre-gate: layer a's frozen router on layer a-1's FFN input (also reported: on the state entering a-1)."""
    routed_te = test.routed_ids.cpu().numpy()
    valid = np.isin(np.arange(len(moe)), have)
    out = np.full((test.num_tokens, len(moe), m), NO_EXPERT, dtype=np.uint8)
    alt = np.full((test.num_tokens, len(moe), m), NO_EXPERT, dtype=np.uint8)
    for i in have:
        a = moe[i]
        w = router_weights[a].to(device).float()
        h = test.ffn_inputs[:, a - 1].to(device).float()
        out[:, i] = rank_desc(h @ w.T, m).cpu().numpy()
        h = test.layer_inputs[:, a - 1].to(device).float()
        alt[:, i] = rank_desc(h @ w.T, m).cpu().numpy()
    arrays["pregate_rank"] = out
    metrics["pregate"] = recall_overlap(out, routed_te, valid)
    metrics["pregate"]["input"] = "FFN input (gate input) of layer a-1, fed to layer a's router weights"
    metrics["pregate_from_layer_input"] = {k_: v for k_, v in recall_overlap(alt, routed_te, valid).items() if k_.endswith("mean")}
    log(f"  pregate: held-out recall {metrics['pregate']['recall_mean']} (from layer input: {metrics['pregate_from_layer_input']['recall_mean']})")


def _drafts(train: Recording, test: Recording, routed_tr_target: torch.Tensor, k: int, fit: _Fit, arrays: dict,
            metrics: dict, log) -> None:
    """SPICE drafts, depth 1..8, from the state entering layer a-d: draft_ids, and draft_conf (the top-k's
    predicted mass)."""
    moe = list(train.moe_layers)
    routed_te = test.routed_ids.cpu().numpy()
    n_layers_moe, t_test = len(moe), test.num_tokens
    draft_ids = np.full((t_test, n_layers_moe, DRAFT_DEPTH, k), NO_EXPERT, dtype=np.uint8)
    draft_conf = np.zeros((t_test, n_layers_moe, DRAFT_DEPTH), dtype=np.float16)
    metrics["draft"] = {"per_depth": {}}
    for d in range(1, DRAFT_DEPTH + 1):
        ok = [i for i, a in enumerate(moe) if a - d >= 0]
        if not ok:
            continue
        xs_tr = _gather(train.layer_inputs, [moe[i] - d for i in ok], fit.device)
        xs_te = _gather(test.layer_inputs, [moe[i] - d for i in ok], fit.device)
        head, info = fit_head(xs_tr, routed_tr_target[ok], steps=fit.steps, batch_tokens=fit.batch_tokens, seed=fit.seed + 10 + d)
        q = predict_probs(head, xs_te)  # (G, T, N)
        top = torch.topk(q, k, dim=-1)
        draft_ids[:, ok, d - 1] = top.indices.permute(1, 0, 2).cpu().numpy().astype(np.uint8)
        draft_conf[:, ok, d - 1] = top.values.sum(-1).T.cpu().numpy().astype(np.float16)
        v = np.zeros(n_layers_moe, bool)
        v[ok] = True
        r = recall_overlap(draft_ids[:, :, d - 1], routed_te, v)
        conf = draft_conf[:, ok, d - 1].astype(np.float32)
        hit = hits(draft_ids[:, ok, d - 1], routed_te[:, ok]) / k
        corr = float(np.corrcoef(conf.ravel(), hit.ravel())[0, 1]) if conf.std() > 0 and hit.std() > 0 else None
        metrics["draft"]["per_depth"][str(d)] = {"recall_mean": r["recall_mean"], "overlap_mean": r["overlap_mean"],
                                                 "recall_per_layer": r["recall_per_layer"], "mean_conf": float(conf.mean()),
                                                 "conf_recall_corr": corr, "train_ce_last": info["loss_last"]}
        del xs_tr, xs_te, q
    arrays["draft_ids"] = draft_ids
    arrays["draft_conf"] = draft_conf
    log("  draft recall by depth: " + ", ".join(f"d{d}={v['recall_mean']:.3f}" for d, v in metrics["draft"]["per_depth"].items()))
