"""What one simulated run records, and the `SimResult` it hands to the metrics (chipsim.sim.metrics).

`RunRecorder` is filled by the engine as it goes: per token an energy `Ledger` (action counts) and its
latency and stall, per (token, MoE layer) what routing found and what the layer did, and the run's
counters. `result()` turns it into a `SimResult` of a few sub-records:

- `per_token` (`TokenRecord`, arrays of shape (T,)): latency, stall, array busy/idle time, host-CPU wait and
  busy time, bytes per component;
- `per_layer` (`LayerRecord`, arrays of shape (T, L)): overlap, hits, stall, demand fetches and the
  experts run on the host, replaced by a surrogate, substituted or dropped;
- `counts` (`RunCounts`): prefetches issued / dropped / unused, fetches, peak buffer slots, expert computes;
- `timeline` (`RecordedTimeline`, only when recording): spans for chipsim.analysis.timeline.

A new per-token or per-layer quantity is a field here and the line in the engine that counts it; the
metric that summarises it goes in chipsim.sim.metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from chipsim.sim.energy import ACTIONS, Ledger


@dataclass
class TokenRecord:
    """Per token (arrays of shape (T,), integer ps or bytes)."""

    latency_ps: np.ndarray  # decode-step wall time
    stall_ps: np.ndarray  # arrays waiting only for expert bytes (or the host issuing them: host_frontend)
    busy_ps: np.ndarray  # arrays running an operation
    occupied_ps: np.ndarray  # busy_ps weighted by the share of the arrays each operation occupies
    idle_ps: np.ndarray  # latency - busy
    host_wait_ps: np.ndarray  # arrays waiting for host-CPU results
    host_busy_ps: np.ndarray  # host CPU computing offloaded experts
    bytes: dict  # memory or link -> (T,) bytes that crossed it
    actions: dict  # arrays action (chipsim.sim.energy.ACTIONS) -> (T,) count
    profiled_pj: np.ndarray  # compute.op_energy_pj: measured energy of the operations listed there
    unpriced_operand_bytes: np.ndarray  # of bytes["hbm"] and bytes["ucie"], operands whose energy profiled_pj holds


@dataclass
class LayerRecord:
    """Per token and MoE layer (arrays of shape (T, L))."""

    overlap: np.ndarray  # bool: the whole routed set was in the buffer when routing decided
    hits: np.ndarray  # routed experts in the buffer (arrived or on their way) then
    stall_ps: np.ndarray  # the layer's stall
    demand_fetches: np.ndarray  # experts fetched on demand
    host: np.ndarray  # experts computed on the host CPU
    surrogate: np.ndarray  # experts replaced by a surrogate
    substituted: np.ndarray  # routed experts replaced by another expert
    dropped: np.ndarray  # routed experts not computed

    @classmethod
    def zeros(cls, tokens: int, layers: int) -> "LayerRecord":
        shape = (tokens, layers)
        return cls(overlap=np.zeros(shape, dtype=bool), hits=np.zeros(shape, dtype=np.int16),
                   stall_ps=np.zeros(shape, dtype=np.int64),
                   **{f.name: np.zeros(shape, dtype=np.int16) for f in fields(cls)
                      if f.name not in ("overlap", "hits", "stall_ps")})


@dataclass
class RunCounts:
    """Counters of the whole run."""

    prefetches_issued: int = 0
    prefetches_dropped: int = 0  # refused for lack of buffer space
    prefetches_unused: int = 0  # staged but evicted without being computed
    fetches_total: int = 0
    peak_buffer_slots: int = 0  # most expert slots held at once (arrived, on their way, or stopping)
    expert_computes: int = 0


@dataclass
class RecordedTimeline:
    """The spans of a recorded run (`record_events=True`), as plain tuples that pickle cheaply.

    events: (lane, name, start_ps, end_ps) of the arrays, tokens, host CPU and landed transfers;
    dma: (engine, phase, start_ps, end_ps, layer, expert, bytes, "demand"/"prefetch" at the span's start,
    cancelled, promoted to demand) per DMA engine span; link: the DMA recorder's link samples."""

    arrays: int
    engines: int
    events: list
    dma: list
    link: list

    def run_data(self, label: str) -> dict:
        """The data chipsim.analysis.timeline draws for one policy run (DMA drawn from the engine spans)."""
        return {"label": label, "arrays": self.arrays, "engines": self.engines,
                "events": [ev for ev in self.events if not ev[0].startswith("dma")],
                "dma": self.dma, "link": self.link}


