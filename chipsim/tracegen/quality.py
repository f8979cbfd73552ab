"""Quality cost of the approximate policy modes, measured as held-out perplexity on the trained model.

Three modes change what a MoE layer computes; each is applied to the live model through hooks on its
MoE blocks (`block.experts(hidden, top_k_index, top_k_weights)`, the interface every supported
transformers class uses) and scored on the trace's own held-out windows, teacher-forced, against the
unmodified model on the same tokens:

- `apex_sf` (APEX stall-free, at each τ): the prefetched set of a token-layer is the top-(k+δ̂) of the
  trace's `apex_rank`, δ̂ from its CDF at τ. A routed expert outside it is replaced by the prefetched,
  non-routed expert the original router ranks highest (`router_rank`), each used once, with the replaced
  expert's gate weight; with none left it is dropped (weight 0). This is the simulator's apex-sf rule
  with "present at routing" read as "prefetched" (apex-sf waits for a prefetch on its way).
- `pregated` (Pre-gated MoE): layer l runs the experts and gate weights that layer l's router gives on
  layer l−1's FFN input (computed live, so a deviation at l−1 carries into l's pre-gate); the first MoE
  layer without an earlier layer runs its own router, as the policy does.
- `spice_lore` (SPICE surrogates, models with shared experts: DeepSeek's, Qwen2-MoE's gated one): when the depth-1 draft's confidence of a
  token-layer is below `confidence`, each routed expert the draft did not predict is replaced by
  shared(x) + B_e·A_e·x with the expert's gate weight. B_e·A_e (rank r) is a reduced-rank least-squares
  fit of expert_e(x) − shared(x) on the FFN inputs the training split routed to e (ridge 1e-3 of the
  mean eigenvalue). Variants: `drop` (the missed experts' outputs left out), `shared` (rank 0) and each
  rank. The rule ignores the SPICE cache (an expert cached from an earlier token is not a miss), so it
  surrogates more experts than the simulator's runs do: an upper bound on SPICE's quality cost.

- `adapmoe` (AdapMoE's adaptive gating, at each threshold; models routing more than two experts): a token-layer's
  routed experts, by descending gate weight normalised to sum 1, are kept until their cumulative weight reaches the
  threshold and the rest left out (weight 0, the kept ones' weights as routed): the simulator's rule
  (chipsim.policies.caching.AdapMoE._keep_count). Decisions come from the live router's weights.

- `floe` (FloE's compressed experts, chipsim.tracegen.quality_floe): every routed expert computed with its up
  projection INT2 and its gate and down projections contextually sparse at each sparsity, and each compression alone.

Decisions come from the trace's predictor outputs, recorded on the unmodified model (predictors see
the clean hidden states); routing itself is live, so a substitution upstream can change a later router's
choice. Everything is seeded and deterministic on a given device.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch
import torch.nn.functional as F

from chipsim.trace.format import NO_EXPERT
from chipsim.trace.predictor_arrays import delta_hat
from chipsim.tracegen.quality_floe import (FLOE_SPARSITIES, UP_BITS, UP_GROUP, FloeCompressed, fit_thresholds, floe_layers,
                                           moe_ffn_inputs)
from chipsim.tracegen.recorder import decoder_layers, find_ffn, find_routers, parse_router_output

APEX_TAUS = (0.6, 0.75, 0.9)
LORE_RANKS = (16, 32)
SPICE_CONFIDENCE = 0.7  # chipsim.policies.spice default `confidence`
ADAPMOE_THRESHOLDS = (0.8, 0.9, 0.95)  # chipsim.policies.caching.AdapMoE's gate_threshold: 0.9 by default


class _ExpertsCall:
    """Pull (hidden, top_k_index, top_k_weights) out of an experts forward's args/kwargs and put them back."""

    NAMES = ("hidden_states", "top_k_index", "top_k_weights")

    @classmethod
    def get(cls, args, kwargs):
        vals = list(args) + [kwargs[n] for n in cls.NAMES[len(args):]]
        return vals[0], vals[1], vals[2]

    @classmethod
    def put(cls, args, kwargs, idx, w):
        vals = list(args) + [kwargs[n] for n in cls.NAMES[len(args):]]
        vals[1], vals[2] = idx, w
        n = len(args)
        return tuple(vals[:n]), {**kwargs, **{name: v for name, v in zip(cls.NAMES[n:], vals[n:])}}


