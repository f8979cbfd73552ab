"""Record a trace from any local Hugging Face MoE checkpoint over a text file.

    python -m chipsim.tracegen.checkpoint MODEL_DIR --text FILE --out traces/NAME.npz [--shape NAME] [--seq 512]
        [--train-tokens 32768] [--heldout-tokens 4096] [--device cuda] [--dtype bfloat16]

A user with real Granite / DeepSeek / Mixtral … weights records a real trace of them with this command
(nothing is fetched: the folder must hold config.json, the weights and the tokenizer). The text is
tokenised with the checkpoint's own tokenizer and split by position: the first 90 % of its tokens are the
training split (predictor training and train_expert_counts), the last 10 % the held-out split whose
windows become the trace's decode tokens. The trace's meta.model.name is --shape, or the chipsim model
shape whose counts match the checkpoint's.

The whole held-out recording is written (a trace has no size limit; only the traces this repository ships
stay below 16 MiB); --max-mib keeps the most leading windows that fit a size.

Needs torch and transformers (imported after the options are read: --help and option errors work without
them); the simulator never imports this module.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import sys
import time
from pathlib import Path

import numpy as np

from chipsim.errors import InputError, OneLineParser, run_module_main, torch_device
from chipsim.files import GIB, check_input, check_output_file, read_input, write_atomic
from chipsim.trace import format as tformat
from chipsim.trace import predictor_arrays
from chipsim.workload.models import MODELS


def matching_shape(counts: dict) -> str | None:
    """The bundled shape with these counts; None when none has them or several do (Phi-mini-MoE and Phi-3.5-MoE,
    the two OLMoEs: --shape names which)."""
    found = [name for name, m in MODELS.items() if all(getattr(m, k) == counts[k] for k in tformat.META_MODEL_KEYS)]
    return found[0] if len(found) == 1 else None


def build_parser() -> OneLineParser:
    ap = OneLineParser(prog="chipsim trace", description="record a chipsim trace from a local Hugging Face MoE "
                       "checkpoint over a text file, fitting the predictors on a training split (needs torch)")
    ap.add_argument("model", help="local checkpoint folder (config.json, weights, tokenizer)")
    ap.add_argument("--text", required=True, help="a UTF-8 text file")
    ap.add_argument("--out", required=True, help="trace path (.npz); its meta is also written beside it as .json")
    ap.add_argument("--shape", default=None, help="chipsim model shape name for meta.model.name")
    ap.add_argument("--seq", type=int, default=512, help="tokens per recorded window (default 512)")
    ap.add_argument("--train-tokens", type=int, default=32768,
                    help="training-split tokens the predictors are fitted on (default 32768)")
    ap.add_argument("--heldout-tokens", type=int, default=4096,
                    help="held-out tokens recorded into the trace (default 4096)")
    ap.add_argument("--max-mib", type=float, default=None,
                    help="keep the most leading windows whose trace fits this many MiB (default: no limit)")
    ap.add_argument("--pred-steps", type=int, default=300, help="optimiser steps per predictor (default 300)")
    ap.add_argument("--batch", type=int, default=8, help="windows per forward pass (default 8)")
    ap.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                    help="model dtype while recording (default float32)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the predictor fits (default 0)")
    return ap


# the text a trace is recorded over is tokenised whole in memory (tokens take several times its bytes): a
# held-out corpus is tens of MB; past this it is a wrong file (a disk image, a model's weights)
TEXT_CORPUS_MAX_BYTES = 1 * GIB


def _check_args(a) -> None:
    """Every option checked before the model is loaded (minutes) or anything is written."""
    if not os.path.isdir(a.model):
        raise InputError(f"chipsim trace {a.model}: not a local checkpoint folder (config.json, weights, tokenizer)")
    check_input(a.text, "--text", TEXT_CORPUS_MAX_BYTES)
    for name, minimum in (("seq", 1), ("train_tokens", 1), ("heldout_tokens", 1), ("pred_steps", 1), ("batch", 1),
                          ("seed", 0)):
        if getattr(a, name) < minimum:
            raise InputError(f"--{name.replace('_', '-')} {getattr(a, name)}: expected a whole number >= {minimum}")
    if a.max_mib is not None and not a.max_mib > 0:
        raise InputError(f"--max-mib {a.max_mib}: expected a size > 0")
    out = Path(a.out)
    check_output_file(str(out), "--out")
    check_output_file(str(out.with_suffix(".json")), "--out")


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    _check_args(a)
    try:
        import torch
        from transformers import AutoTokenizer

        from chipsim.tracegen.predictors import build_trace_arrays
        from chipsim.tracegen.recorder import find_routers, load_local_model, model_counts, record
        from chipsim.tracegen.train import even_starts, save_trimmed, windows
    except ImportError as exc:
        raise InputError(f"chipsim trace needs torch and transformers ({exc.name} is missing): "
                         "pip install torch==2.13.0 -e '.[trace]'") from None
    t0 = time.perf_counter()

    def log(msg):
        print(f"[{time.perf_counter() - t0:7.1f}s] {msg}", flush=True)

    device = torch_device(torch, a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model = load_local_model(a.model, device=device.type, dtype=getattr(torch, a.dtype))
    counts = model_counts(model)
    name = a.shape or matching_shape(counts) or counts["hf_architecture"]
    tok = AutoTokenizer.from_pretrained(a.model, local_files_only=True)
    raw = read_input(a.text, "--text", TEXT_CORPUS_MAX_BYTES)
    ids = np.asarray(tok(raw.decode("utf-8", errors="replace"))["input_ids"], dtype=np.int64)
    split = int(ids.size * 0.9)
    train_ids, held_ids = ids[:split], ids[split:]
    if held_ids.size < a.seq or train_ids.size < a.seq + 1:
        raise InputError(f"--text {a.text}: {ids.size} tokens are too few for windows of {a.seq}")
    rng = np.random.default_rng(a.seed)
    tr = windows(train_ids, rng.integers(0, train_ids.size - a.seq, max(1, a.train_tokens // a.seq)), a.seq)
    he = windows(held_ids, even_starts(held_ids.size, max(1, -(-a.heldout_tokens // a.seq)), a.seq), a.seq)
    log(f"{counts['hf_architecture']} ({name}): {ids.size:,} tokens of text; recording {tr.numel():,} training and {he.numel():,} held-out tokens")
    hdt = torch.bfloat16 if device.type == "cuda" else torch.float32
    rec_tr = record(model, tr, batch_size=a.batch, hidden_dtype=hdt, progress=True)
    rec_te = record(model, he, batch_size=a.batch, hidden_dtype=hdt, progress=True)
    rw = {i: r.weight.detach().float() for i, (_, r) in find_routers(model).items()}
    arrays, metrics = build_trace_arrays(rec_tr, rec_te, rw, device=device, steps=a.pred_steps, cdf_steps=a.pred_steps * 4 // 3,
                                         seed=a.seed, log=log)
    meta = {
        "synthetic": False,
        "model": {**{k: counts[k] for k in tformat.META_MODEL_KEYS}, "name": name, "hf_architecture": counts["hf_architecture"]},
        "provenance": {
            "description": f"{counts['hf_architecture']} checkpoint {Path(a.model).name} over {Path(a.text).name}",
            "kind": "recorded from a local checkpoint",
            "checkpoint": str(a.model),
            "name_or_path": getattr(model.config, "_name_or_path", ""),
            "parameters": sum(p.numel() for p in model.parameters()),
            "text": {"file": Path(a.text).name, "sha256": hashlib.sha256(raw).hexdigest(), "tokens": int(ids.size),
                     "split": "first 90 % of tokens: training split; last 10 %: held-out"},
            "recording": {"dtype": a.dtype, "seq": a.seq, "train_tokens": int(tr.numel()), "heldout_tokens": int(he.numel())},
            "metrics_tokens": int(rec_te.num_tokens),
            "command": "python -m chipsim.tracegen.checkpoint " + " ".join(shlex.quote(x) for x in (argv if argv is not None else sys.argv[1:])),
        },
        "predictor_metrics": metrics,
        "quality": {},
    }
    out = Path(a.out)
    if a.max_mib is None:
        meta["provenance"]["trace_tokens"] = int(arrays["routed_ids"].shape[0])
        tformat.save(out, arrays, meta, specs=predictor_arrays.RECORDED)
    else:
        save_trimmed(out, arrays, meta, a.seq, log, max_bytes=int(a.max_mib * (1 << 20)))
    trace = tformat.load(out)
    write_atomic(str(out.with_suffix(".json")), json.dumps(meta, indent=1, sort_keys=True), what="--out")
    log(f"wrote {out}: {trace.provenance_line()}")
    return 0


if __name__ == "__main__":
    run_module_main(main)
