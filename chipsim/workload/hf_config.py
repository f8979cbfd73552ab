"""A Hugging Face config.json as a ModelShape: one reader per architecture (`model_type`), no torch, no network.

Each reader takes the fields that architecture's transformers modeling code reads (names as published) and
says which ModelShape features the architecture has by construction (Qwen3's q/k norms, gpt-oss's sinks and
expert biases). A field chipsim needs that the file lacks, a value of the wrong type, an impossible shape or an
architecture with no reader is one InputError naming it.

To add an architecture whose layers chipsim already costs (GQA/MLA attention, sliding windows, Mamba2 mixers,
routed + shared experts, dense first layers): write a reader here and add it to READERS. One with a new kind of
layer also needs its costing (chipsim/workload/decode.py) and its parameters (chipsim/workload/models.py).
"""

from __future__ import annotations

import os
from pathlib import Path

from chipsim.errors import InputError
import yaml

from chipsim.files import read_input_text, read_json
from chipsim.workload.shape import FULL, MAMBA, SLIDING, ModelShape

SHAPES_DIR = Path(__file__).resolve().parent / "shapes"  # the bundled shapes
CONFIG_MAX_BYTES = 4 << 20  # a config.json is a few KB; a 4 MB one is not a config
# bounds no real model reaches (the largest vocabularies are ~260k, hidden sizes ~16k, layers ~100) and that keep
# a mistyped value from costing for minutes: it is refused in one line instead
MAX_DIMENSION = 1 << 22
MAX_LAYERS = 1024
MAX_EXPERTS = 65534  # the trace format's expert ids are uint16, 65535 meaning none


class _Fields:
    """Typed access to a config.json's fields, with errors that name the file and the field."""

    def __init__(self, cfg: dict, where: str, model_type: str):
        self.cfg, self.where, self.model_type = cfg, where, model_type

    def _bad(self, key: str, why: str) -> InputError:
        return InputError(f"{self.where}: {key} {why}")

    def int(self, key: str, default=None, minimum: int = 1, maximum: int = MAX_DIMENSION) -> int:
        """A whole-number field; absent or null: `default` (None: the field is required)."""
        value = self.cfg.get(key)
        if value is None:
            if default is None:
                said = "is null" if key in self.cfg else "is missing"
                raise self._bad(key, f"{said}; chipsim needs it (a whole number) for {self.model_type}")
            value = default
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._bad(key, f"must be a whole number, not {value!r}")
        if not minimum <= value <= maximum:
            raise self._bad(key, f"must be from {minimum} to {maximum:,}, not {value:,}")
        return value

    def bool(self, key: str, default: bool) -> bool:
        value = self.cfg.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self._bad(key, f"must be true or false, not {value!r}")
        return value

    def head_dim(self, hidden: int, heads: int) -> int:
        """head_dim when given, else hidden_size / num_attention_heads (transformers' default)."""
        if self.cfg.get("head_dim") is not None:
            return self.int("head_dim")
        if hidden % heads:
            raise self._bad("num_attention_heads", f"{heads} does not divide hidden_size {hidden} and head_dim is "
                            "not given")
        return hidden // heads

    def absent_or(self, key: str, allowed, why: str) -> None:
        """A field whose other values change the layer structure in a way chipsim does not cost."""
        value = self.cfg.get(key)
        if value is not None and value not in allowed:
            raise self._bad(key, f"{value!r}: {why} (chipsim costs {', '.join(map(repr, allowed))})")


def _common(f: _Fields, experts_key: str, top_k_key: str, expert_ffn_key: str, tie_default: bool) -> dict:
    d = f.int("hidden_size")
    heads = f.int("num_attention_heads")
    return dict(
        hf_architecture=_architecture(f), num_layers=f.int("num_hidden_layers", maximum=MAX_LAYERS), hidden_size=d,
        num_experts=f.int(experts_key, maximum=MAX_EXPERTS), top_k=f.int(top_k_key, maximum=MAX_EXPERTS),
        expert_ffn=f.int(expert_ffn_key),
        vocab_size=f.int("vocab_size"), tie_embeddings=f.bool("tie_word_embeddings", tie_default),
        attention="gqa", num_heads=heads, num_kv_heads=f.int("num_key_value_heads", heads),
        head_dim=f.head_dim(d, heads), attention_bias=f.bool("attention_bias", False),
    )


