"""The routing recorder on tiny random-init models of every supported transformers MoE class (CPU, fast).

Random-init models are for tests only, never results.
"""

import json
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from chipsim.tracegen.recorder import (  # noqa: E402
    RoutingRecorder,
    decoder_layers,
    find_routers,
    load_local_model,
    model_counts,
    parse_router_output,
    record,
)

V, D, L = 97, 32, 3
COMMON = dict(vocab_size=V, hidden_size=D, num_hidden_layers=L, num_attention_heads=4, max_position_embeddings=64,
              experts_implementation="eager")

# class -> (config class, kwargs, expected counts: first_dense, experts, top_k, shared)
TINY = {
    "GraniteMoeForCausalLM": ("GraniteMoeConfig", dict(num_key_value_heads=2, intermediate_size=16, num_local_experts=8,
                                                      num_experts_per_tok=2), (0, 8, 2, 0)),
    "GraniteMoeSharedForCausalLM": ("GraniteMoeSharedConfig", dict(num_key_value_heads=2, intermediate_size=16, num_local_experts=8,
                                                                  num_experts_per_tok=2, shared_intermediate_size=24), (0, 8, 2, 1)),
    "MixtralForCausalLM": ("MixtralConfig", dict(num_key_value_heads=2, intermediate_size=16, num_local_experts=8,
                                                 num_experts_per_tok=2), (0, 8, 2, 0)),
    "Qwen2MoeForCausalLM": ("Qwen2MoeConfig", dict(num_key_value_heads=2, intermediate_size=48, moe_intermediate_size=16,
                                                   shared_expert_intermediate_size=24, num_experts=8, num_experts_per_tok=3,
                                                   mlp_only_layers=[0]), (1, 8, 3, 1)),
    "Qwen3MoeForCausalLM": ("Qwen3MoeConfig", dict(num_key_value_heads=2, intermediate_size=48, moe_intermediate_size=16,
                                                   num_experts=8, num_experts_per_tok=3, head_dim=8), (0, 8, 3, 0)),
    "OlmoeForCausalLM": ("OlmoeConfig", dict(num_key_value_heads=4, intermediate_size=16, num_experts=8, num_experts_per_tok=3),
                         (0, 8, 3, 0)),
    "DeepseekV2ForCausalLM": ("DeepseekV2Config", dict(num_key_value_heads=4, intermediate_size=48, moe_intermediate_size=16,
                                                       first_k_dense_replace=1, n_routed_experts=8, n_shared_experts=2,
                                                       num_experts_per_tok=3, kv_lora_rank=16, q_lora_rank=None,
                                                       qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
                                                       topk_method="greedy", n_group=1, topk_group=1), (1, 8, 3, 2)),
    "DeepseekV3ForCausalLM": ("DeepseekV3Config", dict(num_key_value_heads=4, intermediate_size=48, moe_intermediate_size=16,
                                                       first_k_dense_replace=1, n_routed_experts=8, n_shared_experts=1,
                                                       num_experts_per_tok=2, n_group=4, topk_group=2, kv_lora_rank=16,
                                                       q_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
                                                       num_mtp_layers=0), (1, 8, 2, 1)),
    "PhimoeForCausalLM": ("PhimoeConfig", dict(num_key_value_heads=2, intermediate_size=16, num_local_experts=8,
                                               num_experts_per_tok=2), (0, 8, 2, 0)),
}


