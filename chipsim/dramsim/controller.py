"""A command-level DRAM memory system: per channel a controller with read and write queues, a write-drain
policy, FR-FCFS scheduling (row hits first, then oldest) and open or closed pages, issuing ACT / PRE / PREA /
RD / WR / REFA / REFB to the banks under the standard's timing constraints (chipsim.dramsim.standard), cycle by
cycle (idle stretches are skipped, not ticked through).

Requests come from a front end that offers them in order, one every `interval` cycles, and waits (the next
request behind it too) while the target channel's queue is full, as Ramulator 2.1's trace front ends do. A
read completes `read_latency` cycles after its RD; its latency is completion minus arrival in the queue.

What is modelled, per node of every level: the earliest cycle each command may issue (every constraint of
the standard, windows such as tFAW and sibling constraints such as tCCDR included), each bank's open row,
the command bus (one command per cycle, or one row and one column command with `dual_command_bus`; ACT of
LPDDR5 is two commands, ACT-1 and ACT-2, each a cycle of the bus), refresh (all-bank REFA every nREFI per refresh
node, or per-bank REFB every nREFIpb in rotation over the banks of each node of the per-bank refresh level, or none),
and a refresh node stops opening rows once its refresh is due; while a refresh or a page-policy precharge is about
to issue, no queued request takes the column bus.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Iterable

import numpy as np
from mypy_extensions import mypyc_attr

from chipsim.dramsim.standard import ACT, COMMANDS, PRE, PREA, RD, REFA, REFB, WR, Standard

NCMD = len(COMMANDS)
INF = 1 << 62
COLUMN, ROW, ANY = range(3)  # which command bus slot a pick fills


@mypyc_attr(native_class=False)  # a plain frozen dataclass (dataclasses.replace), also where compiled
@dataclass(frozen=True)
class ControllerConfig:
    read_buffer: int = 32  # Ramulator 2.1 controller default queue sizes and write watermarks
    write_buffer: int = 32
    write_high_watermark: float = 0.8  # start draining writes above this share of the write queue
    write_low_watermark: float = 0.2  # stop below it (if reads wait)
    page_policy: str = "open"  # "open" (rows stay open), "closed" (precharge once no queued request hits it) or
    # "capped" (precharge after `page_cap` accesses to the open row: auto-precharge on the next one, or a PRE as
    # soon as it may issue; Ramulator 2.1's ClosedCAP)
    page_cap: int = 4
    refresh: str = "all-bank"  # "all-bank", "per-bank" or "off"


class _Request:
    __slots__ = ("is_write", "nodes", "bank", "row", "arrive")

    def __init__(self, is_write: bool, nodes: list[int], row: int) -> None:
        self.is_write = is_write
        self.nodes = nodes  # flat node id within the channel at every level (the channel itself: 0)
        self.bank = nodes[-1]
        self.row = row
        self.arrive = 0


@mypyc_attr(native_class=False)  # a plain dataclass (as_dict reads its __dict__), also where compiled
@dataclass
class DramResult:
    """What a stream measured: bandwidth, read latency, and the row-buffer outcome."""

    cycles: int
    reads: int
    writes: int
    bandwidth_gbps: float
    read_latency_avg_ns: float
    read_latency_p99_ns: float
    row_hits: int
    row_misses: int  # closed bank: ACT needed
    row_conflicts: int  # another row open: PRE then ACT
    refreshes: int

    def as_dict(self) -> dict:
        return dict(self.__dict__)


class _Channel:
    """One channel's controller and the state of its banks."""

    def __init__(self, std: Standard, cfg: ControllerConfig) -> None:
        self.std, self.cfg = std, cfg
        counts: list[int] = [1] + list(std.org.counts[1:])  # nodes per parent at every level; one channel here
        self.nlevels = len(counts)
        self.sizes: list[int] = []
        n = 1
        for c in counts:
            n *= c
            self.sizes.append(n)
        self.counts = counts
        # what the hot loops read of the standard and the config, as typed fields (compiled: read natively)
        self.command_cycles: list[int] = list(std.command_cycles)
        self.dual_command_bus: bool = std.dual_command_bus
        self.read_latency: int = std.read_latency
        self.read_buffer: int = cfg.read_buffer
        self.write_buffer: int = cfg.write_buffer
        self.write_high = float(cfg.write_high_watermark * cfg.write_buffer)
        self.write_low = float(cfg.write_low_watermark * cfg.write_buffer)
        self.page_policy: str = cfg.page_policy
        self.page_cap: int = cfg.page_cap
        self.per_bank_refresh: bool = cfg.refresh == "per-bank"
        # earliest issue cycle per node and command
        self.next_ok: list[list[int]] = [[0] * (size * NCMD) for size in self.sizes]
        self.open_row: list[int] = [-1] * self.sizes[-1]
        # the constraints each issued command starts: (level, later command, latency, window, sibling)
        self.updates: list[list[tuple[int, int, int, int, bool]]] = [[] for _ in range(NCMD)]
        self.windows: dict[tuple[int, int, int, int, int], deque[int]] = {}
        for con in std.constraints:
            self.updates[con.before].append((con.level, con.after, con.latency, con.window, con.sibling))
        self.reads: list[_Request] = []
        self.writes: list[_Request] = []
        self.active: list[_Request] = []  # rows opened for them, column command to come (Ramulator's active buffer)
        self.write_mode = False
        self.row_bus_free = 0
        self.col_bus_free = 0
        self.wake = INF
        # refresh: every nREFI (nREFIpb per bank) all refresh nodes at once, as Ramulator 2.1's managers do; per-bank
        # refresh rotates over the banks of each node of the standard's per-bank refresh level (default: its refresh
        # level)
        level = std.refresh_level
        if self.per_bank_refresh and std.per_bank_refresh_level >= 0:
            level = std.per_bank_refresh_level
        self.refresh_nodes = self.sizes[level]
        self.banks_per_refresh_node = self.sizes[-1] // self.refresh_nodes
        p = std.params
        self.refresh_interval: int = {"all-bank": p.get("nREFI", INF), "per-bank": p.get("nREFIpb", INF)}.get(
            cfg.refresh, INF)
        self.next_refresh = self.refresh_interval
        self.refresh_bank: list[int] = [0] * self.refresh_nodes
        self.refresh_queue: list[int] = []
        self.refresh_pending = False
        self.to_close: list[int] = []  # closed-page policy: banks to precharge
        self.col_accesses: list[int] = [0] * self.sizes[-1]  # capped policy: accesses to each bank's open row
        self.stats_acts = self.stats_conflicts = self.stats_refreshes = 0
        # a two-part activate (LPDDR5): the bank whose ACT-2 is still to come (-1: none) and its last cycle
        self.act2_window: int = std.second_activate_window
        self.act2_bank: int = -1
        self.act2_deadline: int = 0

    # ------------------------------------------------------------------ timing
    def earliest(self, cmd: int, nodes: list[int]) -> int:
        t = 0
        next_ok = self.next_ok
        for lvl in range(self.nlevels):
            v = next_ok[lvl][nodes[lvl] * NCMD + cmd]
            if v > t:
                t = v
        return t

    def issue(self, cmd: int, nodes: list[int], now: int, bus: bool = True) -> None:
        """Record command `cmd` at `now`: every constraint it starts; `bus=False` for an auto-precharge, which
        takes no command slot."""
        next_ok = self.next_ok
        for lvl, after, latency, window, sibling in self.updates[cmd]:
            t = now + latency
            node = nodes[lvl]
            if window > 1:
                hist = self.windows.setdefault((lvl, node, cmd, after, latency), deque(maxlen=window))
                hist.append(now)
                if len(hist) < window:
                    continue
                t = hist[0] + latency
            table = next_ok[lvl]
            if sibling:
                per_parent = self.counts[lvl]
                first = node - node % per_parent
                for sib in range(first, first + per_parent):
                    if sib != node and t > table[sib * NCMD + after]:
                        table[sib * NCMD + after] = t
            elif t > table[node * NCMD + after]:
                table[node * NCMD + after] = t
        if not bus:
            return
        occupancy = self.command_cycles[cmd]
        if self.dual_command_bus and (cmd == RD or cmd == WR):
            self.col_bus_free = now + occupancy
        else:
            self.row_bus_free = now + occupancy
            if not self.dual_command_bus:
                self.col_bus_free = now + occupancy

    def _banks_of(self, refresh_node: int) -> range:
        n = self.banks_per_refresh_node
        return range(refresh_node * n, (refresh_node + 1) * n)

    def bank_nodes(self, bank: int) -> list[int]:
        """The node ids of a flat bank id at every level (the channel: 0)."""
        out = [0] * self.nlevels
        for lvl in range(self.nlevels - 1, -1, -1):
            out[lvl] = bank
            bank //= self.counts[lvl]
        return out

    # ------------------------------------------------------------------ queues
    def can_accept(self, req: _Request) -> bool:
        if req.is_write:
            return len(self.writes) < self.write_buffer
        return len(self.reads) < self.read_buffer

    def enqueue(self, req: _Request, now: int) -> None:
        req.arrive = now
        (self.writes if req.is_write else self.reads).append(req)

    def _set_write_mode(self) -> None:
        if not self.write_mode:
            if len(self.writes) > self.write_high or not self.reads:
                self.write_mode = True
        elif len(self.writes) < self.write_low and self.reads:
            self.write_mode = False

    # ------------------------------------------------------------------ one cycle
    def tick(self, now: int, completions: list[int]) -> int:
        """Issue what may issue at `now` (one command, or one column and one row command on a dual command bus),
        in the order a controller tries them: a column command of a request whose row is already opened for it
        (the active requests), the refresh commands, then the oldest ready request of the read or write queue.
        While a refresh waits, no queued request starts. Returns the earliest later cycle at which something
        might issue (INF: nothing to do)."""
        self.wake = INF
        row_free = self.row_bus_free <= now
        col_free = self.col_bus_free <= now
        if not row_free and not col_free:
            return min(self.row_bus_free, self.col_bus_free)
        self._refresh_due(now)
        if self.dual_command_bus:
            # a page-policy precharge about to take the row slot holds the queued requests' column commands back for
            # this cycle, as a waiting refresh does (Ramulator 2.1 sends both through its priority buffer and picks
            # no queued read or write while that buffer holds a command)
            closing = row_free and not self.refresh_queue and self._close_ready(now)
            if col_free and not self._active_column(now, completions) and not self.refresh_pending and not closing:
                self._queued(now, completions, COLUMN)
            if row_free and not self._refresh_command(now) and not self.refresh_pending:
                self._queued(now, completions, ROW)
        elif row_free:
            self._single_bus(now, completions)
        w = self.wake
        for free in (self.row_bus_free, self.col_bus_free):
            if now < free < w:
                w = free
        return w

    def _single_bus(self, now: int, completions: list[int]) -> None:
        """One command on a single command bus: an ACT-2 at its deadline first; then a column command of an
        active request, a refresh command, a queued request's next command; an ACT-2 still to come takes a slot
        nothing else wants (Ramulator 2.1's LPDDR5 controller: urgent, normal, then deferred ACT-2)."""
        if self.act2_bank >= 0 and now >= self.act2_deadline:
            self._second_activate(now)
            return
        if self._active_column(now, completions) or self._refresh_command(now):
            return
        if not self.refresh_pending and self._queued(now, completions, ANY):
            return
        if self.act2_bank >= 0:
            self._second_activate(now)

    def _second_activate(self, now: int) -> None:
        """ACT-2 takes the command bus for a cycle; its bank's row is then open to column commands."""
        self.act2_bank = -1
        self.row_bus_free = self.col_bus_free = now + 1

    def _col_cmd(self, req: _Request) -> int:
        return WR if req.is_write else RD

    def _active_column(self, now: int, completions: list[int]) -> bool:
        for req in self.active:
            if req.bank == self.act2_bank:
                continue  # its row opens with ACT-2, still to come
            cmd = self._col_cmd(req)
            t = self.earliest(cmd, req.nodes)
            if t <= now:
                self.active.remove(req)
                self._column(req, cmd, now, completions)
                return True
            if t < self.wake:
                self.wake = t
        return False

    def _queued(self, now: int, completions: list[int], slot: int) -> bool:
        """The oldest ready request of the current queue whose next command fits `slot`; a request that would
        close a row an older queued request hits, or one opened for an active request, waits (Ramulator 2.1's
        FR-FCFS with row-hit protection)."""
        self._set_write_mode()
        queue = self.writes if self.write_mode else self.reads
        if not queue:
            return False
        open_row = self.open_row
        # built when a row conflict first needs them (most picks are row hits): nothing changes them during the scan
        first_hit: dict[int, int] | None = None  # bank -> arrival of the oldest queued request that hits its open row
        active_banks: set[int] | None = None
        for req in queue:
            bank = req.bank
            row = open_row[bank]
            if row == req.row:
                if slot == ROW:
                    continue
                cmd = self._col_cmd(req)
            elif row == -1:
                if slot == COLUMN or self.act2_bank >= 0:
                    continue  # (no ACT-1 while another bank's ACT-2 is still to come)
                cmd = ACT
            else:
                # no closing a row an older queued request hits, or one opened for an active request
                if slot == COLUMN:
                    continue
                if active_banks is None:
                    active_banks = {r.bank for r in self.active}
                if bank in active_banks:
                    continue
                if first_hit is None:
                    first_hit = {}
                    for r in queue:
                        if open_row[r.bank] == r.row and r.bank not in first_hit:
                            first_hit[r.bank] = r.arrive
                if first_hit.get(bank, INF) <= req.arrive:
                    continue
                cmd = PRE
            t = self.earliest(cmd, req.nodes)
            if t > now:
                if t < self.wake:
                    self.wake = t
                continue
            if cmd == RD or cmd == WR:
                queue.remove(req)
                self._column(req, cmd, now, completions)
            elif cmd == ACT:
                self.issue(ACT, req.nodes, now)
                open_row[bank] = req.row
                self.stats_acts += 1
                if self.act2_window:
                    self.act2_bank = bank
                    self.act2_deadline = now + self.act2_window
                queue.remove(req)
                self.active.append(req)
            else:
                self.issue(PRE, req.nodes, now)
                self._closed(bank)
                self.stats_conflicts += 1
            return True
        return False

    def _column(self, req: _Request, cmd: int, now: int, completions: list[int]) -> None:
        self.issue(cmd, req.nodes, now)
        completions.append(-1 if req.is_write else now + self.read_latency - req.arrive)
        policy = self.page_policy
        if policy == "closed" and not any(
                r.bank == req.bank and r.row == req.row for r in (*self.reads, *self.writes, *self.active)):
            self.to_close.append(req.bank)
        elif policy == "capped":
            bank = req.bank
            if self.col_accesses[bank] >= self.page_cap:  # this access auto-precharges the row
                self.issue(PRE, req.nodes, max(now, self.earliest(PRE, req.nodes)), bus=False)
                self._closed(bank)
            else:
                self.col_accesses[bank] += 1
                if self.col_accesses[bank] >= self.page_cap and bank not in self.to_close:
                    self.to_close.append(bank)

    def _closed(self, bank: int) -> None:
        self.open_row[bank] = -1
        self.col_accesses[bank] = 0
        if bank in self.to_close:
            self.to_close.remove(bank)

    def _refresh_due(self, now: int) -> None:
        if now >= self.next_refresh:
            # every refresh node at once, as Ramulator 2.1's all-bank refresh does
            self.refresh_queue.extend(range(self.refresh_nodes))
            self.next_refresh += self.refresh_interval
        elif self.next_refresh < self.wake:
            self.wake = self.next_refresh
        self.refresh_pending = bool(self.refresh_queue)

    def _close_ready(self, now: int) -> bool:
        """Whether _refresh_command issues a page-policy precharge at `now` (it changes nothing)."""
        if not self.to_close:
            return False
        capped = self.page_policy == "capped"
        for bank in self.to_close:
            row = self.open_row[bank]
            if row == -1 or (not capped and any(r.bank == bank and r.row == row
                                                for r in (*self.reads, *self.writes, *self.active))):
                return False  # _refresh_command drops it and issues nothing this cycle
            if capped and any(r.bank == bank for r in self.active):
                continue
            if self.earliest(PRE, self.bank_nodes(bank)) <= now:
                return True
        return False

    def _refresh_command(self, now: int) -> bool:
        """The first pending refresh: close its banks (PREA, or PRE for one bank), then REFA / REFB; a bank with
        an active request is not closed under it. Closed-page precharges go here too (row commands)."""
        if self.refresh_queue:
            node = self.refresh_queue[0]
            per_bank = self.per_bank_refresh
            banks = ([self.refresh_bank[node] + node * self.banks_per_refresh_node] if per_bank
                     else list(self._banks_of(node)))
            nodes = self.bank_nodes(banks[0])
            open_banks = [b for b in banks if self.open_row[b] != -1]
            if open_banks:
                if any(req.bank in open_banks for req in self.active):
                    return False
                cmd = PRE if per_bank else PREA
                t = self.earliest(cmd, nodes)
                for b in open_banks:
                    t = max(t, self.earliest(PRE, self.bank_nodes(b)))
                if t > now:
                    self.wake = min(self.wake, t)
                    return False
                self.issue(cmd, nodes, now)
                for b in open_banks:
                    self._closed(b)
                return True
            cmd = REFB if per_bank else REFA
            t = self.earliest(cmd, nodes)
            if t > now:
                self.wake = min(self.wake, t)
                return False
            self.issue(cmd, nodes, now)
            self.stats_refreshes += 1
            self.refresh_queue.pop(0)
            self.refresh_pending = bool(self.refresh_queue)
            if per_bank:
                self.refresh_bank[node] = (self.refresh_bank[node] + 1) % self.banks_per_refresh_node
            return True
        capped = self.page_policy == "capped"
        for i, bank in enumerate(self.to_close):
            row = self.open_row[bank]
            if row == -1 or (not capped and any(r.bank == bank and r.row == row
                                                for r in (*self.reads, *self.writes, *self.active))):
                self.to_close.pop(i)  # closed already, or a new request hits it: keep it open
                return False
            if capped and any(r.bank == bank for r in self.active):
                continue  # a request the row was opened for still waits for its column command
            nodes = self.bank_nodes(bank)
            t = self.earliest(PRE, nodes)
            if t <= now:
                self.issue(PRE, nodes, now)
                self._closed(bank)
                return True
            self.wake = min(self.wake, t)
        return False


