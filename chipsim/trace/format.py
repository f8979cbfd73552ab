"""The routing-trace file format (schema version 1): one compressed NumPy `.npz` per trace.

A trace holds, per decoded token t and MoE layer l (l counts MoE layers only; dense first layers are
excluded and listed in `moe_layers`), what the model's router chose and what every policy's predictor
would have seen before that choice. Every prediction array is *target-indexed*: row [t, l] is a
prediction *for* MoE layer l, whichever earlier point it was made at. Entries a predictor could not
make (e.g. a prediction for layer 0 from the layer before it) hold the id NO_EXPERT.

Arrays (T tokens, L MoE layers, N routed experts, k = top-k, M = min(N, 2k), D = DRAFT_DEPTH):

| key | dtype, shape | meaning |
| --- | --- | --- |
| routed_ids | uint8 (T, L, k) | experts the router selected, by descending combine weight |
| routed_weights | float16 (T, L, k) | their combine weights as the model applied them |
| router_rank | uint8 (T, L, N) | all experts by descending original-router probability |
| router_rank_prob | float16 (T, L, M) | the original router's softmax probability of router_rank[..., :M] |
| apex_rank | uint8 (T, L, N) | APEX prefetch router ranking (from the pre-attention hidden state of layer l) |
| apex_score | float32 (T, L) | APEX CDF score wᵀx for the same hidden state |
| apex_theta | float32 (L, N-k+1) | APEX ordered thresholds θ_0 ≤ … ≤ θ_{N-k}; p_δ = σ(θ_δ − wᵀx) |
| promoe_rank | uint8 (T, L, M) | ProMoE predictor for layer l from layer l-1's activations |
| pregate_rank | uint8 (T, L, M) | layer l's router applied to layer l-1's hidden state (Pre-gated MoE) |
| floe_rank | uint8 (T, L, M) | FloE inter-expert predictor for layer l from layer l-1 |
| draft_ids | uint8 (T, L, D, k) | SPICE draft prediction for layer l made d+1 layers earlier, at [.., d, :] |
| draft_conf | float16 (T, L, D) | its confidence: draft probability mass on those k experts |
| train_expert_counts | int64 (L, N) | how often each expert was routed over the training split |
| moe_layers | int16 (L,) | absolute layer index of each MoE layer |
| token_ids | int32 (T,) | the decoded tokens' ids (informational) |
| meta | str (JSON) | schema_version, model counts, synthetic flag, provenance, predictor metrics, quality |
"""

from __future__ import annotations

import collections
import hashlib
import io
import json
import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from chipsim.errors import InputError

SCHEMA_VERSION = 1
DRAFT_DEPTH = 8
NO_EXPERT = 255
MAX_TRACE_BYTES = 16 * (1 << 20)

# key -> (dtype, shape spec); shape symbols: T tokens, L MoE layers, N experts, K top-k, M min(N, 2k),
# D draft depth, C = N - k + 1 CDF thresholds.
ARRAY_SPECS: dict[str, tuple[str, tuple[str, ...]]] = {
    "routed_ids": ("uint8", ("T", "L", "K")),
    "routed_weights": ("float16", ("T", "L", "K")),
    "router_rank": ("uint8", ("T", "L", "N")),
    "router_rank_prob": ("float16", ("T", "L", "M")),
    "apex_rank": ("uint8", ("T", "L", "N")),
    "apex_score": ("float32", ("T", "L")),
    "apex_theta": ("float32", ("L", "C")),
    "promoe_rank": ("uint8", ("T", "L", "M")),
    "pregate_rank": ("uint8", ("T", "L", "M")),
    "floe_rank": ("uint8", ("T", "L", "M")),
    "draft_ids": ("uint8", ("T", "L", "D", "K")),
    "draft_conf": ("float16", ("T", "L", "D")),
    "train_expert_counts": ("int64", ("L", "N")),
    "moe_layers": ("int16", ("L",)),
    "token_ids": ("int32", ("T",)),
}

# Arrays whose entries are expert ids (NO_EXPERT allowed where a prediction could not be made).
ID_ARRAYS = ("routed_ids", "router_rank", "apex_rank", "promoe_rank", "pregate_rank", "floe_rank", "draft_ids")
RANK_ARRAYS = ("router_rank", "apex_rank")  # full permutations of 0..N-1

META_MODEL_KEYS = ("num_layers", "first_dense_layers", "num_experts", "top_k", "num_shared_experts")


