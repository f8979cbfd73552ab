"""Record what a Hugging Face transformers MoE model's routers chose, and what its predictors would see.

Works on any local checkpoint (or a model built from a config) of the MoE classes in transformers 5.x:
GraniteMoe, GraniteMoeShared, GraniteMoeHybrid, Mixtral, Qwen2Moe, Qwen3Moe, Olmoe, DeepseekV2, DeepseekV3,
PhiMoe, GptOss and Ernie4_5_Moe. Routers are found by module path (as transformers 5.17 names them):

    model.layers.{i}.mlp.gate                 Mixtral, Qwen2/3-MoE, OLMoE, DeepSeek-V2/V3 (i >= first_k_dense_replace),
                                              ERNIE-4.5-MoE (i >= moe_layer_start_index)
    model.layers.{i}.block_sparse_moe.router  GraniteMoe, GraniteMoeShared, GraniteMoeHybrid (Mamba2 and attention
                                              layers alike; the shared MLP is `shared_mlp` beside the block)
    model.layers.{i}.mlp.router               PhiMoE, gpt-oss

A layer with none of these (DeepSeek's and ERNIE's dense first layers, Qwen's `mlp_only_layers`) is dense. Each
router's forward returns three tensors, in an order that differs between classes: the (B·T, N) logits, the
(B·T, k) combine weights and the (B·T, k) integer ids — (ids, weights, logits) for the Granite classes,
(logits, weights, ids) for the others; `parse_router_output` tells them apart by dtype and width. The hook
records what the router *returned* — the ids and weights the experts were actually run with — so each class's
own choice rule is kept exactly:

    softmax top-k of the logits              Mixtral, Qwen2/3-MoE, OLMoE, DeepSeek-V2 (greedy)
    top-k of the logits, softmax over the k  GraniteMoe*, gpt-oss (its logits include the router's bias)
    sparsemixer (top-2 of the logits)        PhiMoE: the ids are the top-2 logits; the weights are not a softmax
    top-k of softmax + correction bias       ERNIE-4.5 (moe_statics.e_score_correction_bias): not the logits' top-k
    grouped top-k of sigmoid + bias          DeepSeek-V3: not the logits' top-k

The full ranking stored beside them is by the router's logits.

Beside routing it records, for predictor training, the hidden state entering every decoder layer (a
forward pre-hook with kwargs on `model.model.layers[i]`) and the input of every layer's FFN block (the
post-attention-norm activations a gate sees). Padding positions (attention_mask == 0) are dropped.

Needs torch; the simulator never imports this module.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ROUTER_PATHS = ("mlp.gate", "block_sparse_moe.router", "mlp.router")
FFN_PATHS = ("block_sparse_moe", "mlp")


def _get(module, path: str):
    for part in path.split("."):
        module = getattr(module, part, None)
        if module is None:
            return None
    return module


def decoder_layers(model) -> torch.nn.ModuleList:
    """The decoder's layer list (`model.model.layers` for every *ForCausalLM class above)."""
    for path in ("model.layers", "layers", "model.model.layers"):
        layers = _get(model, path)
        if isinstance(layers, torch.nn.ModuleList):
            return layers
    raise ValueError(f"{type(model).__name__}: no decoder layer list at model.layers")


def find_routers(model) -> dict[int, tuple[str, torch.nn.Module]]:
    """Absolute layer index -> (path inside the layer, router module), for MoE layers only."""
    found = {}
    for i, layer in enumerate(decoder_layers(model)):
        for path in ROUTER_PATHS:
            m = _get(layer, path)
            if isinstance(m, torch.nn.Module) and isinstance(getattr(m, "weight", None), torch.Tensor) and m.weight.dim() == 2:
                found[i] = (path, m)
                break
    if not found:
        raise ValueError(f"{type(model).__name__}: found no MoE router at any of {', '.join(ROUTER_PATHS)}")
    return found


def find_ffn(layer) -> torch.nn.Module:
    for path in FFN_PATHS:
        m = _get(layer, path)
        if isinstance(m, torch.nn.Module):
            return m
    raise ValueError(f"{type(layer).__name__}: no FFN block at {' or '.join(FFN_PATHS)}")


def _cfg(config, *names, default=None):
    for n in names:
        v = getattr(config, n, None)
        if v is not None:
            return v
    return default


def shared_experts(cfg) -> int:
    """Shared experts per MoE layer, counted as chipsim.workload.hf_config counts them from the same fields."""
    for key in ("n_shared_experts", "moe_num_shared_experts"):  # DeepSeek-V2/V3; ERNIE-4.5 (one MLP k × as wide)
        if _cfg(cfg, key) is not None:
            return int(getattr(cfg, key))
    # one shared expert of its own width: Qwen2-MoE (sigmoid-gated); GraniteMoeShared / GraniteMoeHybrid (shared_mlp)
    for key in ("shared_expert_intermediate_size", "shared_intermediate_size"):
        if (_cfg(cfg, key) or 0) > 0:
            return 1
    return 0


