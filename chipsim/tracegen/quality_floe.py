"""FloE's compressed experts as a quality mode: held-out perplexity with every routed expert computed as FloE does.

FloE (arXiv 2505.05950, §3) compresses each expert two ways:
- contextual sparsity of the gate and down projections: a(x) = (act(x·W_gate) ⊙ S_t(x·W_up))·W_down, where S_t keeps
  the up projection's output channels whose magnitude is at least t and zeroes the rest, so only the kept channels'
  gate rows and down columns are needed;
- the up projection quantised to INT2 with HQQ (half-quadratic quantisation, Badri & Shaji 2023), its output
  computed densely from the dequantised weights (it is what chooses the channels).

Here every routed expert of every MoE layer is replaced by that computation (the original experts' gate weights are
zeroed and the compressed outputs added back with the same weights). The threshold t of each (layer, expert) is the
s-quantile of |up factor| over the training split's FFN inputs routed to it, computed with the up projection the
variant uses (INT2 or BF16), so a held-out token keeps about 1 − s of the channels; an expert with fewer than
`min_tokens` routed training tokens takes the median of its layer's thresholds. The up factor is the up output for
act(gate)·up experts and gpt-oss's (clamp(up) + 1) for its clamped GLU.

FloE's intra-expert predictor (the next layer's channels estimated from this layer's hidden state times the next
layer's up projection) decides what is moved, not what is computed; its recall against the true mask is reported
(`intra_predictor_recall`, the previous layer's FFN input through this layer's up projection and threshold) but does
not change the outputs.

The INT2 groups (64 weights along the input dimension, a float scale and zero each) are an ASSUMPTION matching
chipsim.policies.floe's byte split; FloE's group size is not stated in what we read.
"""

from __future__ import annotations

import torch

from chipsim.tracegen.recorder import decoder_layers, find_ffn, find_routers

FLOE_SPARSITIES = (0.5, 0.7, 0.9)  # the paper's sparse-kernel points; 0.9 is its end-to-end setting
UP_BITS = 2
UP_GROUP = 64  # ASSUMPTION (see above)
HQQ_LP_NORM, HQQ_BETA, HQQ_KAPPA, HQQ_ITERS = 0.7, 10.0, 1.01, 20  # HQQ paper's proximal solver settings


@torch.no_grad()
def hqq_dequantised(w: torch.Tensor, bits: int = UP_BITS, group: int = UP_GROUP) -> torch.Tensor:
    """w (out, in) quantised to `bits` in groups of `group` consecutive input weights and dequantised back (float32).

    Min-max scale per group; the zero point is then fitted by HQQ's half-quadratic solver, which minimises the lp
    (p = 0.7) norm of the error: W_e = shrink_p(W − dequant(W_q)), z = mean(W_q − (W − W_e)/s), β grown by κ each
    iteration; the zero point kept is the one of least mean absolute error met (the first is plain min-max
    rounding's, so the result is never worse than it by that measure).
    """
    out_f, in_f = w.shape
    if in_f % group:
        raise ValueError(f"hqq_dequantised: input dimension {in_f} is not a multiple of the group {group}")
    wg = w.float().reshape(-1, group)
    top = 2 ** bits - 1
    lo, hi = wg.min(1, keepdim=True).values, wg.max(1, keepdim=True).values
    inv = top / (hi - lo).clamp_min(1e-8)  # 1 / scale
    zero = -lo * inv
    beta, best, best_zero = HQQ_BETA, float("inf"), zero
    for _ in range(HQQ_ITERS):
        q = (wg * inv + zero).round().clamp(0, top)
        err = wg - (q - zero) / inv
        cur = float(err.abs().mean())
        if cur >= best:
            break
        best, best_zero = cur, zero
        e_abs = err.abs()
        shrunk = torch.sign(err) * torch.relu(e_abs - (1.0 / beta) * e_abs.clamp_min(1e-8).pow(HQQ_LP_NORM - 1))
        zero = (q - (wg - shrunk) * inv).mean(1, keepdim=True)
        beta *= HQQ_KAPPA
    zero = best_zero
    q = (wg * inv + zero).round().clamp(0, top)
    return ((q - zero) / inv).reshape(out_f, in_f)


