"""Train a reduced-width MoE language model of a published shape, record it, fit predictors, write a trace.

    python -m chipsim.tracegen.train --shape granite-3.1-3b-a800m --data .data/text-v1 --out OUTDIR --minutes 6 --seed 0 [--tiny]

One seeded command per model: it builds the real transformers class
(GraniteMoeForCausalLM, DeepseekV2ForCausalLM, PhimoeForCausalLM, …) with the published layer count,
dense first layers, expert count, top-k and shared experts of the shape, at reduced width (default
d 512, expert FFN 256, our own 16k byte-level BPE vocabulary); trains it on the pre-tokenised open-licence
text of chipsim.tracegen.textdata (bf16 autocast on a GPU, AdamW, the model family's load-balancing loss
computed from router hooks) until a wall-time budget; reports train and held-out loss before and after;
records a training split (for the predictors and train_expert_counts) and held-out sequences (the trace's
decode tokens: every position of a held-out sequence), fits the predictors of chipsim.tracegen.predictors,
and writes OUTDIR/<trace name>.npz with chipsim.trace.format.save plus OUTDIR/<trace name>.json (its meta).
The weights are never written.

`--tiny` is the CPU dry run: tiny width, a few steps, few tokens; same code path end to end.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from chipsim.errors import InputError
from chipsim.trace import format as tformat
from chipsim.trace import predictor_arrays
from chipsim.tracegen.predictors import build_trace_arrays
from chipsim.tracegen.quality import heldout_nll, measure_quality
from chipsim.tracegen.recorder import RoutingRecorder, find_routers, model_counts, record
from chipsim.tracegen.textdata import load_split
from chipsim.workload.models import get_model

TRACE_NAMES = {
    "granite-3.1-1b-a400m": "real-granite-1b",
    "granite-3.1-3b-a800m": "real-granite-3b",
    "deepseek-v2-lite": "real-deepseek-v2-lite",
    "phi-mini-moe": "real-phi-mini-moe",
    "mixtral-8x7b": "real-mixtral-8x7b",
    "olmoe-1b-7b": "real-olmoe-1b-7b",
    "qwen2-57b-a14b": "real-qwen2-57b-a14b",
}


@dataclass
class Width:
    d: int
    ffn: int  # routed expert FFN
    heads: int
    kv_heads: int
    head_dim: int

    @property
    def scale(self) -> float:
        return self.ffn


DEFAULT_WIDTH = Width(d=512, ffn=256, heads=8, kv_heads=4, head_dim=64)
TINY_WIDTH = Width(d=64, ffn=32, heads=2, kv_heads=2, head_dim=32)


def build_config(shape_name: str, w: Width, vocab: int, max_pos: int, attention_multiplier: float | None = None):
    """The transformers config of the published shape at width w. Returns (config, aux-loss spec)."""
    import transformers as tf

    s = get_model(shape_name)
    common = dict(vocab_size=vocab, hidden_size=w.d, num_hidden_layers=s.num_layers, num_attention_heads=w.heads,
                  max_position_embeddings=max_pos, bos_token_id=0, eos_token_id=0, pad_token_id=None,
                  tie_word_embeddings=s.tie_embeddings)
    arch = s.hf_architecture
    if arch == "GraniteMoeForCausalLM":
        extra = {} if attention_multiplier is None else {"attention_multiplier": attention_multiplier}
        cfg = tf.GraniteMoeConfig(**common, num_key_value_heads=w.kv_heads, intermediate_size=w.ffn,
                                  num_local_experts=s.num_experts, num_experts_per_tok=s.top_k, router_aux_loss_coef=0.01, **extra)
        aux = {"kind": "switch", "coef": 0.01,
               "note": "Switch-style load balancing (N·Σ f_i P_i per layer, averaged over layers), coefficient 0.01 (ASSUMPTION: "
                       "the published Granite value was not checked offline); "
                       + ("multipliers left at the class defaults (1.0)" if attention_multiplier is None else
                          f"attention_multiplier {attention_multiplier:g}, the other multipliers at the class defaults (1.0)")}
    elif arch == "DeepseekV2ForCausalLM":
        dense = int(round(w.ffn * s.dense_ffn / s.expert_ffn / 64)) * 64  # 10944/1408 of the expert width
        cfg = tf.DeepseekV2Config(**common, num_key_value_heads=w.heads, intermediate_size=dense, moe_intermediate_size=w.ffn,
                                  first_k_dense_replace=s.first_dense_layers, n_routed_experts=s.num_experts,
                                  n_shared_experts=s.num_shared_experts, num_experts_per_tok=s.top_k,
                                  kv_lora_rank=max(16, w.d // 4), q_lora_rank=None, qk_nope_head_dim=w.head_dim // 2,
                                  qk_rope_head_dim=w.head_dim // 4, v_head_dim=w.head_dim // 2, topk_method="greedy",
                                  n_group=1, topk_group=1, routed_scaling_factor=1.0, norm_topk_prob=False)
        aux = {"kind": "deepseek_seq", "coef": 0.001,
               "note": "DeepSeek-V2 expert-level balance loss α·Σ_i f_i P_i per sequence (seq_aux), summed over MoE layers, "
                       "α = 0.001 (DeepSeek-V2-Lite's aux_loss_alpha); greedy top-6 of softmax, routed_scaling_factor 1.0, "
                       "weights not renormalised (V2-Lite's settings)"}
    elif arch == "PhimoeForCausalLM":
        cfg = tf.PhimoeConfig(**common, num_key_value_heads=w.kv_heads, intermediate_size=w.ffn, num_local_experts=s.num_experts,
                              num_experts_per_tok=s.top_k)
        aux = {"kind": "switch", "coef": float(cfg.router_aux_loss_coef), "note": "Switch-style, PhimoeConfig's default coefficient; sparsemixer routing"}
    elif arch == "MixtralForCausalLM":
        cfg = tf.MixtralConfig(**common, num_key_value_heads=w.kv_heads, intermediate_size=w.ffn, num_local_experts=s.num_experts,
                               num_experts_per_tok=s.top_k, router_aux_loss_coef=0.02)
        aux = {"kind": "switch", "coef": 0.02, "note": "Switch-style, Mixtral's router_aux_loss_coef 0.02"}
    elif arch == "OlmoeForCausalLM":
        cfg = tf.OlmoeConfig(**common, num_key_value_heads=w.heads, intermediate_size=w.ffn, num_experts=s.num_experts,
                             num_experts_per_tok=s.top_k, router_aux_loss_coef=0.01, norm_topk_prob=False)
        aux = {"kind": "switch", "coef": 0.01, "note": "Switch-style, OLMoE's router_aux_loss_coef 0.01"}
    elif arch == "Qwen2MoeForCausalLM":
        cfg = tf.Qwen2MoeConfig(**common, num_key_value_heads=w.kv_heads, intermediate_size=w.ffn * 4, moe_intermediate_size=w.ffn,
                                shared_expert_intermediate_size=int(w.ffn * s.shared_expert_ffn / s.expert_ffn),
                                num_experts=s.num_experts, num_experts_per_tok=s.top_k, router_aux_loss_coef=0.001)
        aux = {"kind": "switch", "coef": 0.001, "note": "Switch-style, Qwen2-MoE's router_aux_loss_coef 0.001"}
    else:
        cfg, aux = _build_config_2025(tf, s, w, common)
    return cfg, aux


def _build_config_2025(tf, s, w: Width, common: dict):
    """The recipes of the 2025-26 architectures (build_config's, continued): the published shape's layer, expert,
    top-k, shared and layer-type structure at width w, each family's load-balancing coefficient from its
    config.json."""
    arch = s.hf_architecture
    if arch == "Qwen3MoeForCausalLM":
        cfg = tf.Qwen3MoeConfig(**common, num_key_value_heads=w.kv_heads, head_dim=w.head_dim, intermediate_size=w.ffn * 4,
                                moe_intermediate_size=w.ffn, num_experts=s.num_experts, num_experts_per_tok=s.top_k,
                                norm_topk_prob=True, router_aux_loss_coef=0.001)
        return cfg, {"kind": "switch", "coef": 0.001, "note": "Switch-style, Qwen3-30B-A3B's router_aux_loss_coef 0.001; "
                                                               "top-k of softmax, renormalised (norm_topk_prob)"}
    if arch == "GptOssForCausalLM":
        types = list(s.layer_types) or ["full_attention"] * s.num_layers
        cfg = tf.GptOssConfig(**common, num_key_value_heads=w.kv_heads, head_dim=w.head_dim, intermediate_size=w.ffn,
                              num_local_experts=s.num_experts, num_experts_per_tok=s.top_k, layer_types=types,
                              sliding_window=s.sliding_window or 128, router_aux_loss_coef=0.9)
        return cfg, {"kind": "switch", "coef": 0.9, "note": "Switch-style, gpt-oss-20b's router_aux_loss_coef 0.9 (as "
                                                             "published); top-k of the biased logits, then softmax"}
    if arch == "Ernie4_5_MoeForCausalLM":
        dense = int(round(w.ffn * s.dense_ffn / s.expert_ffn / 64)) * 64 if s.first_dense_layers else w.ffn * 4
        cfg = tf.Ernie4_5_MoeConfig(**common, num_key_value_heads=w.kv_heads, intermediate_size=dense,
                                    moe_intermediate_size=w.ffn, moe_num_experts=s.num_experts, moe_k=s.top_k,
                                    moe_num_shared_experts=s.num_shared_experts, moe_layer_start_index=s.first_dense_layers,
                                    moe_layer_end_index=s.num_layers - 1, moe_layer_interval=1, router_aux_loss_coef=0.001)
        return cfg, {"kind": "switch", "coef": 0.001, "note": "Switch-style, coefficient 0.001 (ASSUMPTION: ERNIE-4.5's "
                                                               "own is not in its config.json); correction bias as the class sets it"}
    if arch == "GraniteMoeHybridForCausalLM":
        types = ["mamba" if t == "mamba" else "attention" for t in s.layer_types] or ["attention"] * s.num_layers
        heads = max(1, (2 * w.d) // 64)
        cfg = tf.GraniteMoeHybridConfig(**common, num_key_value_heads=w.kv_heads, intermediate_size=w.ffn,
                                        shared_intermediate_size=int(w.ffn * s.shared_expert_ffn / s.expert_ffn),
                                        num_local_experts=s.num_experts, num_experts_per_tok=s.top_k, layer_types=types,
                                        mamba_n_heads=heads, mamba_d_head=2 * w.d // heads, mamba_d_state=s.mamba_state or 128,
                                        mamba_n_groups=1, mamba_d_conv=s.mamba_conv_kernel or 4, mamba_expand=2,
                                        position_embedding_type="rope" if s.rope else "nope", router_aux_loss_coef=0.01)
        return cfg, {"kind": "switch", "coef": 0.01, "note": "Switch-style, coefficient 0.01 (ASSUMPTION, as Granite-3.1's "
                                                              "recipe); Mamba2 layers at the published positions"}
    if arch == "DeepseekV3ForCausalLM":
        dense = int(round(w.ffn * s.dense_ffn / s.expert_ffn / 64)) * 64
        cfg = tf.DeepseekV3Config(**common, num_key_value_heads=w.heads, intermediate_size=dense, moe_intermediate_size=w.ffn,
                                  first_k_dense_replace=s.first_dense_layers, n_routed_experts=s.num_experts,
                                  n_shared_experts=s.num_shared_experts, num_experts_per_tok=s.top_k,
                                  kv_lora_rank=max(16, w.d // 4), q_lora_rank=None, qk_nope_head_dim=w.head_dim // 2,
                                  qk_rope_head_dim=w.head_dim // 4, v_head_dim=w.head_dim // 2, n_group=1, topk_group=1,
                                  routed_scaling_factor=2.446, norm_topk_prob=True)
        return cfg, {"kind": "switch", "coef": 0.001, "note": "Switch-style, coefficient 0.001 (Moonlight's aux_loss_alpha); "
                                                               "sigmoid scores with the class's correction bias, one group"}
    raise InputError(f"--shape {s.name}: no training recipe for {arch}")


def build_model(shape_name: str, w: Width, vocab: int, max_pos: int, seed: int, device, attention_multiplier: float | None = None):
    import transformers as tf

    cfg, aux = build_config(shape_name, w, vocab, max_pos, attention_multiplier)
    torch.manual_seed(seed)
    cls = getattr(tf, get_model(shape_name).hf_architecture)
    cfg._experts_implementation = "eager"
    model = cls(cfg).to(device)
    return model, cfg, aux


def balance_loss(logits_per_layer: list[torch.Tensor], top_k: int, aux: dict, batch: int) -> torch.Tensor:
    """The family's load-balancing loss from the routers' (B·S, N) logits (one tensor per MoE layer)."""
    total = 0.0
    for logits in logits_per_layer:
        n = logits.shape[-1]
        p = torch.softmax(logits.float(), -1)
        sel = torch.topk(p, top_k, dim=-1).indices
        onehot = torch.zeros_like(p).scatter_(-1, sel, 1.0)
        if aux["kind"] == "deepseek_seq":
            p = p.view(batch, -1, n)
            onehot = onehot.view(batch, -1, n)
            f = onehot.mean(1) * n / top_k  # (B, N)
            total = total + (f * p.mean(1)).sum(-1).mean()
        else:
            total = total + n * (onehot.mean(0) * p.mean(0)).sum() / len(logits_per_layer)
    return aux["coef"] * total


def windows(stream: np.ndarray, starts: np.ndarray, seq: int) -> torch.Tensor:
    return torch.from_numpy(np.stack([stream[s:s + seq].astype(np.int64) for s in starts]))


def even_starts(n_tokens: int, count: int, seq: int) -> np.ndarray:
    """`count` non-overlapping windows spread evenly over a stream (every source of the held-out text)."""
    count = min(count, n_tokens // seq)
    stride = (n_tokens - seq) // max(1, count - 1) if count > 1 else 0
    return np.arange(count) * max(stride, seq)


def eval_loss(model, data: torch.Tensor, batch: int, device, amp) -> float:
    """Mean next-token loss over the windows of `data`; leaves the model in training mode."""
    loss, _ = heldout_nll(model, data, batch, amp)
    model.train()
    return loss


def train_step(model, x, top_k, aux, amp, device):
    with RoutingRecorder(model, hidden=False, keep_graph=True) as rec:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(input_ids=x, use_cache=False).logits
        ce = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), x[:, 1:].flatten())
        bal = balance_loss(rec.logits, top_k, aux, x.shape[0])
    return ce, bal


def pick_experts_impl(model, x, top_k, aux, amp, device, log) -> tuple[str, dict]:
    """On a GPU, time a forward+backward with each experts implementation and keep the fastest that works."""
    timings = {}
    if device.type != "cuda":
        model.set_experts_implementation("eager")
        return "eager", {"eager": None}
    ref = None
    for impl in ("grouped_mm", "eager"):
        try:
            model.set_experts_implementation(impl)
            ts = []
            for i in range(3):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                ce, bal = train_step(model, x, top_k, aux, amp, device)
                (ce + bal).backward()
                torch.cuda.synchronize()
                ts.append(time.perf_counter() - t0)
            model.zero_grad(set_to_none=True)
            if ref is None:
                ref = float(ce)
            elif abs(float(ce) - ref) > 0.05:
                log(f"  experts '{impl}': loss {float(ce):.4f} differs from {ref:.4f}")
            timings[impl] = round(min(ts[1:]), 4)
            log(f"  experts implementation '{impl}': {timings[impl]:.3f} s per step (loss {float(ce):.4f})")
        except Exception as exc:  # an implementation the pinned torch/transformers cannot run here
            model.zero_grad(set_to_none=True)
            timings[impl] = f"failed: {type(exc).__name__}: {str(exc)[:200]}"
            log(f"  experts implementation '{impl}' failed: {timings[impl]}")
    ok = {k: v for k, v in timings.items() if isinstance(v, float)}
    best = min(ok, key=ok.get) if ok else "eager"
    model.set_experts_implementation(best)
    return best, timings


def _time_bar(budget_s: float):
    """A tqdm bar over the training wall-time budget when stderr is a terminal (None otherwise, or without tqdm)."""
    if not sys.stderr.isatty():
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=budget_s, unit="s", desc="training", bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} s")


def lr_at(frac: float, step: int, lr: float, warmup_steps: int) -> float:
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))



def _per_token(key: str) -> bool:
    """Whether a trace array has one row per token (its first axis is T), so trimming tokens trims it."""
    spec = tformat.CORE_ARRAYS.get(key) or predictor_arrays.BY_NAME.get(key)
    return spec is not None and spec.per_token


def save_trimmed(path: Path, arrays: dict, meta: dict, unit: int, log=print,
                 max_bytes: int = tformat.SHIPPED_TRACE_MAX_BYTES) -> int:
    """Save a trace keeping the most leading tokens (a multiple of `unit`, one recorded window) that fit
    `max_bytes` (default: the 16 MiB of a trace this repository ships).

    The compressed bytes per token are estimated from a one-window trial save; sets meta.provenance.trace_tokens.
    """
    t_all = int(arrays["routed_ids"].shape[0])

    def head(t):
        return {k: (v[:t] if _per_token(k) else v) for k, v in arrays.items()}

    unit = max(1, min(unit, t_all))
    trial = path.with_name(path.stem + ".trial.npz")
    trial_meta = dict(meta, provenance={**meta.get("provenance", {}), "trace_tokens": unit})  # what the trial holds
    tformat.save(trial, head(unit), trial_meta, specs=predictor_arrays.RECORDED)
    per_token = trial.stat().st_size / unit
    trial.unlink()
    t_keep = max(unit, min(t_all, int(max_bytes * 15 / 16 / per_token) // unit * unit))
    while True:
        meta.setdefault("provenance", {})["trace_tokens"] = int(t_keep)
        try:
            tformat.save(path, head(t_keep), meta, specs=predictor_arrays.RECORDED, max_bytes=max_bytes)
            return t_keep
        except InputError as exc:
            if "MiB asked for" not in str(exc) or t_keep <= unit:
                raise
            t_keep -= unit
            log(f"{exc}; keeping {t_keep} tokens")


class ShapeMismatchError(RuntimeError):
    """The model built for a shape lacks the shape's counts: a bug in build_config, not a bad input."""


@dataclass(frozen=True)
class RunSizes:
    """How much main() trains, records and evaluates: the options given, else --tiny's or a full run's defaults."""

    width: Width
    seq: int  # tokens per training window
    batch: int  # windows per step
    max_steps: int
    warmup_steps: int
    heldout_tokens: int  # recorded for the trace
    pred_train_tokens: int  # training-split tokens recorded for the predictors
    pred_steps: int
    eval_windows: int  # windows of seq + 1 tokens per loss evaluation

    @classmethod
    def from_args(cls, a) -> "RunSizes":
        tiny = a.tiny
        return cls(width=TINY_WIDTH if tiny else DEFAULT_WIDTH, seq=a.seq or (64 if tiny else 512),
                   batch=a.batch or (4 if tiny else 32),
                   max_steps=a.max_steps if a.max_steps is not None else (6 if tiny else 10**9),
                   warmup_steps=6 if tiny else 100, heldout_tokens=a.heldout_tokens or (256 if tiny else 8192),
                   pred_train_tokens=a.pred_train_tokens or (1024 if tiny else 32768),
                   pred_steps=a.pred_steps or (30 if tiny else 300), eval_windows=4 if tiny else 64)


@dataclass
class TrainResult:
    steps: int
    tokens: int
    seconds: float
    history: list  # (step, training loss) at every logged step


@dataclass
class Recording:
    """What was recorded from the trained model: the trace arrays, the predictors' and quality metrics."""

    arrays: dict
    predictor_metrics: dict
    quality: dict
    heldout_tokens: int  # held-out tokens recorded (the trace keeps as many as fit)
    train_windows: int
    heldout_windows: int
    hidden_dtype: torch.dtype


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description="train a published-shape MoE at reduced width, record it, write a trace")
    ap.add_argument("--shape", required=True, help="model shape name (chipsim.workload.models)")
    ap.add_argument("--data", required=True, help="folder written by python -m chipsim.tracegen.textdata")
    ap.add_argument("--out", required=True, help="output folder for the trace (+ .json meta)")
    ap.add_argument("--minutes", type=float, default=6.0, help="training wall-time budget")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny", action="store_true", help="CPU dry run: tiny width, few steps, few tokens")
    ap.add_argument("--name", default=None, help="trace file stem (default real-<model>)")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--seq", type=int, default=None)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--max-steps", type=int, default=None)
    ap.add_argument("--heldout-tokens", type=int, default=None, help="held-out tokens to record (trace keeps as many as fit 16 MiB)")
    ap.add_argument("--pred-train-tokens", type=int, default=None, help="training-split tokens recorded for the predictors")
    ap.add_argument("--pred-steps", type=int, default=None)
    ap.add_argument("--no-quality", action="store_true", help="skip the held-out perplexity of the approximate modes")
    ap.add_argument("--experts-impl", default="auto", choices=("auto", "eager", "grouped_mm"))
    ap.add_argument("--device", default=None)
    ap.add_argument("--attention-multiplier", type=float, default=None,
                    help="GraniteMoe only: the attention softmax scale (GraniteMoe uses config.attention_multiplier as the "
                         "scale, class default 1.0; 0.015625 = 1/head_dim is, as far as we recall, the published configs' value: not checked offline). "
                         "Default: the class default, as the shipped real-granite-3b trace was trained")
    return ap