def _architecture(f: _Fields) -> str:
    return _first_class(f.cfg, f.where) or _DEFAULT_CLASS[f.model_type]


def _first_class(cfg: dict, where: str) -> str | None:
    """architectures[0] (a class name), None when the field is absent or empty."""
    arch = cfg.get("architectures")
    if arch is None or arch == []:
        return None
    if not isinstance(arch, list) or not isinstance(arch[0], str):
        raise InputError(f"{where}: architectures must be a list of class names, not {arch!r}")
    return arch[0]


def _every_layer_moe(f: _Fields) -> None:
    f.absent_or("decoder_sparse_step", (1,), "MoE on every n-th layer only")
    f.absent_or("mlp_only_layers", ([],), "dense layers between MoE layers")
    f.absent_or("moe_layer_freq", (1,), "MoE on every n-th layer only")


def _sliding(f: _Fields, layers: int, qwen: bool = False, default_types=None, default_window=None) -> dict:
    """layer_types (full_attention / sliding_attention per layer) and sliding_window, as transformers reads them:
    listed per layer when the file lists them; otherwise Mixtral and PhiMoE slide every layer when sliding_window
    is set, Qwen slides only where use_sliding_window says (its layer pattern is refused unless listed), and gpt-oss
    alternates (`default_types`, its class default)."""
    types = f.cfg.get("layer_types")
    if types is None:
        if qwen:
            if f.bool("use_sliding_window", False):
                raise f._bad("use_sliding_window", "is true but layer_types does not say which layers slide")
            return {}
        if default_types is not None:
            types = default_types
        elif f.cfg.get("sliding_window") is None:
            return {}
        else:
            return dict(layer_types=(SLIDING,) * layers, sliding_window=f.int("sliding_window"))
    else:
        types = _layer_types(f, layers, {"full_attention": FULL, "sliding_attention": SLIDING})
    kinds = tuple(types)
    if SLIDING not in kinds:
        return {}
    return dict(layer_types=kinds, sliding_window=f.int("sliding_window", default_window))


def _layer_types(f: _Fields, layers: int, names: dict, key: str = "layer_types") -> tuple[str, ...]:
    types = f.cfg.get(key)
    if not isinstance(types, list) or len(types) != layers:
        raise f._bad(key, f"must list one type per layer ({layers}, num_hidden_layers)")
    for t in types:
        if not isinstance(t, str) or t not in names:
            raise f._bad(key, f"has {t!r}; chipsim costs {', '.join(sorted(names))}")
    return tuple(names[t] for t in types)


# ---------------------------------------------------------------------------------------------- readers
def _granitemoe(f: _Fields, shared_default: int = 0) -> dict:
    shape = _common(f, "num_local_experts", "num_experts_per_tok", "intermediate_size", False)
    shared = f.int("shared_intermediate_size", shared_default, minimum=0)
    if shared:  # GraniteMoeShared / GraniteMoeHybrid: one gated (SiLU) shared MLP beside the experts
        shape.update(num_shared_experts=1, shared_expert_ffn=shared)
    return shape


