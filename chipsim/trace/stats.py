"""Routing statistics of a loaded trace, for `chipsim inspect` (numpy only, no torch).

Every function takes a `chipsim.trace.format.Trace` (or plain arrays) and returns plain Python values;
`trace_stats` gathers them into one JSON-serialisable dict (floats rounded to 6 decimals, `None` where a
statistic is undefined, e.g. reuse on a one-token trace or a predictor with no prediction for a layer).

Definitions (T tokens, L MoE layers, N routed experts, top-k; "recall" = mean |predicted ∩ routed| / k,
the quantity several papers call "overlap"; "overlap" here = share of token-layers whose whole
routed set is predicted, APEX's strict measure):

- **popularity**: per layer, the counts c_e of tokens routed to each expert. Zipf exponent s: least-squares
  fit of log(frequency) = a − s·log(rank) over the experts sorted by descending count, using only the
  experts that occur (c_e > 0; an expert never routed has no logarithm), undefined with fewer than two
  occurring experts. "Overall" fits the same line to the rank-wise mean of the layers' sorted frequency
  profiles (expert ids are unrelated across layers, so counts are not pooled by id). Gini coefficient
  G = Σ_i Σ_j |c_i − c_j| / (2 N² mean(c)) over all N experts (never-routed experts included: 0 for
  uniform use, (N−1)/N when one expert takes every token); "pooled" treats all L·N (layer, expert) pairs
  as one population. The same is computed on `train_expert_counts` (the training split's counts).
- **reuse**: per layer, mean over t = 1..T−1 of |routed(t) ∩ routed(t−1)| / k. Baselines: random k/N, and
  the reuse popularity alone gives if tokens were independent, Σ_e (c_e/T)² / k. Consecutive trace tokens
  can belong to different recorded windows (a few boundaries per trace); they are counted like any other.
- **predictability**: recall of each stored predictor's top-k against the routed set — apex_rank (same
  layer, pre-attention hidden state), pregate_rank, promoe_rank, floe_rank (from layer l−1), draft_ids at
  depth d = 1..8 (made d layers earlier) — counting only token-layers where the predictor made a
  prediction (rows that are all NO_EXPERT, e.g. layer 0 for next-layer predictors, are skipped; a
  NO_EXPERT inside a row counts as a miss); plus the naive baseline "same experts as the previous layer"
  (routed(l−1) as the prediction for routed(l), l ≥ 1) and the random baseline k/N. Overall values pool
  all counted token-layers.
- **δ\\***: `predictor_arrays.delta_star` — the smallest δ with every routed expert inside the APEX ranking's
  top-(k+δ). Mean, median / p90 / p99 (an actual δ* value: numpy's inverted-CDF percentile), max, and
  shares of δ* = 0, 1, 2, 3–4, 5–7, ≥ 8.
- **APEX CDF**: at τ = 0.6 / 0.75 / 0.9 / 0.97, δ̂ = `predictor_arrays.delta_hat`; coverage = share of
  token-layers with δ* ≤ δ̂ (every routed expert prefetched), and mean δ̂.
- **quality**: the trace's meta['quality'] (chipsim.tracegen.quality: held-out perplexity of the trained model
  under each approximate mode against the unmodified model), one row per measured mode and setting with the
  record's values as stored; None when the trace carries no record.
"""

from __future__ import annotations

import numpy as np

from chipsim.trace import format as tf
from chipsim.trace import predictor_arrays

TAUS = (0.6, 0.75, 0.9, 0.97)
DELTA_BINS = (("0", 0, 0), ("1", 1, 1), ("2", 2, 2), ("3-4", 3, 4), ("5-7", 5, 7), ("8+", 8, None))
RANK_PREDICTORS = ("apex_rank", "pregate_rank", "promoe_rank", "floe_rank")


def _r(value) -> float | None:
    """A JSON-safe float rounded to 6 decimals (None for None / NaN)."""
    if value is None:
        return None
    value = float(value)
    return None if not np.isfinite(value) else round(value, 6)


def _rl(values) -> list:
    return [_r(v) for v in values]


# ----------------------------------------------------------------------------------------------------
# popularity