class RoutingOverride:
    """Hooks on every MoE block; `mode.modify(li, rows, idx, w, hidden)` may change a layer's routing.

    rows: the global held-out token indices of the block's input rows (batch-major, as the block
    flattens them). A mode may also return an addend (R, d) for the block's routed-expert output.
    """

    def __init__(self, model, mode):
        self.model = model
        self.mode = mode
        self.rows = None
        self.handles = []
        self._addend = {}
        routers = find_routers(model)
        self.moe = sorted(routers)
        self.layers = decoder_layers(model)
        self.blocks = {a: find_ffn(self.layers[a]) for a in self.moe}
        self.routers = {a: routers[a][1] for a in self.moe}

    def __enter__(self):
        for li, a in enumerate(self.moe):
            experts = self.blocks[a].experts
            self.handles.append(experts.register_forward_pre_hook(self._pre(li), with_kwargs=True))
            self.handles.append(experts.register_forward_hook(self._post(li)))
            if hasattr(self.mode, "capture_ffn_input") and a - 1 >= 0:
                ffn_prev = find_ffn(self.layers[a - 1])
                self.handles.append(ffn_prev.register_forward_pre_hook(self._capture(li, a)))
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        self.handles = []

    def _capture(self, li, a):
        def hook(module, args):
            x = args[0]
            self.mode.capture_ffn_input(li, self.routers[a], x.reshape(-1, x.shape[-1]))
        return hook

    def _pre(self, li):
        def hook(module, args, kwargs):
            hidden, idx, w = _ExpertsCall.get(args, kwargs)
            new_idx, new_w, addend = self.mode.modify(li, self.rows, idx, w, hidden)
            self._addend[li] = addend
            if new_idx is idx and new_w is w:
                return None
            return _ExpertsCall.put(args, kwargs, new_idx.to(idx.dtype), new_w.to(w.dtype))
        return hook

    def _post(self, li):
        def hook(module, args, output):
            addend = self._addend.pop(li, None)
            if addend is None:
                return None
            return output + addend.to(output.dtype)
        return hook


class Baseline:
    def modify(self, li, rows, idx, w, hidden):
        return idx, w, None


class ApexStallFree:
    """Replace routed experts outside the APEX prefetch set; count substitutions and drops."""

    def __init__(self, arrays: dict, tau: float, device):
        k = arrays["routed_ids"].shape[-1]
        n = arrays["router_rank"].shape[-1]
        dh = delta_hat(arrays["apex_score"], arrays["apex_theta"], tau)  # (T, L)
        rank = torch.from_numpy(arrays["apex_rank"].astype(np.int64))
        pos = torch.arange(n)[None, None, :]
        keep = pos < torch.from_numpy(k + dh.astype(np.int64))[..., None]  # (T, L, N) in rank order
        prefetched = torch.zeros(rank.shape, dtype=torch.bool).scatter_(-1, rank, keep)
        self.prefetched = prefetched.to(device)
        self.router_rank = torch.from_numpy(arrays["router_rank"].astype(np.int64)).to(device)
        self.k = k
        self.substituted = 0
        self.dropped = 0
        self.routed = 0

    def modify(self, li, rows, idx, w, hidden):
        pre = self.prefetched[rows, li]  # (R, N)
        rank = self.router_rank[rows, li]  # (R, N) descending original-router probability
        routed_mask = torch.zeros_like(pre).scatter_(1, idx, True)
        missing = ~pre.gather(1, idx)  # (R, k)
        cand = pre.gather(1, rank) & ~routed_mask.gather(1, rank)  # candidates in rank order
        cand_ord = torch.cumsum(cand.long(), 1)
        miss_ord = torch.cumsum(missing.long(), 1)
        new_idx, new_w = idx.clone(), w.clone()
        for j in range(idx.shape[1]):
            match = cand & (cand_ord == miss_ord[:, j:j + 1])
            has = match.any(1)
            sub = rank.gather(1, match.float().argmax(1, keepdim=True))[:, 0]
            sub_here = missing[:, j] & has
            drop_here = missing[:, j] & ~has
            new_idx[:, j] = torch.where(sub_here, sub, idx[:, j])
            new_w[:, j] = torch.where(drop_here, torch.zeros_like(w[:, j]), w[:, j])
            self.substituted += int(sub_here.sum())
            self.dropped += int(drop_here.sum())
        self.routed += idx.numel()
        return new_idx, new_w, None

    def stats(self) -> dict:
        return {"substitution_rate": self.substituted / max(1, self.routed), "drop_rate": self.dropped / max(1, self.routed)}