@dataclass
class ServedRecord:
    """A served run's requests (chipsim.serve): per request (arrays of shape (N,), ps) when it arrived, was admitted,
    first ran, yielded its first token and finished, its size and trace window; per step its tokens and parts; the
    time the chip sat idle between steps; and the area under the number of requests in the system over time
    (request-ps), counted as arrivals and finishes happen (Little's law's L times the run's span)."""

    arrival_ps: np.ndarray
    admitted_ps: np.ndarray
    scheduled_ps: np.ndarray
    first_token_ps: np.ndarray
    finish_ps: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    window: np.ndarray
    step_tokens: np.ndarray
    step_parts: np.ndarray
    idle_ps: int
    area_ps: int
    scheduler: str

    def same(self, other: "ServedRecord") -> bool:
        return all(np.array_equal(getattr(self, f.name), getattr(other, f.name)) for f in fields(self))


@dataclass
class SimResult:
    policy: str
    tokens: int
    moe_layers: int
    per_token: TokenRecord
    per_layer: LayerRecord
    counts: RunCounts
    extra: dict = field(default_factory=dict)  # the policy's own metrics (Policy.extra_metrics)
    timeline: RecordedTimeline | None = None
    # a whole request (chipsim.workload.request): its first `prefill_steps` steps are prefill chunks of these many
    # prompt tokens each, the rest decode steps; 0 and () in decode-only runs, where every step is a token
    prefill_steps: int = 0
    prefill_chunk_tokens: tuple[int, ...] = ()
    # sequences decoded together (chipsim.workload.batch): each step is one token of each, and each MoE layer
    # routes to the union of their experts, `union` of them (steps x MoE layers; None for one sequence)
    batch: int = 1
    union: np.ndarray | None = None
    # a speculative run (chipsim.workload.speculative): each step's (input token, tokens verified, drafts accepted)
    speculative: np.ndarray | None = None
    # a served run (workload.requests): its requests and steps
    served: ServedRecord | None = None


# a run packs its steps' ledgers into arrays this many at a time (chipsim.sim.energy.Ledger: a few hundred bytes each)
LEDGERS_PER_BLOCK = 4096


