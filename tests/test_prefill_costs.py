"""A prefill chunk's operations (chipsim.workload.prefill), summed by hand: causal pairs, the chunk's GEMMs, an
expert over the tokens routed to it, a Mamba2 layer over a chunk."""

from __future__ import annotations

import pytest
from conftest import THOR

from chipsim.hw.compute_formula import ArrayModel
from chipsim.hw.config import load_config
from chipsim.workload.decode import op_group_builders
from chipsim.workload.models import MODELS
from chipsim.workload.prefill import attended_pairs, prefill_group_builders


def builders(model: str, offset: int, tokens: int):
    hw = load_config(THOR, [f"model.name={model}", "compute.timing=analytic"]).hw
    am = ArrayModel(hw)
    return prefill_group_builders(am, MODELS[model], hw, offset, tokens), op_group_builders(am, MODELS[model], hw)


def test_causal_pairs_by_hand():
    """Full attention, 4 queries after 10 cached tokens: each reads the 10 cached keys (40 pairs) and the chunk's
    keys up to itself (1 + 2 + 3 + 4). A 4-token window at positions 10..12: each query sees 4 keys, 1, 2, 3 of
    them its chunk's, so 3 + 2 + 1 cached ones of the 3 a window can reach."""
    assert attended_pairs(10, 4) == (10, 40, 10)
    assert attended_pairs(10, 3, window=4) == (3, 6, 6)
    # two chunks of 256 see the pairs one chunk of 512 sees
    one = attended_pairs(0, 512)
    two = [attended_pairs(0, 256), attended_pairs(256, 256)]
    assert one[1] + one[2] == sum(a[1] + a[2] for a in two) == 512 * 513 // 2


def test_a_granite_chunk_s_attention_macs_and_cache_reads_by_hand():
    """Granite-3B (d 1536, 24 query / 8 KV heads of 64), 512 tokens after 256 cached: q, k, v and o as GEMMs over
    512 tokens; scores and value mix over 512 x 256 + 512 x 513 / 2 pairs per head; the cached K and V read once
    (8 x 256 x 64 x 2 bytes each) beside the projections' weights."""
    g, _ = builders("granite-3.1-3b-a800m", 256, 512)
    op = g["attention"]()
    d, nq, nkv, hd, c = 1536, 24, 8, 64, 512
    pairs = c * 256 + c * (c + 1) // 2
    assert op.macs == c * d * (nq + 2 * nkv) * hd + 2 * nq * pairs * hd + c * nq * hd * d
    weights = d * (nq + 2 * nkv) * hd + nq * hd * d
    assert op.hbm_read_bytes == 2 * weights + 2 * (nkv * 256 * hd * 2)
    assert op.hbm_write_bytes == c * 2 * nkv * hd * 2  # the chunk's K and V appended


def test_an_expert_over_its_routed_tokens_streams_its_weights_once():
    """One Granite-3B expert (3 x 1536 x 512 BF16) for 37 of a chunk's tokens: 37 x 3 x 1536 x 512 MACs, its 4.7 MB
    read once, exactly as decode reads it for one token; one token is decode's expert."""
    g, dec = builders("granite-3.1-3b-a800m", 0, 512)
    op, one = g["expert"](37), dec["expert"]()
    assert op.macs == 37 * 3 * 1536 * 512
    assert op.hbm_read_bytes == one.hbm_read_bytes == 3 * 1536 * 512 * 2
    assert g["expert"](1) == one


def test_a_mamba2_chunk_reads_and_writes_its_state_once():
    """Granite-4.0-H, 100 tokens: MACs 100x a step's; the state (48 x 64 x 128 x 2 B) and the weights read once;
    written: the state and the convolution's last 3 inputs (3,328 channels); one token is decode's layer."""
    g, dec = builders("granite-4.0-h-tiny", 0, 100)
    chunk, step = g["mamba"](), dec["mamba"]()
    assert chunk.macs == 100 * step.macs
    state = 48 * 64 * 128 * 2
    assert chunk.hbm_read_bytes == step.hbm_read_bytes
    assert chunk.hbm_write_bytes == state + 3 * 3328 * 2 and step.hbm_write_bytes == state + 3328 * 2
    assert builders("granite-4.0-h-tiny", 0, 1)[0]["mamba"]().macs == step.macs


@pytest.mark.parametrize("model", ["gpt-oss-20b", "moonlight-16b-a3b", "qwen3-30b-a3b"])
def test_a_chunk_costs_more_than_a_token_and_less_than_its_tokens_one_by_one(model):
    """Weights streamed once: a 256-token chunk's attention takes longer than one decode step's and less than
    256 of them (every model's layer kinds)."""
    g, dec = builders(model, 0, 256)
    for kind in ("attention", "attention_sliding"):
        if g[kind] is None:
            continue
        chunk, step = g[kind]().duration_ps, dec[kind]().duration_ps
        assert step < chunk < 256 * step
