"""Seeded SYNTHETIC routing traces in the schema-v1 format (`chipsim.trace.format`).

A synthetic trace is for tests, examples and sensitivity sweeps when no recorded trace exists. It is
never a measurement of a model: `meta["synthetic"]` is true, the provenance says SYNTHETIC, and every
statistic the generator aimed for is re-measured on the generated arrays and stored in `meta["measured"]`.

How each array is made (T tokens, L MoE layers, N experts, top-k, M = min(N, 2k), D = 8):

- **popularity**: per layer, a Zipf law p(r) ∝ r^-s over a random permutation of the experts, with
  s = zipf_exponent + U(-zipf_spread, +zipf_spread) per layer (OLMoE: 0.65 overall, 0.45–0.84 per layer).
- **routed_ids** (sequential over tokens, vectorised over layers): token t keeps each expert of token t-1
  with probability q_l and fills the remaining slots by sampling without replacement from the popularity
  law (exponential race = Gumbel top-k; experts dropped from t-1 may be drawn again). q_l is calibrated on
  a pilot run so the measured reuse |S_t ∩ S_{t-1}| / k is close to the per-layer target (reuse ±
  reuse_spread, offsets centred so the layer mean is `reuse`). A target below what popularity alone
  gives (q = 0) cannot be reached; the measured value is stored.
- **router logits z**: non-routed experts get log p + Gumbel; the routed ones are placed above them with
  exponential gaps of mean `router_gap` (ordered by log p + Gumbel). router_rank sorts z;
  router_rank_prob = softmax(z) of its first M entries; routed_weights = those of the routed experts,
  renormalised to sum 1 for models without shared experts (GraniteMoE / Mixtral / OLMoE style), raw
  softmax probabilities for models with shared experts (DeepSeek-V2 / Qwen2-MoE, norm_topk_prob false).
- **difficulty**: every token-layer has a noise level h = exp(difficulty_sigma · g), g standard normal
  with a share `difficulty_token_share` of its variance common to all layers of a token; every
  predictor's noise is scaled by h (hard tokens are hard for all predictors), which gives the δ*
  distribution its long tail. Each predictor also has a per-layer multiplier exp(layer_sigma · N(0,1));
  predictors working from an earlier layer's hidden state get 1 + early_layer_penalty · exp(-s/2) for
  source MoE layer s (AdapMoE measured next-layer overlap lowest from the first layers).
- **apex_rank / promoe_rank / pregate_rank / floe_rank / draft_ids**: Plackett–Luce perturbations of the
  router logits, z + σ · h · multiplier · Gumbel, with σ solved by bisection (on a token subsample, common
  random numbers) so the top-k recall (mean |routed ∩ predicted top-k| / k) matches the target accuracy.
  Next-layer predictors and drafts are NO_EXPERT where their source layer does not exist.
  Draft accuracy at depth d+1 is draft_accuracy · draft_accuracy_decay^d.
- **apex_score / apex_theta**: x = log h + apex_score_noise · N(0,1) (the CDF head sees a noisy view of
  the token's difficulty); a proportional-odds model P(δ* ≤ δ | x) = σ(θ_δ − w x) is fitted per layer by
  Newton's method (maximum likelihood over the cumulative indicators, with half a pseudo-observation of
  each outcome at the mean score so θ stays finite); apex_score = w x, θ refitted with slope 1 on the
  stored float32 score and made non-decreasing. The fit is in-sample (the recorder fits on a training
  split instead).
- **draft_conf**: a fractional logistic regression of the draft's measured recall on a noisy view of its
  noise level, per depth: in [0, 1], calibrated in the mean (mean confidence = mean recall at that depth),
  higher where the draft is more often right; 0 where no draft exists.
- **train_expert_counts**: 20× num_tokens tokens (train_tokens_factor) sampled independently from the
  same popularity law (no reuse: counts only).
- **token_ids**: positions t mod vocab_size, not real tokens.

Everything is drawn from `numpy.random.default_rng(seed)` (split into independent child streams), so
the same parameters give byte-identical files on the same platform and numpy version.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np

import chipsim
from chipsim.errors import InputError, OneLineParser
from chipsim.files import check_output_file
from chipsim.trace import format as fmt
from chipsim.trace import predictor_arrays
from chipsim.workload.hf_config import read_config_file
from chipsim.workload.models import MODELS, ModelShape, get_model, resolve

GENERATOR = "chipsim.tracegen.synthetic"
# tokens x MoE layers x experts the generator may hold as router logits at once: its peak memory is about 13 B a
# logit (20,000 OLMoE tokens, 20.5 M logits: 406 MB resident), so ~3.5 GB here
MAX_LOGITS = 1 << 28
PILOT_TOKENS = (128, 384)  # pilot run calibrating the reuse keep-probabilities: num_tokens clipped to this
CALIBRATION_ROWS = 8192  # token-layers used to solve each predictor's noise scale
REPORT_TAUS = (0.6, 0.75, 0.9, 0.97)
# token-layer-expert elements per working chunk (16 MiB of float64): every (T, L, N) step works through the
# tokens in chunks of this size, so a 32k-token trace is generated in bounded memory. Chunking changes no
# value: each step is per row, the random streams are drawn in the same order, and sums over tokens are
# accumulated row after row as one numpy sum over the token axis does (tests/test_synthetic_trace.py).
CHUNK_ELEMENTS = 1 << 21
_STREAMS = ("popularity", "route", "pilot", "router", "difficulty", "apex", "promoe", "pregate", "floe", "draft", "train")


@dataclass
class SyntheticParams:
    """Knobs of the synthetic generator; every default is documented with where it comes from."""

    num_tokens: int = 1024
    """Decoded tokens T in the trace."""
    seed: int = 0
    """Seed of numpy.random.default_rng; the only source of randomness."""
    zipf_exponent: float = 0.65
    """Mean per-layer Zipf exponent of expert popularity (OLMoE: 0.65 overall, measured on a routing trace of OLMoE)."""
    zipf_spread: float = 0.2
    """Per-layer exponent drawn uniformly in zipf_exponent ± zipf_spread (OLMoE: 0.45–0.84 per layer)."""
    reuse: float = 0.35
    """Target mean probability that an expert routed for token t is routed again at t+1, same layer
    (OLMoE 0.25–0.47 per layer; the random baseline is k/N)."""
    reuse_spread: float = 0.10
    """Per-layer reuse targets spread uniformly ± this around `reuse` (offsets centred on zero)."""
    apex_accuracy: float = 0.85
    """Mean share of routed experts inside the top-k of apex_rank (APEX prefetch-router recall at δ=0)."""
    promoe_accuracy: float = 0.75
    """Top-k recall of the ProMoE predictor (APEX Fig. 8: ProMoE overlap high 70s to high 80s)."""
    pregate_accuracy: float = 0.80
    """Top-k recall of layer l's router applied to layer l-1's hidden state (Mixtral top-2: mean 0.87)."""
    floe_accuracy: float = 0.80
    """Top-k recall of FloE's inter-expert predictor (FloE reports precision 0.88 on Mixtral)."""
    draft_accuracy: float = 0.85
    """Top-k recall of the SPICE draft one layer ahead (depth 1)."""
    draft_accuracy_decay: float = 0.92
    """Draft recall at depth d (1-based) = draft_accuracy · decay^(d-1)."""
    difficulty_sigma: float = 0.6
    """Std of the log noise level per token-layer: the larger, the longer the δ* tail."""
    difficulty_token_share: float = 0.3
    """Share of that log-variance common to all layers of one token (some tokens are hard everywhere)."""
    layer_sigma: float = 0.2
    """Std of each predictor's log noise multiplier per layer (per-layer accuracy varies)."""
    early_layer_penalty: float = 0.5
    """Extra noise 1 + penalty·exp(-s/2) for predictors working from MoE layer s (first layers worst)."""
    apex_score_noise: float = 0.3
    """Std of the noise on the APEX CDF's (and the draft confidence's) view of the log noise level
    (0: they see the token-layer's difficulty exactly)."""
    router_gap: float = 0.25
    """Mean logit gap between consecutive routed experts (how peaked routed_weights are)."""
    router_logit_scale: float = 0.5
    """Scale of the non-routed experts' logits, scale·(log popularity + Gumbel) (how much probability
    mass falls outside the routed set)."""
    train_tokens_factor: int = 20
    """The training split behind train_expert_counts has train_tokens_factor × num_tokens tokens."""