def checked_counts(model, shape) -> dict:
    """The built model's counts (recorder.model_counts); ShapeMismatchError where one differs from `shape`'s."""
    counts = model_counts(model)
    for key in tformat.META_MODEL_KEYS:
        if counts[key] != getattr(shape, key):
            raise ShapeMismatchError(f"built model has {key}={counts[key]}, the shape {shape.name} says "
                                     f"{getattr(shape, key)}")
    return counts


def _optimizer(model, lr: float, device) -> torch.optim.AdamW:
    """AdamW, weight decay 0.1 on the matrices but the embeddings."""
    decay = [p for n_, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n_]
    no_decay = [p for n_, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n_)]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda")


def _train(model, opt, train_ids: np.ndarray, np_rng, sz: RunSizes, lr: float, budget: float, top_k: int, aux: dict,
           amp: bool, device, log, tiny: bool) -> TrainResult:
    """Train on random training windows until `budget` seconds or sz.max_steps steps, whichever comes first."""
    model.train()
    step, tokens = 0, 0
    t_train = time.perf_counter()
    hist = []
    bar = _time_bar(budget)  # a progress bar on a terminal; the log lines below either way
    while step < sz.max_steps:
        elapsed = time.perf_counter() - t_train
        if bar is not None:
            bar.update(min(elapsed, budget) - bar.n)
        if elapsed >= budget:
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(elapsed / budget, step, lr, sz.warmup_steps)
        x = windows(train_ids, np_rng.integers(0, train_ids.size - sz.seq - 1, sz.batch), sz.seq).to(device, non_blocking=True)
        ce, bal = train_step(model, x, top_k, aux, amp, device)
        loss = ce + bal
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens += x.numel()
        if step % (1 if tiny else 25) == 0 or step == 1:
            ce_f, bal_f = float(ce.detach()), float(bal.detach())
            hist.append((step, ce_f))
            el = time.perf_counter() - t_train
            log(f"step {step}: loss {ce_f:.4f} aux {bal_f:.5f} gnorm {float(gnorm):.2f} lr {opt.param_groups[0]['lr']:.2e} "
                f"{tokens / el:,.0f} tok/s, {tokens / 1e6:.2f} M tokens")
    train_seconds = time.perf_counter() - t_train
    if bar is not None:
        bar.close()
    return TrainResult(step, tokens, train_seconds, hist)