def model_counts(model) -> dict:
    """The counts a trace is matched on (the ones chipsim's timing needs: layers, dense first layers, experts,
    top-k and shared experts), read off the model itself.

    Raises ValueError when the MoE layers are not one contiguous run ending at the last layer (the trace
    format lists dense layers only at the start).
    """
    routers = find_routers(model)
    n_layers = len(decoder_layers(model))
    moe = sorted(routers)
    first = moe[0]
    if moe != list(range(first, n_layers)):
        raise ValueError(f"{type(model).__name__}: MoE layers {moe} are not layers {first}..{n_layers - 1}; the trace format needs dense layers first only")
    router = routers[first][1]
    cfg = model.config
    num_experts = int(router.weight.shape[0])
    top_k = int(_cfg(router, "top_k", default=None) or _cfg(cfg, "num_experts_per_tok", "moe_k", "experts_per_token",
                                                              "moe_topk", "top_k"))
    return {
        "num_layers": n_layers,
        "first_dense_layers": first,
        "num_experts": num_experts,
        "top_k": top_k,
        "num_shared_experts": shared_experts(cfg),
        "hf_architecture": type(model).__name__,
    }


def parse_router_output(out, num_experts: int):
    """(ids int64 (n, k), weights float32 (n, k), logits float32 (n, N)) from a router's returned tuple."""
    tensors = [t for t in (out if isinstance(out, (tuple, list)) else (out,)) if torch.is_tensor(t)]
    ids = [t for t in tensors if not t.is_floating_point()]
    floats = [t for t in tensors if t.is_floating_point()]
    if len(ids) != 1 or len(floats) != 2:
        raise ValueError(f"router returned {[tuple(t.shape) for t in tensors]}: expected logits, weights and integer ids")
    ids = ids[0]
    k = ids.shape[-1]
    a, b = floats
    if a.shape[-1] == num_experts and b.shape[-1] == k:
        logits, weights = a, b
    elif b.shape[-1] == num_experts and a.shape[-1] == k:
        logits, weights = b, a
    else:
        raise ValueError(f"router returned float tensors {tuple(a.shape)}, {tuple(b.shape)} for {num_experts} experts top-{k}")
    n = ids.numel() // k
    return ids.reshape(n, k).long(), weights.reshape(n, k).float(), logits.reshape(n, num_experts).float()


@dataclass
class Recording:
    """Per non-padding token (T, in batch-then-position order) and layer.

    routed_ids / routed_weights (T, L, k): what the router returned, sorted by descending weight.
    router_logits (T, L, N) float32. layer_inputs / ffn_inputs (T, num_layers, d): hidden state entering
    each decoder layer, and each layer's FFN-block input (None unless hidden states were kept).
    """

    moe_layers: list[int]
    num_layers: int
    routed_ids: torch.Tensor
    routed_weights: torch.Tensor
    router_logits: torch.Tensor
    token_ids: torch.Tensor
    layer_inputs: torch.Tensor | None = None
    ffn_inputs: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.routed_ids.shape[0])

    @staticmethod
    def cat(parts: list["Recording"]) -> "Recording":
        def c(name):
            xs = [getattr(p, name) for p in parts]
            return None if xs[0] is None else torch.cat(xs, 0)

        return Recording(parts[0].moe_layers, parts[0].num_layers, c("routed_ids"), c("routed_weights"), c("router_logits"),
                         c("token_ids"), c("layer_inputs"), c("ffn_inputs"))