def _tiny(arch, seed=0):
    cfg_name, kwargs, _ = TINY[arch]
    cfg = getattr(transformers, cfg_name)(**COMMON, **kwargs)
    torch.manual_seed(seed)
    model = getattr(transformers, arch)(cfg).eval()
    if arch == "DeepseekV3ForCausalLM":  # a non-zero selection bias, so the recorded ids differ from a plain top-k
        for _, r in find_routers(model).values():
            r.e_score_correction_bias.normal_(0, 0.3)
    return model


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Every tiny model saved with save_pretrained and reloaded from its local folder."""
    out = {}
    for arch in TINY:
        path = tmp_path_factory.mktemp(arch)
        _tiny(arch).save_pretrained(path)
        out[arch] = load_local_model(str(path))
    return out


@pytest.mark.parametrize("arch", list(TINY))
def test_record_every_class_from_local_checkpoint(saved, arch):
    model = saved[arch]
    assert type(model).__name__ == arch
    first, n, k, shared = TINY[arch][2]
    counts = model_counts(model)
    assert counts == {"num_layers": L, "first_dense_layers": first, "num_experts": n, "top_k": k,
                      "num_shared_experts": shared, "hf_architecture": arch}
    ids = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(1))
    rec = record(model, ids, batch_size=2)
    assert rec.moe_layers == list(range(first, L))
    assert rec.routed_ids.shape == (18, L - first, k)
    assert rec.router_logits.shape == (18, L - first, n)
    assert rec.layer_inputs.shape == (18, L, D) and rec.ffn_inputs.shape == (18, L, D)
    assert torch.equal(rec.token_ids, ids.reshape(-1))
    # weights sorted descending, ids distinct
    assert (rec.routed_weights[..., :-1] >= rec.routed_weights[..., 1:]).all()
    s = torch.sort(rec.routed_ids, -1).values
    assert (s[..., 1:] != s[..., :-1]).all()
    # the recorded ids and weights are what the router itself returns for the recorded FFN input
    for li, a in enumerate(rec.moe_layers):
        _, router = find_routers(model)[a]
        with torch.no_grad():
            r_ids, r_w, r_logits = parse_router_output(router(rec.ffn_inputs[:, a]), n)
        assert torch.equal(torch.sort(r_ids, -1).values, torch.sort(rec.routed_ids[:, li], -1).values)
        assert torch.allclose(torch.sort(r_w, -1, descending=True).values, rec.routed_weights[:, li], atol=1e-6)
        assert torch.allclose(r_logits, rec.router_logits[:, li], atol=1e-5)
    # the layer-input hook saw the embeddings entering layer 0
    with torch.no_grad():
        emb = model.get_input_embeddings()(ids).reshape(-1, D)
    scale = getattr(model.config, "embedding_multiplier", 1.0) or 1.0
    assert torch.allclose(rec.layer_inputs[:, 0], emb * scale, atol=1e-5)


@pytest.mark.parametrize("arch", ["GraniteMoeForCausalLM", "MixtralForCausalLM", "DeepseekV2ForCausalLM", "OlmoeForCausalLM"])
def test_recorded_ids_are_the_routers_top_k(saved, arch):
    """For greedy softmax routers the routed set is the top-k of the recorded logits."""
    model = saved[arch]
    ids = torch.randint(0, V, (1, 12), generator=torch.Generator().manual_seed(2))
    rec = record(model, ids, hidden=False)
    k = rec.routed_ids.shape[-1]
    top = torch.topk(rec.router_logits, k, -1).indices
    assert torch.equal(torch.sort(top, -1).values, torch.sort(rec.routed_ids, -1).values)


def test_deepseek_v3_records_the_biased_grouped_choice(saved):
    """DeepSeek-V3's choice (bias + group limit) is not the top-k of its logits: the recorder keeps the real one."""
    model = saved["DeepseekV3ForCausalLM"]
    ids = torch.randint(0, V, (2, 16), generator=torch.Generator().manual_seed(3))
    rec = record(model, ids, hidden=False)
    k = rec.routed_ids.shape[-1]
    top = torch.sort(torch.topk(rec.router_logits, k, -1).indices, -1).values
    assert not torch.equal(top, torch.sort(rec.routed_ids, -1).values)


@pytest.mark.parametrize("arch", ["GraniteMoeForCausalLM", "DeepseekV2ForCausalLM"])
def test_prefill_routing_equals_token_by_token_decode(saved, arch):
    model = saved[arch]
    ids = torch.randint(0, V, (1, 10), generator=torch.Generator().manual_seed(4))
    pre = record(model, ids, hidden=False)
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad(), RoutingRecorder(model, hidden=False) as rec:
        for t in range(ids.shape[1]):
            model(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True)
        dec = rec.take(ids)
    assert dec.routed_ids.shape == pre.routed_ids.shape
    assert torch.equal(dec.routed_ids, pre.routed_ids)
    assert torch.allclose(dec.routed_weights, pre.routed_weights, atol=1e-5)