def expert_counts(routed_ids: np.ndarray, num_experts: int) -> np.ndarray:
    """(L, N) int: how many tokens each layer routed to each expert; routed_ids (T, L, k)."""
    t, n_layers, k = routed_ids.shape
    flat = routed_ids.astype(np.int64) + (np.arange(n_layers) * num_experts)[None, :, None]
    return np.bincount(flat.ravel(), minlength=n_layers * num_experts).reshape(n_layers, num_experts)


def zipf_exponent(freqs) -> float | None:
    """Zipf exponent s of a frequency (or count) vector: least-squares slope of log(frequency) against
    log(rank) over the entries sorted descending, using only the entries > 0 (negated, so f ∝ r^-s gives s).
    None with fewer than two positive entries. Scale-free: counts and shares give the same s."""
    f = np.sort(np.asarray(freqs, dtype=np.float64).ravel())[::-1]
    f = f[f > 0]
    if f.size < 2:
        return None
    x = np.log(np.arange(1, f.size + 1, dtype=np.float64))
    y = np.log(f)
    x0 = x - x.mean()
    return float(-(x0 @ (y - y.mean())) / (x0 @ x0))


def gini(values) -> float | None:
    """Gini coefficient Σ_i Σ_j |x_i − x_j| / (2 n² mean(x)) of non-negative values (zeros included);
    0 for equal values, (n−1)/n when one entry holds everything; None when all are zero or empty."""
    x = np.sort(np.asarray(values, dtype=np.float64).ravel())
    n = x.size
    if n == 0 or x.sum() <= 0:
        return None
    # Σ_i Σ_j |x_i − x_j| = 2 Σ_i (2i − n − 1) x_(i) for x sorted ascending, i = 1..n
    i = np.arange(1, n + 1, dtype=np.float64)
    return float(2.0 * ((2 * i - n - 1) @ x) / (2.0 * n * n * x.mean()))


def popularity(counts: np.ndarray) -> dict:
    """Zipf exponent and Gini per layer and overall, from (L, N) counts."""
    counts = np.asarray(counts, dtype=np.float64)
    zipf = [zipf_exponent(row) for row in counts]
    gin = [gini(row) for row in counts]
    totals = counts.sum(axis=1, keepdims=True)
    shares = np.divide(counts, totals, out=np.zeros_like(counts), where=totals > 0)
    profile = np.sort(shares, axis=1)[:, ::-1][totals[:, 0] > 0].mean(axis=0) if (totals > 0).any() else np.zeros(0)
    zs = [z for z in zipf if z is not None]
    gs = [g for g in gin if g is not None]
    return {
        "zipf_per_layer": _rl(zipf),
        "gini_per_layer": _rl(gin),
        "zipf_overall": _r(zipf_exponent(profile)) if profile.size else None,
        "zipf_mean": _r(np.mean(zs)) if zs else None,
        "zipf_min": _r(min(zs)) if zs else None,
        "zipf_max": _r(max(zs)) if zs else None,
        "gini_mean": _r(np.mean(gs)) if gs else None,
        "gini_pooled": _r(gini(counts)),
        "top1_share_mean": _r(shares.max(axis=1).mean()) if counts.size else None,
    }


# ----------------------------------------------------------------------------------------------------
# reuse and predictability


def membership(ids: np.ndarray, num_experts: int) -> np.ndarray:
    """(..., m) expert ids -> (..., N) bool membership; NO_EXPERT (and any id ≥ N) ignored."""
    out = np.zeros(ids.shape[:-1] + (num_experts + 1,), dtype=bool)
    np.put_along_axis(out, np.minimum(ids.astype(np.int64), num_experts), True, axis=-1)
    return out[..., :num_experts]