class RoutingRecorder:
    """Context manager: hooks every router (and optionally every layer and FFN input) of a model.

    After one or more forward calls, `take(mask)` returns what was recorded since the last take as a
    Recording; with several calls (token-by-token decode) their tokens are concatenated per call.
    With `keep_graph=True` (training) only the router logits are kept, with their autograd graph, in
    `self.logits` (a list per forward of per-layer tensors) for a load-balancing loss.
    """

    def __init__(self, model, hidden: bool = True, hidden_dtype=torch.float32, keep_graph: bool = False, store_device=None):
        self.model = model
        self.layers = decoder_layers(model)
        self.routers = find_routers(model)
        self.moe_layers = sorted(self.routers)
        self.hidden = hidden and not keep_graph
        self.hidden_dtype = hidden_dtype
        self.keep_graph = keep_graph
        self.store_device = store_device
        self._handles = []
        self._reset()

    def _reset(self):
        self.routing: dict[int, list] = {i: [] for i in self.moe_layers}
        self.layer_in: dict[int, list] = {i: [] for i in range(len(self.layers))}
        self.ffn_in: dict[int, list] = {i: [] for i in range(len(self.layers))}
        self.logits: list[torch.Tensor] = []  # keep_graph: every router call's logits, in call order

    def _store(self, t: torch.Tensor) -> torch.Tensor:
        t = t.detach()
        if self.store_device is not None:
            t = t.to(self.store_device, non_blocking=False)
        return t

    def __enter__(self):
        for i, (_, router) in self.routers.items():
            n_exp = int(router.weight.shape[0])

            def hook(mod, args, out, i=i, n_exp=n_exp):
                if self.keep_graph:
                    self.logits.append(parse_router_output(out, n_exp)[2])
                    return
                ids, w, logits = parse_router_output(out, n_exp)
                order = torch.argsort(w, dim=-1, descending=True, stable=True)
                self.routing[i].append((self._store(ids.gather(-1, order)), self._store(w.gather(-1, order)), self._store(logits)))

            self._handles.append(router.register_forward_hook(hook))
        if self.hidden:
            for i, layer in enumerate(self.layers):
                def pre(mod, args, kwargs, i=i):
                    h = args[0] if args else kwargs["hidden_states"]
                    self.layer_in[i].append(self._store(h.reshape(-1, h.shape[-1]).to(self.hidden_dtype)))

                def ffn_pre(mod, args, kwargs, i=i):
                    h = args[0] if args else kwargs["hidden_states"]
                    self.ffn_in[i].append(self._store(h.reshape(-1, h.shape[-1]).to(self.hidden_dtype)))

                self._handles.append(layer.register_forward_pre_hook(pre, with_kwargs=True))
                self._handles.append(find_ffn(layer).register_forward_pre_hook(ffn_pre, with_kwargs=True))
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles = []
        return False

    def take(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None) -> Recording:
        """Everything recorded since the last take; rows where attention_mask == 0 are dropped.

        input_ids / attention_mask are (B, S) for the tokens of those calls (concatenated along S for
        token-by-token decode).
        """
        n_calls = len(self.routing[self.moe_layers[0]])
        if n_calls == 0:
            raise ValueError("nothing recorded: run a forward inside the recorder first")

        def per_call_cat(lists, idx=None):
            # calls are (B*S_c) rows each; reorder to batch-major over all calls
            xs = [x if idx is None else x[idx] for x in lists]
            if len(xs) == 1 or input_ids is None:
                return torch.cat(xs, 0)
            b = input_ids.shape[0]
            return torch.cat([x.reshape(b, -1, *x.shape[1:]) for x in xs], 1).reshape(-1, *xs[0].shape[1:])

        ids = torch.stack([per_call_cat(self.routing[i], 0) for i in self.moe_layers], 1)
        w = torch.stack([per_call_cat(self.routing[i], 1) for i in self.moe_layers], 1)
        logits = torch.stack([per_call_cat(self.routing[i], 2) for i in self.moe_layers], 1)
        layer_in = ffn_in = None
        if self.hidden:
            layer_in = torch.stack([per_call_cat(self.layer_in[i]) for i in range(len(self.layers))], 1)
            ffn_in = torch.stack([per_call_cat(self.ffn_in[i]) for i in range(len(self.layers))], 1)
        tok = input_ids.reshape(-1).to(ids.device) if input_ids is not None else torch.full((ids.shape[0],), -1, dtype=torch.long, device=ids.device)
        if attention_mask is not None:
            keep = attention_mask.reshape(-1).bool().to(ids.device)
            ids, w, logits, tok = ids[keep], w[keep], logits[keep], tok[keep]
            if layer_in is not None:
                layer_in, ffn_in = layer_in[keep.to(layer_in.device)], ffn_in[keep.to(ffn_in.device)]
        self._reset()
        return Recording(self.moe_layers, len(self.layers), ids, w, logits, tok, layer_in, ffn_in)


@torch.no_grad()
def record(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, batch_size: int = 8,
           hidden: bool = True, hidden_dtype=torch.float32, store_device=None, autocast_dtype=None,
           progress: bool = False) -> Recording:
    """One prefill per batch of sequences (B, S); returns the concatenated Recording of all non-padding tokens."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    parts = []
    batches = range(0, input_ids.shape[0], batch_size)
    if progress:
        try:
            from tqdm.auto import tqdm

            batches = tqdm(batches, desc="recording", unit="batch")
        except ImportError:
            pass
    with RoutingRecorder(model, hidden=hidden, hidden_dtype=hidden_dtype, store_device=store_device) as rec:
        for s in batches:
            ids = input_ids[s:s + batch_size].to(device)
            mask = None if attention_mask is None else attention_mask[s:s + batch_size].to(device)
            with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                model(input_ids=ids, attention_mask=mask, use_cache=False)
            parts.append(rec.take(ids, mask))
    model.train(was_training)
    return Recording.cat(parts)


def load_local_model(path: str, device: str = "cpu", dtype=torch.float32):
    """A local Hugging Face checkpoint folder (config.json + weights); nothing is fetched from a hub."""
    from transformers import AutoModelForCausalLM

    kwargs = {"local_files_only": True, "dtype": dtype}
    if device == "cpu":
        kwargs["experts_implementation"] = "eager"
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    return model.to(device).eval()
