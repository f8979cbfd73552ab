"""Models as data: config.json shapes, their parameters against what was published, the new layers' bytes and
operations summed by hand, expert formats, and bad model input."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, THOR
from test_bad_input import assert_rejected, chipsim, write_config

from chipsim.cli import main
from chipsim.hw.compute_formula import ArrayModel
from chipsim.hw.config import load_config
from chipsim.workload import hf_config
from chipsim.workload.decode import build_workload, op_group_builders
from chipsim.workload.model_report import expert_bytes
from chipsim.workload.models import MODELS, model_of

NEW = ["qwen3-30b-a3b", "gpt-oss-20b", "ernie-4.5-21b-a3b", "granite-4.0-h-tiny", "phi-3.5-moe",
       "moonlight-16b-a3b", "olmoe-1b-7b-0125"]
SEVEN = ["granite-3.1-1b-a400m", "granite-3.1-3b-a800m", "phi-mini-moe", "deepseek-v2-lite", "qwen2-57b-a14b",
         "mixtral-8x7b", "olmoe-1b-7b"]


def groups(model: str, context: int = 1024, *overrides: str) -> dict:
    """The op groups of `model`'s decode step on thor's analytic arrays (one OpCost each)."""
    hw = load_config(THOR, [f"model.name={model}", f"workload.context_length={context}", "compute.timing=analytic",
                            *overrides]).hw
    am = ArrayModel(hw)
    return {name: build() for name, build in op_group_builders(am, model_of(hw.model), hw).items() if build}


def test_every_model_named_in_the_issue_is_bundled_with_a_source():
    assert set(NEW + SEVEN) <= set(MODELS)
    for name in MODELS:
        record = hf_config.bundled_record(name)
        assert record["source"] and record["published"]["source"]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_parameters_match_what_was_published_within_one_percent(name):
    m, pub = MODELS[name], hf_config.bundled_record(name)["published"]
    ours = {"total_params_billion": m.total_params(),
            "active_params_billion": m.active_params(pub.get("active_counts_input_embedding", True))}
    for key in pub["checked"]:
        assert abs(ours[key] / 1e9 - pub[key]) <= 0.01 * pub[key], (key, ours[key], pub[key])
    if "total_params_billion" not in pub["checked"]:  # ERNIE-4.5: only its name's 21B was found; the file says so
        assert pub["note"] and f"{m.total_params() / 1e9:.2f} B" in pub["note"]


def test_the_seven_shapes_expert_sizes_are_the_reference_table_s():
    """REFERENCE §E's BF16 expert sizes: 3 x d x I x 2 bytes."""
    mib = {"granite-3.1-1b-a400m": 3.0, "granite-3.1-3b-a800m": 4.5, "phi-mini-moe": 22.5, "deepseek-v2-lite": 16.5,
           "qwen2-57b-a14b": 52.5, "mixtral-8x7b": 336.0, "olmoe-1b-7b": 12.0}
    for name, size in mib.items():
        assert expert_bytes(MODELS[name], "bf16") == size * 2**20


def test_gpt_oss_checkpoint_is_its_published_size():
    """MXFP4 experts (4.25 bits a weight, biases at 16 bit) and BF16 for the rest: the model card's 12.8 GiB."""
    m = MODELS["gpt-oss-20b"]
    d, i = 2880, 2880
    per_expert = 3 * d * i * 4 // 8 + 3 * d * i // 32 + (2 * i + d) * 2
    assert expert_bytes(m, "mxfp4") == per_expert
    checkpoint = m.non_expert_params() * 2 + 24 * 32 * per_expert
    assert abs(checkpoint / 2**30 - 12.8) < 0.01 * 12.8


def test_a_sliding_window_layer_reads_at_most_its_window():
    """gpt-oss at context 1,024: a full layer's scores and value mix read 1,024 tokens of K and of V
    (8 KV heads x 64 x 2 bytes each), a sliding one 128; everything else is the same."""
    g = groups("gpt-oss-20b", 1024)
    per_token = 8 * 64 * 2
    assert g["attention"].hbm_read_bytes - g["attention_sliding"].hbm_read_bytes == 2 * (1024 - 128) * per_token
    short = groups("gpt-oss-20b", 100)  # below the window both are the same
    assert short["attention"].hbm_read_bytes == short["attention_sliding"].hbm_read_bytes


