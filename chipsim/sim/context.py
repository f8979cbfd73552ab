"""The policy boundary: the object a policy's hooks receive as `ctx`, exposing exactly
chipsim.policies.base.SimContext over the engine (chipsim.sim.engine.Simulation), never the engine itself.

Every id a policy hands over is taken exactly when it is an integer of any type (an int at once, a NumPy integer
through operator.index) and refused otherwise, in one line naming the policy, the call and the value (PolicyError);
routing is read only once the run has routed it (chipsim.policies.base says what each hook knows). Plain ints in
range take one type check per id. The checks of what a policy hands back (its LayerPlan, choose_victims's keys) are
here too, so that the boundary is one file.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any, Collection

import numpy as np

from chipsim.hw.config import HardwareConfig
from chipsim.policies.base import ROUTING_ARRAYS, LayerPlan, PolicyError
from chipsim.trace.format import CORE_ARRAYS, TokenRows, Trace
from chipsim.units import ns_to_ps, transfer_ps
from chipsim.workload.decode import DecodeWorkload, ExpertFormat
from chipsim.workload.host import HostTiming

if TYPE_CHECKING:  # the engine creates its context: a type for the compiler, not an import at run time
    from chipsim.sim.engine import Simulation


def _exact_int(value: Any) -> int | None:
    """`value` as the int it is, when it is an integer of any type (int, a NumPy integer: operator.index); None for
    anything else, a bool included (True is not expert 1)."""
    if type(value) is int:
        return value
    if isinstance(value, (bool, np.bool_)):
        return None
    try:
        return operator.index(value)
    except Exception:  # noqa: BLE001 - a policy's odd object: whatever its __index__ raises, it is no integer
        return None


def _plain_pair(pair: Any) -> bool:
    """A (MoE layer, expert ids) pair of plain ints, the ids in a set, list or tuple: nothing to check further."""
    if type(pair) is not tuple or len(pair) != 2 or type(pair[0]) is not int:
        return False
    experts = pair[1]
    if not isinstance(experts, (set, frozenset, list, tuple)):
        return False
    for e in experts:
        if type(e) is not int:
            return False
    return True


class PolicyContext:
    """SimContext over one Simulation: the run's set-up, the trace as far as it is known, the expert buffer."""

    def __init__(self, sim: Simulation, trace: Trace, routed: TokenRows, sees_future: bool) -> None:
        self._sim = sim
        self._label = str(sim.policy.label)
        self._hw = sim.hw
        self._workload = sim.workload
        self._expert_format = sim.expert_format
        self._host_timing = sim.host_timing
        self._tokens = sim.num_tokens
        self._layers = sim.num_moe_layers
        self._experts = sim.num_experts
        self._top_k = sim.top_k
        self._slots = sim.slots
        self._in_place = bool(sim.roles.in_place)
        self._trace = trace
        self._slot_of = sim._slot_of  # the buffer's entries by index (the engine's own list)
        self._routed = routed  # the run's routing per token, as nested lists
        self._sees_future = sees_future
        # the trace arrays this policy may read: the core schema and what it declares
        self._readable = set(CORE_ARRAYS) | {spec.name for spec in sim.policy.trace_arrays}
        self._rows: dict[str, TokenRows] = {}  # trace_row's arrays, per token as nested lists
        self._first_token = 0  # the first token this policy's steps run (a request's decode policy: the engine sets)
        self._batch = sim.batch.batch if sim.batch is not None else 1

    # ---- the run's set-up (constant for the whole run)
    @property
    def hw(self) -> HardwareConfig:
        return self._hw

    @property
    def workload(self) -> DecodeWorkload:
        return self._workload

    @property
    def expert_format(self) -> ExpertFormat:
        return self._expert_format


    @property
    def host_timing(self) -> HostTiming:
        return self._host_timing

    @property
    def num_tokens(self) -> int:
        return self._tokens

    @property
    def num_moe_layers(self) -> int:
        return self._layers

    @property
    def num_experts(self) -> int:
        return self._experts

    @property
    def top_k(self) -> int:
        return self._top_k

    @property
    def slots(self) -> int:
        return self._slots

    @property
    def batch(self) -> int:
        return self._batch

    @property
    def first_token(self) -> int:
        return self._first_token

    @property
    def step_tokens(self) -> Any:
        sim = self._sim
        if sim._known is not None:  # a served step: its parts' tokens, each part's in order
            steps: Any = sim._step_tokens
            return steps
        first = sim._step_first
        last = sim._current_token
        return range(last if first > last else first, last + 1)

    @property
    def row_keep(self) -> int:
        keep: int = self._sim.row_keep()
        return keep

    @property
    def step_clock(self) -> int:
        clock: int = self._sim._use_clock
        return clock

    @property
    def read_tokens(self) -> Any:
        served: Any = self._sim.served
        return served.read if served is not None else None

    @property
    def served(self) -> bool:
        return self._sim._known is not None

    @property
    def in_place(self) -> bool:
        return self._in_place

    # ---- the trace
    def trace_routed(self, t: Any, layer: Any) -> list[int]:
        """The router's experts at token t, MoE layer `layer`, once the run has routed it (any time: the oracle)."""
        cell = self._routing_cell("trace_routed", None, t, layer, True)
        n = self._layers
        return list(self._routed[cell // n][cell % n])

    def trace_row(self, key: Any, t: Any, layer: Any) -> Any:
        """Row [t, layer] of a (T, L, ...) trace array this policy may read, as a list (a number for a (T, L)
        array); a routing array's once the run has routed (t, layer)."""
        rows = self._rows.get(key) if type(key) is str else None
        if rows is None:
            rows = self._token_rows(key)
        cell = self._routing_cell("trace_row", key, t, layer, key in ROUTING_ARRAYS)
        n = self._layers
        row = rows[cell // n][cell % n]
        return list(row) if type(row) is list else row

    @property
    def trace_meta(self) -> dict:
        return self._trace.meta

    def trace_array(self, key: Any) -> np.ndarray:
        """A core trace array or one the policy declares in `trace_arrays`, whole; a routing array only for a policy
        that sees future routing (the others read it per token and layer, with trace_routed and trace_row)."""
        self._check_readable("trace_array", key)
        if key in ROUTING_ARRAYS and not self._sees_future:
            raise self._refuse(f"trace_array({key!r})", f"'{key}' carries routing, which is known only as the run "
                               "routes each token and layer: read it with trace_routed(t, layer) or "
                               f"trace_row('{key}', t, layer) (only a policy that sees_future_routing, the oracle, "
                               "reads it whole)")
        return self._trace[key]

    # ---- the expert buffer
    def present(self, layer: Any, expert: Any) -> bool:
        """In the buffer: arrived or on its way."""
        index = self._index("present", layer, expert)
        return index >= 0 and self._slot_of[index] is not None

    def resident(self, layer: Any, expert: Any) -> bool:
        index = self._index("resident", layer, expert)
        if index < 0:
            return False
        entry = self._slot_of[index]
        return entry is not None and entry.resident

    def resident_keys(self) -> list[tuple[int, int]]:
        return [entry.key for entry in self._sim.buffer.in_buffer() if entry.resident]

    def keys_of_layer(self, layer: Any) -> list[tuple[int, int]]:
        return [entry.key for entry in self._sim.buffer.of_layer(self._layer_id("keys_of_layer", layer))]

    def last_use(self, key: Any) -> int:
        if type(key) is tuple and len(key) == 2:
            layer, expert = key
            if type(layer) is not int or type(expert) is not int:
                layer = self._as_id(layer, "MoE layer", f"last_use({key!r})")
                expert = self._as_id(expert, "expert id", f"last_use({key!r})")
            index = self._index("last_use", layer, expert)
            entry = self._slot_of[index] if index >= 0 else None
            if entry is not None:
                return entry.last_use
        raise self._refuse(f"last_use({key!r})", f"{key!r} is not a (MoE layer, expert) key in the buffer")

    def least_recently_used(self, count: int, protect: Any) -> list[tuple[int, int]]:
        """The `count` arrived experts used longest ago ((last use, key) order), none of `protect`'s."""
        if count <= 0:
            return []
        return self._sim.buffer.least_recently_used(count, self._protected(count, protect))

    def free_slots(self) -> int:
        return self._sim.buffer.free_slots()

    # ---- estimates
    @property
    def fetch_bytes_per_s(self) -> int:
        """The rate an expert fetch moves at alone: the fetch path's bottleneck, or the pageable copy rate below it
        where host_frontend.expert_memory is pageable."""
        rate: int = self._sim._fetch_bytes_per_s
        return rate

    @property
    def fetch_setup_ps(self) -> int:
        """The fixed cost of each part (descriptor) of a fetch: dma.setup_ns, or host_frontend.pageable_setup_ns."""
        return ns_to_ps(self._sim._copy_setup_ns)

    def fetch_estimate_ps(self) -> int:
        """When an expert fetched now would land if it queued behind every byte already on the link."""
        sim = self._sim
        return sim._fetch_fixed_ps + transfer_ps(sim.dma.queued_bytes() + sim._fetch_bytes, sim._fetch_bytes_per_s)

    def host_estimate_ps(self) -> int:
        """When an expert handed to the host CPU now would be done, counting the host's queue."""
        host = self._sim.host
        queued = len(host.queue) + host.count
        return (queued + 1) * self._host_timing.total_ps

    # ---- actions
    def prefetch(self, layer: Any, expert: Any) -> bool:
        """Stage an expert ahead of need. False if the buffer has no free slot (nothing is evicted)."""
        index = self._index("prefetch", layer, expert)
        if index < 0:
            raise self._outside_model("prefetch", layer, expert)
        return self._sim._prefetch_at(index)

    def evict(self, layer: Any, expert: Any, stop_transfer: bool = True) -> None:
        """Free an expert's slot. One still on its way stops at its next chunk boundary, or, with
        stop_transfer=False, moves all its bytes first, as a demand fetch (its slot frees when they land)."""
        index = self._index("evict", layer, expert)
        if index >= 0:
            self._sim._evict_at(index, stop_transfer)

    def cancel_unneeded(self, layer: Any, needed: Any) -> list[int]:
        """Drop this layer's experts that are still on their way and not in `needed`; the experts dropped."""
        layer_id = self._layer_id("cancel_unneeded", layer)
        keep = self._expert_ids("cancel_unneeded", layer_id, "needed", needed)
        dropped: list[int] = []
        sim = self._sim
        for entry in sim.buffer.of_layer(layer_id):
            if entry.key[1] not in keep and not entry.resident:
                dropped.append(entry.key[1])
                sim._evict_at(entry.index, True)
        return dropped

    def evict_layer(self, layer: Any, stop_transfers: bool = True) -> None:
        layer_id = self._layer_id("evict_layer", layer)
        sim = self._sim
        for entry in sim.buffer.of_layer(layer_id):
            sim._evict_at(entry.index, stop_transfers)

    # ---- the boundary's checks (their slow paths run only for an id that is not a plain int, or is refused)
    def _refuse(self, call: str, problem: str) -> PolicyError:
        return PolicyError(f"policy {self._label}: {call}: {problem}")

    def _as_id(self, value: Any, what: str, call: str) -> int:
        """`value` as the exact int it is; refused, naming `what` ("expert id", "MoE layer", "token") and `call`,
        when it is not an integer (a bool included: True is not expert 1)."""
        number = _exact_int(value)
        if number is None:
            kind = "a bool, not an integer id" if isinstance(value, (bool, np.bool_)) else "not an integer"
            raise self._refuse(call, f"{what} {value!r} is {kind}")
        return number

    def _index(self, call: str, layer: Any, expert: Any) -> int:
        """layer * experts + expert, the buffer index of a key a policy names in `call`; -1 for integers outside the
        model (no such expert: never another layer's); refused when either is not an integer."""
        if type(layer) is int and type(expert) is int:
            layer_id: int = layer  # typed: compiled code compares and adds them natively
            expert_id: int = expert
        else:
            text = f"{call}({layer!r}, {expert!r})"
            layer_id = self._as_id(layer, "MoE layer", text)
            expert_id = self._as_id(expert, "expert id", text)
        if 0 <= layer_id < self._layers and 0 <= expert_id < self._experts:
            return layer_id * self._experts + expert_id
        return -1

    def _outside_model(self, call: str, layer: Any, expert: Any) -> PolicyError:
        """The refusal of an action on a key whose integers name no expert of the model."""
        text = f"{call}({layer!r}, {expert!r})"
        number = _exact_int(expert)
        if number is None or not 0 <= number < self._experts:
            return self._refuse(text, f"expert id {number} is out of range: the model has experts "
                                      f"0..{self._experts - 1}")
        return self._refuse(text, f"MoE layer {_exact_int(layer)} is out of range: the model has MoE layers "
                                  f"0..{self._layers - 1}")

    def _layer_id(self, call: str, layer: Any) -> int:
        """A MoE layer a policy names in `call` as an exact int (one outside the model has no experts)."""
        return layer if type(layer) is int else self._as_id(layer, "MoE layer", f"{call}({layer!r})")

    def _expert_ids(self, call: str, first: int, what: str, experts: Any) -> set[int]:
        """A collection of expert ids a policy hands over in `call`(`first`, ...) (`what`: "needed", "protect"), as a
        set of exact ints."""
        try:
            ids = set(experts)
        except TypeError:
            raise self._refuse(f"{call}({first}, ...)", f"{what} {experts!r} is not a collection of expert ids") from None
        for e in ids:
            if type(e) is not int:
                return {self._as_id(x, f"{what} expert id", f"{call}({first}, ...)") for x in ids}
        return ids

    def _protected(self, count: int, protect: Any) -> list[tuple[int, Collection[int]]]:
        """least_recently_used's `protect`, (MoE layer, expert ids) pairs whose ids are exact ints: as given when they
        are plain ints in a list (nothing copied), else a checked copy."""
        if type(protect) is list and all(_plain_pair(pair) for pair in protect):
            return protect
        call = f"least_recently_used({count}, ...)"
        if not isinstance(protect, (list, tuple)):
            raise self._refuse(call, f"protect {protect!r} is not a list of (MoE layer, expert ids) pairs")
        out: list[tuple[int, Collection[int]]] = []
        for pair in protect:
            if type(pair) is not tuple or len(pair) != 2:
                raise self._refuse(call, f"protect holds {pair!r}, not a (MoE layer, expert ids) pair")
            layer, experts = pair
            if type(layer) is not int:
                layer = self._as_id(layer, "protect's MoE layer", call)
            out.append((layer, self._expert_ids("least_recently_used", count, "protect", experts)))
        return out

    def _check_readable(self, call: str, key: Any) -> None:
        if type(key) is not str or key not in self._readable:
            raise self._refuse(f"{call}({key!r})", f"trace array {key!r} is not a core array and not declared in "
                                                   "the policy's trace_arrays")

    def _token_rows(self, key: Any) -> TokenRows:
        """A (T, L, ...) trace array the policy may read, per token as nested lists (made once, on first use)."""
        self._check_readable("trace_row", key)
        array = self._trace[key]
        if array.ndim < 2 or array.shape[1] != self._layers or array.shape[0] < self._tokens:
            raise self._refuse(f"trace_row({key!r}, ...)", f"'{key}' is not a (token, MoE layer, ...) array")
        rows = self._routed if key == "routed_ids" else TokenRows(array[:self._tokens], keep=self.row_keep)
        self._rows[key] = rows
        return rows

    def _routing_cell(self, call: str, key: Any, t: Any, layer: Any, routing: bool) -> int:
        """t * MoE layers + layer of a position a policy reads the trace at in `call` (of array `key`; None:
        trace_routed's): both exact ints of the run, and, when the array carries routing, routed already (unless the
        policy sees future routing); refused otherwise."""
        if type(t) is int and type(layer) is int:
            token: int = t  # typed: compiled code compares them natively
            layer_id: int = layer
        else:
            first = "" if key is None else f"{key!r}, "
            text = f"{call}({first}{t!r}, {layer!r})"
            token = self._as_id(t, "token", text)
            layer_id = self._as_id(layer, "MoE layer", text)
        if not (0 <= token < self._tokens and 0 <= layer_id < self._layers):
            first = "" if key is None else f"{key!r}, "  # (the message's: made only for a refusal)
            raise self._refuse(f"{call}({first}{token}, {layer_id})", f"outside the run: it has tokens "
                               f"0..{self._tokens - 1} and MoE layers 0..{self._layers - 1}")
        cell = token * self._layers + layer_id
        upto_cell = self._sim._routed_upto
        routed_in_window = self._sim._known
        if routed_in_window is not None:  # a served run: what each trace token's current request has routed
            if routing and not self._sees_future and layer_id > routed_in_window[token]:
                raise self._refuse(f"{call}({'' if key is None else repr(key) + ', '}{token}, {layer_id})",
                                   f"token {token}, MoE layer {layer_id} has not routed yet in the request that reads "
                                   "this trace window now; only a policy that sees_future_routing (the oracle) "
                                   "reads routing ahead")
            return cell
        # a prefill chunk routes all its tokens layer by layer: a later layer of any of them is not routed yet
        if routing and not self._sees_future and (
                cell > upto_cell or (token >= self._sim._step_first and layer_id > upto_cell % self._layers)):
            upto = self._sim._routed_upto
            first = "" if key is None else f"{key!r}, "
            known = (f"the run has routed up to token {upto // self._layers}, MoE layer "
                     f"{upto % self._layers}" if upto >= 0 else "the run has routed nothing yet")
            raise self._refuse(f"{call}({first}{token}, {layer_id})", f"token {token}, MoE layer {layer_id} has not "
                               f"routed yet ({known}); only a policy that sees_future_routing (the oracle) reads "
                               "routing ahead")
        return cell

    def _checked_plan(self, t: int, layer: int, plan: Any) -> LayerPlan:
        """The plan on_route returned, every expert of it an exact int of the model (a copy only where an id was
        another integer type); refused otherwise."""
        if not isinstance(plan, LayerPlan):
            raise self._refuse(f"on_route({t}, {layer})", f"returned {type(plan).__name__}, not a LayerPlan")
        given_execute, given_on_host, given_surrogate = plan.execute, plan.on_host, plan.surrogate
        execute = self._plan_experts(t, layer, "execute", given_execute)
        on_host = self._plan_experts(t, layer, "on_host", given_on_host) if given_on_host else given_on_host
        surrogate = self._plan_experts(t, layer, "surrogate", given_surrogate) if given_surrogate else given_surrogate
        if plan.tokens is not None:
            self._check_token_counts(t, layer, plan.tokens)
        if execute is given_execute and on_host is given_on_host and surrogate is given_surrogate:
            return plan
        return LayerPlan(execute, on_host, surrogate, plan.substituted, plan.dropped, plan.tokens)

    def _check_token_counts(self, t: int, layer: int, tokens: Any) -> None:
        """LayerPlan.tokens: expert ids of the model to counts of at least one token; refused otherwise."""
        call = f"on_route({t}, {layer}) -> LayerPlan.tokens"
        if not isinstance(tokens, dict):
            raise self._refuse(call, f"{tokens!r} is not a mapping of expert id -> tokens")
        for e, n in tokens.items():
            expert = self._as_id(e, "expert id", call)
            if not 0 <= expert < self._experts or type(n) is not int or n < 1:
                raise self._refuse(call, f"{e!r}: {n!r} is not an expert of the model with a count of at least 1")

    def _plan_experts(self, t: int, layer: int, field: str, experts: Any) -> Any:
        """A LayerPlan field's experts: the list itself when each is a plain int of the model, else a checked copy."""
        n = self._experts
        if type(experts) is list:
            for e in experts:
                if type(e) is not int:
                    break
                expert: int = e  # typed: compared natively
                if not 0 <= expert < n:
                    break
            else:
                return experts
        call = f"on_route({t}, {layer}) -> LayerPlan.{field}"
        if not isinstance(experts, (list, tuple)):
            raise self._refuse(call, f"{experts!r} is not a list of expert ids")
        checked: list[int] = []
        for e in experts:
            expert = self._as_id(e, "expert id", call)
            if not 0 <= expert < n:
                raise self._refuse(call, f"expert id {expert} is out of range: the model has experts 0..{n - 1}")
            checked.append(expert)
        return checked

    def _victim(self, victim: Any, layer: int, count: int) -> tuple[int, int]:
        """A key choose_victims returned, as exact ints of the model; refused otherwise."""
        n = self._experts
        if type(victim) is tuple and len(victim) == 2:
            a, b = victim
            if type(a) is int and type(b) is int:
                index = self._index("", a, b)  # plain ints: never refused, no message made
            else:
                index = self._index(f"choose_victims({layer}, ..., {count}) -> ", a, b)
            if index >= 0:
                return index // n, index % n
        call = f"choose_victims({layer}, ..., {count})"
        if type(victim) is not tuple or len(victim) != 2:
            raise self._refuse(call, f"returned {victim!r}, not a (MoE layer, expert) key")
        raise self._outside_model(call + " -> ", victim[0], victim[1])
