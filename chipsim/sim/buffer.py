"""The expert buffer: which experts hold a slot (arrived or on their way), found by index and kept in issue order.

An expert is at index layer * experts + expert of `slot_of` (None: not in the buffer): a list read by a plain int,
no int object made, no hash. The same entries are linked in the order they were issued, the order policies see them
in, over the whole buffer and within each MoE layer (a layer's entries without walking the buffer). An entry evicted
while its bytes are still moving is a "zombie": no longer in the buffer, its slot taken until they stop or land.
"""

from __future__ import annotations

from typing import Any, Collection


class Entry:
    """One expert's slot in the buffer and the DMA transfer that fills it."""

    __slots__ = ("key", "index", "transfers", "parts_left", "evicted", "resident", "prefetched", "used",
                 "waited", "last_use", "prev", "next", "layer_prev", "layer_next")

    def __init__(self, key: tuple[int, int], index: int, prefetched: bool) -> None:
        self.key = key  # (MoE layer, expert), as policies name it
        self.index = index  # layer * experts + expert
        self.transfers: list[Any] = []  # chipsim.sim.dma.Transfer (or chipsim.sim.native's)
        self.parts_left = 0
        self.evicted = False
        self.resident = False
        self.prefetched = prefetched
        self.used = False
        self.waited = False  # computed since it was fetched: its first use synchronised with the DMA
        self.last_use = -1
        # neighbours in issue order, in the whole buffer and within its layer (None at the ends; cleared when evicted)
        self.prev: Entry | None = None
        self.next: Entry | None = None
        self.layer_prev: Entry | None = None
        self.layer_next: Entry | None = None


class ExpertBuffer:
    """`slots` expert slots over `layers` MoE layers of `experts` experts each (module docstring)."""

    def __init__(self, layers: int, experts: int, slots: int) -> None:
        self.layers = layers
        self.experts = experts
        self.slots = slots
        self.slot_of: list[Entry | None] = [None] * (layers * experts)
        self.held = 0  # entries in the buffer
        self.zombies = 0  # evicted while in flight: the slot frees when the bytes land or stop
        self.first: Entry | None = None
        self.last: Entry | None = None
        self.layer_first: list[Entry | None] = [None] * layers
        self.layer_last: list[Entry | None] = [None] * layers

    def free_slots(self) -> int:
        """Slots neither held nor still draining an evicted transfer."""
        return self.slots - self.held - self.zombies

    def of_layer(self, layer: int) -> list[Entry]:
        """A MoE layer's entries in issue order (a copy: the caller may evict them as it goes)."""
        entries: list[Entry] = []
        if not 0 <= layer < self.layers:
            return entries
        entry = self.layer_first[layer]
        while entry is not None:
            entries.append(entry)
            entry = entry.layer_next
        return entries

    def in_buffer(self) -> list[Entry]:
        """Every entry in issue order."""
        entries: list[Entry] = []
        entry = self.first
        while entry is not None:
            entries.append(entry)
            entry = entry.next
        return entries

    def least_recently_used(self, count: int, protected: list[tuple[int, Collection[int]]]) -> list[tuple[int, int]]:
        """The `count` arrived experts used longest ago, in (last use, layer, expert) order, none of `protected`'s
        (MoE layer, expert ids) pairs."""
        experts = self.experts
        # every arrived expert as one int, last_use * cells + index: sorted as plain ints in (last use, layer,
        # expert) order; the protected are skipped as they come up, so only the first few are checked
        cells = len(self.slot_of)
        ranked: list[int] = []
        entry = self.first
        while entry is not None:
            if entry.resident:
                ranked.append(entry.last_use * cells + entry.index)
            entry = entry.next
        ranked.sort()
        victims: list[tuple[int, int]] = []
        for rank in ranked:
            index = rank % cells
            layer, expert = index // experts, index % experts
            for protected_layer, protected_experts in protected:
                if layer == protected_layer and expert in protected_experts:
                    break
            else:
                victims.append((layer, expert))
                if len(victims) == count:
                    break
        return victims

    def link(self, entry: Entry) -> None:
        """Into the buffer: found by its index, last in issue order."""
        self.slot_of[entry.index] = entry
        self.held += 1
        last = self.last
        entry.prev = last
        if last is None:
            self.first = entry
        else:
            last.next = entry
        self.last = entry
        layer = entry.key[0]
        last = self.layer_last[layer]
        entry.layer_prev = last
        if last is None:
            self.layer_first[layer] = entry
        else:
            last.layer_next = entry
        self.layer_last[layer] = entry

    def unlink(self, entry: Entry) -> None:
        """Out of the buffer; its links cleared (no reference cycle is left for the garbage collector)."""
        self.slot_of[entry.index] = None
        self.held -= 1
        prev, nxt = entry.prev, entry.next
        if prev is None:
            self.first = nxt
        else:
            prev.next = nxt
        if nxt is None:
            self.last = prev
        else:
            nxt.prev = prev
        layer = entry.key[0]
        prev, nxt = entry.layer_prev, entry.layer_next
        if prev is None:
            self.layer_first[layer] = nxt
        else:
            prev.layer_next = nxt
        if nxt is None:
            self.layer_last[layer] = prev
        else:
            nxt.layer_prev = prev
        entry.prev = entry.next = entry.layer_prev = entry.layer_next = None