def _granitemoehybrid(f: _Fields) -> dict:
    """transformers' defaults: a shared MLP of 1024, attention without RoPE unless position_embedding_type says
    "rope"; layer types as published (attention / mamba) or as transformers saves them (full / linear_attention),
    or in the older layers_block_type key."""
    shape = _granitemoe(f, shared_default=1024)
    names = {"attention": FULL, "full_attention": FULL, "mamba": MAMBA, "linear_attention": MAMBA}
    key = "layers_block_type" if f.cfg.get("layer_types") is None and "layers_block_type" in f.cfg else "layer_types"
    kinds = _layer_types(f, shape["num_layers"], names, key)
    position = f.cfg.get("position_embedding_type")
    if position not in (None, "rope", "nope"):
        raise f._bad("position_embedding_type", f"{position!r}: chipsim costs rope or nope")
    shape.update(layer_types=kinds, rope=position == "rope")
    if MAMBA in kinds:
        d = shape["hidden_size"]
        heads, expand = f.int("mamba_n_heads"), f.int("mamba_expand", 2)
        head_dim = expand * d // heads if f.cfg.get("mamba_d_head") == "auto" else f.int("mamba_d_head")
        if heads * head_dim != expand * d:
            raise f._bad("mamba_d_head", f"{head_dim} x mamba_n_heads {heads} is not mamba_expand {expand} x "
                         f"hidden_size {d}")
        shape.update(mamba_heads=heads, mamba_head_dim=head_dim, mamba_state=f.int("mamba_d_state"),
                     mamba_groups=f.int("mamba_n_groups", 1), mamba_conv_kernel=f.int("mamba_d_conv", 4),
                     mamba_conv_bias=f.bool("mamba_conv_bias", True), mamba_proj_bias=f.bool("mamba_proj_bias", False))
    return shape


def _phimoe(f: _Fields) -> dict:
    shape = _common(f, "num_local_experts", "num_experts_per_tok", "intermediate_size", False)
    shape.update(_sliding(f, shape["num_layers"]), lm_head_bias=f.bool("lm_head_bias", False))
    return shape


def _mixtral(f: _Fields) -> dict:
    shape = _common(f, "num_local_experts", "num_experts_per_tok", "intermediate_size", False)
    shape.update(_sliding(f, shape["num_layers"]))
    return shape


def _olmoe(f: _Fields) -> dict:
    return _common(f, "num_experts", "num_experts_per_tok", "intermediate_size", False)


def _qwen2_moe(f: _Fields) -> dict:
    _every_layer_moe(f)
    shape = _common(f, "num_experts", "num_experts_per_tok", "moe_intermediate_size", False)
    shared = f.int("shared_expert_intermediate_size", 0, minimum=0)
    if shared:  # one shared expert behind a sigmoid gate
        shape.update(num_shared_experts=1, shared_expert_ffn=shared, shared_expert_gate=True)
    shape.update(_sliding(f, shape["num_layers"], qwen=True))
    return shape


def _qwen3_moe(f: _Fields) -> dict:
    _every_layer_moe(f)
    # published files say num_experts; transformers 5.x's Qwen3MoeConfig saves it as num_local_experts
    experts_key = "num_local_experts" if "num_experts" not in f.cfg and "num_local_experts" in f.cfg else "num_experts"
    shape = _common(f, experts_key, "num_experts_per_tok", "moe_intermediate_size", False)
    shape.update(qk_norm=True)  # Qwen3Attention: q_norm and k_norm over head_dim
    shape.update(_sliding(f, shape["num_layers"], qwen=True))
    return shape


def _deepseek(f: _Fields) -> dict:
    _every_layer_moe(f)
    shape = _common(f, "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size", False)
    nope, rope = f.int("qk_nope_head_dim"), f.int("qk_rope_head_dim")
    v3 = f.model_type == "deepseek_v3"  # the classes' defaults differ: V3 1 shared, 3 dense first; V2 2 and 0
    shared = f.int("n_shared_experts", 1 if v3 else 2, minimum=0)
    first_dense = f.int("first_k_dense_replace", 3 if v3 else 0, minimum=0)
    # q_lora_rank: null means a full q_proj; absent, the classes' default 1536
    q_lora = 0 if "q_lora_rank" in f.cfg and f.cfg["q_lora_rank"] is None else f.int("q_lora_rank", 1536, minimum=0)
    shape.update(attention="mla", head_dim=nope + rope, kv_lora_rank=f.int("kv_lora_rank"),
                 qk_nope_head_dim=nope, qk_rope_head_dim=rope, v_head_dim=f.int("v_head_dim"),
                 q_lora_rank=q_lora, first_dense_layers=first_dense,
                 num_shared_experts=shared, shared_expert_ffn=shape["expert_ffn"] if shared else 0)
    if first_dense:
        shape["dense_ffn"] = f.int("intermediate_size")
    # DeepSeek-V3's router adds a per-expert correction bias to its sigmoid scores (e_score_correction_bias)
    shape["router_bias"] = v3
    return shape