class RunRecorder:
    """The engine's bookkeeping of one run: a Ledger per token, per-token and per-layer arrays, counters."""

    def __init__(self, tokens: int, layers: int, components: tuple[str, ...]):
        """`components`: the config's memories and links (chipsim.hw.paths.components), counted per byte."""
        self.layers = LayerRecord.zeros(tokens, layers)
        self.moe_layers = layers
        self.latency_ps = np.zeros(tokens, dtype=np.int64)
        self.stall_ps = np.zeros(tokens, dtype=np.int64)
        self.host_wait_ps = np.zeros(tokens, dtype=np.int64)
        self.counts = RunCounts()
        self.components = components
        self.ledgers: list[Ledger] = []  # the steps' ledgers not yet packed into arrays
        self._packed: list[dict] = []  # blocks of LEDGERS_PER_BLOCK steps' ledgers as arrays (memory per step small)
        self.ledger = Ledger.empty(components)  # the token being decoded (transfers landing after the last: its)

    def grow(self, steps: int) -> None:
        """Records for `steps` steps: those made so far kept, zeros after them (or cut to `steps`)."""
        old = self.latency_ps.size
        keep = min(old, steps)
        grown = LayerRecord.zeros(steps, self.moe_layers)
        for f in fields(grown):
            getattr(grown, f.name)[:keep] = getattr(self.layers, f.name)[:keep]
        self.layers = grown
        for name in ("latency_ps", "stall_ps", "host_wait_ps"):
            arr = np.zeros(steps, dtype=np.int64)
            arr[:keep] = getattr(self, name)[:keep]
            setattr(self, name, arr)

    def start_token(self) -> Ledger:
        if len(self.ledgers) >= LEDGERS_PER_BLOCK:  # every earlier step's ledger is final once a new step starts
            self._pack()
        self.ledger = Ledger.empty(self.components)
        return self.ledger

    def _pack(self) -> None:
        """The ledgers so far as arrays, one block (a long run keeps a few integers per step, not a Ledger)."""
        ledgers = self.ledgers
        if not ledgers:
            return
        block = {name: np.array([getattr(lg, name) for lg in ledgers], dtype=np.int64)
                 for name in ("busy_ps", "occupied_ps", "idle_ps", "host_busy_ps", "profiled_pj",
                              "unpriced_operand_bytes")}
        block["bytes"] = {c: np.array([lg.bytes[c] for lg in ledgers], dtype=np.int64) for c in self.components}
        block["actions"] = {a: np.array([lg.actions[a] for lg in ledgers], dtype=np.int64) for a in ACTIONS}
        self._packed.append(block)
        self.ledgers = []

    def _joined(self, *path: str) -> np.ndarray:
        arrays = []
        for block in self._packed:
            value = block
            for key in path:
                value = value[key]
            arrays.append(value)
        return np.concatenate(arrays) if len(arrays) > 1 else arrays[0]

    def end_token(self, t: int, latency_ps: int, stall_ps: int) -> None:
        self.ledger.idle_ps = latency_ps - self.ledger.busy_ps
        self.latency_ps[t] = latency_ps
        self.stall_ps[t] = stall_ps
        self.ledgers.append(self.ledger)

    def result(self, policy: str, moe_layers: int, extra: dict,
               timeline: RecordedTimeline | None = None) -> SimResult:
        self._pack()
        if not self._packed:  # no step ran
            self._packed.append({"bytes": {c: np.zeros(0, dtype=np.int64) for c in self.components},
                                 "actions": {a: np.zeros(0, dtype=np.int64) for a in ACTIONS},
                                 **{name: np.zeros(0, dtype=np.int64) for name in (
                                     "busy_ps", "occupied_ps", "idle_ps", "host_busy_ps", "profiled_pj",
                                     "unpriced_operand_bytes")}})
        join = self._joined
        per_token = TokenRecord(
            latency_ps=self.latency_ps,
            stall_ps=self.stall_ps,
            busy_ps=join("busy_ps"),
            occupied_ps=join("occupied_ps"),
            idle_ps=join("idle_ps"),
            host_wait_ps=self.host_wait_ps,
            host_busy_ps=join("host_busy_ps"),
            bytes={c: join("bytes", c) for c in self.components},
            actions={a: join("actions", a) for a in ACTIONS},
            profiled_pj=join("profiled_pj"),
            unpriced_operand_bytes=join("unpriced_operand_bytes"),
        )
        steps = int(per_token.busy_ps.size)
        return SimResult(policy=policy, tokens=steps, moe_layers=moe_layers, per_token=per_token,
                         per_layer=self.layers, counts=self.counts, extra=extra, timeline=timeline)


def differences(a: SimResult, b: SimResult) -> list[str]:
    """The fields in which two runs' results differ (per token, per layer, counts, the policy's own metrics):
    empty when they are identical to the picosecond and the byte."""
    out = []
    if a.tokens != b.tokens:
        out.append("tokens")
    for part, x, y in (("per_token", a.per_token, b.per_token), ("per_layer", a.per_layer, b.per_layer)):
        for f in fields(x):
            u, v = getattr(x, f.name), getattr(y, f.name)
            if isinstance(u, dict):
                out += [f"{part}.{f.name}.{k}" for k in sorted(set(u) | set(v))
                        if k not in u or k not in v or not np.array_equal(u[k], v[k])]
            elif not np.array_equal(u, v):
                out.append(f"{part}.{f.name}")
    if a.counts != b.counts:
        out.append("counts")
    if a.extra != b.extra:
        out.append("extra")
    if (a.prefill_steps, a.prefill_chunk_tokens) != (b.prefill_steps, b.prefill_chunk_tokens):
        out.append("prefill")
    if (a.served is None) != (b.served is None) or (a.served is not None and not a.served.same(b.served)):
        out.append("served")
    for name in ("union", "speculative"):
        u, v = getattr(a, name), getattr(b, name)
        if (u is None) != (v is None) or (u is not None and not np.array_equal(u, v)):
            out.append(name)
    if a.batch != b.batch:
        out.append("batch")
    return out