def reuse(routed_ids: np.ndarray, num_experts: int) -> dict:
    """Token-to-token reuse |routed(t) ∩ routed(t−1)| / k per layer and its baselines."""
    t, n_layers, k = routed_ids.shape
    counts = expert_counts(routed_ids, num_experts)
    pop_base = ((counts / t) ** 2).sum(axis=1) / k
    if t < 2:
        per_layer = [None] * n_layers
        mean = None
    else:
        member = membership(routed_ids, num_experts)
        hits = (member[1:] & member[:-1]).sum(axis=-1)  # (T-1, L)
        per_layer = _rl(hits.mean(axis=0) / k)
        mean = _r(hits.mean() / k)
    return {
        "per_layer": per_layer,
        "mean": mean,
        "min": min((v for v in per_layer if v is not None), default=None),
        "max": max((v for v in per_layer if v is not None), default=None),
        "random_baseline": _r(k / num_experts),
        "popularity_baseline_per_layer": _rl(pop_base),
        "popularity_baseline": _r(pop_base.mean()),
    }


def recall(predicted: np.ndarray, routed_member: np.ndarray, k: int) -> tuple[list, float | None, float | None]:
    """Recall of predicted ids (T, L, k) against routed membership (T, L, N): per layer, pooled, and the
    strict overlap (share of counted rows with all k routed experts predicted). Rows that are entirely
    NO_EXPERT are not counted; a layer with no counted row gives None."""
    n = routed_member.shape[-1]
    made = (predicted != tf.NO_EXPERT).any(axis=-1)  # (T, L)
    padded = np.concatenate([routed_member, np.zeros(routed_member.shape[:-1] + (1,), dtype=bool)], axis=-1)
    hit = np.take_along_axis(padded, np.minimum(predicted.astype(np.int64), n), axis=-1).sum(axis=-1)  # (T, L)
    rows = made.sum(axis=0)
    per_layer_sum = np.where(made, hit, 0).sum(axis=0)
    per_layer = [None if r == 0 else _r(s / (r * k)) for s, r in zip(per_layer_sum, rows)]
    total = int(rows.sum())
    if total == 0:
        return per_layer, None, None
    return per_layer, _r(per_layer_sum.sum() / (total * k)), _r(((hit == k) & made).sum() / total)


def predictability(trace: tf.Trace) -> dict:
    """Recall of every stored predictor, the previous-layer baseline and the random baseline."""
    k, n = trace.top_k, trace.num_experts
    routed = trace["routed_ids"]
    member = membership(routed, n)
    out: dict = {"random_baseline": _r(k / n)}
    for key in RANK_PREDICTORS:  # a predictor the trace does not carry: None
        if key not in trace.arrays:
            out[key.removesuffix("_rank")] = None
            continue
        per_layer, pooled, strict = recall(trace[key][..., :k], member, k)
        out[key.removesuffix("_rank")] = {"recall_per_layer": per_layer, "recall": pooled, "overlap": strict}
    draft = trace.arrays.get("draft_ids")  # (T, L, D, k)
    depths = []
    for d in range(draft.shape[2] if draft is not None else 0):
        per_layer, pooled, strict = recall(draft[:, :, d, :], member, k)
        depths.append({"depth": d + 1, "recall_per_layer": per_layer, "recall": pooled, "overlap": strict})
    out["draft"] = depths
    prev = np.concatenate([np.full((routed.shape[0], 1, k), tf.NO_EXPERT, dtype=routed.dtype), routed[:, :-1]], axis=1)
    per_layer, pooled, strict = recall(prev, member, k)
    out["previous_layer"] = {"recall_per_layer": per_layer, "recall": pooled, "overlap": strict}
    return out


# ----------------------------------------------------------------------------------------------------
# δ* and the APEX CDF


def delta_star_summary(dstar: np.ndarray) -> dict:
    """Mean, median, p90, p99, max and binned shares of a δ* array (T, L)."""
    flat = np.asarray(dstar).ravel()
    shares = {}
    for label, lo, hi in DELTA_BINS:
        sel = flat >= lo if hi is None else (flat >= lo) & (flat <= hi)
        shares[label] = _r(sel.mean())
    pct = {q: int(np.percentile(flat, q, method="inverted_cdf")) for q in (50, 90, 99)}
    return {
        "mean": _r(flat.mean()),
        "median": pct[50],
        "p90": pct[90],
        "p99": pct[99],
        "max": int(flat.max()),
        "shares": shares,
        "mean_per_layer": _rl(np.asarray(dstar).mean(axis=0)),
    }