def _gpt_oss(f: _Fields) -> dict:
    top_k_key = "num_experts_per_tok" if "num_experts_per_tok" in f.cfg else "experts_per_token"
    shape = _common(f, "num_local_experts", top_k_key, "intermediate_size", False)
    layers = shape["num_layers"]
    alternate = [SLIDING if (i + 1) % 2 else FULL for i in range(layers)]  # GptOssConfig's default
    shape.update(_sliding(f, layers, default_types=alternate, default_window=128),
                 attention_bias=f.bool("attention_bias", True))
    shape.update(attention_sinks=True, expert_bias=True, router_bias=True, expert_activation="swiglu_clamped")
    return shape


def _ernie4_5_moe(f: _Fields) -> dict:
    shape = _common(f, "moe_num_experts", "moe_k", "moe_intermediate_size", True)
    f.absent_or("moe_layer_interval", (1,), "MoE on every n-th layer only")
    f.absent_or("use_bias", (False,), "biases on every linear layer (attention, MLPs, LM head) are not costed")
    start = f.int("moe_layer_start_index", 1, minimum=0)  # Ernie4_5_MoeConfig's defaults: 1 dense, 2 shared
    end = f.cfg.get("moe_layer_end_index", -1)
    if end not in (-1, None, shape["num_layers"] - 1):
        raise f._bad("moe_layer_end_index", f"{end!r}: dense layers after the MoE layers (chipsim costs MoE up to "
                     f"the last layer: -1 or {shape['num_layers'] - 1})")
    shared = f.int("moe_num_shared_experts", 2, minimum=0)
    shape.update(first_dense_layers=start, num_shared_experts=shared,
                 shared_expert_ffn=shape["expert_ffn"] if shared else 0, router_bias=True)  # moe_statics: a bias
    if start:
        shape["dense_ffn"] = f.int("intermediate_size")
    return shape


def _published_format(f: _Fields) -> str:
    """The experts' format as the checkpoint ships them (quantization_config), named as chipsim's expert formats
    (chipsim/hw/expert_formats.py), for `chipsim models`; a run's own precision is model.expert_bits or
    model.expert_format. A method chipsim does not know is refused rather than costed as BF16 unsaid."""
    quant = f.cfg.get("quantization_config")
    if quant is None:
        return ""
    if not isinstance(quant, dict):
        raise f._bad("quantization_config", f"must be a mapping, not {quant!r}")
    method, bits = quant.get("quant_method"), quant.get("bits")
    if method == "mxfp4":
        return "mxfp4"
    if method == "fp8" and quant.get("fmt", "e4m3") == "e4m3":
        block = quant.get("weight_block_size")
        if block is None:
            return "fp8-e4m3"
        if block == [128, 128]:
            return "fp8-e4m3-block128"
    if method in ("gptq", "awq") and bits in (4, 8) and not isinstance(bits, bool):
        return f"int{bits}"
    raise f._bad("quantization_config", f"{quant!r}: chipsim reads fp8 (E4M3, per tensor or 128 x 128 blocks), "
                 "mxfp4 and 4- or 8-bit gptq/awq; remove quantization_config to cost the experts as BF16, or set "
                 "model.expert_format")


READERS = {
    "granitemoe": _granitemoe, "granitemoeshared": _granitemoe, "granitemoehybrid": _granitemoehybrid,
    "phimoe": _phimoe, "mixtral": _mixtral, "olmoe": _olmoe, "qwen2_moe": _qwen2_moe, "qwen3_moe": _qwen3_moe,
    "deepseek_v2": _deepseek, "deepseek_v3": _deepseek, "gpt_oss": _gpt_oss, "ernie4_5_moe": _ernie4_5_moe,
}
_DEFAULT_CLASS = {
    "granitemoe": "GraniteMoeForCausalLM", "granitemoeshared": "GraniteMoeSharedForCausalLM",
    "granitemoehybrid": "GraniteMoeHybridForCausalLM", "phimoe": "PhimoeForCausalLM",
    "mixtral": "MixtralForCausalLM", "olmoe": "OlmoeForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM", "deepseek_v2": "DeepseekV2ForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM",
    "gpt_oss": "GptOssForCausalLM", "ernie4_5_moe": "Ernie4_5_MoeForCausalLM",
}
_BY_CLASS = {cls: mt for mt, cls in _DEFAULT_CLASS.items()}


