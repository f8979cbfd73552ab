"""Request streams for the command-level DRAM model (and, written out, for Ramulator 2.1's ReadWriteTrace front
end, so both simulators see the same requests).

A request is (is_write, channel, address below the channel as one index per level, row). A stream is
`sequential` (consecutive bursts through the address mapping, chipsim.dramsim.mapping; the default `interleaved`
spreads them over the data-level nodes and bank groups first, then the columns of a row, then the banks and
ranks, then rows: long row-hit runs on every bank in parallel) or `random` (every request a uniformly random
bank, row and column); `read_share` is the
probability that a request reads (seeded: the same seed gives the same requests); `streams` > 1 interleaves
that many sequential streams, each from its own region (an equal share of the rows' worth of addresses), in turn
or drawn at random at given relative paces.
"""

from __future__ import annotations

import numpy as np

from chipsim.dramsim.mapping import Mapping, resolve
from chipsim.dramsim.standard import Standard


def _stream_order(count: int, streams: int, paces: tuple, rng: np.random.Generator) -> list[int]:
    """Which stream each request belongs to: in turn (no paces), or each request a stream drawn at random in
    proportion to the paces (seeded), so that streams of any rates drift over each other's banks as independent
    streams do rather than moving in lockstep."""
    if not paces:
        return [i % streams for i in range(count)]
    weights = np.asarray(paces, dtype=float)
    return [int(s) for s in rng.choice(streams, size=count, p=weights / weights.sum())]


def stream_mapping(std: Standard, channels: int = 1, spec: str = "interleaved", xor: str = "",
                   key: str = "", names: tuple[str, str] = ("address_mapping", "address_xor")) -> Mapping:
    """The address mapping `spec` (a preset or a field order; `xor` the fields to hash) for this standard; errors
    name `key` (a memory's dotted config key) and `names` (what gave the mapping and the hash)."""
    sizes = dict(zip(std.levels, std.org.counts))
    sizes.update(channel=channels, column=std.org.columns, row=std.org.rows)
    prefix = f"{key}." if key else ""
    return resolve(spec, xor, std.levels, std.data_level, sizes, prefix + names[0], prefix + names[1])


def requests(std: Standard, count: int, *, kind: str = "sequential", read_share: float = 1.0, channels: int = 1,
             streams: int = 1, seed: int = 1, paces: tuple = (), write_streams: tuple = (),
             mapping: Mapping | None = None) -> list[tuple]:
    """`paces`: the sequential streams' relative rates (default: in turn); `write_streams`: streams whose every
    request writes (the others follow read_share), e.g. fetch writes beside operand reads; `mapping`: the address
    mapping of the sequential streams (default: interleaved, no hash)."""
    if kind not in ("sequential", "random"):
        raise ValueError(f"stream kind {kind!r}: sequential or random")
    if paces and len(paces) != streams:
        raise ValueError(f"{len(paces)} paces for {streams} streams")
    rng = np.random.default_rng(seed)
    writes_drawn = rng.random(count) >= read_share
    writes: list[bool] = writes_drawn.tolist()  # (plain bools: read one by one below)
    levels: list[str] = list(std.levels[1:])
    sizes: dict[str, int] = dict(zip(std.levels, std.org.counts))
    sizes["channel"] = channels
    sizes["column"] = std.org.columns
    sizes["row"] = std.org.rows
    out: list[tuple] = []
    if kind == "random":
        fields = {name: rng.integers(0, sizes[name], count) for name in ["channel"] + levels + ["row", "column"]}
        for i in range(count):
            addr = tuple(int(fields[name][i]) for name in levels)
            out.append((bool(writes[i]), int(fields["channel"][i]), addr, int(fields["row"][i]),
                        int(fields["column"][i])))
        return out
    if mapping is None:
        mapping = stream_mapping(std, channels)
    rows: int = std.org.rows
    total = 1
    for _name, size in mapping.fields:
        total *= size
    # each stream starts an equal share of the rows' worth of addresses after the previous one
    region = max(1, rows // streams) * (total // rows)
    cursors = [0] * streams
    for i, s in enumerate(_stream_order(count, streams, tuple(paces), rng)):
        value = mapping.decode((s * region + cursors[s]) % total)
        cursors[s] += 1
        addr = tuple([value[name] for name in levels])
        out.append((writes[i] or s in write_streams, value["channel"], addr, value["row"], value["column"]))
    return out


def ramulator_trace_lines(std: Standard, reqs: list[tuple]) -> list[str]:
    """The requests as Ramulator 2.1 ReadWriteTrace lines: `R|W channel,<levels>,row,column` (columns in its
    units: one burst = the standard's burst length)."""
    prefetch = std.org.burst_length
    return [f"{'W' if w else 'R'} {ch},{','.join(map(str, addr))},{row},{col * prefetch}" for w, ch, addr, row, col
            in reqs]


def ramulator_loadstore_lines(std: Standard, reqs: list[tuple]) -> list[str]:
    """The requests (one channel) as Ramulator 2.1 LoadStoreTrace lines `LD|ST address`, the address laid out as
    its RoBaRaCoCh mapper reads it: from the least significant bit, the burst offset, the column (in bursts),
    then each level below the channel in order, then the row. Unlike a ReadWriteTrace line, such a request has
    its own address, so Ramulator's write coalescing and read forwarding see distinct requests."""
    counts = std.org.counts[1:]
    lines = []
    for w, ch, addr, row, col in reqs:
        if ch:
            raise ValueError("LoadStoreTrace lines are for one channel")
        flat = row
        for lvl in range(len(counts) - 1, -1, -1):
            flat = flat * counts[lvl] + addr[lvl]
        flat = (flat * std.org.columns + col) * std.org.burst_bytes
        lines.append(f"{'ST' if w else 'LD'} {flat}")
    return lines
