"""The routing-trace file format (schema version 1): one compressed NumPy `.npz` per trace.

A trace holds, per decoded token t and MoE layer l (l counts MoE layers only; dense first layers are
excluded and listed in `moe_layers`), what the model's router chose, and whatever predictor outputs its
recorder wrote for the policies that read them. Every prediction array is *target-indexed*: row [t, l] is a
prediction *for* MoE layer l, whichever earlier point it was made at. Entries a predictor could not make
(e.g. a prediction for layer 0 from the layer before it) hold the id NO_EXPERT.

This module is the core schema, which every trace carries and every policy may read (T tokens, L MoE
layers, N routed experts, k = top-k, M = min(N, 2k)):

| key | dtype, shape | meaning |
| --- | --- | --- |
| routed_ids | uint8 (T, L, k) | experts the router selected, by descending combine weight |
| routed_weights | float16 (T, L, k) | their combine weights as the model applied them |
| router_rank | uint8 (T, L, N) | all experts by descending original-router probability |
| router_rank_prob | float16 (T, L, M) | the original router's softmax probability of router_rank[..., :M] |
| moe_layers | int16 (L,) | absolute layer index of each MoE layer |
| token_ids | int32 (T,) | the decoded tokens' ids (informational) |
| meta | str (JSON) | schema_version, model counts, synthetic flag, provenance, predictor metrics, quality |

and the `ArraySpec` (chipsim.trace.spec) by which any other array is described and checked. Predictor outputs (APEX's ranking
and CDF, ProMoE / pre-gate / FloE rankings, SPICE drafts, training-split counts) are specified in
chipsim.trace.predictor_arrays; a policy names the ones it reads in `Policy.trace_arrays`, and
`runner.prepare` checks them against the trace. A trace may carry arrays no installed policy reads.
"""

from __future__ import annotations

import collections
import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from chipsim.errors import InputError
from chipsim.files import GIB, TRACE_MAX_BYTES, open_input, write_atomic
from chipsim.trace import unpacked
from chipsim.trace.predictor_arrays import RECORDED
from chipsim.trace.spec import DRAFT_DEPTH, NO_EXPERT, ArraySpec, rows_distinct  # noqa: F401 (the format's names)

SCHEMA_VERSION = 1
# the traces this repository ships stay below this (a test checks; chipsim.tracegen.train trims to it); the format
# itself has no size limit: a user may record or generate a trace of any length
SHIPPED_TRACE_MAX_BYTES = 16 * (1 << 20)


CORE_ARRAYS: dict[str, ArraySpec] = {s.name: s for s in (
    ArraySpec("routed_ids", "uint8", ("T", "L", "K"), "experts the router selected, by descending combine weight",
              ids="ids"),
    ArraySpec("routed_weights", "float16", ("T", "L", "K"), "their combine weights as the model applied them",
              finite=True, minimum=0.0),
    ArraySpec("router_rank", "uint8", ("T", "L", "N"), "all experts by descending original-router probability",
              ids="permutation"),
    ArraySpec("router_rank_prob", "float16", ("T", "L", "M"),
              "the original router's softmax probability of router_rank[..., :M]", finite=True, minimum=0.0,
              maximum=1.0),
    ArraySpec("moe_layers", "int16", ("L",), "absolute layer index of each MoE layer"),
    ArraySpec("token_ids", "int32", ("T",), "the decoded tokens' ids (informational)"),
)}

META_MODEL_KEYS = ("num_layers", "first_dense_layers", "num_experts", "top_k", "num_shared_experts")


class TokenRows:
    """A per-token trace array read as nested Python lists one token at a time (the last few kept): what a
    policy or the engine indexes per token and layer, fast, without turning a long trace's arrays into
    Python lists whole (a 32k-token ranking would take gigabytes). `convert` may rewrite each token's rows. `keep`:
    tokens kept converted, more than a step of several tokens reads (a batch, a verify step)."""

    def __init__(self, array: np.ndarray, convert: Callable[[list], list] | None = None, keep: int = 64):
        self._array, self._convert, self._keep = array, convert, keep
        self._rows: dict[int, list] = {}

    def __len__(self) -> int:
        return len(self._array)

    def __getitem__(self, t: int) -> list:
        rows = self._rows.get(t)
        if rows is None:
            rows = self._array[t].tolist()
            if self._convert is not None:
                rows = self._convert(rows)
            self._rows[t] = rows
            if len(self._rows) > self._keep:
                del self._rows[next(iter(self._rows))]  # the oldest converted token
        return rows