def test_sinks_add_one_logit_per_head_and_biases_their_reads():
    """gpt-oss, 64 heads at context 1,024: SFU ops = 1 (input norm) + 64 x (1,024 + 1) exps; the q/k/v biases
    ((64 + 16) x 64) and the o bias (2,880) are read beside the projections' weights."""
    g = groups("gpt-oss-20b", 1024)
    assert g["attention"].sfu_ops == 1 + 64 * 1025
    d, hd = 2880, 64
    weights = d * (64 + 16) * hd + 64 * hd * d
    cache = 2 * 8 * 1024 * hd
    assert g["attention"].hbm_read_bytes == 2 * (weights + cache + (64 + 16) * hd + d)


def test_qwen3_q_k_norms_are_one_rsqrt_per_head():
    """Qwen3-30B-A3B (32 query, 4 KV heads): 1 + 36 rsqrt + 32 x context exps."""
    assert groups("qwen3-30b-a3b", 512)["attention"].sfu_ops == 1 + 36 + 32 * 512


def test_a_mamba2_step_by_hand():
    """Granite-4.0-H-Tiny: d 1536, 48 heads x 64 (E 3072), state 128, 1 group, kernel 4: C = 3072 + 256 = 3328
    channels, in_proj 1536 -> 2 x 3072 + 256 + 48 = 6448. MACs: in_proj, y = C.h (48 x 64 x 128), out_proj. Bytes
    read: in_proj and out_proj weights, conv taps + bias + 3 past inputs, dt bias/A/D, the state; written: the
    convolution's new inputs and the state. No context in any of it."""
    d, e, n, h, ch, proj = 1536, 3072, 128, 48, 3328, 6448
    for context in (64, 8192):
        op = groups("granite-4.0-h-tiny", context)["mamba"]
        assert op.macs == d * proj + h * 64 * n + e * d
        state = h * 64 * n * 2
        assert op.hbm_read_bytes == 2 * (d * proj + ch * 4 + ch * 3 + ch + 3 * h + e * d) + state
        assert op.hbm_write_bytes == 2 * ch + state
        assert op.sfu_ops == 1 + ch + 2 * h + e + 1  # input norm, conv SiLU, softplus + exp, gate SiLU, group norm
    m = MODELS["granite-4.0-h-tiny"]
    assert m.cache_bytes(1000) == 36 * (state + ch * 3 * 2) + 4 * 1000 * 2 * 4 * 128 * 2


def test_mla_with_a_query_lora_costs_its_two_projections(tmp_path):
    """A DeepSeek-V3 config with q_lora_rank 1536: the query costs d x 1536 + 1536 x heads x (nope + rope) MACs
    instead of d x heads x (nope + rope); the cache is kv_lora_rank + rope per token either way."""
    cfg = dict(hf_config.bundled_record("moonlight-16b-a3b")["config"])
    with_lora = tmp_path / "lora" / "config.json"
    with_lora.parent.mkdir()
    with_lora.write_text(json.dumps(dict(cfg, q_lora_rank=1536)))
    base = groups("moonlight-16b-a3b")["attention"]
    lora = groups("moonlight-16b-a3b", 1024, f"model.config={with_lora}")["attention"]
    d, qk = 2048, 16 * (128 + 64)
    assert lora.macs - base.macs == d * 1536 + 1536 * qk - d * qk
    assert MODELS["moonlight-16b-a3b"].kv_cache_bytes_per_token_layer() == (512 + 64) * 2


@pytest.mark.parametrize("fmt, bits_per_weight_x32", [("mxfp4", 4 * 32 + 8), ("nvfp4", 4 * 32 + 16),
                                                       ("bf16", 16 * 32)])
def test_expert_formats_set_the_bytes_moved(fmt, bits_per_weight_x32):
    """Granite-3B's expert (3 x 1536 x 512 weights) in `fmt`: its bits a weight (x 32, scales included)."""
    wl = build_workload(load_config(THOR, [f"model.expert_format={fmt}"]).hw)
    assert wl.expert_bytes == 3 * 1536 * 512 * bits_per_weight_x32 // 32 // 8


