"""`chipsim models`: the bundled shapes in a table, and what chipsim derives from one shape (a bundled name or a
config.json): layers by kind, attention and cache bytes, experts and their bytes in a weight format, parameters
beside what was published."""

from __future__ import annotations

from chipsim.hw.expert_formats import FORMATS
from chipsim.workload.decode import BF16_BYTES, DenseWeights, expert_part_bytes, non_expert_bytes
from chipsim.workload.hf_config import bundled_record
from chipsim.workload.models import MODELS
from chipsim.workload.shape import FULL, MAMBA, SLIDING, ModelShape

DEFAULT_GROUP, DEFAULT_SCALE_BITS = 128, 16  # integer formats' groups when no config says (hwconfigs/thor.yaml's)


def expert_bytes(m: ModelShape, fmt: str) -> int:
    """One routed expert's bytes in format `fmt` (its biases at 16 bit), as a run counts them."""
    f = FORMATS[fmt]
    return sum(expert_part_bytes(m, f.bits, f.group_size or DEFAULT_GROUP, f.scale_bits or DEFAULT_SCALE_BITS))


def dense_bytes(m: ModelShape, fmt: str) -> int:
    """Every non-expert weight with its matrices in format `fmt` (as model.dense_bits at the format's bits and
    scales counts them; norms and biases BF16)."""
    f = FORMATS[fmt]
    dense = DenseWeights(f.bits, f.group_size or DEFAULT_GROUP, f.scale_bits or DEFAULT_SCALE_BITS, 0)
    return non_expert_bytes(m, dense)


def _non_expert(m: ModelShape, asked: str) -> str:
    """The non-expert weights at BF16, and in the format asked for (--expert-format) where it is below 16 bit."""
    text = f"non-expert weights: {m.non_expert_params() * BF16_BYTES / 1e9:.3f} GB (BF16"
    if asked and FORMATS[asked].bits < 16:
        text += f"; {dense_bytes(m, asked) / 1e9:.3f} GB as {asked}, model.dense_bits {FORMATS[asked].bits}"
    return text + ")"


def table() -> str:
    lines = [f"{'name':22} {'architecture':30} {'layers':>6} {'MoE':>4} {'experts':>7} {'top-k':>5} {'shared':>6} "
             f"{'expert MB':>9} {'total B':>8} {'active B':>8}"]
    for name in sorted(MODELS):
        m = MODELS[name]
        fmt = m.published_expert_format or "bf16"
        lines.append(f"{m.name:22} {m.hf_architecture:30} {m.num_layers:>6} {m.num_moe_layers:>4} {m.num_experts:>7} "
                     f"{m.top_k:>5} {m.num_shared_experts:>6} {expert_bytes(m, fmt) / 1e6:>9.2f} "
                     f"{m.total_params() / 1e9:>8.2f} {m.active_params() / 1e9:>8.2f}")
    lines.append("expert MB: one routed expert as the checkpoint ships it (BF16 unless the model says otherwise); "
                 "`chipsim models NAME` for the rest")
    return "\n".join(lines)


def _mixers(m: ModelShape) -> str:
    counts = {kind: sum(m.mixer(i) == kind for i in range(m.num_layers)) for kind in (FULL, SLIDING, MAMBA)}
    words = {FULL: "full attention", SLIDING: f"sliding-window attention ({m.sliding_window} tokens)",
             MAMBA: "Mamba2"}
    return ", ".join(f"{n} {words[k]}" for k, n in counts.items() if n)


def _attention(m: ModelShape) -> str:
    if m.attention == "mla":
        q = f"query LoRA {m.q_lora_rank}" if m.q_lora_rank else "full query projection"
        return (f"MLA: {m.num_heads} heads, latent {m.kv_lora_rank} + RoPE {m.qk_rope_head_dim} cached, no-position "
                f"{m.qk_nope_head_dim}, value {m.v_head_dim}, {q}; absorbed projections at decode")
    kind = "MHA" if m.num_kv_heads == m.num_heads else "MQA" if m.num_kv_heads == 1 else "GQA"
    extras = [name for name, on in (("q/k norms", m.qk_norm), ("q/k/v/o biases", m.attention_bias),
                                    ("sinks", m.attention_sinks), ("no RoPE", not m.rope)) if on]
    return f"{kind}: {m.num_heads} query / {m.num_kv_heads} KV heads of {m.head_dim}" + (
        f"; {', '.join(extras)}" if extras else "")