class ExpertWeights:
    """One MoE layer's routed experts as separate matrices: gate and up (F, d), down (d, F), biases, the activation.

    Two layouts of transformers 5.x: `gate_up_proj` (N, 2F, d) chunked gate | up with `act_fn` (Mixtral, Qwen2/3-MoE,
    DeepSeek-V2, GraniteMoe, Phimoe, OLMoE), and gpt-oss's (N, d, 2F) interleaved gate/up with biases and its
    clamped GLU (`_apply_gate`).
    """

    def __init__(self, experts):
        self.experts = experts
        self.gpt_oss = hasattr(experts, "gate_up_proj_bias") and hasattr(experts, "_apply_gate")
        if not self.gpt_oss and not (hasattr(experts, "gate_up_proj") and hasattr(experts, "act_fn")):
            raise ValueError(f"FloE quality mode: {type(experts).__name__} has neither expert layout it knows")

    @property
    def num_experts(self) -> int:
        return int(self.experts.gate_up_proj.shape[0])

    def gate_up(self, e: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(W_gate, W_up), each (F, d) float32."""
        gu = self.experts.gate_up_proj[e].float()
        if self.gpt_oss:
            return gu[:, ::2].T.contiguous(), gu[:, 1::2].T.contiguous()
        f = gu.shape[0] // 2
        return gu[:f], gu[f:]

    def biases(self, e: int):
        """(gate bias, up bias, down bias) or Nones."""
        if not self.gpt_oss:
            return None, None, None
        b = self.experts.gate_up_proj_bias[e].float()
        return b[::2], b[1::2], self.experts.down_proj_bias[e].float()

    def down(self, e: int) -> torch.Tensor:
        """W_down (d, F) float32."""
        w = self.experts.down_proj[e].float()
        return w.T if self.gpt_oss else w

    def up_factor(self, up: torch.Tensor) -> torch.Tensor:
        """What multiplies the gate's activation channel by channel (its magnitude chooses the kept channels)."""
        if self.gpt_oss:
            return up.clamp(-self.experts.limit, self.experts.limit) + 1
        return up

    def hidden(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        if self.gpt_oss:
            g = gate.clamp(max=self.experts.limit)
            return self.up_factor(up) * g * torch.sigmoid(g * self.experts.alpha)
        return self.experts.act_fn(gate) * up


class FloeLayer:
    """One MoE layer's experts compressed as a variant does (INT2 up or BF16 up), with per-expert thresholds."""

    def __init__(self, weights: ExpertWeights, int2_up: bool):
        self.w = weights
        self.int2_up = int2_up
        self._up = {}

    def up_weight(self, e: int) -> torch.Tensor:
        if e not in self._up:
            _, up = self.w.gate_up(e)
            self._up[e] = hqq_dequantised(up) if self.int2_up else up
        return self._up[e]

    def up_out(self, e: int, x: torch.Tensor) -> torch.Tensor:
        _, b_up, _ = self.w.biases(e)
        u = x @ self.up_weight(e).T
        return u if b_up is None else u + b_up

    def expert(self, e: int, x: torch.Tensor, thr: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(expert e's compressed output (R, d), the kept-channel mask (R, F)) for FFN inputs x (R, d) float32."""
        w_gate, _ = self.w.gate_up(e)
        b_gate, _, b_down = self.w.biases(e)
        up = self.up_out(e, x)
        keep = self.w.up_factor(up).abs() >= thr
        gate = x @ w_gate.T
        if b_gate is not None:
            gate = gate + b_gate
        y = (self.w.hidden(gate, up) * keep) @ self.w.down(e).T
        return (y if b_down is None else y + b_down), keep


@torch.no_grad()
def fit_thresholds(layers: list[FloeLayer], ffn_inputs: list[torch.Tensor], routed: torch.Tensor, sparsity: float,
                   min_tokens: int = 8) -> torch.Tensor:
    """(L, N) thresholds: the `sparsity`-quantile of |up factor| over the FFN inputs each expert was routed.

    ffn_inputs[li]: (T, d) float32 FFN inputs of MoE layer li; routed: (T, L, k) routed expert ids.
    """
    n_exp = layers[0].w.num_experts
    thr = torch.full((len(layers), n_exp), float("nan"))
    for li, layer in enumerate(layers):
        x_all = ffn_inputs[li]
        ids = routed[:, li].to(x_all.device)
        for e in range(n_exp):
            sel = (ids == e).any(-1).nonzero()[:, 0]
            if sel.numel() < min_tokens:
                continue
            mag = layer.w.up_factor(layer.up_out(e, x_all[sel])).abs().flatten()
            # on the model's device (a CPU sort of each expert's channels took ~0.2 s: 50 s a fit on the H100)
            thr[li, e] = float(torch.quantile(mag, sparsity)) if mag.numel() <= 16_000_000 else \
                float(mag.kthvalue(max(1, int(sparsity * mag.numel()))).values)
        known = thr[li][~thr[li].isnan()]
        fill = float(known.median()) if known.numel() else 0.0
        thr[li] = torch.where(thr[li].isnan(), torch.full_like(thr[li], fill), thr[li])
    return thr


class FloeCompressed:
    """RoutingOverride mode: every routed expert computed as FloE's compressed expert (see the module docstring)."""

    def __init__(self, layers: list[FloeLayer], thresholds: torch.Tensor):
        self.layers = layers
        self.thr = thresholds.tolist()
        self.kept = 0
        self.channels = 0
        self.hit = 0
        self.true = 0
        self._prev = {}

    def capture_ffn_input(self, li, router, x):
        self._prev[li] = x.float()

    def modify(self, li, rows, idx, w, hidden):
        x = hidden.float()
        out = torch.zeros(x.shape[0], x.shape[-1], device=x.device, dtype=torch.float32)
        layer = self.layers[li]
        prev = self._prev.pop(li, None)
        for e in torch.unique(idx).tolist():
            r, k = (idx == e).nonzero(as_tuple=True)
            y, keep = layer.expert(e, x[r], self.thr[li][e])
            out.index_add_(0, r, w[r, k].float()[:, None] * y)
            self.kept += int(keep.sum())
            self.channels += keep.numel()
            if prev is not None:
                pred = layer.w.up_factor(layer.up_out(e, prev[r])).abs() >= self.thr[li][e]
                self.hit += int((pred & keep).sum())
                self.true += int(keep.sum())
        return idx, torch.zeros_like(w), out

    def stats(self) -> dict:
        out = {"kept_channel_share": self.kept / max(1, self.channels)}
        if self.true:
            out["intra_predictor_recall"] = self.hit / self.true
        return out


def floe_layers(model, int2_up: bool) -> list[FloeLayer]:
    layers = decoder_layers(model)
    return [FloeLayer(ExpertWeights(find_ffn(layers[a]).experts), int2_up) for a in sorted(find_routers(model))]


def moe_ffn_inputs(model, train_rec) -> list[torch.Tensor]:
    """The training recording's FFN inputs of each MoE layer, float32 on the model's device."""
    device = next(model.parameters()).device
    return [train_rec.ffn_inputs[:, a].to(device).float() for a in sorted(find_routers(model))]