class AdaptiveGating:
    """AdapMoE's adaptive gating: of each token-layer's routed experts (above top-2), those past the cumulative
    normalised weight `threshold` (descending weight order; the first to reach it kept) get weight 0."""

    def __init__(self, threshold: float):
        self.threshold = threshold
        self.dropped = 0
        self.routed = 0

    def modify(self, li, rows, idx, w, hidden):
        self.routed += idx.numel()
        if idx.shape[1] <= 2:
            return idx, w, None
        weights = w.float()
        total = weights.sum(1, keepdim=True)
        order = torch.argsort(weights, dim=1, descending=True, stable=True)
        share = weights.gather(1, order) / torch.where(total > 0, total, torch.ones_like(total))
        before = torch.cumsum(share, 1) - share  # the weight of the experts ahead of each
        keep_sorted = (before < self.threshold - 1e-9) | (total <= 0)
        keep_sorted[:, 0] = True
        keep = torch.zeros_like(keep_sorted).scatter(1, order, keep_sorted)
        self.dropped += int((~keep).sum())
        return idx, torch.where(keep, w, torch.zeros_like(w)), None

    def stats(self) -> dict:
        return {"drop_rate": self.dropped / max(1, self.routed)}


class PreGated:
    """Layer l runs layer l's router applied to layer l−1's FFN input."""

    def __init__(self, num_experts: int):
        self.num_experts = num_experts
        self.pending = {}
        self.deviations = 0
        self.routed = 0
        self.rows = 0  # token-layers
        self.own_router_rows = 0

    def capture_ffn_input(self, li, router, x):
        ids, w, _ = parse_router_output(router(x), self.num_experts)
        self.pending[li] = (ids, w)

    def modify(self, li, rows, idx, w, hidden):
        got = self.pending.pop(li, None)
        self.routed += idx.numel()
        self.rows += idx.shape[0]
        if got is None:
            self.own_router_rows += idx.shape[0]
            return idx, w, None
        ids, gw = got
        live = torch.zeros(idx.shape[0], self.num_experts, dtype=torch.bool, device=idx.device).scatter_(1, idx, True)
        self.deviations += int((~live.gather(1, ids)).sum())
        return ids, gw, None

    def stats(self) -> dict:
        return {"deviation_rate": self.deviations / max(1, self.routed),
                # share of token-layers (not of routed experts) that ran their own router
                "first_layer_own_router_share": self.own_router_rows / max(1, self.rows)}


def shared_path(block):
    """The block's shared-expert output as a function of its FFN input, or None where it has none: DeepSeek's
    `shared_experts` (added as is), Qwen2-MoE's `shared_expert` scaled by sigmoid(`shared_expert_gate`(x))."""
    if getattr(block, "shared_experts", None) is not None:
        return block.shared_experts
    expert, gate = getattr(block, "shared_expert", None), getattr(block, "shared_expert_gate", None)
    if expert is not None and gate is not None:
        return lambda x: torch.sigmoid(gate(x)) * expert(x)
    return None


