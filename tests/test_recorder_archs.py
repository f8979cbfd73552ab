"""The recorder on the MoE classes of the 2025-26 bundled shapes (gpt-oss, ERNIE-4.5, Granite-4.0-H, Qwen3-MoE,
Moonlight = DeepSeek-V3, OLMoE, Phi-3.5-MoE): each router found, its choice recorded as the class makes it, and
the counts a trace is matched on equal to chipsim's shape of the same config.json.

Tiny random-init models (tests only, never results); the full-size checks build models on the meta device.
"""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from chipsim.tracegen.recorder import find_routers, load_local_model, model_counts, record  # noqa: E402
from chipsim.trace.format import META_MODEL_KEYS  # noqa: E402
from chipsim.workload import hf_config  # noqa: E402
from chipsim.workload.models import MODELS  # noqa: E402

V, D = 97, 64
COMMON = dict(vocab_size=V, hidden_size=D, num_attention_heads=4, max_position_embeddings=64,
              experts_implementation="eager")
COUNT_KEYS = (*META_MODEL_KEYS, "hf_architecture")

# class -> (config class, tiny kwargs with the bundled shape's structure, bundled shape)
TINY = {
    "GptOssForCausalLM": ("GptOssConfig", dict(
        num_hidden_layers=2, num_key_value_heads=2, head_dim=16, intermediate_size=32, num_local_experts=8,
        num_experts_per_tok=2, sliding_window=4, layer_types=["sliding_attention", "full_attention"]), "gpt-oss-20b"),
    "Ernie4_5_MoeForCausalLM": ("Ernie4_5_MoeConfig", dict(
        num_hidden_layers=3, num_key_value_heads=2, intermediate_size=96, moe_intermediate_size=32, moe_num_experts=8,
        moe_k=3, moe_num_shared_experts=2, moe_layer_start_index=1), "ernie-4.5-21b-a3b"),
    "GraniteMoeHybridForCausalLM": ("GraniteMoeHybridConfig", dict(
        num_hidden_layers=3, num_key_value_heads=2, intermediate_size=32, num_local_experts=8, num_experts_per_tok=2,
        shared_intermediate_size=48, layer_types=["mamba", "attention", "mamba"], mamba_n_heads=4, mamba_d_head=32,
        mamba_d_state=16, mamba_chunk_size=8, position_embedding_type="nope"), "granite-4.0-h-tiny"),
    "Qwen3MoeForCausalLM": ("Qwen3MoeConfig", dict(
        num_hidden_layers=2, num_key_value_heads=2, intermediate_size=96, moe_intermediate_size=32, num_experts=8,
        num_experts_per_tok=3, head_dim=16), "qwen3-30b-a3b"),
    # Moonlight routes in one group (n_group 1): the choice is the top-k of sigmoid(logits) + correction bias
    "DeepseekV3ForCausalLM": ("DeepseekV3Config", dict(
        num_hidden_layers=3, num_key_value_heads=4, intermediate_size=96, moe_intermediate_size=32,
        first_k_dense_replace=1, n_routed_experts=8, n_shared_experts=2, num_experts_per_tok=3, n_group=1,
        topk_group=1, kv_lora_rank=16, q_lora_rank=None, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8),
        "moonlight-16b-a3b"),
    "OlmoeForCausalLM": ("OlmoeConfig", dict(
        num_hidden_layers=2, num_key_value_heads=4, intermediate_size=32, num_experts=8, num_experts_per_tok=3),
        "olmoe-1b-7b-0125"),
    "PhimoeForCausalLM": ("PhimoeConfig", dict(
        num_hidden_layers=2, num_key_value_heads=2, intermediate_size=32, num_local_experts=8, num_experts_per_tok=2),
        "phi-3.5-moe"),
}


def _router_biases(model) -> None:
    """Non-zero router biases (zero at init), so a rule that adds them is told apart from a plain top-k."""
    g = torch.Generator().manual_seed(7)
    for _, r in find_routers(model).values():
        for bias in (getattr(r, "bias", None), getattr(r, "e_score_correction_bias", None),
                     getattr(getattr(r, "moe_statics", None), "e_score_correction_bias", None)):
            if isinstance(bias, torch.Tensor):
                with torch.no_grad():
                    bias.copy_(torch.randn(bias.shape, generator=g) * 0.3)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """arch -> (the tiny model saved with save_pretrained and reloaded by load_local_model, its folder)."""
    out = {}
    for arch, (cfg_name, kwargs, _) in TINY.items():
        if not hasattr(transformers, arch):
            continue
        torch.manual_seed(0)
        model = getattr(transformers, arch)(getattr(transformers, cfg_name)(**COMMON, **kwargs))
        _router_biases(model)
        path = tmp_path_factory.mktemp(arch)
        model.save_pretrained(path)
        out[arch] = (load_local_model(str(path)), path)
    return out


def _model(saved, arch):
    if arch not in saved:
        pytest.skip(f"transformers {transformers.__version__} has no {arch}")
    return saved[arch][0]