@dataclass
class Trace:
    """A loaded, validated trace. `meta['model']` holds the model counts it was recorded from."""

    arrays: dict[str, np.ndarray]
    meta: dict
    path: str = ""
    sha256: str = ""
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def num_tokens(self) -> int:
        return int(self.arrays["routed_ids"].shape[0])

    @property
    def num_moe_layers(self) -> int:
        return int(self.arrays["routed_ids"].shape[1])

    @property
    def num_experts(self) -> int:
        return int(self.meta["model"]["num_experts"])

    @property
    def top_k(self) -> int:
        return int(self.meta["model"]["top_k"])

    @property
    def synthetic(self) -> bool:
        return bool(self.meta.get("synthetic", False))

    def __getitem__(self, key: str) -> np.ndarray:
        return self.arrays[key]

    def provenance_line(self) -> str:
        """One line saying where the trace came from, marked SYNTHETIC when it is."""
        prov = self.meta.get("provenance", {})
        tag = "SYNTHETIC " if self.synthetic else ""
        desc = prov.get("description", "")
        return (
            f"{tag}trace {Path(self.path).name or '<memory>'} ({self.num_tokens} tokens, "
            f"{self.num_moe_layers} MoE layers, {self.num_experts} experts top-{self.top_k}"
            f"{', ' + desc if desc else ''})"
        )

    def check_matches(self, model) -> None:
        """Reject a trace recorded from a model whose layer / expert / top-k / shared counts differ."""
        want = {
            "num_layers": model.num_layers,
            "first_dense_layers": model.first_dense_layers,
            "num_experts": model.num_experts,
            "top_k": model.top_k,
            "num_shared_experts": model.num_shared_experts,
        }
        have = self.meta["model"]
        for key, value in want.items():
            if int(have[key]) != value:
                raise InputError(
                    f"trace {self.path}: recorded from a model with {key}={have[key]}, "
                    f"but model.name '{model.name}' has {key}={value}"
                )


def _dims(meta_model: dict, n_tokens: int) -> dict[str, int]:
    n, k = int(meta_model["num_experts"]), int(meta_model["top_k"])
    return {
        "T": n_tokens,
        "L": int(meta_model["num_layers"]) - int(meta_model["first_dense_layers"]),
        "N": n,
        "K": k,
        "M": min(n, 2 * k),
        "D": DRAFT_DEPTH,
        "C": n - k + 1,
    }


def validate(arrays: dict[str, np.ndarray], meta: dict, where: str = "trace") -> None:
    """Check schema version, keys, dtypes, shapes and id ranges; raise InputError naming the first problem."""
    if meta.get("schema_version") != SCHEMA_VERSION:
        raise InputError(f"{where}: schema_version {meta.get('schema_version')!r} is not supported (this chipsim reads {SCHEMA_VERSION})")
    model = meta.get("model")
    if not isinstance(model, dict) or any(k not in model for k in META_MODEL_KEYS):
        raise InputError(f"{where}: meta.model must give {', '.join(META_MODEL_KEYS)}")
    try:
        [int(model[k]) for k in META_MODEL_KEYS]
    except (TypeError, ValueError):
        raise InputError(f"{where}: meta.model {', '.join(META_MODEL_KEYS)} must be integers") from None
    if int(model["num_experts"]) > NO_EXPERT:
        raise InputError(f"{where}: {model['num_experts']} experts do not fit uint8 ids")
    missing = [k for k in ARRAY_SPECS if k not in arrays]
    if missing:
        raise InputError(f"{where}: missing array(s) {', '.join(missing)}")
    unknown = [k for k in arrays if k not in ARRAY_SPECS]
    if unknown:
        raise InputError(f"{where}: unknown array(s) {', '.join(unknown)}")
    dims = _dims(model, int(arrays["routed_ids"].shape[0]) if arrays["routed_ids"].ndim else 0)
    if dims["T"] < 1:
        raise InputError(f"{where}: holds no tokens")
    for key, (dtype, spec) in ARRAY_SPECS.items():
        arr = arrays[key]
        want_shape = tuple(dims[s] for s in spec)
        if arr.dtype != np.dtype(dtype):
            raise InputError(f"{where}: array {key} has dtype {arr.dtype}, expected {dtype}")
        if arr.shape != want_shape:
            raise InputError(f"{where}: array {key} has shape {arr.shape}, expected {want_shape} for the model in meta")
    n = dims["N"]
    for key in ID_ARRAYS:
        arr = arrays[key]
        bad = (arr >= n) & (arr != NO_EXPERT)
        if bad.any():
            raise InputError(f"{where}: array {key} holds expert id {int(arr[bad][0])} out of range 0..{n - 1}")
    if (arrays["routed_ids"] == NO_EXPERT).any():
        raise InputError(f"{where}: routed_ids must name an expert for every token and layer")
    routed_sorted = np.sort(arrays["routed_ids"], axis=-1)
    if (routed_sorted[..., 1:] == routed_sorted[..., :-1]).any():
        raise InputError(f"{where}: routed_ids repeats an expert within one token-layer")
    for key in RANK_ARRAYS:
        if not (np.sort(arrays[key], axis=-1) == np.arange(n, dtype=np.uint8)).all():
            raise InputError(f"{where}: every row of {key} must be a permutation of 0..{n - 1}")
    theta = arrays["apex_theta"]
    if not np.isfinite(theta).all() or (np.diff(theta, axis=-1) < 0).any():
        raise InputError(f"{where}: apex_theta must be finite and non-decreasing along δ")
    if not np.isfinite(arrays["apex_score"]).all():
        raise InputError(f"{where}: apex_score holds a non-finite value")
    expected_layers = np.arange(int(model["first_dense_layers"]), int(model["num_layers"]), dtype=np.int16)
    if not (arrays["moe_layers"] == expected_layers).all():
        raise InputError(f"{where}: moe_layers must list layers {expected_layers[0]}..{expected_layers[-1]}")