def apex_cdf(trace: tf.Trace, dstar: np.ndarray, taus=TAUS) -> list[dict]:
    """Coverage (δ* ≤ δ̂) and mean δ̂ of the stored APEX CDF at each τ, overall and per layer."""
    out = []
    for tau in taus:
        dhat = predictor_arrays.delta_hat(trace["apex_score"], trace["apex_theta"], tau)
        covered = dstar <= dhat
        out.append({
            "tau": tau,
            "coverage": _r(covered.mean()),
            "mean_delta_hat": _r(dhat.mean()),
            "coverage_per_layer": _rl(covered.mean(axis=0)),
            "mean_delta_hat_per_layer": _rl(dhat.mean(axis=0)),
        })
    return out


# ----------------------------------------------------------------------------------------------------
# provenance and the whole report


def provenance_summary(trace: tf.Trace) -> dict:
    """The provenance fields `chipsim inspect` prints, those that exist in meta['provenance']."""
    prov = trace.meta.get("provenance", {}) or {}
    out: dict = {}
    for key in ("kind", "architecture", "width", "parameters", "routed_expert_parameters", "generator"):
        if key in prov:
            out[key] = prov[key]
    training = prov.get("training")
    if isinstance(training, dict):
        out["training"] = {k: training[k] for k in ("tokens", "steps", "seconds", "batch", "seq") if k in training}
    loss = prov.get("loss")
    if isinstance(loss, dict):
        out["loss"] = {k: loss[k] for k in ("train_before", "train_after", "heldout_before", "heldout_after", "unit")
                       if k in loss}
    text = prov.get("text")
    if isinstance(text, dict) and isinstance(text.get("sources"), dict):
        out["text_sources"] = {
            name: {k: src[k] for k in ("package", "licence", "train_bytes", "heldout_bytes") if k in src}
            for name, src in text["sources"].items() if isinstance(src, dict)
        }
    for key in ("command", "seed", "device"):
        if key in prov:
            out[key] = prov[key]
    return out


QUALITY_RATES = (("substitution_rate", "subst."), ("drop_rate", "drop"), ("deviation_rate", "deviat."),
                 ("surrogate_rate", "surr."), ("heldout_relative_sq_error", "LoRE err"))
QUALITY_NAMES = {"apex_sf": "apex-sf", "pregated": "pregated", "spice_lore": "spice"}


def _setting_order(key: str):
    """Named settings first (alphabetically), then numeric ones in numeric order: drop, shared, 16, 32."""
    try:
        return (1, float(key), key)
    except ValueError:
        return (0, 0.0, key)


def quality_summary(trace: tf.Trace) -> dict | None:
    """meta['quality'] as flat rows (mode, setting, the record's path and values); None without a record."""
    q = trace.meta.get("quality")
    if not isinstance(q, dict) or not q:
        return None
    base = q.get("baseline") if isinstance(q.get("baseline"), dict) else {}
    out: dict = {
        "baseline_ppl": base.get("ppl"),
        "baseline_nll": base.get("nll"),
        "hooked_identity_nll": base.get("hooked_identity_nll"),
        **{k: q[k] for k in ("heldout_windows", "window_tokens", "scored_tokens", "precision", "method", "seconds") if k in q},
        "settings": {},
        "modes": [],
    }
    for mode in sorted(k for k in q if k != "baseline" and isinstance(q[k], dict)):
        node = q[mode]
        if "ppl" in node:
            out["modes"].append({"mode": mode, "setting": None, "record": f"meta['quality']['{mode}']", **node})
            continue
        settings = {k: v for k, v in node.items() if not isinstance(v, dict)}
        if settings:
            out["settings"][mode] = settings
        table, where = node, f"meta['quality']['{mode}']"
        if isinstance(node.get("variants"), dict):
            table, where = node["variants"], where + "['variants']"
        for key in sorted(table, key=_setting_order):
            if isinstance(table[key], dict) and "ppl" in table[key]:
                out["modes"].append({"mode": mode, "setting": key, "record": f"{where}['{key}']", **table[key]})
    return out