def _recording(model):
    """Two sequences, the second padded: 9 + 6 tokens."""
    ids = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    return record(model, ids, attention_mask=mask, batch_size=2, hidden=False)


def _sorted(ids):
    return torch.sort(ids, -1).values


def _topk(scores, k):
    return _sorted(torch.topk(scores, k, -1).indices)


def _bias(router, arch):
    if arch == "Ernie4_5_MoeForCausalLM":
        return router.moe_statics.e_score_correction_bias.squeeze(0)
    return router.e_score_correction_bias


# what each class chooses from its (T, N) logits, checkable by hand (the recorder keeps whatever was returned)
CHOICE = {
    "Qwen3MoeForCausalLM": lambda logits, r, arch: logits,  # softmax top-k: softmax keeps the order
    "OlmoeForCausalLM": lambda logits, r, arch: logits,  # softmax top-k
    "GraniteMoeHybridForCausalLM": lambda logits, r, arch: logits,  # top-k of the logits, then softmax over the k
    "GptOssForCausalLM": lambda logits, r, arch: logits,  # top-k, then softmax; its logits already hold the bias
    "PhimoeForCausalLM": lambda logits, r, arch: logits,  # sparsemixer at eval: the argmax, then the next one
    # softmax, plus the correction bias for the choice only: not the logits' top-k
    "Ernie4_5_MoeForCausalLM": lambda logits, r, arch: torch.softmax(logits, -1) + _bias(r, arch),
    # sigmoid, plus the correction bias for the choice only (one group): not the logits' top-k
    "DeepseekV3ForCausalLM": lambda logits, r, arch: torch.sigmoid(logits) + _bias(r, arch),
}
BIASED_CHOICE = ("Ernie4_5_MoeForCausalLM", "DeepseekV3ForCausalLM")


@pytest.mark.parametrize("arch", list(TINY))
def test_recorded_routing_is_the_classes_own_choice(saved, arch):
    model = _model(saved, arch)
    counts = model_counts(model)
    n, k, first = counts["num_experts"], counts["top_k"], counts["first_dense_layers"]
    rec = _recording(model)
    assert rec.moe_layers == list(range(first, counts["num_layers"]))
    assert rec.routed_ids.shape == (15, counts["num_layers"] - first, k)
    assert rec.router_logits.shape == (15, counts["num_layers"] - first, n)
    assert ((rec.routed_ids >= 0) & (rec.routed_ids < n)).all()
    s = _sorted(rec.routed_ids)
    assert (s[..., 1:] != s[..., :-1]).all()
    routers = find_routers(model)
    for li, a in enumerate(rec.moe_layers):
        scores = CHOICE[arch](rec.router_logits[:, li], routers[a][1], arch)
        assert torch.equal(_topk(scores, k), s[:, li])
    if arch in BIASED_CHOICE:  # the bias changed the choice somewhere: a plain top-k would be wrong
        assert not torch.equal(_topk(rec.router_logits, k), s)


@pytest.mark.parametrize("arch", ["GptOssForCausalLM", "GraniteMoeHybridForCausalLM"])
def test_top_k_then_softmax_weights(saved, arch):
    """gpt-oss and Granite weight the k chosen experts by a softmax over their k logits only."""
    rec = _recording(_model(saved, arch))
    k = rec.routed_ids.shape[-1]
    want = torch.softmax(torch.topk(rec.router_logits, k, -1).values, -1)
    assert torch.allclose(rec.routed_weights, want, atol=1e-6)


@pytest.mark.parametrize("arch", list(TINY))
def test_counts_agree_with_chipsims_shape_of_the_saved_config(saved, arch):
    """model_counts of the checkpoint equals hf_config's shape of its own config.json (as transformers saved it)."""
    model = _model(saved, arch)
    shape = hf_config.read_config_file(str(saved[arch][1] / "config.json"), "config")
    assert model_counts(model) == {key: getattr(shape, key) for key in COUNT_KEYS}
    bundled = MODELS[TINY[arch][2]]  # the tiny config has the bundled shape's structure
    assert bundled.hf_architecture == arch
    assert (shape.num_shared_experts, shape.first_dense_layers > 0) == (
        bundled.num_shared_experts, bundled.first_dense_layers > 0)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_full_size_counts_agree_with_every_bundled_shape(name):
    """Each bundled shape's config built at full size on the meta device (no weights) counts as the shape does."""
    shape = MODELS[name]
    if not hasattr(transformers, shape.hf_architecture):
        pytest.skip(f"transformers {transformers.__version__} has no {shape.hf_architecture}")
    cfg = dict(hf_config.bundled_record(name)["config"])
    cfg.pop("quantization_config", None)  # gpt-oss's MXFP4: a loading option, not structure
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    with torch.device("meta"):
        model = getattr(transformers, shape.hf_architecture)(config)
    assert model_counts(model) == {key: getattr(shape, key) for key in COUNT_KEYS}
