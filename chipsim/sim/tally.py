"""What the current token moves and does, tallied as plain ints while it runs and added to its Ledger
(chipsim.sim.record) when it ends and once the last transfers have landed: the same sums as adding to the Ledger's
dicts as it goes, without a dict update per fetch or operation (compiled: each count is a native int field)."""

from __future__ import annotations

from typing import Final

from chipsim.sim.energy import ACTIONS, Ledger
from chipsim.sim.work import Work

# the arrays' actions by their place in ACTIONS (chipsim.sim.energy prices them)
_MAC: Final = ACTIONS.index("mac")
_SFU_OP: Final = ACTIONS.index("sfu_op")
_VECTOR_OP: Final = ACTIONS.index("vector_op")
_SRAM_READ_BIT: Final = ACTIONS.index("sram_read_bit")
_SRAM_WRITE_BIT: Final = ACTIONS.index("sram_write_bit")


class TokenTally:
    """The token's bytes per component, actions and busy times so far (`components`: the run's memories and links,
    in the Ledger's order; `fetch_components`: those every landed fetch byte crosses; `roles`: which component
    plays which part, chipsim.hw.machine.Roles)."""

    def __init__(self, components: tuple[str, ...], fetch_components: tuple[str, ...], roles) -> None:
        self.components = components
        # by component, as `components`, and last a sink for the bytes of a link the machine does not have (a SoC's
        # compute units or host CPU at the memory itself: roles.operand_link / host_link none), never charged
        self.bytes = [0] * (len(components) + 1)
        self.actions = [0] * len(ACTIONS)
        self.busy_ps = 0
        self.occupied_ps = 0
        self.host_busy_ps = 0
        # the counts every fetch and every arrays operation add to; add_to spreads them over the lists above
        self.fetched = 0  # bytes landed: each crosses every component of the fetch path
        self.operand_bytes = 0  # operands streamed from the operand memory over the operand link
        self.macs = self.sfu_ops = self.vector_ops = 0
        self.sram_read_bits = self.sram_write_bits = 0
        self.profiled_pj = self.unpriced_operand_bytes = 0  # compute.op_energy_pj's operations
        place = {name: i for i, name in enumerate(components)}
        place[""] = self._sink = len(components)
        self.at_operand_memory, self.at_operand_link = place[roles.operand_memory], place[roles.operand_link]
        self.at_host_memory, self.at_host_link = place[roles.host_memory], place[roles.host_link]
        self.fetch_places = [place[c] for c in fetch_components]

    def work(self, work: Work) -> None:
        """What arrays work moves and does (its time is added once it has run)."""
        self.operand_bytes += work.bytes  # read from the operand memory, across the operand link
        self.macs += work.macs
        self.sfu_ops += work.sfu_ops
        self.vector_ops += work.vector_ops
        # each operand lands in SRAM once and is read from it once (but those of operations with a measured energy)
        priced = work.bytes - work.unpriced_bytes
        self.sram_write_bits += 8 * priced
        self.sram_read_bits += 8 * (priced + work.sram_bytes - work.unpriced_sram_bytes)
        self.profiled_pj += work.profiled_pj
        self.unpriced_operand_bytes += work.unpriced_bytes

    def occupied(self, work: Work, busy: int) -> None:
        """The arrays' occupied time: the work's own, stretched as its time was (operand flows slowed by others)."""
        self.occupied_ps += work.occupied if busy == work.ps else busy * work.occupied // max(work.ps, 1)

    def add_to(self, ledger: Ledger) -> None:
        """Add what was tallied since the last call to `ledger` (the current token's), and start again."""
        tally, actions = self.bytes, self.actions
        for i in self.fetch_places:
            tally[i] += self.fetched
        tally[self.at_operand_memory] += self.operand_bytes
        tally[self.at_operand_link] += self.operand_bytes
        actions[_MAC] += self.macs
        actions[_SFU_OP] += self.sfu_ops
        actions[_VECTOR_OP] += self.vector_ops
        actions[_SRAM_READ_BIT] += self.sram_read_bits
        actions[_SRAM_WRITE_BIT] += self.sram_write_bits
        tally[self._sink] = 0
        self.fetched = self.operand_bytes = 0
        self.macs = self.sfu_ops = self.vector_ops = 0
        self.sram_read_bits = self.sram_write_bits = 0
        for counts, names, values in ((ledger.bytes, self.components, tally), (ledger.actions, ACTIONS, actions)):
            for i, n in enumerate(values):
                if n:
                    counts[names[i]] += n
                    values[i] = 0
        ledger.busy_ps += self.busy_ps
        ledger.occupied_ps += self.occupied_ps
        ledger.profiled_pj += self.profiled_pj
        ledger.unpriced_operand_bytes += self.unpriced_operand_bytes
        self.profiled_pj = self.unpriced_operand_bytes = 0
        ledger.host_busy_ps += self.host_busy_ps
        self.busy_ps = self.occupied_ps = self.host_busy_ps = 0