def trace_stats(trace: tf.Trace) -> dict:
    """All of the above for one trace, as a JSON-serialisable dict."""
    tf.check_arrays(trace, [spec for spec in predictor_arrays.RECORDED if spec.name in trace.arrays], "chipsim inspect")
    n = trace.num_experts
    routed = trace["routed_ids"]
    has_apex = all(k in trace.arrays for k in ("apex_rank", "apex_score", "apex_theta"))
    dstar = predictor_arrays.delta_star(trace["apex_rank"], trace["routed_ids"]) if has_apex else None
    counts = trace.arrays.get("train_expert_counts")
    return {
        "trace": {
            "path": trace.path,
            "sha256": trace.sha256,
            "synthetic": trace.synthetic,
            "provenance_line": trace.provenance_line(),
            "model": trace.meta.get("model", {}).get("name"),
            "tokens": trace.num_tokens,
            "moe_layers": [int(v) for v in trace["moe_layers"]],
            "num_experts": n,
            "top_k": trace.top_k,
        },
        "provenance": provenance_summary(trace),
        "popularity": popularity(expert_counts(routed, n)),
        "popularity_train_counts": popularity(counts) if counts is not None else None,
        "reuse": reuse(routed, n),
        "predictability": predictability(trace),
        "delta_star": delta_star_summary(dstar) if has_apex else None,
        "apex_cdf": apex_cdf(trace, dstar) if has_apex else [],
        "quality": quality_summary(trace),
    }


# ----------------------------------------------------------------------------------------------------
# text rendering


def _f(value, digits: int = 3) -> str:
    """A number to `digits` decimals; '-' for none; anything else (a hand-edited meta field) as it is."""
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    return f"{value:.{digits}f}"


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def format_report(stats: dict) -> str:
    """A readable rendering of `trace_stats`: provenance, a per-layer table and summary lines."""
    tr = stats["trace"]
    pr, ds = _filled_predictability(stats)
    lines = _provenance_lines(tr, stats["provenance"])
    lines += _per_layer_table(stats, pr, ds)
    lines += _summary_lines(stats, pr)
    lines += _delta_star_lines(stats, ds)
    lines += [""] + format_quality(stats.get("quality"))
    if tr["synthetic"]:
        lines += ["", "SYNTHETIC trace: routing and predictions come from a generator, not a model."]
    return "\n".join(lines)


def _provenance_lines(tr: dict, prov: dict) -> list[str]:
    """The trace's one-line description, then what its provenance says of the model, its training and its text."""
    lines = [tr["provenance_line"]]
    if "kind" in prov:
        lines.append(f"  kind: {prov['kind']}")
    if "architecture" in prov:
        arch = prov["architecture"]
        width = prov.get("width")
        if isinstance(width, dict) and width:
            arch += " (" + ", ".join(f"{k} {v}" for k, v in width.items()) + ")"
        lines.append(f"  architecture: {arch}")
    if _is_number(prov.get("parameters")):
        routed = prov.get("routed_expert_parameters")
        extra = f" ({routed / 1e6:.1f} M in routed experts)" if isinstance(routed, (int, float)) else ""
        lines.append(f"  parameters: {prov['parameters'] / 1e6:.1f} M{extra}")
    if isinstance(prov.get("training"), dict) and _is_number(prov["training"].get("tokens")):
        t = prov["training"]
        parts = [f"{t['tokens'] / 1e6:.2f} M tokens"]
        if "steps" in t:
            parts.append(f"{t['steps']} steps")
        if _is_number(t.get("seconds")):
            parts.append(f"{t['seconds']:.0f} s")
        lines.append("  training: " + ", ".join(parts))
    if isinstance(prov.get("loss"), dict):
        lo = prov["loss"]
        unit = lo.get("unit", "")

        def pair(a, b):
            return f"{_f(lo.get(a))} -> {_f(lo.get(b))}" if a in lo else _f(lo.get(b))

        lines.append(f"  final loss ({unit}): train {pair('train_before', 'train_after')}, "
                     f"held-out {pair('heldout_before', 'heldout_after')}")
    if isinstance(prov.get("text_sources"), dict) and all(isinstance(v, dict) for v in prov["text_sources"].values()):
        srcs = "; ".join(f"{s.get('package', name)} ({s['licence']})" if "licence" in s else s.get("package", name)
                         for name, s in prov["text_sources"].items())
        lines.append(f"  text: {srcs}")
    if "generator" in prov:
        lines.append(f"  generator: {prov['generator']}")
    if "command" in prov:
        lines.append(f"  command: {prov['command']}")
    lines.append(f"  sha256: {tr['sha256']}")
    return lines