def test_fp8_per_tensor_has_one_scale_per_matrix():
    wl = build_workload(load_config(THOR, ["model.expert_format=fp8-e4m3"]).hw)
    assert wl.expert_matrix_bytes == (1536 * 512 + 4, 1536 * 512 + 4, 512 * 1536 + 4)


def test_a_config_json_replays_exactly_as_the_bundled_shape(tmp_path, capsys):
    """Granite-3B's fields in a config.json give the same run, number for number, as model.name."""
    path = tmp_path / "granite-3b" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(hf_config.bundled_record("granite-3.1-3b-a800m")["config"]))
    results = []
    for override in ("model.name=granite-3.1-3b-a800m", f"model.config={path}"):
        assert main(["run", THOR, "--set", override, "--set", "workload.max_tokens=24", "--policy", "apex",
                     "--json"]) == 0
        results.append(json.loads(capsys.readouterr().out))
    assert results[0] == results[1]


def test_an_inline_shape_is_a_config_json(tmp_path):
    shape = hf_config.bundled_record("qwen3-30b-a3b")["config"]
    cfg = write_config(tmp_path, "model:\n  shape: " + json.dumps(shape) + "\n")
    assert model_of(load_config(cfg).hw.model) == dataclasses.replace(MODELS["qwen3-30b-a3b"], name="inline")


def test_models_lists_and_describes(tmp_path):
    code, out, _ = chipsim("models")
    assert code == 0 and all(name in out for name in MODELS)
    path = tmp_path / "my-model" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(hf_config.bundled_record("gpt-oss-20b")["config"]))
    code, out, _ = chipsim("models", str(path))
    assert code == 0 and "my-model: GptOssForCausalLM" in out and "12 sliding-window attention (128 tokens)" in out
    assert f"{(3 * 2880 * 2880 * 17 // 32 + 3 * 2880 * 2) / 1e6:.3f} MB as mxfp4" in out  # 4.25 bits + 16-bit biases


# ---------------------------------------------------------------------------------------------- bad input
def _config_json(tmp_path, text: str) -> str:
    path = tmp_path / "m" / "config.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return str(path)


QWEN3 = dict(hf_config.bundled_record("qwen3-30b-a3b")["config"])
GPT_OSS = dict(hf_config.bundled_record("gpt-oss-20b")["config"])


@pytest.mark.parametrize("text, fragments", [
    ("{not json", ["model.config", "not JSON"]),
    (json.dumps({k: v for k, v in QWEN3.items() if k != "moe_intermediate_size"}),
     ["moe_intermediate_size is missing", "qwen3_moe"]),
    (json.dumps(dict(QWEN3, model_type="llama")), ["'llama' is not an architecture chipsim costs", "gpt_oss"]),
    (json.dumps(dict(QWEN3, num_experts_per_tok=200)), ["top-k 200 exceeds the 128 routed experts"]),
    (json.dumps(dict(QWEN3, num_hidden_layers=0)), ["num_hidden_layers must be from 1 to 1,024, not 0"]),
    (json.dumps(dict(QWEN3, hidden_size="2048")), ["hidden_size must be a whole number"]),
    (json.dumps(dict(QWEN3, mlp_only_layers=[3])), ["mlp_only_layers", "dense layers between MoE layers"]),
    (json.dumps(dict(QWEN3, hidden_size=None)), ["hidden_size is null"]),
    (json.dumps(dict(QWEN3, vocab_size=10**12)), ["vocab_size must be from 1 to 4,194,304"]),
    (json.dumps(dict(QWEN3, model_type=["qwen3_moe"])), ["model_type must be a name"]),
    (json.dumps({k: v for k, v in dict(QWEN3, architectures=[["x"]]).items() if k != "model_type"}),
     ["architectures must be a list of class names"]),
    (json.dumps(dict(QWEN3, use_sliding_window=True)), ["use_sliding_window", "which layers slide"]),
    (json.dumps(dict(GPT_OSS, layer_types=[["sliding_attention"]] * 24)), ["layer_types has"]),
    (json.dumps(dict(GPT_OSS, quantization_config="mxfp4")), ["quantization_config must be a mapping"]),
    (json.dumps(dict(QWEN3, quantization_config={"quant_method": "bitsandbytes", "load_in_4bit": True})),
     ["quantization_config", "bitsandbytes", "remove quantization_config"]),
    (json.dumps(dict(QWEN3, hidden_act="gelu")), ["hidden_act 'gelu'", "chipsim costs 'silu'"]),
    (json.dumps(QWEN3)[:-1] + ', "hidden_size": 4096}', ["not JSON", "'hidden_size' given twice"]),
])
def test_bad_config_json_is_one_line_before_any_work(tmp_path, text, fragments):
    path = _config_json(tmp_path, text)
    out = tmp_path / "out"
    assert_rejected(["run", THOR, "--set", f"model.config={path}", "--out", str(out)], *fragments, out_dir=out)


