"""The predictor outputs a trace may carry beside its core arrays, and the APEX CDF's δ̂ and δ*.

Each output is an `ArraySpec` (chipsim.trace.spec); a policy lists the specs it reads in
`Policy.trace_arrays`, the recorder (chipsim.tracegen.predictors) and the synthetic generator write them, and
`trace.format.save(..., specs=RECORDED)` checks what they write. A new predictor output is one new spec here,
the code that computes it, and the policy that declares it: nothing in the format or the engine, and no
existing trace has to be regenerated (a trace without it still replays every policy that does not read it).

Shapes (T tokens, L MoE layers, N routed experts, k = top-k, M = min(N, 2k), D = DRAFT_DEPTH, C = N - k + 1):

| key | dtype, shape | meaning |
| --- | --- | --- |
| apex_rank | uint8 (T, L, N) | APEX prefetch router ranking (from the pre-attention hidden state of layer l) |
| apex_score | float32 (T, L) | APEX CDF score wᵀx for the same hidden state |
| apex_theta | float32 (L, C) | APEX ordered thresholds θ_0 ≤ … ≤ θ_{N-k}; p_δ = σ(θ_δ − wᵀx) |
| promoe_rank | uint8 (T, L, M) | ProMoE predictor for layer l from layer l-1's activations |
| pregate_rank | uint8 (T, L, M) | layer l's router applied to layer l-1's hidden state (Pre-gated MoE) |
| floe_rank | uint8 (T, L, M) | FloE inter-expert predictor for layer l from layer l-1 |
| draft_ids | uint8 (T, L, D, k) | SPICE draft prediction for layer l made d+1 layers earlier, at [.., d, :] |
| draft_conf | float16 (T, L, D) | its confidence: draft probability mass on those k experts |
| train_expert_counts | int64 (L, N) | how often each expert was routed over the training split |
"""

from __future__ import annotations

import numpy as np

from chipsim.trace.spec import ArraySpec


def _non_decreasing(theta: np.ndarray) -> str | None:
    return "must be non-decreasing along δ" if (np.diff(theta, axis=-1) < 0).any() else None


APEX_RANK = ArraySpec("apex_rank", "uint8", ("T", "L", "N"), "APEX prefetch-router ranking", ids="permutation")
APEX_SCORE = ArraySpec("apex_score", "float32", ("T", "L"), "APEX CDF score wᵀx", finite=True)
APEX_THETA = ArraySpec("apex_theta", "float32", ("L", "C"), "APEX ordered CDF thresholds θ_δ", finite=True,
                       rule=_non_decreasing)
PROMOE_RANK = ArraySpec("promoe_rank", "uint8", ("T", "L", "M"), "ProMoE previous-layer predictor ranking", ids="ids")
PREGATE_RANK = ArraySpec("pregate_rank", "uint8", ("T", "L", "M"), "pre-gate ranking: layer l's router on layer "
                         "l-1's hidden state", ids="ids")
FLOE_RANK = ArraySpec("floe_rank", "uint8", ("T", "L", "M"), "FloE inter-expert predictor ranking", ids="ids")
DRAFT_IDS = ArraySpec("draft_ids", "uint8", ("T", "L", "D", "K"), "SPICE draft predictions up to D layers ahead",
                      ids="ids")
DRAFT_CONF = ArraySpec("draft_conf", "float16", ("T", "L", "D"), "SPICE draft confidences", finite=True, minimum=0.0,
                       maximum=1.0)
TRAIN_EXPERT_COUNTS = ArraySpec("train_expert_counts", "int64", ("L", "N"), "training-split expert routing counts",
                                minimum=0)

# every output the bundled recorder and synthetic generator write, by name
RECORDED: tuple[ArraySpec, ...] = (APEX_RANK, APEX_SCORE, APEX_THETA, PROMOE_RANK, PREGATE_RANK, FLOE_RANK,
                                   DRAFT_IDS, DRAFT_CONF, TRAIN_EXPERT_COUNTS)
BY_NAME: dict[str, ArraySpec] = {s.name: s for s in RECORDED}


# ---------------------------------------------------------------------------------------------- APEX CDF
# δ̂ and δ* are computed this many tokens at a time: their (T, L, N) intermediates stay small on long traces
_CHUNK_TOKENS = 2048


def delta_hat(score: np.ndarray, theta: np.ndarray, tau: float) -> np.ndarray:
    """δ̂(x) = min{δ : σ(θ_δ − wᵀx) ≥ τ} per token and MoE layer (int64, 0..C-1), exact for any τ in (0, 1):
    score (T, L) = wᵀx, theta (L, C) non-decreasing in δ. Where no δ reaches τ, the last (N − k)."""
    logit_tau = np.log(tau / (1.0 - tau))
    theta = np.asarray(theta, dtype=np.float64)
    out = np.empty(np.shape(score), dtype=np.int64)
    for start in range(0, len(out), _CHUNK_TOKENS):
        part = np.asarray(score[start:start + _CHUNK_TOKENS], dtype=np.float64)
        ok = theta[None, :, :] - part[:, :, None] >= logit_tau  # (t, L, C), monotone in δ
        out[start:start + _CHUNK_TOKENS] = np.where(ok.any(axis=-1), ok.argmax(axis=-1), theta.shape[1] - 1)
    return out


def delta_star(rank: np.ndarray, routed: np.ndarray) -> np.ndarray:
    """δ* (T, L) = the smallest δ with every routed expert inside rank[..., :k+δ] (rank (T, L, N) a full
    ranking, routed (T, L, k))."""
    n, k = rank.shape[-1], routed.shape[-1]
    out = np.empty(rank.shape[:-1], dtype=np.int64)
    for start in range(0, len(out), _CHUNK_TOKENS):
        part = rank[start:start + _CHUNK_TOKENS]
        position = np.empty(part.shape, dtype=np.int64)
        np.put_along_axis(position, part.astype(np.int64), np.broadcast_to(np.arange(n), part.shape), axis=-1)
        out[start:start + _CHUNK_TOKENS] = np.take_along_axis(
            position, routed[start:start + _CHUNK_TOKENS].astype(np.int64), axis=-1).max(axis=-1) + 1 - k
    return out