def _filled_predictability(stats: dict) -> tuple[dict, dict]:
    """The predictability and δ* statistics with every predictor the trace does not carry as all-None rows
    (printed '-'), so the table and the summary read them alike."""
    tr = stats["trace"]
    none_per_layer = {"recall_per_layer": [None] * len(tr["moe_layers"]), "recall": None, "overlap": None}
    pr = {name: (v if v is not None else none_per_layer) for name, v in stats["predictability"].items()}
    if not pr["draft"]:
        pr["draft"] = [none_per_layer]
    ds = stats["delta_star"] or {"mean_per_layer": [None] * len(tr["moe_layers"])}
    return pr, ds


def _per_layer_table(stats: dict, pr: dict, ds: dict) -> list[str]:
    """Popularity, reuse, every predictor's recall and mean δ* per MoE layer."""
    tr, pop, ru = stats["trace"], stats["popularity"], stats["reuse"]
    k = tr["top_k"]
    lines = ["", f"Per MoE layer (recall = mean |predicted top-{k} ∩ routed| / {k}; '-' = no prediction):"]
    header = (f"{'layer':>5} {'zipf':>6} {'gini':>6} {'reuse':>6} {'apex':>6} {'pregate':>7} {'promoe':>6} "
              f"{'floe':>6} {'draft1':>6} {'draft8':>6} {'prev-l':>6} {'mean δ*':>7}")
    lines += [header, "-" * len(header)]
    for i, layer in enumerate(tr["moe_layers"]):
        lines.append(
            f"{layer:>5} {_f(pop['zipf_per_layer'][i], 2):>6} {_f(pop['gini_per_layer'][i]):>6} "
            f"{_f(ru['per_layer'][i]):>6} {_f(pr['apex']['recall_per_layer'][i]):>6} "
            f"{_f(pr['pregate']['recall_per_layer'][i]):>7} {_f(pr['promoe']['recall_per_layer'][i]):>6} "
            f"{_f(pr['floe']['recall_per_layer'][i]):>6} {_f(pr['draft'][0]['recall_per_layer'][i]):>6} "
            f"{_f(pr['draft'][-1]['recall_per_layer'][i]):>6} {_f(pr['previous_layer']['recall_per_layer'][i]):>6} "
            f"{_f(ds['mean_per_layer'][i], 2):>7}"
        )
    return lines


def _summary_lines(stats: dict, pr: dict) -> list[str]:
    """Popularity, reuse, recall and strict overlap over all layers, and the draft's recall by depth."""
    pop, ru = stats["popularity"], stats["reuse"]
    pt = stats["popularity_train_counts"] or {}
    lines = [
        "",
        "Summary:",
        f"  popularity (trace tokens): Zipf exponent per layer mean {_f(pop['zipf_mean'], 2)} "
        f"({_f(pop['zipf_min'], 2)}–{_f(pop['zipf_max'], 2)}), overall {_f(pop['zipf_overall'], 2)}; "
        f"Gini mean {_f(pop['gini_mean'])}, pooled {_f(pop['gini_pooled'])}; top expert's share {_f(pop['top1_share_mean'])}",
        f"  popularity (training-split counts): Zipf mean {_f(pt.get('zipf_mean'), 2)} "
        f"({_f(pt.get('zipf_min'), 2)}–{_f(pt.get('zipf_max'), 2)}), overall {_f(pt.get('zipf_overall'), 2)}; "
        f"Gini mean {_f(pt.get('gini_mean'))}",
        f"  reuse |routed(t) ∩ routed(t-1)|/k: mean {_f(ru['mean'])} ({_f(ru['min'])}–{_f(ru['max'])}); "
        f"random k/N {_f(ru['random_baseline'])}, popularity alone {_f(ru['popularity_baseline'])}",
    ]
    preds = ", ".join(f"{name} {_f(pr[name]['recall'])}" for name in ("apex", "pregate", "promoe", "floe"))
    lines.append(f"  recall: {preds}; previous layer's experts {_f(pr['previous_layer']['recall'])}; "
                 f"random k/N {_f(pr['random_baseline'])}")
    lines.append("  strict overlap (whole routed set predicted): "
                 + ", ".join(f"{name} {_f(pr[name]['overlap'])}" for name in ("apex", "pregate", "promoe", "floe")))
    lines.append("  draft recall by depth 1..8: " + " ".join(_f(d["recall"]) for d in pr["draft"]))
    return lines