def _check_params(p: SyntheticParams) -> SyntheticParams:
    """Coerce to plain Python numbers (for JSON) and reject out-of-range values with an InputError."""
    out = {}
    for f in fields(SyntheticParams):
        value = getattr(p, f.name)
        kind = int if f.type in ("int", int) else float
        try:
            if isinstance(value, bool) or (kind is int and float(value) != int(value)):
                raise ValueError
            value = kind(value)
        except (TypeError, ValueError):
            raise InputError(f"synthetic.{f.name}: expected a {kind.__name__}, got {value!r}") from None
        if kind is float and not math.isfinite(value):
            raise InputError(f"synthetic.{f.name}: must be finite, got {value!r}")
        out[f.name] = value

    def need(ok: bool, name: str, what: str) -> None:
        if not ok:
            raise InputError(f"synthetic.{name}: must be {what}, got {out[name]!r}")

    need(out["num_tokens"] >= 1, "num_tokens", ">= 1")
    need(out["seed"] >= 0, "seed", ">= 0")
    need(out["zipf_exponent"] >= 0, "zipf_exponent", ">= 0")
    need(out["zipf_spread"] >= 0, "zipf_spread", ">= 0")
    need(0 <= out["reuse"] < 1, "reuse", "in [0, 1)")
    need(out["reuse_spread"] >= 0, "reuse_spread", ">= 0")
    for name in ("apex_accuracy", "promoe_accuracy", "pregate_accuracy", "floe_accuracy", "draft_accuracy"):
        need(0 < out[name] <= 1, name, "in (0, 1]")
    need(0 < out["draft_accuracy_decay"] <= 1, "draft_accuracy_decay", "in (0, 1]")
    need(out["difficulty_sigma"] >= 0, "difficulty_sigma", ">= 0")
    need(0 <= out["difficulty_token_share"] <= 1, "difficulty_token_share", "in [0, 1]")
    need(out["layer_sigma"] >= 0, "layer_sigma", ">= 0")
    need(out["early_layer_penalty"] >= 0, "early_layer_penalty", ">= 0")
    need(out["apex_score_noise"] >= 0, "apex_score_noise", ">= 0")
    need(out["router_gap"] > 0, "router_gap", "> 0")
    need(out["router_logit_scale"] > 0, "router_logit_scale", "> 0")
    need(out["train_tokens_factor"] >= 1, "train_tokens_factor", ">= 1")
    return SyntheticParams(**out)


# ----------------------------------------------------------------------------------------------------
# small numeric helpers


def _sigmoid(u: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * u))  # overflow-free logistic


