"""What chipsim costs of an MoE model: its shape (ModelShape), with the weights, cache bytes and parameters that
follow from it. Shapes are read from config.json files by chipsim.workload.hf_config and named in
chipsim.workload.models."""

from __future__ import annotations

from dataclasses import dataclass, field

# the token mixers a layer may have (HF's layer_types names, "attention" read as full)
FULL, SLIDING, MAMBA = "full_attention", "sliding_attention", "mamba"


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
    attention: str  # "gqa" (MHA and MQA included: num_kv_heads = num_heads or 1) or "mla"
    num_heads: int
    num_kv_heads: int
    head_dim: int
    # shared experts (always computed) and dense first layers
    num_shared_experts: int = 0
    shared_expert_ffn: int = 0  # intermediate size of one shared expert
    first_dense_layers: int = 0
    dense_ffn: int = 0  # intermediate size of the dense FFN in the first layers
    shared_expert_gate: bool = False  # Qwen2-MoE: sigmoid gate on the shared expert
    # MLA (DeepSeek-V2/V3): the KV cache holds one compressed latent per token and layer
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    q_lora_rank: int = 0  # DeepSeek-V3: queries through a low-rank projection too (0: a full q_proj)
    # per-layer token mixer (FULL, SLIDING or MAMBA); empty: every layer full attention
    layer_types: tuple[str, ...] = ()
    sliding_window: int = 0  # tokens a sliding-window layer attends to
    attention_sinks: bool = False  # gpt-oss: one learned logit per head joins every softmax
    attention_bias: bool = False  # biases on q, k, v and o projections
    qk_norm: bool = False  # Qwen3: an RMSNorm over each head's query and key
    rope: bool = True  # False: no position embedding in attention (Granite-4.0-H, "nope")
    expert_bias: bool = False  # gpt-oss: biases on the experts' gate/up and down projections
    router_bias: bool = False  # a bias per expert on the router's scores (gpt-oss; DeepSeek-V3's correction bias)
    lm_head_bias: bool = False
    expert_activation: str = "silu"  # "silu": SiLU(gate)·up; "swiglu_clamped": gpt-oss's clamped, scaled form
    # Mamba2 layers (Granite-4.0-H): heads x head_dim = the inner width; state of d_state per head dim
    mamba_heads: int = 0
    mamba_head_dim: int = 0
    mamba_state: int = 0
    mamba_groups: int = 0
    mamba_conv_kernel: int = 0
    mamba_conv_bias: bool = False
    mamba_proj_bias: bool = False
    published_expert_format: str = ""  # how the checkpoint ships its experts (e.g. mxfp4), for `chipsim models`
    source: str = field(default="", compare=False)  # where the values came from

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.first_dense_layers

    @property
    def moe_layer_indices(self) -> list[int]:
        return list(range(self.first_dense_layers, self.num_layers))

    def mixer(self, layer: int) -> str:
        """The token mixer of `layer`: FULL, SLIDING or MAMBA."""
        return self.layer_types[layer] if self.layer_types else FULL

    @property
    def expert_params(self) -> int:
        """Weights of one routed expert: gate and up (d × I each) and down (I × d), and their biases if any."""
        return sum(i * o for _, i, o in self.expert_matrix_params()) + self.expert_bias_params()

    def expert_matrix_params(self) -> list[tuple[str, int, int]]:
        """(name, in_features, out_features) of one routed expert's matrices, in execution order."""
        d, i = self.hidden_size, self.expert_ffn
        return [("gate", d, i), ("up", d, i), ("down", i, d)]

    def expert_bias_params(self) -> int:
        """gpt-oss: a bias on each of gate and up (I each) and on down (d); kept at 16 bit beside the weights."""
        return 2 * self.expert_ffn + self.hidden_size if self.expert_bias else 0

    def attention_weight_params(self) -> int:
        """Weights of one attention layer (projections, their biases, q/k norms, sinks)."""
        d = self.hidden_size
        if self.attention == "mla":
            h = self.num_heads
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            q = d * self.q_lora_rank + self.q_lora_rank * h * qk if self.q_lora_rank else d * h * qk
            kv_a = d * (self.kv_lora_rank + self.qk_rope_head_dim)
            kv_b = self.kv_lora_rank * h * (self.qk_nope_head_dim + self.v_head_dim)
            o = h * self.v_head_dim * d
            # the low-rank latents' RMSNorms (kv_lora_rank, q_lora_rank weights) are not counted: < 0.01 %
            return q + kv_a + kv_b + o
        nq, nkv, hd = self.num_heads, self.num_kv_heads, self.head_dim
        params = d * (nq + 2 * nkv) * hd + nq * hd * d
        if self.attention_bias:
            params += (nq + 2 * nkv) * hd + d
        if self.qk_norm:
            params += 2 * hd
        if self.attention_sinks:
            params += nq
        return params

    def mamba_inner(self) -> int:
        return self.mamba_heads * self.mamba_head_dim

    def mamba_conv_channels(self) -> int:
        """x, B and C pass through the short convolution."""
        return self.mamba_inner() + 2 * self.mamba_groups * self.mamba_state

    def mamba_in_proj_outputs(self) -> int:
        """z (gate), x, B, C and one dt per head."""
        return 2 * self.mamba_inner() + 2 * self.mamba_groups * self.mamba_state + self.mamba_heads

    def mamba_weight_params(self) -> int:
        """One Mamba2 mixer: in_proj, the depthwise short convolution, dt bias, A, D, the gated norm, out_proj."""
        d, inner, ch = self.hidden_size, self.mamba_inner(), self.mamba_conv_channels()
        params = d * self.mamba_in_proj_outputs() + ch * self.mamba_conv_kernel + 3 * self.mamba_heads
        params += inner + inner * d
        if self.mamba_conv_bias:
            params += ch
        if self.mamba_proj_bias:
            params += self.mamba_in_proj_outputs() + d
        return params

    def mixer_params(self, layer: int) -> int:
        return self.mamba_weight_params() if self.mixer(layer) == MAMBA else self.attention_weight_params()

    def kv_cache_bytes_per_token_layer(self, bytes_per_value: int = 2) -> int:
        """KV-cache bytes one token adds to one attention layer (BF16 by default)."""
        if self.attention == "mla":
            return (self.kv_lora_rank + self.qk_rope_head_dim) * bytes_per_value
        return 2 * self.num_kv_heads * self.head_dim * bytes_per_value

    def attended_tokens(self, layer: int, context: int) -> int:
        """Tokens an attention layer reads at a context of `context`: a sliding window reads at most its window."""
        return min(context, self.sliding_window) if self.mixer(layer) == SLIDING else context

    def mamba_state_bytes(self, bytes_per_value: int = 2) -> int:
        """One Mamba2 layer's recurrent state: the SSM state (heads × head_dim × d_state) and the convolution's last
        kernel − 1 inputs per channel (what the next step needs), both at `bytes_per_value` (BF16: the model's dtype,
        as mamba_ssm's inference cache allocates them; transformers computes the state in FP32 and its cache keeps
        kernel inputs, which would double the state: a choice, not a measurement)."""
        ssm = self.mamba_heads * self.mamba_head_dim * self.mamba_state
        conv = self.mamba_conv_channels() * (self.mamba_conv_kernel - 1)
        return (ssm + conv) * bytes_per_value

    def cache_bytes(self, context: int, bytes_per_value: int = 2) -> int:
        """What a request's cache holds at `context` tokens: KV for each attention layer (a sliding layer keeps its
        window), the recurrent state for each Mamba2 layer."""
        total = 0
        for layer in range(self.num_layers):
            if self.mixer(layer) == MAMBA:
                total += self.mamba_state_bytes(bytes_per_value)
            else:
                total += self.attended_tokens(layer, context) * self.kv_cache_bytes_per_token_layer(bytes_per_value)
        return total

    def router_params(self) -> int:
        return self.hidden_size * self.num_experts + (self.num_experts if self.router_bias else 0)

    def non_expert_params(self) -> int:
        """Everything that stays on-package: embeddings, LM head, token mixers, routers, shared and dense FFNs, norms."""
        d = self.hidden_size
        emb = self.vocab_size * d * (1 if self.tie_embeddings else 2)
        total = emb + d + (self.vocab_size if self.lm_head_bias else 0)
        total += sum(self.mixer_params(layer) + 2 * d for layer in range(self.num_layers))  # two RMSNorms a layer
        total += self.num_moe_layers * self.router_params()
        total += self.num_moe_layers * self.num_shared_experts * 3 * d * self.shared_expert_ffn
        if self.shared_expert_gate:
            total += self.num_moe_layers * d
        total += self.first_dense_layers * 3 * d * self.dense_ffn
        return total

    def mixer_matrix_params(self, layer: int) -> int:
        """Of mixer_params, the projections' weights: what model.dense_bits quantises (norms, biases, sinks, the
        Mamba2 convolution taps, dt bias, A and D stay BF16)."""
        d = self.hidden_size
        if self.mixer(layer) == MAMBA:
            return d * self.mamba_in_proj_outputs() + self.mamba_inner() * d
        if self.attention == "mla":
            return self.attention_weight_params()  # MLA's count is its projections alone
        nq, nkv, hd = self.num_heads, self.num_kv_heads, self.head_dim
        return d * (nq + 2 * nkv) * hd + nq * hd * d

    def non_expert_matrix_params(self) -> int:
        """Of non_expert_params, the weight matrices' (model.dense_bits): embeddings, LM head, the mixers'
        projections, routers, shared and dense FFNs, the shared experts' gate; the rest is norms and biases."""
        d = self.hidden_size
        total = self.vocab_size * d * (1 if self.tie_embeddings else 2)
        total += sum(self.mixer_matrix_params(layer) for layer in range(self.num_layers))
        total += self.num_moe_layers * d * self.num_experts
        total += self.num_moe_layers * self.num_shared_experts * 3 * d * self.shared_expert_ffn
        if self.shared_expert_gate:
            total += self.num_moe_layers * d
        return total + self.first_dense_layers * 3 * d * self.dense_ffn

    def total_params(self) -> int:
        return self.non_expert_params() + self.num_moe_layers * self.num_experts * self.expert_params

    def active_params(self, count_input_embedding: bool = True) -> int:
        """Weights one token uses: everything on-package and top-k routed experts per MoE layer (the input
        embedding is one row looked up; publishers differ on whether they count it)."""
        active = self.non_expert_params() + self.num_moe_layers * self.top_k * self.expert_params
        if not count_input_embedding:
            active -= self.vocab_size * self.hidden_size if not self.tie_embeddings else 0
        return active