def _delta_star_lines(stats: dict, ds: dict) -> list[str]:
    """δ* of the oracle and the stored APEX CDF's coverage, or why there are none."""
    if stats["delta_star"] is None:
        return ["  δ* and the APEX CDF: the trace carries no APEX predictor arrays"]
    shares = " ".join(f"{label}: {_f(v)}" for label, v in ds["shares"].items())
    return [f"  δ* (oracle): mean {_f(ds['mean'], 2)}, median {ds['median']}, p90 {ds['p90']}, "
            f"p99 {ds['p99']}, max {ds['max']}; shares {shares}",
            "  APEX CDF: " + "; ".join(f"τ {a['tau']}: coverage {_f(a['coverage'])}, mean δ̂ {_f(a['mean_delta_hat'], 2)}"
                                      for a in stats["apex_cdf"])]


def _setting_text(mode: str, setting) -> str:
    if setting is None:
        return ""
    if mode == "apex_sf":
        return f"τ {setting}"
    if mode == "spice_lore" and str(setting).isdigit():
        return f"LoRE rank {setting}"
    return str(setting)


def format_quality(q: dict | None) -> list[str]:
    """The quality section of `format_report`: baseline perplexity and one row per measured mode."""
    if not q:
        return ["quality: not measured (the trace carries no meta['quality'] record)"]
    scope = []
    if "heldout_windows" in q and "window_tokens" in q:
        scope.append(f"over all {q['heldout_windows']} recorded held-out windows of {q['window_tokens']} tokens "
                     "(not only the trace's tokens)")
    if "scored_tokens" in q:
        scope.append(f"{q['scored_tokens']:,} tokens scored")
    if "precision" in q:
        scope.append(q["precision"])
    lines = ["Quality cost (chipsim.tracegen.quality): held-out perplexity of the trace's trained model under each "
             "approximate mode, teacher-forced" + (", " + ", ".join(scope) if scope else "") + ":"]
    lines.append(f"  baseline ppl {_f(q.get('baseline_ppl'))} (nll {_f(q.get('baseline_nll'), 5)}; through identity "
                 f"hooks {_f(q.get('hooked_identity_nll'), 5)})")
    rates = [(key, head) for key, head in QUALITY_RATES if any(key in m for m in q["modes"])]
    header = f"  {'mode':<9} {'setting':<12} {'ppl':>9} {'Δ ppl %':>8}" + "".join(f" {head:>8}" for _, head in rates)
    lines += [header, "  " + "-" * (len(header) - 2)]
    for m in q["modes"]:
        pct = m.get("delta_ppl_pct")
        line = (f"  {QUALITY_NAMES.get(m['mode'], m['mode']):<9} {_setting_text(m['mode'], m['setting']):<12} "
                f"{_f(m.get('ppl')):>9} {'-' if pct is None else f'{pct:+.3f}':>8}")
        line += "".join(f" {_f(m.get(key), 4):>8}" for key, _ in rates)
        lines.append(line)
    for mode, settings in q.get("settings", {}).items():
        text = "; ".join(f"{k} {v}" for k, v in sorted(settings.items()))
        lines.append(f"  {QUALITY_NAMES.get(mode, mode)}: {text}")
    legend = {"subst.": "subst./drop = share of routed experts substituted / dropped",
              "deviat.": "deviat. = share replaced by the pre-gate's choice",
              "surr.": "surr. = share replaced by surrogates",
              "LoRE err": "LoRE err = held-out relative squared error of the surrogate against the expert's output"}
    shown = [legend[head] for _, head in rates if head in legend]
    if shown:
        lines.append("  " + "; ".join(shown))
    return lines
