"""Published MoE model shapes (values from each model's config.json on its model card).

Timing always uses these shapes; a trace only supplies routing, so a trace recorded from a
reduced-width model of the same layer / expert / top-k / shared counts matches the full shape.
"""

from __future__ import annotations

from dataclasses import dataclass

from chipsim.errors import InputError


@dataclass(frozen=True)
class ModelShape:
    name: str
    hf_architecture: str
    num_layers: int
    hidden_size: int
    num_experts: int  # routed experts per MoE layer
    top_k: int
    expert_ffn: int  # intermediate size of one routed expert (gated: gate, up, down)
    vocab_size: int
    tie_embeddings: bool
    # attention
    attention: str  # "gqa" or "mla"
    num_heads: int
    num_kv_heads: int
    head_dim: int
    # shared experts (always computed) and dense first layers
    num_shared_experts: int = 0
    shared_expert_ffn: int = 0  # intermediate size of one shared expert
    first_dense_layers: int = 0
    dense_ffn: int = 0  # intermediate size of the dense FFN in the first layers
    shared_expert_gate: bool = False  # Qwen2-MoE: sigmoid gate on the shared expert
    # MLA (DeepSeek-V2): the KV cache holds one compressed latent per token and layer
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.first_dense_layers

    @property
    def moe_layer_indices(self) -> list[int]:
        return list(range(self.first_dense_layers, self.num_layers))

    @property
    def expert_params(self) -> int:
        """Weights of one routed expert: gate and up (d × I each) and down (I × d)."""
        return 3 * self.hidden_size * self.expert_ffn

    def expert_matrix_params(self) -> list[tuple[str, int, int]]:
        """(name, in_features, out_features) of one routed expert's matrices, in execution order."""
        d, i = self.hidden_size, self.expert_ffn
        return [("gate", d, i), ("up", d, i), ("down", i, d)]

    def attention_weight_params(self) -> int:
        """Weights of one layer's attention block (projections only)."""
        d = self.hidden_size
        if self.attention == "mla":
            h = self.num_heads
            q = d * h * (self.qk_nope_head_dim + self.qk_rope_head_dim)
            kv_a = d * (self.kv_lora_rank + self.qk_rope_head_dim)
            kv_b = self.kv_lora_rank * h * (self.qk_nope_head_dim + self.v_head_dim)
            o = h * self.v_head_dim * d
            return q + kv_a + kv_b + o
        q = d * self.num_heads * self.head_dim
        kv = 2 * d * self.num_kv_heads * self.head_dim
        o = self.num_heads * self.head_dim * d
        return q + kv + o

    def kv_cache_bytes_per_token_layer(self, bytes_per_value: int = 2) -> int:
        """KV-cache bytes one token adds to one layer (BF16 by default)."""
        if self.attention == "mla":
            return (self.kv_lora_rank + self.qk_rope_head_dim) * bytes_per_value
        return 2 * self.num_kv_heads * self.head_dim * bytes_per_value

    def non_expert_params(self) -> int:
        """Everything that stays on-package: embeddings, LM head, attention, routers, shared and dense FFNs, norms."""
        d = self.hidden_size
        emb = self.vocab_size * d * (1 if self.tie_embeddings else 2)
        per_layer = self.attention_weight_params() + 2 * d  # two RMSNorms
        total = emb + d + self.num_layers * per_layer
        total += self.num_moe_layers * d * self.num_experts  # routers
        total += self.num_moe_layers * self.num_shared_experts * 3 * d * self.shared_expert_ffn
        if self.shared_expert_gate:
            total += self.num_moe_layers * d
        total += self.first_dense_layers * 3 * d * self.dense_ffn
        return total

    def total_params(self) -> int:
        return self.non_expert_params() + self.num_moe_layers * self.num_experts * self.expert_params


# Values from each model's published config.json (Hugging Face model cards).
MODELS: dict[str, ModelShape] = {
    m.name: m
    for m in [
        ModelShape(
            name="granite-3.1-1b-a400m", hf_architecture="GraniteMoeForCausalLM",
            num_layers=24, hidden_size=1024, num_experts=32, top_k=8, expert_ffn=512,
            vocab_size=49155, tie_embeddings=True,
            attention="gqa", num_heads=16, num_kv_heads=8, head_dim=64,
        ),
        ModelShape(
            name="granite-3.1-3b-a800m", hf_architecture="GraniteMoeForCausalLM",
            num_layers=32, hidden_size=1536, num_experts=40, top_k=8, expert_ffn=512,
            vocab_size=49155, tie_embeddings=True,
            attention="gqa", num_heads=24, num_kv_heads=8, head_dim=64,
        ),
        ModelShape(
            name="phi-mini-moe", hf_architecture="PhimoeForCausalLM",
            num_layers=32, hidden_size=4096, num_experts=16, top_k=2, expert_ffn=960,
            vocab_size=32064, tie_embeddings=False,
            attention="gqa", num_heads=32, num_kv_heads=8, head_dim=128,
        ),
        ModelShape(
            name="deepseek-v2-lite", hf_architecture="DeepseekV2ForCausalLM",
            num_layers=27, hidden_size=2048, num_experts=64, top_k=6, expert_ffn=1408,
            vocab_size=102400, tie_embeddings=False,
            attention="mla", num_heads=16, num_kv_heads=16, head_dim=192,
            num_shared_experts=2, shared_expert_ffn=1408, first_dense_layers=1, dense_ffn=10944,
            kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
        ),
        ModelShape(
            name="qwen2-57b-a14b", hf_architecture="Qwen2MoeForCausalLM",
            num_layers=28, hidden_size=3584, num_experts=64, top_k=8, expert_ffn=2560,
            vocab_size=151936, tie_embeddings=False,
            attention="gqa", num_heads=28, num_kv_heads=4, head_dim=128,
            num_shared_experts=1, shared_expert_ffn=20480, shared_expert_gate=True,
        ),
        ModelShape(
            name="mixtral-8x7b", hf_architecture="MixtralForCausalLM",
            num_layers=32, hidden_size=4096, num_experts=8, top_k=2, expert_ffn=14336,
            vocab_size=32000, tie_embeddings=False,
            attention="gqa", num_heads=32, num_kv_heads=8, head_dim=128,
        ),
        ModelShape(
            name="olmoe-1b-7b", hf_architecture="OlmoeForCausalLM",
            num_layers=16, hidden_size=2048, num_experts=64, top_k=8, expert_ffn=1024,
            vocab_size=50304, tie_embeddings=False,
            attention="gqa", num_heads=16, num_kv_heads=16, head_dim=128,
        ),
    ]
}


def get_model(name: str) -> ModelShape:
    try:
        return MODELS[name]
    except KeyError:
        known = ", ".join(sorted(MODELS))
        raise InputError(f"model.name: unknown model '{name}' (known: {known})") from None