def describe(m: ModelShape, fmt: str = "", context: int = 4096, published: dict | None = None) -> str:
    """What chipsim derives from shape `m`: the lines `chipsim models NAME` prints."""
    asked, fmt = fmt, fmt or m.published_expert_format or "bf16"
    dense = m.first_dense_layers
    lines = [f"{m.name}: {m.hf_architecture}", f"  source: {m.source or '(inline)'}",
             f"  layers: {m.num_layers} ({dense} dense first, {m.num_moe_layers} MoE); token mixers: {_mixers(m)}"]
    if any(m.mixer(i) != MAMBA for i in range(m.num_layers)):
        lines.append(f"  attention: {_attention(m)}")
        lines.append(f"  KV cache: {m.kv_cache_bytes_per_token_layer(BF16_BYTES):,} B per token per attention "
                     "layer (BF16)")
    if any(m.mixer(i) == MAMBA for i in range(m.num_layers)):
        lines.append(f"  Mamba2: {m.mamba_heads} heads x {m.mamba_head_dim}, state {m.mamba_state}, "
                     f"{m.mamba_groups} group(s), conv kernel {m.mamba_conv_kernel}; state "
                     f"{m.mamba_state_bytes(BF16_BYTES):,} B per layer (BF16)")
    lines.append(f"  cache at {context:,} tokens: {m.cache_bytes(context, BF16_BYTES) / 1e6:,.2f} MB (BF16)")
    shared = (f", {m.num_shared_experts} shared of {m.shared_expert_ffn}"
              f"{' (sigmoid-gated)' if m.shared_expert_gate else ''}") if m.num_shared_experts else ", no shared"
    act = "clamped SwiGLU" if m.expert_activation == "swiglu_clamped" else "SiLU-gated"
    lines.append(f"  experts: {m.num_experts} routed, top-{m.top_k}{shared}; expert FFN {m.expert_ffn}, {act}"
                 f"{', with biases' if m.expert_bias else ''}{'; dense FFN ' + str(m.dense_ffn) if dense else ''}")
    per_format = ", ".join(f"{name} {expert_bytes(m, name) / 1e6:.2f}" for name in ("bf16", "fp8-e4m3", "mxfp4", "int4"))
    lines.append(f"  bytes per expert: {expert_bytes(m, fmt) / 1e6:.3f} MB as {fmt} "
                 f"({m.expert_params:,} weights); MB in other formats: {per_format}")
    if m.published_expert_format:
        lines.append(f"  the checkpoint ships its experts as {m.published_expert_format}")
    lines.append(f"  {_non_expert(m, asked)}; all experts: "
                 f"{m.num_moe_layers * m.num_experts * expert_bytes(m, fmt) / 1e9:.3f} GB as {fmt}")
    lines.append(f"  parameters: {m.total_params() / 1e9:.3f} B total, {m.active_params() / 1e9:.3f} B active "
                 f"({m.active_params(False) / 1e9:.3f} B without the input embedding)")
    if published:
        lines += _published_lines(m, published)
    return "\n".join(lines)


def _published_lines(m: ModelShape, record: dict) -> list[str]:
    pub = record.get("published") or {}
    lines = []
    for key, ours in (("total_params_billion", m.total_params()), ("active_params_billion", None)):
        if key not in pub:
            continue
        if ours is None:
            ours = m.active_params(pub.get("active_counts_input_embedding", True))
        off = 100 * (ours / 1e9 - pub[key]) / pub[key]
        held = "held to 1 % by the tests" if key in pub.get("checked", []) else "not held (a rounded figure)"
        lines.append(f"  published {key.split('_')[0]}: {pub[key]:g} B (chipsim counts {off:+.1f} %; {held})")
    if pub.get("source"):
        lines.append(f"    from: {pub['source']}")
    for note in record.get("unconfirmed") or []:
        lines.append(f"  unconfirmed: {note}")
    return lines


def describe_bundled(name: str, fmt: str = "", context: int = 4096) -> str:
    return describe(MODELS[name], fmt, context, bundled_record(name))