def simulate(std: Standard, requests: Iterable[tuple], *, channels: int = 1, offers_per_cycle: int = 1,
             interval: int = 1, controller: ControllerConfig = ControllerConfig(), warmup: int = 0,
             window: tuple[int, int] | None = None) -> DramResult:
    """Run `requests` (chipsim.dramsim.streams: (is_write, channel, address below the channel, row, column))
    through `channels` controllers. The front end offers up to `offers_per_cycle` requests every `interval`
    cycles, in order, and stops at the first that finds its queue full; the run ends when the last request is
    accepted (Ramulator 2.1's trace front ends end there too). The first `warmup` completed requests are left out
    of the statistics; or, with `window` = (first, end) cycles, only the commands issued in it count and the run
    stops at its end (a window of whole refresh intervals measures refresh without sampling error)."""
    chans = [_Channel(std, controller) for _ in range(channels)]
    pending = _pending_requests(std, chans, requests)
    total = len(pending)
    sent = 0
    now = 0
    next_offer = 0
    completions: list[int] = []
    latencies: list[int] = []
    reads = writes = 0
    done = 0
    start_cycle = 0
    base = [0, 0, 0]
    limit = _cycle_limit(std, total)
    w_from, w_end = window if window is not None else (0, INF)
    opened = w_from <= 0
    if window is not None:
        warmup = 0
    while sent < total and now < w_end:
        if now > limit:
            raise RuntimeError(f"DRAM model {std.name}: {sent} of {total} requests in after {now} cycles")
        if now >= next_offer:
            for _ in range(offers_per_cycle):
                chan, req = pending[sent]
                if not chan.can_accept(req):
                    break
                chan.enqueue(req, now)
                sent += 1
                if sent == total:
                    break
            next_offer = now + interval
        wake = INF
        for ch in chans:
            w = ch.tick(now, completions)
            if w < wake:
                wake = w
        if completions and not opened:
            completions.clear()  # before the window
        if completions:
            for lat in completions:
                done += 1
                if done == warmup:
                    start_cycle = now + 1
                    base = _row_totals(chans)
                elif done > warmup:
                    if lat < 0:
                        writes += 1
                    else:
                        reads += 1
                        latencies.append(lat)
            completions.clear()
        # next cycle: where a command may issue or the front end may offer again (a full queue frees only when
        # a command issues, which wakes us)
        nxt = wake if wake < INF else now + 1
        if next_offer > now and next_offer < nxt:
            nxt = next_offer
        if not opened and nxt > w_from:
            nxt = max(now + 1, w_from)  # stop at the window's opening
        now = max(now + 1, nxt)
        if not opened and now >= w_from:
            opened = True
            start_cycle = now
            base = _row_totals(chans)
    if window is not None:
        if now < w_end:
            raise ValueError(f"DRAM model {std.name}: the requests ran out at cycle {now}, before the window's end "
                             f"{w_end}")
        now = w_end
    return _result(std, chans, max(1, now - start_cycle), reads, writes, latencies, base)