def test_a_trace_of_another_model_is_refused(tmp_path):
    """thor's trace is of Granite-3B's 32 layers; a config.json of 24 is not its model."""
    granite = hf_config.bundled_record("granite-3.1-3b-a800m")["config"]
    path = _config_json(tmp_path, json.dumps(dict(granite, num_hidden_layers=24)))
    assert_rejected(["run", THOR, "--set", f"model.config={path}"], "num_layers=32", "num_layers=24")


def test_config_and_shape_together_are_refused(tmp_path):
    path = _config_json(tmp_path, json.dumps(QWEN3))
    cfg = write_config(tmp_path, f"model:\n  config: {path}\n  shape: {{model_type: qwen3_moe}}\n")
    assert_rejected(["run", cfg], "model.shape", "not both")


def test_a_key_the_format_decides_cannot_be_set_beside_it():
    assert_rejected(["run", THOR, "--set", "model.expert_format=mxfp4", "--set", "model.expert_bits=8"],
                    "model.expert_bits", "mxfp4 decides it")


def test_models_of_an_unknown_name_or_a_bad_file(tmp_path):
    assert_rejected(["models", "no-such-model"], "unknown model 'no-such-model'")
    path = _config_json(tmp_path, "[]")
    assert_rejected(["models", path], f"chipsim models {path}: expected a JSON object")  # the path said once