def save(path: str | os.PathLike, arrays: dict[str, np.ndarray], meta: dict) -> None:
    """Validate and write a trace; written to a temporary name first so a failure leaves nothing behind."""
    meta = dict(meta, schema_version=SCHEMA_VERSION)
    validate(arrays, meta, where=str(path))
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    payload = {k: arrays[k] for k in ARRAY_SPECS}
    payload["meta"] = np.array(json.dumps(meta, sort_keys=True))
    # np.savez_compressed stamps the current time into each zip entry; write entries ourselves with a fixed
    # timestamp so the same trace always gives the same bytes.
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for key in sorted(payload):
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.require(payload[key], requirements="C"), allow_pickle=False)
            info = zipfile.ZipInfo(key + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, buf.getvalue())
    size = tmp.stat().st_size
    if size > MAX_TRACE_BYTES:
        tmp.unlink()
        raise InputError(f"{path}: trace would be {size / (1 << 20):.1f} MiB, over the 16 MiB limit")
    os.replace(tmp, path)


_LOADED: "collections.OrderedDict[tuple, Trace]" = collections.OrderedDict()
_LOADED_MAX = 4


def load(path: str | os.PathLike) -> Trace:
    """Load and validate a trace file; every problem is an InputError naming the file.

    Loading a 14 MB trace takes ~0.4 s and a sweep prepares the same file many times, so the last few
    loaded traces are kept, keyed by (path, size, mtime, inode): an edited file is read again. Their arrays
    are read-only, so every user of a shared Trace sees the file's contents."""
    path = str(path)
    try:
        st = os.stat(path)
        key = (os.path.abspath(path), st.st_size, st.st_mtime_ns, st.st_ino)
    except OSError:
        key = None  # _load words the error
    if key is not None and key in _LOADED:
        _LOADED.move_to_end(key)
        return _LOADED[key]
    trace = _load(path)
    if key is not None:
        _LOADED[key] = trace
        while len(_LOADED) > _LOADED_MAX:
            _LOADED.popitem(last=False)
    return trace


def _load(path: str) -> Trace:
    if not os.path.exists(path):
        raise InputError(f"trace {path}: file not found")
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise InputError(f"trace {path}: cannot read ({exc.strerror})") from None
    try:
        with np.load(io.BytesIO(raw), allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except Exception as exc:  # zipfile, numpy and zlib raise many types for a truncated or foreign file
        raise InputError(f"trace {path}: not a readable chipsim trace (truncated or not .npz: {type(exc).__name__})") from None
    if "meta" not in arrays:
        raise InputError(f"trace {path}: has no meta record")
    meta_array = arrays.pop("meta")
    try:
        if meta_array.size != 1 or meta_array.dtype.kind != "U":
            raise ValueError("meta is not one string")
        meta = json.loads(str(meta_array.reshape(-1)[0]))
    except (json.JSONDecodeError, ValueError):
        raise InputError(f"trace {path}: meta record is not valid JSON") from None
    if not isinstance(meta, dict):
        raise InputError(f"trace {path}: meta record must be a JSON object")
    validate(arrays, meta, where=f"trace {path}")
    for array in arrays.values():
        array.flags.writeable = False
    return Trace(arrays=arrays, meta=meta, path=path, sha256=hashlib.sha256(raw).hexdigest())


def apex_delta_hat(trace: Trace, tau: float) -> np.ndarray:
    """δ̂(x) = min{δ : σ(θ_δ − wᵀx) ≥ τ}, per token and MoE layer (int, 0..N-k); exact for any τ in (0, 1)."""
    logit_tau = np.log(tau / (1.0 - tau))
    theta = trace["apex_theta"].astype(np.float64)  # (L, C)
    score = trace["apex_score"].astype(np.float64)  # (T, L)
    ok = theta[None, :, :] - score[:, :, None] >= logit_tau  # (T, L, C), monotone in δ
    n_thresholds = theta.shape[1]
    first = np.where(ok.any(axis=-1), ok.argmax(axis=-1), n_thresholds - 1)
    return first.astype(np.int64)


def oracle_delta_star(trace: Trace) -> np.ndarray:
    """δ* = the smallest δ with every routed expert inside the top-(k+δ) of the APEX ranking."""
    rank = trace["apex_rank"]  # (T, L, N)
    n = rank.shape[-1]
    position = np.empty_like(rank, dtype=np.int64)
    np.put_along_axis(position, rank.astype(np.int64), np.arange(n)[None, None, :].repeat(rank.shape[0], 0).repeat(rank.shape[1], 1), axis=-1)
    routed_pos = np.take_along_axis(position, trace["routed_ids"].astype(np.int64), axis=-1)
    return routed_pos.max(axis=-1) + 1 - trace.top_k