def supported() -> str:
    return ", ".join(sorted(READERS))


def shape_from_config(cfg, where: str, name: str, source: str = "") -> ModelShape:
    """The ModelShape of a config.json's fields (a dict), or an InputError naming what is wrong."""
    if not isinstance(cfg, dict):
        raise InputError(f"{where}: expected a JSON object of config.json fields, not {type(cfg).__name__}")
    model_type = cfg.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise InputError(f"{where}: model_type must be a name, not {model_type!r}")
    if model_type is None:
        model_type = _BY_CLASS.get(_first_class(cfg, where) or "")
        if model_type is None:
            raise InputError(f"{where}: model_type is missing (and architectures names no class chipsim knows); "
                             f"chipsim costs {supported()}")
    reader = READERS.get(model_type)
    if reader is None:
        raise InputError(f"{where}: model_type {model_type!r} is not an architecture chipsim costs "
                         f"(supported: {supported()})")
    f = _Fields(cfg, where, model_type)
    f.absent_or("hidden_act", ("silu", "swish"), "another activation in the experts and dense MLPs")
    shape = ModelShape(name=name, source=source, published_expert_format=_published_format(f), **reader(f))
    _check(shape, where)
    return shape


def _check(m: ModelShape, where: str) -> None:
    """Impossible shapes, named by the config.json field that makes them so."""
    if m.top_k > m.num_experts:
        raise InputError(f"{where}: top-k {m.top_k} exceeds the {m.num_experts} routed experts")
    if m.first_dense_layers >= m.num_layers:
        raise InputError(f"{where}: all {m.num_layers} layers are dense (first {m.first_dense_layers}); no MoE "
                         "layer to simulate")
    if m.attention == "gqa" and m.num_heads % m.num_kv_heads:
        raise InputError(f"{where}: num_key_value_heads {m.num_kv_heads} does not divide num_attention_heads "
                         f"{m.num_heads}")
    if m.layer_types and (MAMBA in m.layer_types) and m.first_dense_layers:
        raise InputError(f"{where}: dense first layers in a hybrid model are not costed")


def read_config_file(path: str, where: str) -> ModelShape:
    """A Hugging Face config.json on disk (the name shown is its folder's, as a downloaded snapshot is named)."""
    cfg = read_json(path, f"{where}: config.json", CONFIG_MAX_BYTES, unique_keys=True)
    name = Path(os.path.abspath(path)).parent.name or Path(path).stem
    return shape_from_config(cfg, f"{where} {path}", name=name, source=str(path))


def _read_yaml(path: Path) -> dict:
    from chipsim.values import yaml_load

    where = f"model shape {path}"
    try:
        data = yaml_load(read_input_text(str(path), "model shape", CONFIG_MAX_BYTES))
    except yaml.YAMLError as exc:
        raise InputError(f"{where}: not YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict) or not isinstance(data.get("config"), dict) or not isinstance(data.get("name"), str):
        raise InputError(f"{where}: expected a mapping with name, source and config (config.json fields)")
    return data


def read_bundled(path: Path) -> ModelShape:
    """A bundled shape file: name, source, the config.json fields chipsim reads (`config`), and what was published
    about it (`published`: read by the tests and `chipsim models`)."""
    data = _read_yaml(path)
    return shape_from_config(data["config"], f"model shape {path}", name=data["name"],
                             source=str(data.get("source", "")))


def bundled_record(name: str) -> dict:
    """The bundled file of `name` as data (source, published counts, unconfirmed fields), with its path."""
    path = SHAPES_DIR / f"{name}.yaml"  # a bundled shape is named as its file (chipsim.workload.models)
    if not path.is_file():
        raise InputError(f"model.name: unknown model '{name}'")
    return dict(_read_yaml(path), path=str(path))