def test_a_quantised_checkpoint_s_format_is_read_and_said(tmp_path, capsys):
    """quantization_config names the format the checkpoint ships its experts in: DeepSeek-V3's and Qwen3's FP8
    configs give E4M3 with 128 x 128 blocks (8 bits plus one 32-bit scale per 16,384 weights), gpt-oss mxfp4; the
    bytes printed are that format's."""
    fp8 = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
    for quant, name in ((fp8, "fp8-e4m3-block128"), (dict(fp8, weight_block_size=None), "fp8-e4m3"),
                        ({"quant_method": "gptq", "bits": 4}, "int4"), ({"quant_method": "mxfp4"}, "mxfp4")):
        path = _config_json(tmp_path, json.dumps(dict(QWEN3, quantization_config=quant)))
        assert main(["models", path]) == 0
        out = capsys.readouterr().out
        assert f"the checkpoint ships its experts as {name}" in out
        m = hf_config.read_config_file(path, "t")
        assert f"bytes per expert: {expert_bytes(m, name) / 1e6:.3f} MB as {name}" in out
    weights = 3 * 2048 * 768  # Qwen3-30B-A3B: gate, up, down of hidden 2048 x expert FFN 768
    assert expert_bytes(m, "fp8-e4m3-block128") == weights + 3 * (2048 * 768 // (128 * 128)) * 4


def test_a_sweep_of_a_config_json_model_recomputes_when_the_file_changes(tmp_path, monkeypatch):
    """The config.json is an input like the trace: the same path with other contents is another point (here a
    wider expert: slower), never the cached result."""
    from chipsim.analysis.sweep import run_sweep

    monkeypatch.setenv("CHIPSIM_CACHE_DIR", str(tmp_path / "cache"))
    fields = hf_config.bundled_record("granite-3.1-3b-a800m")["config"]
    path = _config_json(tmp_path, json.dumps(fields))

    def sweep():
        return run_sweep(THOR, {"workload.max_tokens": [4]}, ["no-prefetch"], str(tmp_path / "sw"), jobs=1,
                         progress=False, overrides=[f"model.config={path}", "workload.warmup_tokens=0"])

    first = sweep()
    assert (first.attrs["simulated"], sweep().attrs["simulated"]) == (1, 0)
    _config_json(tmp_path, json.dumps(dict(fields, intermediate_size=1024)))
    wider = sweep()
    assert wider.attrs["simulated"] == 1
    assert wider["latency_ms_per_token"][0] > first["latency_ms_per_token"][0]


def test_fields_a_config_json_leaves_out_take_the_transformers_class_defaults():
    """A sparse file reads as transformers 5.17 would build it: gpt-oss alternates 128-token windows (sliding
    first) and has attention biases; DeepSeek-V3 has a 1,536 query LoRA, 1 shared expert and 3 dense layers (V2:
    2 shared, none dense); a null q_lora_rank is a full q_proj; Granite-4.0-H has a 1,024 shared MLP and no RoPE."""
    sparse = {k: v for k, v in GPT_OSS.items() if k not in ("layer_types", "sliding_window", "attention_bias")}
    assert hf_config.shape_from_config(sparse, "t", "t") == dataclasses.replace(MODELS["gpt-oss-20b"], name="t")
    moon = dict(hf_config.bundled_record("moonlight-16b-a3b")["config"])
    bare = {k: v for k, v in moon.items() if k not in ("q_lora_rank", "n_shared_experts", "first_k_dense_replace")}
    v3 = hf_config.shape_from_config(bare, "t", "t")
    assert (v3.q_lora_rank, v3.num_shared_experts, v3.first_dense_layers) == (1536, 1, 3)
    v2 = hf_config.shape_from_config(dict(bare, model_type="deepseek_v2"), "t", "t")
    assert (v2.q_lora_rank, v2.num_shared_experts, v2.first_dense_layers) == (1536, 2, 0)
    assert hf_config.shape_from_config(dict(moon), "t", "t").q_lora_rank == 0  # published: null
    granite = dict(hf_config.bundled_record("granite-4.0-h-tiny")["config"])
    plain = {k: v for k, v in granite.items() if k not in ("shared_intermediate_size", "position_embedding_type")}
    h = hf_config.shape_from_config(plain, "t", "t")
    assert (h.shared_expert_ffn, h.rope) == (1024, False)


def test_an_impossible_model_is_refused_before_any_operation_is_costed(tmp_path):
    """A layer count that cannot fit thor's 2 GiB: the capacity check comes before the (cycle-level) costing."""
    granite = hf_config.bundled_record("granite-3.1-3b-a800m")["config"]
    path = _config_json(tmp_path, json.dumps(dict(granite, num_hidden_layers=1000)))
    assert_rejected(["run", THOR, "--set", f"model.config={path}"], "memory.hbm.capacity_gib")


def test_a_trace_of_shared_counts_is_named_only_by_shape():
    """Phi-mini-MoE and Phi-3.5-MoE share every count a trace carries: a checkpoint of either is not guessed."""
    from chipsim.tracegen.checkpoint import matching_shape
    from chipsim.trace import format as tformat

    counts = {k: getattr(MODELS["phi-3.5-moe"], k) for k in tformat.META_MODEL_KEYS}
    assert matching_shape(counts) is None
    counts = {k: getattr(MODELS["qwen3-30b-a3b"], k) for k in tformat.META_MODEL_KEYS}
    assert matching_shape(counts) == "qwen3-30b-a3b"


def test_a_bundled_name_reads_its_own_file_and_not_every_shape():
    """Start-up: `chipsim run` of a bundled model parses that model's YAML alone; the registry of all fourteen is
    read on first use (and gives the same shape)."""
    code = ("import chipsim.workload.models as m; s = m.get_model('qwen3-30b-a3b'); "
            "print('MODELS' in vars(m), m.MODELS['qwen3-30b-a3b'] is s, 'MODELS' in vars(m))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.stdout.split() == ["False", "True", "True"], proc.stderr