@pytest.mark.parametrize("arch", ["GraniteMoeForCausalLM", "DeepseekV2ForCausalLM"])
def test_padding_is_excluded(saved, arch):
    model = saved[arch]
    g = torch.Generator().manual_seed(5)
    a, b = torch.randint(0, V, (1, 8), generator=g), torch.randint(0, V, (1, 5), generator=g)
    batch = torch.zeros(2, 8, dtype=torch.long)
    batch[0], batch[1, :5] = a[0], b[0]
    mask = torch.zeros(2, 8, dtype=torch.long)
    mask[0], mask[1, :5] = 1, 1
    both = record(model, batch, attention_mask=mask, batch_size=2)
    alone = [record(model, a), record(model, b)]
    assert both.num_tokens == 13
    assert torch.equal(both.token_ids, torch.cat([a[0], b[0]]))
    assert torch.equal(both.routed_ids, torch.cat([alone[0].routed_ids, alone[1].routed_ids]))
    assert torch.allclose(both.layer_inputs, torch.cat([alone[0].layer_inputs, alone[1].layer_inputs]), atol=1e-5)


def test_parse_router_output_either_order():
    logits, w, ids = torch.randn(5, 8), torch.rand(5, 2), torch.randint(0, 8, (5, 2))
    for out in ((logits, w, ids), (ids, w, logits)):
        i, ww, lg = parse_router_output(out, 8)
        assert torch.equal(i, ids) and torch.equal(ww, w) and torch.equal(lg, logits)
    with pytest.raises(ValueError):
        parse_router_output((logits, w), 8)


def test_non_moe_model_is_rejected():
    cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=D, intermediate_size=16, num_hidden_layers=2, num_attention_heads=4)
    model = transformers.LlamaForCausalLM(cfg)
    assert len(decoder_layers(model)) == 2
    with pytest.raises(ValueError, match="no MoE router"):
        find_routers(model)


def test_checkpoint_command_writes_a_trace(tmp_path):
    """`chipsim trace MODEL_DIR --text FILE --out X.npz` on a tiny local checkpoint."""
    tokenizers = pytest.importorskip("tokenizers")
    from chipsim.cli import main as cli_main
    from chipsim.trace import format as tformat

    text = " ".join(f"word{i % 37} token{i % 11} line{i % 5}." for i in range(1200))
    tk = tokenizers.Tokenizer(tokenizers.models.BPE())
    tk.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.train_from_iterator([text], tokenizers.trainers.BpeTrainer(vocab_size=V, special_tokens=["<eot>"], show_progress=False))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eot>")
    model = _tiny("GraniteMoeForCausalLM")
    ckpt = tmp_path / "ckpt"
    model.save_pretrained(ckpt)
    fast.save_pretrained(ckpt)
    (tmp_path / "text.txt").write_text(text)
    out = tmp_path / "t.npz"
    assert cli_main(["trace", str(ckpt), "--text", str(tmp_path / "text.txt"), "--out", str(out), "--seq", "16",
                            "--train-tokens", "128", "--heldout-tokens", "32", "--pred-steps", "10"]) == 0
    t = tformat.load(out)
    assert t.num_tokens == 32 and t.meta["model"]["hf_architecture"] == "GraniteMoeForCausalLM"
    assert t.meta["synthetic"] is False and t.meta["provenance"]["text"]["tokens"] > 0
    assert t.meta["provenance"]["trace_tokens"] == 32 and json.loads(out.with_suffix(".json").read_text()) == {
        k: v for k, v in t.meta.items() if k != "schema_version"}
    # --max-mib keeps the most leading whole windows that fit: here one 16-token window of the two
    limit = out.stat().st_size - 1
    small = tmp_path / "small.npz"
    assert cli_main(["trace", str(ckpt), "--text", str(tmp_path / "text.txt"), "--out", str(small), "--seq", "16",
                     "--train-tokens", "128", "--heldout-tokens", "32", "--pred-steps", "10",
                     "--max-mib", str(limit / (1 << 20))]) == 0
    assert tformat.load(small).num_tokens == 16 and small.stat().st_size <= limit
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "small.json", "small.npz", "t.json", "t.npz", "text.txt"]