def _pending_requests(std: Standard, chans: list[_Channel],
                      requests: Iterable[tuple]) -> list[tuple[_Channel, _Request]]:
    """Each request with the channel it goes to, its address below the channel as node ids at every level."""
    counts = std.org.counts[1:]

    def nodes_of(addr: tuple) -> list[int]:  # the address below the channel -> node ids at every level, channel first
        out: list[int] = [0]
        flat = 0
        for lvl, idx in enumerate(addr):
            flat = flat * counts[lvl] + idx
            out.append(flat)
        return out

    return [(chans[ch], _Request(bool(w), nodes_of(addr), row)) for w, ch, addr, row, _col in requests]


def _cycle_limit(std: Standard, total: int) -> int:
    """No request can wait longer than every timing of the standard together, several times over: beyond this
    cycle the model is stuck (a bug), not slow."""
    return (total + 10) * 8 * (sum(v for k, v in std.params.items() if k not in ("rate_mtps", "tck_ps")) + 64)


def _row_totals(chans: list[_Channel]) -> list[int]:
    """Row misses, row conflicts and refreshes so far, over every channel."""
    return [sum(c.stats_acts - c.stats_conflicts for c in chans), sum(c.stats_conflicts for c in chans),
            sum(c.stats_refreshes for c in chans)]


def _result(std: Standard, chans: list[_Channel], cycles: int, reads: int, writes: int, latencies: list[int],
            base: list[int]) -> DramResult:
    """The measured run: `cycles` since the statistics started, row outcomes counted since `base`."""
    tck_ns = std.tck_ps * 1e-3
    served = reads + writes
    misses, conflicts, refreshes = (a - b for a, b in zip(_row_totals(chans), base))
    lat_ns = np.array(latencies, dtype=np.float64) * tck_ns if latencies else np.zeros(1)
    return DramResult(
        cycles=cycles, reads=reads, writes=writes,
        bandwidth_gbps=served * std.org.burst_bytes / (cycles * tck_ns),
        read_latency_avg_ns=float(lat_ns.mean()), read_latency_p99_ns=float(np.percentile(lat_ns, 99)),
        row_hits=max(0, served - misses - conflicts), row_misses=misses, row_conflicts=conflicts,
        refreshes=refreshes)