def _gumbel(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Standard Gumbel noise as float32 (-log of a unit exponential)."""
    e = rng.standard_exponential(shape, dtype=np.float32)
    return -np.log(np.maximum(e, np.finfo(np.float32).tiny, out=e), out=e)


def _onehot(ids: np.ndarray, n: int) -> np.ndarray:
    """(..., k) expert ids -> (..., n) bool membership (NO_EXPERT ignored)."""
    out = np.zeros(ids.shape[:-1] + (n + 1,), dtype=bool)
    np.put_along_axis(out, np.minimum(ids.astype(np.int64), n), True, axis=-1)
    return out[..., :n]


def _topk_recall(scores: np.ndarray, routed: np.ndarray, k: int) -> float:
    """Mean |routed ∩ top-k(scores)| / k over rows; scores (R, N) float, routed (R, N) bool."""
    n = scores.shape[-1]
    kth = np.partition(scores, n - k, axis=-1)[:, n - k : n - k + 1]
    return float(((scores >= kth) & routed).sum() / (scores.shape[0] * k))


def _solve_noise(z: np.ndarray, routed: np.ndarray, mult: np.ndarray, noise: np.ndarray, k: int, target: float) -> float:
    """σ such that top-k recall of z + σ·mult·noise is `target` (bisection on log σ, common random numbers)."""
    n = z.shape[-1]
    target = max(target, k / n + 0.01)  # infinite noise gives uniform ranking: recall k/N
    if target >= 1.0:
        return 0.0
    scaled = mult[:, None] * noise
    lo, hi = math.log(1e-3), math.log(1e3)
    for _ in range(22):  # relative precision ~1e-5 in σ
        mid = 0.5 * (lo + hi)
        if _topk_recall(z + math.exp(mid) * scaled, routed, k) > target:
            lo = mid  # still too accurate: more noise
        else:
            hi = mid
    return math.exp(0.5 * (lo + hi))


def _chunks(n_tokens: int, per_token: int, first: int = 1) -> list[tuple[int, int]]:
    """Token ranges [a, b) covering 0..n_tokens in order, CHUNK_ELEMENTS / per_token tokens each, the first
    at least `first` tokens (a calibration subsample drawn before the rest)."""
    size = max(1, CHUNK_ELEMENTS // max(per_token, 1))
    bounds, start, stop = [], 0, min(n_tokens, max(size, first))
    while start < n_tokens:
        bounds.append((start, stop))
        start, stop = stop, min(n_tokens, stop + size)
    return bounds


def _token_sum(total: np.ndarray | None, part: np.ndarray) -> np.ndarray:
    """total + the rows of `part` added one after another: chunk by chunk, the same float sum as one numpy
    sum over axis 0 of the whole array (which adds its rows in order)."""
    return part.sum(axis=0) if total is None else np.concatenate([total[None], part]).sum(axis=0)


def _top_ids(scores: np.ndarray, m: int) -> np.ndarray:
    """Ids of the m highest scores along the last axis, highest first."""
    if m < scores.shape[-1]:
        top = np.argpartition(-scores, m - 1, axis=-1)[..., :m]
        order = np.argsort(-np.take_along_axis(scores, top, axis=-1), axis=-1, kind="stable")
        return np.take_along_axis(top, order, axis=-1)
    return np.argsort(-scores, axis=-1, kind="stable")


# ----------------------------------------------------------------------------------------------------
# routing


def _popularity(rng: np.random.Generator, n_layers: int, n: int, p: SyntheticParams) -> tuple[np.ndarray, np.ndarray]:
    """Per-layer Zipf exponents (L,) and popularity (L, N) over a random permutation of the experts."""
    exps = np.maximum(p.zipf_exponent + rng.uniform(-p.zipf_spread, p.zipf_spread, size=n_layers), 0.0)
    ranks = np.arange(1, n + 1, dtype=np.float64)
    pop = np.empty((n_layers, n))
    for layer in range(n_layers):
        pop[layer, rng.permutation(n)] = ranks ** -exps[layer]
    return exps, pop / pop.sum(axis=1, keepdims=True)


def _route(pop: np.ndarray, keep_p: np.ndarray, race: np.ndarray, keep_u: np.ndarray, k: int) -> np.ndarray:
    """Routed sets (T, L, k) (unordered): keep each of token t-1's experts with probability keep_p[l],
    fill the rest without replacement from the popularity law (exponential race: k smallest E/p)."""
    return _route_keys(race / pop[None].astype(np.float32), keep_p, keep_u, k)


def _route_keys(keys: np.ndarray, keep_p: np.ndarray, keep_u: np.ndarray, k: int) -> np.ndarray:
    """`_route` on the race keys E/p (T, L, N) float32, smaller = drawn first; overwrites `keys`."""
    n_tokens, n_layers, _ = keys.shape
    rows = np.arange(n_layers)[:, None]
    out = np.empty((n_tokens, n_layers, k), dtype=np.int64)
    cur = np.argpartition(keys[0], k - 1, axis=-1)[:, :k]
    out[0] = cur
    for t in range(1, n_tokens):
        kk = keys[t]
        keep = keep_u[t] < keep_p[:, None]
        kk[rows, cur] = np.where(keep, -1.0, kk[rows, cur])  # kept experts win the race
        cur = np.argpartition(kk, k - 1, axis=-1)[:, :k]
        out[t] = cur
    return out


def _reuse_per_layer(ids: np.ndarray, n: int) -> np.ndarray:
    """Mean |S_t ∩ S_{t-1}| / k per layer over t = 1..T-1 (NaN when T = 1)."""
    if ids.shape[0] < 2:
        return np.full(ids.shape[1], np.nan)
    member = _onehot(ids, n)
    return (member[1:] & member[:-1]).sum(axis=-1).mean(axis=0) / ids.shape[-1]


def _calibrate_keep(
    rng: np.random.Generator, pop: np.ndarray, targets: np.ndarray, k: int, n_pilot: int
) -> tuple[np.ndarray, np.ndarray]:
    """Keep-probabilities q_l that give the target reuse on a pilot run; also the q=0 reuse (baseline)."""
    n_layers, n = pop.shape
    race = rng.standard_exponential((n_pilot, n_layers, n), dtype=np.float32)
    keep_u = rng.random((n_pilot, n_layers, k))

    def measure(q: np.ndarray) -> np.ndarray:
        return _reuse_per_layer(_route(pop, q, race, keep_u, k), n)

    base = measure(np.zeros(n_layers))
    q = np.clip((targets - base) / np.maximum(1.0 - base, 1e-6), 0.0, 0.99)
    for _ in range(3):
        q = np.clip(q + (targets - measure(q)) / np.maximum(1.0 - base, 1e-6), 0.0, 0.99)
    return q, base


def _router_logits(
    rng: np.random.Generator, pop: np.ndarray, routed: np.ndarray, gap: float, scale: float
) -> tuple[np.ndarray, np.ndarray]:
    """Router logits z (T, L, N) with the routed experts on top, and routed ids ordered by descending z."""
    n_tokens, n_layers, k = routed.shape
    n = pop.shape[1]
    logp = np.log(pop)[None]
    z = np.empty((n_tokens, n_layers, n))
    best_other = np.zeros((n_tokens, n_layers))
    chunks = _chunks(n_tokens, n_layers * n)
    for a, b in chunks:
        z[a:b] = scale * (logp + _gumbel(rng, (b - a, n_layers, n))).astype(np.float64)
        if k < n:
            best_other[a:b] = np.where(_onehot(routed[a:b], n), -np.inf, z[a:b]).max(axis=-1)
    # order the routed experts by popularity + Gumbel (popular experts tend to weigh more)
    ordered = np.empty_like(routed)
    for a, b in chunks:
        order_key = np.take_along_axis(logp + _gumbel(rng, (b - a, n_layers, n)), routed[a:b], axis=-1)
        ordered[a:b] = np.take_along_axis(routed[a:b], np.argsort(-order_key, axis=-1, kind="stable"), axis=-1)
    gaps = rng.exponential(gap, size=(n_tokens, n_layers, k)) + 1e-3  # strict order
    for a, b in chunks:
        top_values = best_other[a:b, :, None] + np.cumsum(gaps[a:b], axis=-1)[..., ::-1]  # descending
        np.put_along_axis(z[a:b], ordered[a:b], top_values, axis=-1)
    return z, ordered


def _noisy_top_ids(
    rng: np.random.Generator, z: np.ndarray, routed: np.ndarray, mult: np.ndarray, k: int, target: float,
    calib_tokens: int, out: np.ndarray,
) -> float:
    """A Plackett–Luce predictor: top ids of z + σ·mult·Gumbel (T, L', N) written into `out` (T, L', m),
    σ solved on the first `calib_tokens` tokens so the top-k recall is `target`; returns σ. The noise is
    drawn chunk by chunk from `rng` (the same numbers as one draw of the whole array)."""
    n_tokens, n_layers, n = z.shape
    sigma = None
    for a, b in _chunks(n_tokens, n_layers * n, first=calib_tokens):
        noise = _gumbel(rng, (b - a, n_layers, n))
        if sigma is None:
            c = slice(0, calib_tokens)
            sigma = _solve_noise(z[c].reshape(-1, n), routed[c].reshape(-1, n), mult[c].reshape(-1),
                                 noise[c].reshape(-1, n), k, target)
        out[a:b] = _top_ids(z[a:b] + sigma * mult[a:b][..., None] * noise, out.shape[-1])
    return sigma


# ----------------------------------------------------------------------------------------------------
# APEX ordinal-logistic CDF


def _fit_cdf(x: np.ndarray, dstar: np.ndarray, n_thresholds: int, fit_slope: bool, iters: int = 60) -> tuple[np.ndarray, np.ndarray]:
    """Per-layer maximum-likelihood fit of P(δ* ≤ δ | x) = σ(θ_δ − w·x) over all cumulative indicators.

    x, dstar: (T, L). Returns θ (L, C) and w (L,) (w = 1 when fit_slope is false). Half a pseudo-observation
    of each outcome at the mean x per (layer, δ) keeps θ finite when an indicator is all 0 or all 1.
    Newton's method on the concave log-likelihood; the Hessian is arrow-shaped (θ diagonal + w), solved
    by its Schur complement.
    """
    n_tokens, n_layers = x.shape
    deltas = np.arange(n_thresholds)
    chunks = _chunks(n_tokens, n_layers * n_thresholds)
    # the cumulative indicators δ* ≤ δ per chunk, once (bool: 1 byte each; they take part as 0.0 / 1.0)
    y_chunks = [dstar[a:b, :, None] <= deltas for a, b in chunks]
    y_sum = None
    for y in y_chunks:
        y_sum = _token_sum(y_sum, y.astype(np.float64))  # (L, C)
    xbar = x.mean(axis=0)  # (L,)
    freq = (y_sum + 0.5) / (n_tokens + 1.0)
    w = np.zeros(n_layers) if fit_slope else np.ones(n_layers)
    theta = np.log(freq / (1.0 - freq)) + w[:, None] * xbar[:, None]
    for _ in range(iters):
        r_sum = v_sum = xr_sum = xv_sum = xxv_sum = None
        for (a, b), y in zip(chunks, y_chunks):  # the sums over tokens of the (T, L, C) terms, chunk by chunk
            x3 = x[a:b, :, None]
            s = _sigmoid(theta[None] - w[None, :, None] * x3)
            v = s * (1.0 - s)
            r = y - s
            r_sum = _token_sum(r_sum, r)
            v_sum = _token_sum(v_sum, v)
            if fit_slope:
                xr_sum = _token_sum(xr_sum, (x3 * r).sum(axis=2))
                xv_sum = _token_sum(xv_sum, x3 * v)
                xxv_sum = _token_sum(xxv_sum, (x3 * x3 * v).sum(axis=2))
        sb = _sigmoid(theta - (w * xbar)[:, None])
        vb = sb * (1.0 - sb)
        rb = 0.5 - sb
        g_theta = r_sum + rb  # (L, C)
        a = v_sum + vb + 1e-12
        if fit_slope:
            g_w = -xr_sum - xbar * rb.sum(axis=1)
            b = xv_sum + xbar[:, None] * vb
            e = xxv_sum + xbar**2 * vb.sum(axis=1)
            dw = (g_w + (b * g_theta / a).sum(axis=1)) / np.maximum(e - (b * b / a).sum(axis=1), 1e-12)
            dw = np.clip(dw, -2.0, 2.0)
            dtheta = (g_theta + b * dw[:, None]) / a
        else:
            dw = np.zeros(n_layers)
            dtheta = g_theta / a
        dtheta = np.clip(dtheta, -4.0, 4.0)
        theta = theta + dtheta
        w = w + dw
        if max(np.abs(dtheta).max(), np.abs(dw).max()) < 1e-10:
            break
    return np.maximum.accumulate(theta, axis=1), w


def _fit_fractional_logit(f: np.ndarray, y: np.ndarray, iters: int = 50) -> tuple[float, float]:
    """(a, b) maximising Σ y log σ(a + b f) + (1 − y) log(1 − σ(a + b f)) for y in [0, 1] (Newton)."""
    a = float(np.log((y.mean() + 1e-3) / (1.0 - y.mean() + 1e-3)))
    b = 0.0
    for _ in range(iters):
        s = _sigmoid(a + b * f)
        r = y - s
        v = s * (1.0 - s) + 1e-12
        g = np.array([r.sum(), (f * r).sum()])
        h = np.array([[v.sum(), (f * v).sum()], [(f * v).sum(), (f * f * v).sum()]]) + 1e-9 * np.eye(2)
        step = np.clip(np.linalg.solve(h, g), -4.0, 4.0)
        a, b = a + float(step[0]), b + float(step[1])
        if np.abs(step).max() < 1e-10:
            break
    return a, b


# ----------------------------------------------------------------------------------------------------
# the generator


def _model_meta(model: ModelShape) -> dict:
    return {
        "name": model.name,
        "hf_architecture": model.hf_architecture,
        "num_layers": model.num_layers,
        "first_dense_layers": model.first_dense_layers,
        "num_experts": model.num_experts,
        "top_k": model.top_k,
        "num_shared_experts": model.num_shared_experts,
    }


def _r(value) -> float | None:
    """A JSON-friendly rounded float (None for NaN)."""
    value = float(value)
    return None if not math.isfinite(value) else round(value, 6)


@dataclass
class _RoutingDraws:
    """What the routing was drawn from, per layer: recorded in the provenance and the measured statistics."""

    zipf_s: np.ndarray  # (L,) Zipf exponents
    pop: np.ndarray  # (L, N) popularity
    reuse_targets: np.ndarray  # (L,) aimed-for reuse
    keep_p: np.ndarray  # (L,) keep-probabilities calibrated to reach it
    reuse_base: np.ndarray  # (L,) the reuse popularity alone gives (q = 0)


@dataclass
class _DraftStats:
    """Per draft depth (1..D): the noise scale solved, the recall aimed for and measured, and the confidence's
    mean and correlation with the recall; None where the depth reaches before the first layer."""

    sigma: list = field(default_factory=list)
    target: list = field(default_factory=list)
    recall: list = field(default_factory=list)
    conf_mean: list = field(default_factory=list)
    conf_corr: list = field(default_factory=list)


def _check_model(model: ModelShape) -> None:
    if model.num_moe_layers < 1:
        raise InputError(f"model {model.name}: has no MoE layers")
    if not 1 <= model.top_k < model.num_experts or model.num_experts > fmt.NO_EXPERT:
        raise InputError(f"model {model.name}: needs 1 <= top_k < num_experts <= {fmt.NO_EXPERT}")


def _draw_routing(streams: dict, n_tokens: int, n_layers: int, n: int, k: int,
                  p: SyntheticParams) -> tuple[_RoutingDraws, np.ndarray]:
    """Popularity and the routed sets (T, L, k) (unordered) with token-to-token reuse calibrated on a pilot run."""
    zipf_s, pop = _popularity(streams["popularity"], n_layers, n, p)
    offsets = streams["popularity"].uniform(-p.reuse_spread, p.reuse_spread, size=n_layers)
    reuse_targets = np.clip(p.reuse + offsets - offsets.mean(), 0.0, 0.99)
    n_pilot = min(max(n_tokens, PILOT_TOKENS[0]), PILOT_TOKENS[1])
    keep_p, reuse_base = _calibrate_keep(streams["pilot"], pop, reuse_targets, k, n_pilot)
    rng = streams["route"]
    keys = rng.standard_exponential((n_tokens, n_layers, n), dtype=np.float32)
    keep_u = rng.random((n_tokens, n_layers, k))
    np.divide(keys, pop[None].astype(np.float32), out=keys)  # race keys E/p, in place
    routed_sets = _route_keys(keys, keep_p, keep_u, k)
    return _RoutingDraws(zipf_s, pop, reuse_targets, keep_p, reuse_base), routed_sets


def _router_arrays(z: np.ndarray, k: int, m: int, renormalise: bool) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """router_rank, router_rank_prob and routed_weights from the logits (softmax), and the softmax mass of the
    routed experts (T, L); the weights renormalised to sum 1 when `renormalise` (no shared experts)."""
    n_tokens, n_layers, n = z.shape
    router_rank = np.empty((n_tokens, n_layers, n), dtype=np.uint8)
    router_rank_prob = np.empty((n_tokens, n_layers, m), dtype=np.float16)
    routed_weights = np.empty((n_tokens, n_layers, k), dtype=np.float16)
    routed_mass = np.empty((n_tokens, n_layers))
    for a, b in _chunks(n_tokens, n_layers * n):
        probs = np.exp(z[a:b] - z[a:b].max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        rank = _top_ids(z[a:b], n)
        rank_prob = np.take_along_axis(probs, rank[..., :m], axis=-1)
        routed_prob = rank_prob[..., :k]
        router_rank[a:b] = rank
        router_rank_prob[a:b] = rank_prob
        routed_mass[a:b] = routed_prob.sum(axis=-1)
        if renormalise:
            routed_weights[a:b] = routed_prob / routed_prob.sum(axis=-1, keepdims=True)
        else:
            routed_weights[a:b] = routed_prob
    arrays = {"routed_weights": routed_weights, "router_rank": router_rank, "router_rank_prob": router_rank_prob}
    return arrays, routed_mass


def _log_difficulty(rng: np.random.Generator, n_tokens: int, n_layers: int, p: SyntheticParams) -> np.ndarray:
    """log h (T, L): the noise level per token-layer shared by all predictors, part of it common to a token."""
    share = p.difficulty_token_share
    g = math.sqrt(share) * rng.standard_normal((n_tokens, 1)) + math.sqrt(1.0 - share) * rng.standard_normal((n_tokens, n_layers))
    return p.difficulty_sigma * g


def _early(p: SyntheticParams, source_layer: np.ndarray) -> np.ndarray:
    """Noise multiplier of a predictor working from MoE layer `source_layer` (the first layers worst)."""
    return 1.0 + p.early_layer_penalty * np.exp(-source_layer / 2.0)


def _apex_rank(rng: np.random.Generator, z: np.ndarray, routed: np.ndarray, h: np.ndarray, k: int,
               p: SyntheticParams, calib_tokens: int) -> tuple[np.ndarray, float]:
    """The APEX prefetch router's same-layer ranking (T, L, N) and its noise scale."""
    apex_layer_mult = np.exp(p.layer_sigma * rng.standard_normal(z.shape[1]))
    apex_rank = np.empty(z.shape, dtype=np.uint8)
    sigma = _noisy_top_ids(rng, z, routed, h * apex_layer_mult[None], k, p.apex_accuracy, calib_tokens, apex_rank)
    return apex_rank, sigma


def _next_layer_ranks(streams: dict, z: np.ndarray, routed: np.ndarray, h: np.ndarray, k: int, m: int,
                      p: SyntheticParams, calib_tokens: int) -> tuple[dict[str, np.ndarray], dict[str, float | None]]:
    """ProMoE, Pre-gated and FloE rankings (T, L, m) for layer l from layer l-1 (NO_EXPERT at layer 0), and
    their noise scales (None with one MoE layer)."""
    n_tokens, n_layers, _ = z.shape
    layer_idx = np.arange(n_layers)
    next_layer, next_layer_sigma = {}, {}
    for name, target in (("promoe", p.promoe_accuracy), ("pregate", p.pregate_accuracy), ("floe", p.floe_accuracy)):
        rng = streams[name]
        ranks = np.full((n_tokens, n_layers, m), fmt.NO_EXPERT, dtype=np.uint8)
        layer_mult = np.exp(p.layer_sigma * rng.standard_normal(n_layers))
        sigma = None
        if n_layers > 1:
            mult = h[:, 1:] * (layer_mult * _early(p, layer_idx - 1.0))[None, 1:]
            sigma = _noisy_top_ids(rng, z[:, 1:], routed[:, 1:], mult, k, target, calib_tokens, ranks[:, 1:])
        next_layer[name] = ranks
        next_layer_sigma[name] = sigma
    return next_layer, next_layer_sigma


def _drafts(rng: np.random.Generator, z: np.ndarray, routed: np.ndarray, h: np.ndarray, k: int, p: SyntheticParams,
            calib_tokens: int) -> tuple[np.ndarray, np.ndarray, _DraftStats]:
    """SPICE drafts: draft_ids (T, L, D, k) for layer l made d+1 layers earlier, their confidence draft_conf
    (T, L, D) and the statistics per depth."""
    n_tokens, n_layers, _ = z.shape
    depth = fmt.DRAFT_DEPTH
    layer_idx = np.arange(n_layers)
    draft_ids = np.full((n_tokens, n_layers, depth, k), fmt.NO_EXPERT, dtype=np.uint8)
    draft_conf = np.zeros((n_tokens, n_layers, depth), dtype=np.float16)
    draft_layer_mult = np.exp(p.layer_sigma * rng.standard_normal(n_layers))
    stats = _DraftStats()
    for d in range(depth):
        target = p.draft_accuracy * p.draft_accuracy_decay**d
        stats.target.append(_r(target))
        if d + 1 >= n_layers:
            for column in (stats.sigma, stats.recall, stats.conf_mean, stats.conf_corr):
                column.append(None)
            continue
        source = layer_idx[d + 1 :] - (d + 1.0)
        mult = h[:, d + 1 :] * (draft_layer_mult[d + 1 :] * _early(p, source))[None]
        rr = routed[:, d + 1 :]
        ids = draft_ids[:, d + 1 :, d, :]
        sigma = _noisy_top_ids(rng, z[:, d + 1 :], rr, mult, k, target, calib_tokens, ids)
        correct = np.take_along_axis(rr, ids.astype(np.intp), axis=-1).sum(axis=-1) / k  # (T, L-d-1)
        # the draft's confidence: a calibrated function of a noisy view of its own noise level
        feature = -np.log(max(sigma, 1e-6) * mult) + p.apex_score_noise * rng.standard_normal(mult.shape)
        a, b = _fit_fractional_logit(feature.reshape(-1), correct.reshape(-1))
        conf = _sigmoid(a + b * feature)
        draft_conf[:, d + 1 :, d] = conf.astype(np.float16)
        stats.sigma.append(_r(sigma))
        stats.recall.append(_r(correct.mean()))
        stats.conf_mean.append(_r(conf.mean()))
        stats.conf_corr.append(_r(np.corrcoef(conf.reshape(-1), correct.reshape(-1))[0, 1]) if correct.std() > 0 and conf.std() > 0 else None)
    return draft_ids, draft_conf, stats


def _train_counts(rng: np.random.Generator, pop: np.ndarray, k: int, n_train: int) -> np.ndarray:
    """(L, N) expert counts of `n_train` independent tokens from the popularity law (no reuse)."""
    n_layers, n = pop.shape
    train_counts = np.zeros((n_layers, n), dtype=np.int64)
    inv_pop = (1.0 / pop)[None].astype(np.float32)
    for start in range(0, n_train, 2048):
        size = min(2048, n_train - start)
        keys = rng.standard_exponential((size, n_layers, n), dtype=np.float32) * inv_pop
        picked = np.argpartition(keys, k - 1, axis=-1)[..., :k]
        train_counts += _onehot(picked, n).sum(axis=0)
    return train_counts


def _apex_cdf(rng: np.random.Generator, log_h: np.ndarray, dstar: np.ndarray, n_thresholds: int,
              p: SyntheticParams) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """apex_score (T, L) float32 and apex_theta (L, C) float32, non-decreasing: a latent score from the
    token-layer's difficulty, fitted to the oracle δ*; and the fitted slope per layer."""
    x = log_h + p.apex_score_noise * rng.standard_normal(log_h.shape)
    _, w = _fit_cdf(x, dstar, n_thresholds, fit_slope=True)
    score = (w[None] * x).astype(np.float32)
    theta, _ = _fit_cdf(score.astype(np.float64), dstar, n_thresholds, fit_slope=False)
    return score, np.maximum.accumulate(theta.astype(np.float32), axis=1), w


def _measured(arrays: dict[str, np.ndarray], routed: np.ndarray, routed_mass: np.ndarray, draws: _RoutingDraws,
              dstar: np.ndarray, drafts: _DraftStats, n: int, k: int) -> dict:
    """Every statistic the generator aimed for, measured on the generated arrays."""
    n_tokens, n_layers, _ = routed.shape
    reuse_layer = _reuse_per_layer(arrays["routed_ids"], n)
    apex_member = _onehot(arrays["apex_rank"][..., :k], n)
    apex_recall_layer = (apex_member & routed).sum(axis=(0, 2)) / (n_tokens * k)
    measured = {
        "reuse": _r(np.nanmean(reuse_layer)) if n_tokens > 1 else None,
        "reuse_per_layer": [_r(v) for v in reuse_layer],
        "reuse_random_baseline": _r(k / n),
        "reuse_popularity_baseline": _r(draws.reuse_base.mean()),
        "routed_weight_mass": _r(routed_mass.mean()),
        "apex_topk_recall": _r(apex_recall_layer.mean()),
        "apex_topk_recall_per_layer": [_r(v) for v in apex_recall_layer],
        "mean_delta_star": _r(dstar.mean()),
        "delta_star_quantiles": {q: int(np.quantile(dstar, float(q), method="lower")) for q in ("0.5", "0.9", "0.99")},
        "delta_star_max": int(dstar.max()),
        "delta_star_zero_share": _r((dstar == 0).mean()),
    }
    for name in ("promoe", "pregate", "floe"):
        if n_layers > 1:
            hit = _onehot(arrays[f"{name}_rank"][:, 1:, :k], n) & routed[:, 1:]
            measured[f"{name}_recall"] = _r(hit.sum() / (n_tokens * (n_layers - 1) * k))
        else:
            measured[f"{name}_recall"] = None
    measured["draft_recall_by_depth"] = drafts.recall
    measured["draft_conf_mean_by_depth"] = drafts.conf_mean
    measured["draft_conf_recall_corr_by_depth"] = drafts.conf_corr
    cdf = {"tau": list(REPORT_TAUS), "mean_delta_hat": [], "coverage": []}
    for tau in REPORT_TAUS:
        dhat = predictor_arrays.delta_hat(arrays["apex_score"], arrays["apex_theta"], tau)
        cdf["mean_delta_hat"].append(_r(dhat.mean()))
        cdf["coverage"].append(_r((dstar <= dhat).mean()))
    measured["apex_cdf"] = cdf
    train_counts = arrays["train_expert_counts"]
    train_share = train_counts / train_counts.sum(axis=1, keepdims=True)
    measured["train_popularity_top1_share"] = _r(train_share.max(axis=1).mean())
    return measured


def _provenance(p: SyntheticParams, draws: _RoutingDraws, noise_scale: dict, drafts: _DraftStats, apex_slope: np.ndarray,
                n_train: int) -> dict:
    """meta['provenance']: what was asked for and every number drawn on the way."""
    description = (
        f"SYNTHETIC generator (no model was run), seed {p.seed}, {p.num_tokens} tokens, zipf {p.zipf_exponent}"
        f"±{p.zipf_spread}, reuse {p.reuse}±{p.reuse_spread}, apex top-k recall {p.apex_accuracy}, "
        f"promoe {p.promoe_accuracy}, pregate {p.pregate_accuracy}, floe {p.floe_accuracy}, draft "
        f"{p.draft_accuracy}×{p.draft_accuracy_decay}^(d-1)"
    )
    return {
        "description": description,
        "generator": GENERATOR,
        "chipsim_version": chipsim.__version__,
        "params": asdict(p),
        "token_ids": "positions t mod vocab_size, not real tokens",
        "apex_cdf_fit": "in-sample proportional-odds fit on this trace's own δ*",
        "draws": {
            "zipf_exponent_per_layer": [_r(v) for v in draws.zipf_s],
            "reuse_target_per_layer": [_r(v) for v in draws.reuse_targets],
            "reuse_keep_probability_per_layer": [_r(v) for v in draws.keep_p],
            "noise_scale": {
                **{name: (_r(s) if s is not None else None) for name, s in noise_scale.items()},
                "draft_by_depth": drafts.sigma,
            },
            "draft_target_by_depth": drafts.target,
            "apex_cdf_slope_per_layer": [_r(v) for v in apex_slope],
            "train_tokens": n_train,
        },
    }


def generate(model: ModelShape | str, params: SyntheticParams | None = None) -> tuple[dict[str, np.ndarray], dict]:
    """Generate a complete schema-v1 trace for `model`: (arrays, meta), ready for `format.save`."""
    if isinstance(model, str):
        model = get_model(model)
    p = _check_params(params if params is not None else SyntheticParams())
    _check_model(model)
    n, k = model.num_experts, model.top_k
    n_layers, n_tokens = model.num_moe_layers, p.num_tokens
    if n_tokens * n_layers * n > MAX_LOGITS:
        raise InputError(f"synthetic.num_tokens {n_tokens:,}: x {n_layers} MoE layers x {n} experts is more router "
                         f"logits than the {MAX_LOGITS:,} the generator holds at once (~13 B each at its peak): at "
                         f"most {MAX_LOGITS // (n_layers * n):,} tokens of {model.name}")
    streams = dict(zip(_STREAMS, np.random.default_rng(p.seed).spawn(len(_STREAMS))))
    draws, routed_sets = _draw_routing(streams, n_tokens, n_layers, n, k, p)
    z, routed_ids = _router_logits(streams["router"], draws.pop, routed_sets, p.router_gap, p.router_logit_scale)
    del routed_sets
    routed_ids = routed_ids.astype(np.uint8)
    routed = _onehot(routed_ids, n)
    router, routed_mass = _router_arrays(z, k, min(n, 2 * k), model.num_shared_experts == 0)
    log_h = _log_difficulty(streams["difficulty"], n_tokens, n_layers, p)
    h = np.exp(log_h)
    calib_tokens = max(1, min(n_tokens, -(-CALIBRATION_ROWS // n_layers)))
    apex_rank, sigma_apex = _apex_rank(streams["apex"], z, routed, h, k, p, calib_tokens)
    next_layer, next_layer_sigma = _next_layer_ranks(streams, z, routed, h, k, min(n, 2 * k), p, calib_tokens)
    draft_ids, draft_conf, drafts = _drafts(streams["draft"], z, routed, h, k, p, calib_tokens)
    del z
    dstar = predictor_arrays.delta_star(apex_rank, routed_ids)
    apex_score, apex_theta, apex_slope = _apex_cdf(streams["apex"], log_h, dstar, n - k + 1, p)
    n_train = p.train_tokens_factor * n_tokens
    arrays = {
        "routed_ids": routed_ids,
        **router,
        "apex_rank": apex_rank,
        "apex_score": apex_score,
        "apex_theta": apex_theta,
        "promoe_rank": next_layer["promoe"],
        "pregate_rank": next_layer["pregate"],
        "floe_rank": next_layer["floe"],
        "draft_ids": draft_ids,
        "draft_conf": draft_conf,
        "train_expert_counts": _train_counts(streams["train"], draws.pop, k, n_train),
        "moe_layers": np.arange(model.first_dense_layers, model.num_layers, dtype=np.int16),
        "token_ids": (np.arange(n_tokens) % model.vocab_size).astype(np.int32),
    }
    meta = {
        "synthetic": True,
        "model": _model_meta(model),
        "provenance": _provenance(p, draws, {"apex": sigma_apex, **next_layer_sigma}, drafts, apex_slope, n_train),
        "measured": _measured(arrays, routed, routed_mass, draws, dstar, drafts, n, k),
        "predictor_metrics": {},
        "quality": {},
    }
    return arrays, meta


def write(path: str | os.PathLike, model: ModelShape | str, params: SyntheticParams | None = None) -> dict:
    """Generate and save a synthetic trace; returns its meta (as saved, with schema_version)."""
    arrays, meta = generate(model, params)
    fmt.save(path, arrays, meta, specs=predictor_arrays.RECORDED)
    return dict(meta, schema_version=fmt.SCHEMA_VERSION)


def summary_line(path: str | os.PathLike, meta: dict) -> str:
    """One line: file, size and the measured statistics."""
    ms = meta["measured"]
    cdf = ms["apex_cdf"]
    i90 = cdf["tau"].index(0.9)
    drafts = [v for v in ms["draft_recall_by_depth"] if v is not None]

    def f(v) -> str:
        return "n/a" if v is None else f"{v:.3f}"

    return (
        f"{path}: {os.path.getsize(path) / 1024:.1f} KiB, {meta['model']['name']}, "
        f"{len(ms['reuse_per_layer'])} MoE layers, SYNTHETIC; reuse {f(ms['reuse'])}, apex top-k recall "
        f"{f(ms['apex_topk_recall'])}, promoe {f(ms['promoe_recall'])}, pregate {f(ms['pregate_recall'])}, "
        f"floe {f(ms['floe_recall'])}, draft d1 {f(drafts[0] if drafts else None)} d{len(drafts)} "
        f"{f(drafts[-1] if drafts else None)}, mean δ* {f(ms['mean_delta_star'])}, "
        f"δ̂@0.9 {f(cdf['mean_delta_hat'][i90])} (coverage {f(cdf['coverage'][i90])})"
    )


def _parse_set(items: list[str]) -> dict:
    known = {f.name: f for f in fields(SyntheticParams) if f.name not in ("num_tokens", "seed")}  # --tokens, --seed
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in known:
            raise InputError(f"--set {item!r}: expected KEY=VALUE with KEY one of {', '.join(known)}")
        try:
            out[key] = float(value)
        except ValueError:
            raise InputError(f"--set {item!r}: {value!r} is not a number") from None
    return out


def _shape(args) -> ModelShape:
    """The shape --model names (as `chipsim models NAME|PATH` reads it) or --model-config's config.json describes."""
    if args.model_config is not None:
        return read_config_file(args.model_config, "--model-config")
    return resolve(args.model)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(
        prog="python -m chipsim.tracegen.synthetic",
        description="Write a seeded SYNTHETIC routing trace (schema v1) for a model shape.",
    )
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", help=f"a bundled shape ({', '.join(sorted(MODELS))}), or a bundled-style YAML file")
    which.add_argument("--model-config", metavar="CONFIG_JSON", help="a Hugging Face config.json: the shape it describes")
    parser.add_argument("--tokens", type=int, default=SyntheticParams.num_tokens, help="decoded tokens (default 1024)")
    parser.add_argument("--seed", type=int, default=SyntheticParams.seed, help="random seed (default 0)")
    parser.add_argument("--out", required=True, help="output .npz path")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a SyntheticParams field")
    args = parser.parse_args(argv)
    try:
        overrides = _parse_set(args.set)
        params = SyntheticParams(num_tokens=args.tokens, seed=args.seed, **overrides)
        out = Path(args.out)
        check_output_file(str(out), "--out")  # before generating: a folder, a FIFO or an unwritable place
        meta = write(out, _shape(args), params)
    except InputError as exc:
        print(f"chipsim: error: {exc}", file=sys.stderr)
        return 2
    print(summary_line(out, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