def _expert_residual(block, x: torch.Tensor, e: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(expert e's output, its residual against the shared expert) for FFN inputs x, both float32."""
    y_e = block.experts(x, torch.full((x.shape[0], 1), e, device=x.device, dtype=torch.long),
                        torch.ones(x.shape[0], 1, device=x.device)).float()
    return y_e, y_e - shared_path(block)(x).float()


def fit_lore(model, train_rec, ranks=LORE_RANKS, ridge: float = 1e-3, min_tokens: int = 8, log=print) -> dict:
    """Reduced-rank residuals expert_e(x) − shared(x) ≈ x·A_e·B_e per MoE layer and expert, every rank in `ranks`.

    Returns {rank: (A (L, N, d, r), B (L, N, r, d))} in float32 on the model's device (zeros for an expert the
    training split never routed to, i.e. shared-only), plus "tokens" (L, N) calibration counts.
    """
    t0 = time.perf_counter()
    routers = find_routers(model)
    moe = sorted(routers)
    layers = decoder_layers(model)
    device = next(model.parameters()).device
    r_max = max(ranks)
    n_exp = int(routers[moe[0]][1].weight.shape[0])
    d = int(train_rec.ffn_inputs.shape[-1])
    A = torch.zeros(len(moe), n_exp, d, r_max, device=device)
    B = torch.zeros(len(moe), n_exp, r_max, d, device=device)
    counts = torch.zeros(len(moe), n_exp, dtype=torch.int64)
    ids_all = train_rec.routed_ids
    with torch.no_grad():
        for li, a in enumerate(moe):
            block = find_ffn(layers[a])
            x_all = train_rec.ffn_inputs[:, a].to(device).float()
            ids = ids_all[:, li].to(device)
            for e in range(n_exp):
                sel = (ids == e).any(-1).nonzero()[:, 0]
                counts[li, e] = sel.numel()
                if sel.numel() < min_tokens:
                    continue
                x = x_all[sel]
                _, res = _expert_residual(block, x, e)
                g = x.T @ x
                g = g + ridge * g.diagonal().mean() * torch.eye(d, device=device)
                w_full = torch.linalg.solve(g, x.T @ res)  # (d, d) least squares x·W ≈ res
                fitted = x @ w_full
                _, vecs = torch.linalg.eigh(fitted.T @ fitted)  # ascending
                v = vecs[:, -r_max:].flip(-1)  # top right singular vectors of the fit
                A[li, e] = w_full @ v
                B[li, e] = v.T
    log(f"  LoRE residuals fitted for {len(moe)} layers x {n_exp} experts in {time.perf_counter() - t0:.1f} s")
    return {"A": A, "B": B, "tokens": counts}


@torch.no_grad()
def lore_fit_error(model, rec, lore: dict, ranks=LORE_RANKS) -> dict:
    """Relative error ‖expert_e(x) − surrogate(x)‖² / ‖expert_e(x)‖² over rec's (token, routed expert) pairs.

    Keys: "shared" (the shared expert alone) and each rank; rec is normally the held-out recording.
    """
    routers = find_routers(model)
    moe = sorted(routers)
    layers = decoder_layers(model)
    device = next(model.parameters()).device
    err = {"shared": 0.0, **{str(r): 0.0 for r in ranks}}
    norm = 0.0
    for li, a in enumerate(moe):
        block = find_ffn(layers[a])
        x_all = rec.ffn_inputs[:, a].to(device).float()
        ids = rec.routed_ids[:, li].to(device)
        for e in torch.unique(ids).tolist():
            x = x_all[(ids == e).any(-1)]
            y_e, res = _expert_residual(block, x, e)
            norm += float(y_e.pow(2).sum())
            err["shared"] += float(res.pow(2).sum())
            for r in ranks:
                fit = (x @ lore["A"][li, e, :, :r]) @ lore["B"][li, e, :r, :]
                err[str(r)] += float((res - fit).pow(2).sum())
    return {k: round(v / max(norm, 1e-30), 5) for k, v in err.items()}


class SpiceLore:
    """Low-confidence depth-1 draft misses replaced by shared(x) (+ rank-r residual) or dropped."""

    def __init__(self, model, arrays: dict, lore: dict | None, variant: str, confidence: float, device):
        routers = find_routers(model)
        self.moe = sorted(routers)
        layers = decoder_layers(model)
        self.shared = [shared_path(find_ffn(layers[a])) for a in self.moe]
        draft = torch.from_numpy(arrays["draft_ids"][:, :, 0].astype(np.int64)).to(device)  # (T, L, k)
        conf = torch.from_numpy(arrays["draft_conf"][:, :, 0].astype(np.float32)).to(device)
        self.draft = draft
        self.low = (conf < confidence) & (draft[..., 0] != NO_EXPERT)
        self.variant = variant
        self.rank = int(variant) if variant.isdigit() else 0
        self.lore = lore
        self.surrogates = 0
        self.routed = 0

    def modify(self, li, rows, idx, w, hidden):
        draft = self.draft[rows, li]  # (R, k)
        predicted = (idx[:, :, None] == draft[:, None, :]).any(-1)
        sur = self.low[rows, li][:, None] & ~predicted  # (R, k)
        self.routed += idx.numel()
        n_sur = int(sur.sum())
        self.surrogates += n_sur
        if n_sur == 0:
            return idx, w, None
        new_w = torch.where(sur, torch.zeros_like(w), w)
        if self.variant == "drop":
            return idx, new_w, None
        r_idx, slot = sur.nonzero(as_tuple=True)
        x = hidden[r_idx].float()
        gate = w[r_idx, slot].float()[:, None]
        with torch.autocast(x.device.type, enabled=False):
            y = self.shared[li](x).float()
            if self.rank:
                e = idx[r_idx, slot]
                a_e = self.lore["A"][li, e, :, :self.rank]  # (n, d, r)
                b_e = self.lore["B"][li, e, :self.rank, :]  # (n, r, d)
                y = y + torch.bmm(torch.bmm(x[:, None, :], a_e), b_e)[:, 0]
        addend = torch.zeros(hidden.shape[0], hidden.shape[-1], device=hidden.device, dtype=torch.float32)
        addend.index_add_(0, r_idx, gate * y)
        return idx, new_w, addend

    def stats(self) -> dict:
        return {"surrogate_rate": self.surrogates / max(1, self.routed)}


@torch.no_grad()
def heldout_nll(model, seqs: torch.Tensor, batch: int, amp: bool, override: RoutingOverride | None = None) -> tuple[float, int]:
    """Mean next-token NLL (nats) over every window of `seqs` (W, S); rows of window w are w·S … w·S+S−1."""
    device = next(model.parameters()).device
    model.eval()
    tot, cnt = 0.0, 0
    seq = seqs.shape[1]
    for s in range(0, seqs.shape[0], batch):
        x = seqs[s:s + batch].to(device)
        if override is not None:
            override.rows = torch.arange(s * seq, (s + x.shape[0]) * seq, device=device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(input_ids=x, use_cache=False).logits
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), x[:, 1:].flatten(), reduction="sum")
        tot += float(loss)
        cnt += x[:, 1:].numel()
    return tot / cnt, cnt


def _entry(nll: float, base: float, extra: dict) -> dict:
    ppl, ppl0 = math.exp(nll), math.exp(base)
    return {"nll": round(nll, 5), "ppl": round(ppl, 4), "baseline_ppl": round(ppl0, 4),
            "delta_ppl": round(ppl - ppl0, 4), "delta_ppl_pct": round(100 * (ppl / ppl0 - 1), 3),
            **{k: round(v, 5) for k, v in extra.items()}}


def measure_quality(model, heldout_seqs: torch.Tensor, arrays: dict, *, train_rec=None, heldout_rec=None, batch: int = 8, amp: bool = False,
                    taus=APEX_TAUS, ranks=LORE_RANKS, confidence: float = SPICE_CONFIDENCE, log=print) -> dict:
    """meta['quality'] of a trace: held-out perplexity of each approximate mode against the unmodified model.

    heldout_seqs: the windows the trace's held-out tokens were recorded from, in the same order (arrays
    cover every one of their tokens). train_rec: the training-split Recording (with ffn_inputs) to fit
    LoRE residuals on; heldout_rec (optional): the held-out Recording to report the fits' error on. SPICE is
    measured only on models with shared experts.
    """
    t0 = time.perf_counter()
    device = next(model.parameters()).device
    n_tok = int(arrays["routed_ids"].shape[0])
    if heldout_seqs.numel() != n_tok or not np.array_equal(heldout_seqs.reshape(-1).numpy(), arrays["token_ids"].astype(np.int64)):
        raise ValueError("measure_quality: heldout_seqs are not the tokens the arrays were recorded from")
    base, cnt = heldout_nll(model, heldout_seqs, batch, amp)
    with RoutingOverride(model, Baseline()) as ov:
        same, _ = heldout_nll(model, heldout_seqs, batch, amp, ov)
    out = {
        "method": ("held-out perplexity of the trained model, teacher-forced over the trace's held-out windows, each mode "
                   "applied through hooks on the MoE blocks (chipsim.tracegen.quality); decisions from the trace's predictor "
                   "outputs, routing live"),
        "heldout_windows": int(heldout_seqs.shape[0]), "window_tokens": int(heldout_seqs.shape[1]), "scored_tokens": cnt,
        "precision": "bf16 autocast" if amp else "fp32",
        "baseline": {"nll": round(base, 5), "ppl": round(math.exp(base), 4), "hooked_identity_nll": round(same, 5)},
    }
    log(f"  quality: baseline held-out ppl {math.exp(base):.3f} over {cnt:,} tokens (identity hooks: {math.exp(same):.3f})")

    out["apex_sf"] = {}
    for tau in taus:
        mode = ApexStallFree(arrays, tau, device)
        with RoutingOverride(model, mode) as ov:
            nll, _ = heldout_nll(model, heldout_seqs, batch, amp, ov)
        out["apex_sf"][str(tau)] = _entry(nll, base, mode.stats())
        e = out["apex_sf"][str(tau)]
        log(f"  quality: apex-sf tau={tau}: ppl {e['ppl']:.3f} ({e['delta_ppl_pct']:+.2f} %), substituted {e['substitution_rate']:.4f}, "
            f"dropped {e['drop_rate']:.4f}")

    n_exp = int(arrays["router_rank"].shape[-1])
    mode = PreGated(n_exp)
    with RoutingOverride(model, mode) as ov:
        nll, _ = heldout_nll(model, heldout_seqs, batch, amp, ov)
    out["pregated"] = _entry(nll, base, mode.stats())
    log(f"  quality: pregated: ppl {out['pregated']['ppl']:.3f} ({out['pregated']['delta_ppl_pct']:+.2f} %), "
        f"deviation rate {out['pregated']['deviation_rate']:.4f}")

    if int(arrays["routed_ids"].shape[-1]) > 2:  # adaptive gating changes nothing at top-1 and top-2
        out["adapmoe"] = _measure_adapmoe(model, heldout_seqs, base, batch, amp, log)

    layers = decoder_layers(model)
    has_shared = all(shared_path(find_ffn(layers[a])) is not None for a in sorted(find_routers(model)))
    if has_shared and train_rec is not None:
        lore = fit_lore(model, train_rec, ranks, log=log)
        fit_err = lore_fit_error(model, heldout_rec, lore, ranks) if heldout_rec is not None else {}
        spice = {"confidence": confidence, "rule": ("a token-layer whose depth-1 draft confidence is below `confidence`: each "
                 "routed expert the draft did not predict is replaced (SPICE cache ignored: an upper bound)"),
                 "calibration": "LoRE fitted on the training split's FFN inputs routed to each expert",
                 "variants": {}}
        for variant in ("drop", "shared") + tuple(str(r) for r in ranks):
            mode = SpiceLore(model, arrays, lore, variant, confidence, device)
            with RoutingOverride(model, mode) as ov:
                nll, _ = heldout_nll(model, heldout_seqs, batch, amp, ov)
            spice["variants"][variant] = _entry(nll, base, mode.stats())
            if variant in fit_err:
                spice["variants"][variant]["heldout_relative_sq_error"] = fit_err[variant]
            e = spice["variants"][variant]
            log(f"  quality: spice surrogate '{variant}': ppl {e['ppl']:.3f} ({e['delta_ppl_pct']:+.2f} %), "
                f"surrogate rate {e['surrogate_rate']:.4f}")
        out["spice_lore"] = spice
    if train_rec is not None:
        d = int(train_rec.ffn_inputs.shape[-1])
        if d % UP_GROUP == 0:
            out["floe"] = measure_floe(model, heldout_seqs, base, train_rec, batch=batch, amp=amp, log=log)
        else:
            log(f"  quality: floe not measured: hidden size {d} is not a multiple of the INT2 group {UP_GROUP}")
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


def _measure_adapmoe(model, heldout_seqs: torch.Tensor, base_nll: float, batch: int, amp: bool, log) -> dict:
    """meta['quality']['adapmoe']: AdapMoE's adaptive gating at each of ADAPMOE_THRESHOLDS."""
    out = {}
    for threshold in ADAPMOE_THRESHOLDS:
        mode = AdaptiveGating(threshold)
        with RoutingOverride(model, mode) as ov:
            nll, _ = heldout_nll(model, heldout_seqs, batch, amp, ov)
        out[str(threshold)] = e = _entry(nll, base_nll, mode.stats())
        log(f"  quality: adapmoe threshold {threshold}: ppl {e['ppl']:.3f} ({e['delta_ppl_pct']:+.2f} %), "
            f"dropped {e['drop_rate']:.4f} of routed experts")
    return out


def measure_floe(model, heldout_seqs: torch.Tensor, base_nll: float, train_rec, *, batch: int, amp: bool,
                 sparsities=FLOE_SPARSITIES, log=print) -> dict:
    """meta['quality']['floe']: FloE (INT2 up + sparsity s) at each s, and each compression alone."""
    x_train = moe_ffn_inputs(model, train_rec)
    out = {"rule": ("every routed expert computed as FloE's: the up projection's output channels below the (layer, expert) "
                    "threshold zeroed, so the gate and down projections need only the kept channels; the up projection "
                    f"INT{UP_BITS} (HQQ, groups of {UP_GROUP}) where said"),
           "calibration": "threshold = the s-quantile of |up factor| over the training split's FFN inputs routed to the expert",
           "up_bits": UP_BITS, "up_group": UP_GROUP, "sparse_bf16_up": {}}

    def run(layers, sparsity):
        thr = fit_thresholds(layers, x_train, train_rec.routed_ids, sparsity) if sparsity > 0 else \
            torch.full((len(layers), layers[0].w.num_experts), -1.0)
        mode = FloeCompressed(layers, thr)
        with RoutingOverride(model, mode) as ov:
            nll, _ = heldout_nll(model, heldout_seqs, batch, amp, ov)
        return _entry(nll, base_nll, mode.stats())

    int2, bf16 = floe_layers(model, int2_up=True), floe_layers(model, int2_up=False)
    out["int2_up_dense"] = run(int2, 0.0)
    log(f"  quality: floe INT2 up alone: ppl {out['int2_up_dense']['ppl']:.3f} ({out['int2_up_dense']['delta_ppl_pct']:+.2f} %)")
    for s in sparsities:
        out[str(s)] = e = run(int2, s)
        out["sparse_bf16_up"][str(s)] = b = run(bf16, s)
        log(f"  quality: floe sparsity {s}: ppl {e['ppl']:.3f} ({e['delta_ppl_pct']:+.2f} %), kept {e['kept_channel_share']:.3f}, "
            f"intra-predictor recall {e.get('intra_predictor_recall', float('nan')):.3f}; BF16 up {b['delta_ppl_pct']:+.2f} %")
    return out