@dataclass
class Trace:
    """A loaded, validated trace. `meta['model']` holds the model counts it was recorded from."""

    arrays: dict[str, np.ndarray]
    meta: dict
    path: str = ""
    sha256: str = ""
    # the ArraySpecs this trace has passed (its arrays are read-only once loaded): a sweep prepares the same
    # cached Trace at every point, and checks each spec once
    _checked: set = field(default_factory=set, repr=False)

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


def dims_of(meta_model: dict, n_tokens: int) -> dict[str, int]:
    """The values of the shape symbols of `ArraySpec` for a trace of this model and length."""
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


def validate(arrays: dict[str, np.ndarray], meta: dict, where: str = "trace", specs=()) -> None:
    """Check schema version, the core arrays (keys, dtypes, shapes, id ranges) and every array of `specs`
    (ArraySpecs, e.g. the predictor outputs a recorder writes); any other array must merely be numeric.
    Raise InputError naming the first problem."""
    version = meta.get("schema_version")
    if type(version) is not int or version != SCHEMA_VERSION:  # not 1.0, not true
        raise InputError(f"{where}: schema_version {version!r} is not supported (this chipsim reads {SCHEMA_VERSION})")
    model = meta.get("model")
    if not isinstance(model, dict) or any(k not in model for k in META_MODEL_KEYS):
        raise InputError(f"{where}: meta.model must give {', '.join(META_MODEL_KEYS)}")
    if any(type(model[k]) is not int or model[k] < 0 for k in META_MODEL_KEYS):
        raise InputError(f"{where}: meta.model {', '.join(META_MODEL_KEYS)} must be whole numbers >= 0")
    _check_meta_types(meta, where)
    if int(model["num_experts"]) > NO_EXPERT:
        raise InputError(f"{where}: {model['num_experts']} experts do not fit uint8 ids")
    specs = list(specs)
    missing = [k for k in list(CORE_ARRAYS) + [s.name for s in specs] if k not in arrays]
    if missing:
        raise InputError(f"{where}: missing array(s) {', '.join(missing)}")
    for key, arr in arrays.items():
        if arr.dtype.kind not in "biuf":
            raise InputError(f"{where}: array {key} has dtype {arr.dtype}, not a numeric array")
    _check_meta_counts(model, where)
    dims = dims_of(model, int(arrays["routed_ids"].shape[0]) if arrays["routed_ids"].ndim else 0)
    if dims["T"] < 1:
        raise InputError(f"{where}: holds no tokens")
    _check_meta_tokens(meta, dims["T"], where)
    for spec in list(CORE_ARRAYS.values()) + specs:
        spec.check(arrays[spec.name], dims, where)
    if (arrays["routed_ids"] == NO_EXPERT).any():
        raise InputError(f"{where}: routed_ids must name an expert for every token and layer")
    if not rows_distinct(arrays["routed_ids"], dims["N"]):  # every id is below N (checked above)
        raise InputError(f"{where}: routed_ids repeats an expert within one token-layer")
    expected_layers = np.arange(int(model["first_dense_layers"]), int(model["num_layers"]), dtype=np.int16)
    if not (arrays["moe_layers"] == expected_layers).all():
        raise InputError(f"{where}: moe_layers must list layers {expected_layers[0]}..{expected_layers[-1]}")


# meta fields whose type a reader relies on: key -> (type, what it must be)
META_TYPES = {"synthetic": (bool, "true or false"), "provenance": (dict, "a mapping"),
              "quality": (dict, "a mapping"), "predictor_metrics": (dict, "a mapping"), "measured": (dict, "a mapping")}


def _check_meta_counts(model: dict, where: str) -> None:
    """meta.model's counts against each other: a router picks top_k distinct experts of num_experts, and a trace
    of routing has at least one MoE layer after the dense ones."""
    if not 1 <= model["top_k"] <= model["num_experts"]:
        raise InputError(f"{where}: meta.model.top_k {model['top_k']} must be from 1 to meta.model.num_experts "
                         f"({model['num_experts']}): a token is routed to top_k distinct experts")
    if model["first_dense_layers"] >= model["num_layers"]:
        raise InputError(f"{where}: meta.model.first_dense_layers {model['first_dense_layers']} leaves no MoE layer of "
                         f"meta.model.num_layers {model['num_layers']}")


def _check_meta_tokens(meta: dict, tokens: int, where: str) -> None:
    """meta.provenance.trace_tokens, where a recorder wrote it, is the number of tokens the arrays hold."""
    count = meta.get("provenance", {}).get("trace_tokens")
    if count is not None and (type(count) is not int or count != tokens):
        raise InputError(f"{where}: meta.provenance.trace_tokens is {count!r}, but routed_ids holds {tokens} tokens")