def _record(model, train_ids: np.ndarray, held_ids: np.ndarray, np_rng, sz: RunSizes, device, seed: int,
            with_quality: bool, log) -> Recording:
    """Record a training split (for the predictors) and held-out windows (for the trace), fit the predictors
    and, unless told not to, measure the approximate modes' held-out perplexity."""
    if device.type == "cuda":
        torch.set_float32_matmul_precision("highest")
    model.eval()
    seq = sz.seq
    n_tr = max(1, sz.pred_train_tokens // seq)
    tr_seqs = windows(train_ids, np_rng.integers(0, train_ids.size - seq - 1, n_tr), seq)
    n_he = max(1, math.ceil(sz.heldout_tokens / seq))
    he_starts = even_starts(held_ids.size, n_he, seq)
    he_seqs = windows(held_ids, he_starts, seq)
    hdt = torch.bfloat16 if device.type == "cuda" else torch.float32
    t_rec = time.perf_counter()
    tty = sys.stderr.isatty()
    rec_tr = record(model, tr_seqs, batch_size=8, hidden=True, hidden_dtype=hdt, progress=tty)
    rec_te = record(model, he_seqs, batch_size=8, hidden=True, hidden_dtype=hdt, progress=tty)
    log(f"recorded {rec_tr.num_tokens:,} training-split and {rec_te.num_tokens:,} held-out tokens in {time.perf_counter() - t_rec:.1f} s")
    router_w = {i: r.weight.detach().float() for i, (_, r) in find_routers(model).items()}
    arrays, pmetrics = build_trace_arrays(rec_tr, rec_te, router_w, device=device, steps=sz.pred_steps,
                                          cdf_steps=int(sz.pred_steps * 4 / 3), seed=seed, log=log)
    log(f"predictors fitted in {pmetrics['seconds']} s")
    quality = {}
    if with_quality:
        quality = measure_quality(model, he_seqs, arrays, train_rec=rec_tr, heldout_rec=rec_te, batch=8, amp=False, log=log)
        log(f"quality measured in {quality['seconds']} s")
    return Recording(arrays, pmetrics, quality, int(rec_te.num_tokens), n_tr, n_he, hdt)


@dataclass
class Losses:
    """Mean cross-entropy (nats per token) on the evaluation windows, before and after training."""

    heldout_before: float
    train_before: float
    train_after: float = math.nan
    heldout_after: float = math.nan


@dataclass
class BuiltModel:
    model: torch.nn.Module
    config: object  # the transformers config it was built from
    aux: dict  # load-balancing loss settings
    counts: dict  # recorder.model_counts, checked against the shape
    parameters: int
    routed_expert_parameters: int


def _build(a, shape, width: Width, vocab: int, seq: int, device, log) -> BuiltModel:
    """The reduced-width model of the shape, its counts checked against the shape's."""
    model, cfg, aux = build_model(a.shape, width, vocab, max(seq, 2048), a.seed, device, a.attention_multiplier)
    counts = checked_counts(model, shape)
    n_params = sum(p.numel() for p in model.parameters())
    n_expert_params = sum(p.numel() for n_, p in model.named_parameters() if ".experts." in n_)
    log(f"model {counts['hf_architecture']}: {counts['num_layers']} layers ({counts['first_dense_layers']} dense first), "
        f"{counts['num_experts']} experts top-{counts['top_k']}, {counts['num_shared_experts']} shared; d {width.d}, expert FFN {width.ffn}; "
        f"{n_params / 1e6:.1f} M parameters ({n_expert_params / 1e6:.1f} M in routed experts)")
    return BuiltModel(model, cfg, aux, counts, n_params, n_expert_params)


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    try:
        return _run(a, argv)
    except ShapeMismatchError as exc:
        print(f"chipsim: error: {exc}", file=sys.stderr)
        return 1


def _run(a, argv: list[str] | None) -> int:
    t_start = time.perf_counter()
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    amp = device.type == "cuda"
    sz = RunSizes.from_args(a)
    seq, batch = sz.seq, sz.batch
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = a.name or TRACE_NAMES.get(a.shape, "real-" + a.shape)
    shape = get_model(a.shape)

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:7.1f}s] {msg}", flush=True)

    import transformers

    log(f"torch {torch.__version__}, transformers {transformers.__version__}, device {device}"
        + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""))
    torch.manual_seed(a.seed)
    np_rng = np.random.default_rng(a.seed)
    train_ids, held_ids, data_meta = load_split(a.data)
    vocab = int(data_meta["vocab_size"])
    log(f"data: {train_ids.size:,} training / {held_ids.size:,} held-out tokens, vocab {vocab}")
    built = _build(a, shape, sz.width, vocab, seq, device, log)
    model, aux = built.model, built.aux

    eval_held = windows(held_ids, even_starts(held_ids.size, sz.eval_windows, seq + 1), seq + 1)
    eval_train = windows(train_ids, np_rng.integers(0, train_ids.size - seq - 2, sz.eval_windows), seq + 1)
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")
    x0 = windows(train_ids, np_rng.integers(0, train_ids.size - seq - 2, batch), seq).to(device)
    if a.experts_impl == "auto":
        impl, impl_timing = pick_experts_impl(model, x0, shape.top_k, aux, amp, device, log)
    else:
        model.set_experts_implementation(a.experts_impl)
        impl, impl_timing = a.experts_impl, {}
    log(f"experts implementation: {impl}")

    losses = Losses(heldout_before=eval_loss(model, eval_held, batch, device, amp),
                    train_before=eval_loss(model, eval_train, batch, device, amp))
    log(f"before training: train loss {losses.train_before:.4f}, held-out loss {losses.heldout_before:.4f} "
        f"(ln V = {math.log(vocab):.4f})")
    trained = _train(model, _optimizer(model, a.lr, device), train_ids, np_rng, sz, a.lr, a.minutes * 60.0,
                     shape.top_k, aux, amp, device, log, a.tiny)
    losses.heldout_after = eval_loss(model, eval_held, batch, device, amp)
    losses.train_after = eval_loss(model, eval_train, batch, device, amp)
    log(f"after {trained.steps} steps ({trained.tokens:,} tokens, {trained.seconds:.0f} s): train loss "
        f"{losses.train_before:.4f} -> {losses.train_after:.4f}, held-out loss {losses.heldout_before:.4f} -> "
        f"{losses.heldout_after:.4f}")

    rec = _record(model, train_ids, held_ids, np_rng, sz, device, a.seed, not a.no_quality, log)
    cmd = "python -m chipsim.tracegen.train " + " ".join(shlex.quote(x) for x in (argv if argv is not None else sys.argv[1:]))
    meta = _trace_meta(a, cmd, shape, built, sz, (impl, impl_timing), losses, trained, rec, data_meta, amp, device)
    path = out_dir / f"{name}.npz"
    meta["provenance"]["metrics_tokens"] = rec.heldout_tokens
    save_trimmed(path, rec.arrays, meta, seq, log)
    trace = tformat.load(path)
    (out_dir / f"{name}.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
    log(f"wrote {path} ({path.stat().st_size / (1 << 20):.2f} MiB): {trace.provenance_line()}")
    log(f"total {time.perf_counter() - t_start:.0f} s")
    return 0


def _trace_meta(a, cmd: str, shape, built: BuiltModel, sz: RunSizes, experts_impl: tuple[str, dict], losses: Losses,
                trained: TrainResult, rec: Recording, data_meta: dict, amp: bool, device) -> dict:
    """The trace's meta: the model's counts, and a provenance saying how it was built, trained and recorded."""
    import transformers

    counts, width, seq, tiny = built.counts, sz.width, sz.seq, a.tiny
    impl, impl_timing = experts_impl
    return {
        "synthetic": False,
        "model": {**{k: counts[k] for k in tformat.META_MODEL_KEYS}, "name": shape.name, "hf_architecture": counts["hf_architecture"]},
        "provenance": {
            "description": (f"{'TINY DRY RUN, not a result: ' if tiny else ''}{counts['hf_architecture']} at the {shape.name} counts, "
                            f"d {width.d}, trained {trained.tokens / 1e6:.1f} M tokens, held-out loss {losses.heldout_after:.3f}"),
            "kind": "tiny CPU dry run (not a result)" if tiny else "trained reduced-width model of the published shape",
            "architecture": counts["hf_architecture"],
            "shape": shape.name,
            "config": {k: v for k, v in built.config.to_dict().items() if isinstance(v, (int, float, str, bool)) or v is None},
            "width": {"hidden_size": width.d, "expert_ffn": width.ffn, "heads": width.heads, "kv_heads": width.kv_heads,
                      "head_dim": width.head_dim},
            "parameters": built.parameters,
            "routed_expert_parameters": built.routed_expert_parameters,
            "load_balancing": built.aux,
            "training": {
                "steps": trained.steps, "tokens": trained.tokens, "batch": sz.batch, "seq": seq,
                "seconds": round(trained.seconds, 1),
                "budget_minutes": a.minutes, "lr": a.lr, "optimizer": "AdamW(0.9, 0.95), wd 0.1 on matrices, clip 1.0, "
                f"warm-up {sz.warmup_steps} steps, cosine on wall time to 10 %", "precision": "bf16 autocast" if amp else "fp32",
                "experts_implementation": impl, "experts_implementation_timing": impl_timing,
                "loss_history": trained.history[:: max(1, len(trained.history) // 40)],
            },
            "loss": {"train_before": round(losses.train_before, 4), "train_after": round(losses.train_after, 4),
                     "heldout_before": round(losses.heldout_before, 4), "heldout_after": round(losses.heldout_after, 4),
                     "eval": f"{sz.eval_windows} windows of {seq + 1} tokens each (held-out: spread evenly over the held-out documents)",
                     "unit": "nats per token"},
            "text": {"sources": data_meta["sources"], "split": data_meta["split"], "tokenizer": data_meta["tokenizer"],
                     "train_tokens_available": data_meta["train_tokens"], "heldout_tokens_available": data_meta["heldout_tokens"],
                     "data_sha256": data_meta["sha256"], "prepare_command": data_meta["command"]},
            "recording": {"predictor_train_tokens": sz.pred_train_tokens,
                          "predictor_train_windows": f"{rec.train_windows} random training windows of {seq}",
                          "heldout_windows": f"{rec.heldout_windows} windows of {seq} spread evenly over the held-out documents",
                          "precision": "fp32 forward (TF32 off)", "hidden_state_storage": str(rec.hidden_dtype).replace("torch.", ""),
                          "train_expert_counts": "routed-expert counts over the predictor training split"},
            "seed": a.seed,
            "command": cmd,
            "software": {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version()},
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        },
        "predictor_metrics": rec.predictor_metrics,
        "quality": rec.quality,
    }


if __name__ == "__main__":
    sys.exit(main())