def _check_meta_types(meta: dict, where: str) -> None:
    for key, (tp, words) in META_TYPES.items():
        if key in meta and type(meta[key]) is not tp:
            raise InputError(f"{where}: meta.{key} must be {words}, got {type(meta[key]).__name__}")
    prov = meta.get("provenance", {})
    for key in ("description", "kind", "architecture", "command", "generator"):
        if key in prov and not isinstance(prov[key], str):
            raise InputError(f"{where}: meta.provenance.{key} must be a string, got {type(prov[key]).__name__}")


def check_arrays(trace: "Trace", specs, reader: str) -> None:
    """Check that `trace` carries every array of `specs` as specified; `reader` names who reads them (e.g.
    "policy apex") in the one-line error."""
    dims = dims_of(trace.meta["model"], trace.num_tokens)
    for spec in specs:
        if spec.name not in trace.arrays:
            raise InputError(f"trace {trace.path}: {reader} reads array '{spec.name}' ({spec.meaning}), which the "
                             "trace does not carry")
        if spec not in trace._checked:
            spec.check(trace.arrays[spec.name], dims, f"trace {trace.path}")
            trace._checked.add(spec)


def save(path: str | os.PathLike, arrays: dict[str, np.ndarray], meta: dict, specs=(),
         max_bytes: int | None = None) -> None:
    """Validate (core arrays, and `specs` for the others the caller vouches for) and write a trace, whole or
    not at all. Every array given is written; the same arrays and meta always give the same bytes."""
    meta = dict(meta, schema_version=SCHEMA_VERSION)
    validate(arrays, meta, where=str(path), specs=specs)
    payload = dict(arrays)
    payload["meta"] = np.array(json.dumps(meta, sort_keys=True))

    def write_zip(fh) -> None:
        import zipfile  # writing and unpacking a trace only: a run reads its checked copy in the cache

        # np.savez_compressed stamps the current time into each zip entry; write entries ourselves with a fixed
        # timestamp so the same trace always gives the same bytes. Each array streams into the file (a 32k-token
        # trace is 190 MB compressed: never held in memory whole).
        with zipfile.ZipFile(fh, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            for key in sorted(payload):
                array = np.require(payload[key], requirements="C")
                info = zipfile.ZipInfo(key + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_DEFLATED
                with zf.open(info, "w", force_zip64=array.nbytes > zipfile.ZIP64_LIMIT // 2) as entry:
                    np.lib.format.write_array(entry, array, allow_pickle=False)
        size = fh.tell()
        if max_bytes is not None and size > max_bytes:
            raise InputError(f"{path}: trace would be {size / (1 << 20):.1f} MiB, over the "
                             f"{max_bytes / (1 << 20):g} MiB asked for")

    write_atomic(str(path), write_zip)


_LOADED: "collections.OrderedDict[tuple, Trace]" = collections.OrderedDict()
_LOADED_MAX = 4


def load(path: str | os.PathLike, needed=None) -> Trace:
    """Load and validate a trace file; every problem is an InputError naming the file.

    Loading a 14 MB trace takes ~0.4 s and a sweep prepares the same file many times, so the last few
    loaded traces are kept, keyed by (path, size, mtime, inode): an edited file is read again. Their arrays
    are read-only, so every user of a shared Trace sees the file's contents.

    From the trace cache, the arrays named in `needed` (every array where None) are read and checked before the
    trace is handed out, the others when first asked for (chipsim.trace.unpacked.CheckedArrays)."""
    path = str(path)
    try:
        st = os.stat(path)
        key = (os.path.abspath(path), st.st_size, st.st_mtime_ns, st.st_ino)
    except OSError:
        key = None  # _load words the error
    if key is not None and key in _LOADED:
        _LOADED.move_to_end(key)
        trace = _LOADED[key]
        if not isinstance(trace.arrays, unpacked.CheckedArrays) or trace.arrays.verify(needed):
            return trace
        del _LOADED[key]  # an array of its cache entry changed since: unpacked again
    trace = _load(path, needed)
    if key is not None:
        _LOADED[key] = trace
        while len(_LOADED) > _LOADED_MAX:
            _LOADED.popitem(last=False)
    return trace


# The arrays of a trace unpack to about 1.6x its file (real-granite-3b.npz: 13.9 MB -> 22 MB; a 32k-token trace
# ~0.3 GB); beyond this the declared sizes are a zip bomb or a foreign archive, refused before anything unpacks.
TRACE_MAX_UNPACKED_BYTES = unpacked.MAX_BYTES  # 8 GiB; its cached copies are bound by the same
_NPY_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def _check_members(f, label: str) -> None:
    """The archive's declared sizes, before np.load unpacks it: all members together within
    TRACE_MAX_UNPACKED_BYTES, and each .npy member's header declaring no more array bytes than the member holds
    (np.load allocates what the header declares before it reads)."""
    import zipfile

    with zipfile.ZipFile(f) as zf:
        infos = zf.infolist()
        total = sum(info.file_size for info in infos)
        if total > TRACE_MAX_UNPACKED_BYTES:
            raise InputError(f"{label}: its arrays would unpack to {total / GIB:.1f} GiB, over the "
                             f"{TRACE_MAX_UNPACKED_BYTES / GIB:g} GiB a trace may hold")
        for info in infos:
            with zf.open(info) as member:
                version = np.lib.format.read_magic(member)
                if version not in _NPY_HEADERS:
                    raise ValueError(f"{info.filename}: .npy format {version}")
                shape, _, dtype = _NPY_HEADERS[version](member)
                declared = math.prod(shape) * dtype.itemsize
                if declared > info.file_size:
                    raise InputError(f"{label}: array {info.filename} declares {declared} bytes in a member of "
                                     f"{info.file_size}")


def _load(path: str, needed=None) -> Trace:
    """The trace at `path`, its arrays read-only: from the checked, unpacked copy of this file's bytes in the cache
    (chipsim.trace.unpacked; the arrays `needed` checked now) where there is one, else unpacked and validated, every
    predictor output it carries checked too (and the copy stored)."""
    label = f"trace {path}"
    with open_input(path, "trace", TRACE_MAX_BYTES) as f:
        sha256 = _file_sha256(f, label)
        cached = unpacked.read(sha256)
        if cached is not None and not cached.arrays.verify(needed):
            cached = None
        arrays, meta_text = (cached.arrays, cached.meta_text) if cached is not None else _unpack(f, label)
    meta = _parse_meta(meta_text, path)
    trace = Trace(arrays=arrays, meta=meta, path=path, sha256=sha256)
    carried = [spec for spec in RECORDED if spec.name in arrays]
    if cached is not None:
        trace._checked.update(spec for spec in carried if spec.name in cached.checked)
        return trace
    validate(arrays, meta, where=label)
    # a predictor output the trace carries is checked whether or not a policy reads it: a corrupt array means a
    # corrupt file
    check_arrays(trace, carried, "chipsim")
    for array in arrays.values():
        array.flags.writeable = False
    unpacked.write(sha256, arrays, meta_text, [spec.name for spec in carried])
    return trace


def _file_sha256(f, label: str) -> str:
    """sha256 of the open file's bytes, hashed in blocks: never held whole beside its arrays."""
    digest = hashlib.sha256()
    try:
        read = 0
        for block in iter(lambda: f.read(1 << 22), b""):
            read += len(block)
            if read > TRACE_MAX_BYTES:
                raise InputError(f"{label}: grew past {TRACE_MAX_BYTES / GIB:g} GiB while it was read")
            digest.update(block)
    except OSError as exc:
        raise InputError(f"{label}: cannot read ({exc.strerror})") from None
    return digest.hexdigest()


def _unpack(f, label: str) -> tuple[dict[str, np.ndarray], str]:
    """The arrays of the open .npz and its meta record's text (checked to be one string)."""
    try:
        f.seek(0)
        _check_members(f, label)
        f.seek(0)
        with np.load(f, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except InputError:
        raise
    except Exception as exc:  # zipfile, numpy and zlib raise many types for a truncated or foreign file
        raise InputError(f"{label}: not a readable chipsim trace (truncated or not .npz: {type(exc).__name__})") from None
    if "meta" not in arrays:
        raise InputError(f"{label}: has no meta record")
    meta_array = arrays.pop("meta")
    if meta_array.size != 1 or meta_array.dtype.kind != "U":
        raise InputError(f"{label}: meta record is not valid JSON")
    return arrays, str(meta_array.reshape(-1)[0])


def _parse_meta(meta_text: str, path: str) -> dict:
    try:
        meta = json.loads(meta_text)
    except (json.JSONDecodeError, ValueError):
        raise InputError(f"trace {path}: meta record is not valid JSON") from None
    if not isinstance(meta, dict):
        raise InputError(f"trace {path}: meta record must be a JSON object")
    return meta
