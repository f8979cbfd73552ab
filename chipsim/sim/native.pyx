# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The native event core in C (Cython; chipsim.sim.core): SimPy's event loop and events (simpy/core.py,
simpy/events.py, simpy/resources: Process, Condition, Request and Release step by step), the flow network of
chipsim.sim.flows and the DMA queue of chipsim.sim.dma, with C integers where those use Python's: times and rates in
64 bits, a flow's progress (1e-12 byte units: 4.7e18 for one 4.7 MB expert, past 64 bits for larger ones) in 128.
The queue is a C heap of (time, priority, sequence number) entries; a flow tick, the end of a DMA setup and a landing
are entries that call their owner directly, with no event object and no bound method.

Same events, created in the same order, at the same times, with the same priorities and sequence numbers as the
reference on SimPy: the results are identical to the picosecond (tests/test_fast_engine.py runs every policy through
both cores; tests/test_flows.py and tests/test_dma.py run every hand check on both networks and both DMA queues).
What differs is only how the work is done: the network memoises its rates by interned signatures and keeps its flows
in the allocation's order; the DMA queue does not settle again after a batch that changed nothing; an arrays
operation alone until it ends (no flow, nothing scheduled before its end, its operand rate within what its path
gives one flow) is one wake-up instead of the reference's fixed wait, operand flow, tick and trigger: nothing can
happen meanwhile, and alone it ends at exactly its own time. Division keeps Python's semantics (floor; Cython's
default, cdivision off).

Built by setup.py with Cython when it is there; without it `run.engine: fast` runs on SimPy (chipsim.sim.core).
"""

from cpython.ref cimport PyObject, Py_INCREF, Py_XDECREF
from libc.stdlib cimport malloc, realloc, free

from chipsim.sim.flows import WRITE, solve_rates

cdef extern from *:
    # gcc's and clang's 128-bit integer; Cython converts it to and from Python ints
    ctypedef long long i128 "__int128"

cdef enum:
    URGENT = 0  # simpy.events.URGENT: a process's start
    NORMAL = 1  # simpy.events.NORMAL: a timeout, a triggered event
    # what a queue entry wakes
    K_WAKE = 0  # a Wake: its callbacks
    K_FLOW_TICK = 1  # a FlowNetwork's tick (value: its generation)
    K_DMA_SETUP = 2  # a DmaPath's end of setup (value: that time)
    K_DMA_LANDING = 3  # a DmaPath's landing (value: that time)
    K_OPERATION = 4  # an Operation's next step (its fixed time over, or an operand stream done)

# chipsim.sim.dma's priorities and transfer states
cdef enum:
    DEMAND = 0
    PREFETCH = 1
    QUEUED = 0
    SETUP = 1
    ACTIVE = 2
    DRAINING = 3
    PAUSED = 4
    DONE = 5

cdef long long PS_PER_S = 1_000_000_000_000
cdef Py_ssize_t FID_BITS = 40  # a flow's order key: its signature's rank above its fid
cdef Py_ssize_t MEMO_MAX = 1 << 14
cdef object _PENDING = object()


def _check_constants():
    """The C values above restate chipsim's own constants: a change there must not leave them behind."""
    from chipsim.sim import dma, flows
    from chipsim.units import PS_PER_S as ps_per_s

    ours = (DEMAND, PREFETCH, QUEUED, SETUP, ACTIVE, DRAINING, PAUSED, DONE, PS_PER_S, MEMO_MAX)
    theirs = (dma.DEMAND, dma.PREFETCH, dma.QUEUED, dma.SETUP, dma.ACTIVE, dma.DRAINING, dma.PAUSED, dma.DONE,
              ps_per_s, flows._MEMO_MAX)
    if ours != theirs:
        raise ImportError(f"chipsim.sim.native's constants {ours} differ from chipsim's {theirs}: rebuild it")


_check_constants()


cdef inline i128 ceil_div(i128 a, i128 b):
    """-(-a // b) for b > 0, as Python computes it."""
    cdef i128 q = a // b
    if q * b != a:
        q += 1
    return q


# ============================================================================================== the event loop
cdef struct Entry:
    long long at
    long long eid
    int priority
    int kind
    PyObject* obj  # holds a reference
    long long value


cdef inline bint _before(Entry* a, Entry* b) noexcept:
    if a.at != b.at:
        return a.at < b.at
    if a.priority != b.priority:
        return a.priority < b.priority
    return a.eid < b.eid


cdef class Loop:
    """SimPy's Environment in C (simpy/core.py): its queue of (time, priority, sequence number, event), each popped
    entry's callbacks called (or its owner's tick), until none is left (`run()`) or until a time (`run(until)`)."""

    cdef public long long now
    cdef Entry* heap
    cdef Py_ssize_t size
    cdef Py_ssize_t capacity
    cdef long long eid

    def __cinit__(self):
        self.capacity = 256
        self.heap = <Entry*>malloc(self.capacity * sizeof(Entry))
        if self.heap == NULL:
            raise MemoryError()
        self.size = 0
        self.now = 0
        self.eid = 0

    def __dealloc__(self):
        cdef Py_ssize_t i
        if self.heap != NULL:
            for i in range(self.size):
                Py_XDECREF(self.heap[i].obj)
            free(self.heap)

    cdef int push(self, long long at, int priority, int kind, object obj, long long value) except -1:
        cdef Entry* grown
        cdef Py_ssize_t i, parent
        cdef Entry e
        if self.size == self.capacity:
            grown = <Entry*>realloc(self.heap, 2 * self.capacity * sizeof(Entry))
            if grown == NULL:
                raise MemoryError()
            self.heap = grown
            self.capacity *= 2
        Py_INCREF(obj)
        e.at = at
        e.eid = self.eid
        self.eid += 1
        e.priority = priority
        e.kind = kind
        e.obj = <PyObject*>obj
        e.value = value
        i = self.size
        self.size += 1
        while i > 0:
            parent = (i - 1) >> 1
            if _before(&e, &self.heap[parent]):
                self.heap[i] = self.heap[parent]
                i = parent
            else:
                break
        self.heap[i] = e
        return 0

    cdef Entry pop(self) noexcept:
        """The earliest entry (the caller owns its reference); the heap must not be empty."""
        cdef Entry top = self.heap[0]
        cdef Entry last
        cdef Py_ssize_t i, child, n
        self.size -= 1
        n = self.size
        if n:
            last = self.heap[n]
            i = 0
            while True:
                child = 2 * i + 1
                if child >= n:
                    break
                if child + 1 < n and _before(&self.heap[child + 1], &self.heap[child]):
                    child += 1
                if _before(&self.heap[child], &last):
                    self.heap[i] = self.heap[child]
                    i = child
                else:
                    break
            self.heap[i] = last
        return top

    cpdef long long next_time(self):
        """When the earliest pending entry is (-1: none)."""
        return self.heap[0].at if self.size else -1

    def run(self, until=None):
        """Process entries until none is left or, with `until`, every one before that time, then stand at
        `until` (SimPy's run(until))."""
        cdef long long end = -1 if until is None else until
        cdef Entry e
        cdef Wake wake
        cdef object obj
        while self.size and (end < 0 or self.heap[0].at < end):
            e = self.pop()
            self.now = e.at
            obj = <object>e.obj
            Py_XDECREF(e.obj)  # `obj` holds it now
            if e.kind == K_WAKE:
                wake = <Wake>obj
                callbacks = wake.callbacks
                wake.callbacks = None
                if callbacks is not None:
                    for callback in callbacks:
                        callback(wake)
            elif e.kind == K_FLOW_TICK:
                (<FlowNetwork>obj)._on_tick(e.value)
            elif e.kind == K_OPERATION:
                (<Operation>obj)._step()
            elif e.kind == K_DMA_SETUP:
                (<DmaPath>obj)._on_setup_tick(e.value)
            else:
                (<DmaPath>obj)._on_landing(e.value)
        if end >= 0:
            self.now = end

    def timeout(self, long long delay, value=None):
        return wake_in(self, delay, None, value)

    def event(self):
        return pending(self)

    def process(self, generator):
        return Process(self, generator)


cdef class Wake:
    """What `env.timeout(d)` or a triggered `env.event()` is to SimPy's `step()`: callbacks, ok, value."""

    cdef public object callbacks  # a list, None once processed
    cdef public bint _ok
    cdef public object _value
    cdef public Loop env

    @property
    def triggered(self):
        return self._value is not _PENDING

    @property
    def processed(self):
        return self.callbacks is None

    @property
    def value(self):
        return self._value

    @property
    def ok(self):
        return self._ok


cdef inline Wake _wake(Loop env, object callback, object value):
    cdef Wake wake = Wake.__new__(Wake)
    wake.env = env
    wake.callbacks = [] if callback is None else [callback]
    wake._ok = True
    wake._value = value
    return wake


cpdef Wake wake_in(Loop env, long long delay, object callback=None, object value=None):
    """`env.timeout(delay, value)` with `callback` appended."""
    cdef Wake wake = _wake(env, callback, value)
    env.push(env.now + delay, NORMAL, K_WAKE, wake, 0)
    return wake


cpdef Wake pending(Loop env):
    """`env.event()`: waits until `trigger` schedules it."""
    cdef Wake wake = _wake(env, None, None)
    wake._value = _PENDING
    return wake


cpdef trigger(Wake wake, object value=None):
    """`event.succeed(value)`: processed after everything already scheduled for now."""
    wake._value = value
    wake.env.push(wake.env.now, NORMAL, K_WAKE, wake, 0)


cdef class Process(Wake):
    """`env.process(generator)`: started by an urgent event now, resumed by each event it yields once that is
    processed, scheduled itself when the generator returns (its value the return value)."""

    cdef object _generator
    cdef object _resume_callback

    def __init__(self, Loop env, generator):
        self.env = env
        self.callbacks = []
        self._ok = True
        self._value = _PENDING
        self._generator = generator
        self._resume_callback = self._resume
        env.push(env.now, URGENT, K_WAKE, _wake(env, self._resume_callback, None), 0)

    def _resume(self, Wake event):
        generator = self._generator
        while True:
            try:
                event = generator.send(event._value)
            except StopIteration as stop:
                self._value = stop.value
                # let go of the bound method (a cycle through self) and the generator, so that a finished process
                # goes by reference counting, not by the cyclic garbage collector
                self._resume_callback = self._generator = None
                self.env.push(self.env.now, NORMAL, K_WAKE, self, 0)
                return
            if event.callbacks is not None:  # not yet processed: resume when it is
                event.callbacks.append(self._resume_callback)
                return


cdef class AllOf(Wake):
    """`env.all_of(events)`: triggered once every one of them has been processed."""

    cdef tuple _events
    cdef Py_ssize_t _count

    def __init__(self, Loop env, events):
        cdef Wake event
        self.env = env
        self.callbacks = []
        self._ok = True
        self._value = _PENDING
        self._events = tuple(events)
        self._count = 0
        if not self._events:
            trigger(self)
            return
        for event in self._events:
            if event.callbacks is None:
                self._check(event)
            else:
                event.callbacks.append(self._check)

    def _check(self, _event):
        if self._value is not _PENDING:
            return
        self._count += 1
        if self._count == len(self._events):
            trigger(self)


cdef class Resource:
    """`simpy.Resource(env, capacity)` (simpy/resources/resource.py): requests granted in order, up to `capacity`
    users."""

    cdef public Loop env
    cdef public Py_ssize_t capacity
    cdef public list users
    cdef public list queue

    def __init__(self, Loop env, Py_ssize_t capacity):
        self.env = env
        self.capacity = capacity
        self.users = []
        self.queue = []

    @property
    def count(self):
        return len(self.users)

    def request(self):
        return Request(self)

    def release(self, request):
        release = _wake(self.env, self._grant_head, None)
        try:
            self.users.remove(request)
        except ValueError:
            pass
        trigger(release)

    def _grant_head(self, _event=None):
        if self.queue and len(self.users) < self.capacity:
            head = self.queue.pop(0)
            self.users.append(head)
            trigger(head)


cdef class Request(Wake):
    """`resource.request()`, used as `with resource.request() as req: yield req`."""

    cdef public Resource resource

    def __init__(self, Resource resource):
        self.env = resource.env
        self.callbacks = []
        self._ok = True
        self._value = _PENDING
        self.resource = resource
        resource.queue.append(self)
        resource._grant_head()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_value, traceback):
        if self._value is _PENDING:
            self.resource.queue.remove(self)
        if exc_type is not GeneratorExit:
            self.resource.release(self)


# ============================================================================================== the flow network
cdef class Flow:
    """chipsim.sim.flows.Flow: N bytes over a path; `remaining` and `target` in units of 1e-12 byte."""

    cdef public long long fid
    cdef public tuple path
    cdef public long long level
    cdef public long long cap
    cdef i128 _remaining
    cdef i128 _target
    cdef public long long rate
    cdef public object on_target
    cdef public object tag
    cdef public tuple sig
    cdef public long long not_before
    cdef public long long sid
    cdef public long long rank
    cdef public long long finish
    cdef DmaPath _owner  # a DMA transfer's flow: its path is told directly (no on_target call)
    cdef Operation _op  # an arrays operation's operand stream: the operation is told directly

    @property
    def remaining(self):
        return self._remaining

    @remaining.setter
    def remaining(self, value):
        self._remaining = value

    @property
    def target(self):
        return self._target

    @property
    def remaining_bytes(self):
        return ceil_div(self._remaining, PS_PER_S)


cdef class _NetworkBatch:
    cdef FlowNetwork network

    def __enter__(self):
        self.network.begin()
        return self.network

    def __exit__(self, *exc):
        self.network.end()


cdef class FlowNetwork:
    """chipsim.sim.flows.FlowNetwork in C: the same rates (chipsim.sim.flows.solve_rates, memoised by the flows'
    interned signatures), the flows kept in the allocation's order, the same ticks."""

    cdef public Loop env
    cdef public list names
    cdef public dict index
    cdef public list capacity
    cdef public list turnaround_ppm
    cdef public list shared_capacity
    cdef public list flows
    cdef public long long last_update
    cdef public long long allocations
    cdef long long _next_fid
    cdef long long _generation
    cdef long long _tick_at
    cdef int _batch_depth
    cdef bint _dirty
    cdef _NetworkBatch _batch
    cdef dict _memo
    cdef dict _sig_ids
    cdef list _sigs
    cdef list _sig_rank
    cdef dict _sid_by_path  # id(path) -> {(level, cap): sid}: a signature's id without hashing its path
    cdef list _paths_seen  # each path _sid_by_path knows, held so that its id is not reused

    def __init__(self, Loop env, names, capacities, turnaround_ppm=None, shared_capacities=None):
        if len(names) != len(capacities) or any(int(c) <= 0 for c in capacities):
            raise ValueError("every resource needs a name and a positive capacity (bytes/s)")
        self.shared_capacity = [int(s) or int(c) for s, c in zip(shared_capacities or [0] * len(names), capacities)]
        self.env = env
        self.names = list(names)
        self.index = {name: i for i, name in enumerate(self.names)}
        self.capacity = [int(c) for c in capacities]
        self.turnaround_ppm = [int(t) for t in (turnaround_ppm or [0] * len(names))]
        self.flows = []
        self.last_update = env.now
        self._next_fid = 0
        self._generation = 0
        self._tick_at = -1
        self._batch_depth = 0
        self._dirty = False
        self._batch = _NetworkBatch.__new__(_NetworkBatch)
        self._batch.network = self
        self._memo = {}
        self.allocations = 0
        self._sig_ids = {}
        self._sigs = []
        self._sig_rank = []
        self._sid_by_path = {}
        self._paths_seen = []

    # ------------------------------------------------------------------------------------ public
    def path(self, *hops):
        return tuple((self.index[name], bool(write)) for name, write in hops)

    def add(self, nbytes, tuple path, level=0, cap=0, on_target=None, tag=None, not_before=0):
        if nbytes <= 0 or not path:
            raise ValueError("a flow moves at least one byte over at least one resource")
        return self._add(nbytes, path, level, cap, on_target, tag, not_before, None)

    def resume(self, Flow flow, target_units=0):
        self._resume(flow, target_units)

    def set_target(self, Flow flow, target_units):
        self._set_target(flow, target_units)

    def remove(self, Flow flow):
        self._advance()
        self.flows.remove(flow)
        flow.rate = 0
        self._changed()

    cpdef bint quiet_until(self, long long end):
        """No flow, and nothing in the event queue at or before `end`: an arrays operation is alone until it ends."""
        return not self.flows and not (self.env.size and self.env.heap[0].at <= end)

    def alone_rate(self, path):
        return min(self.capacity[r] for r, _ in path)

    def batch(self):
        return self._batch

    cpdef begin(self):
        self._batch_depth += 1

    cpdef end(self):
        self._batch_depth -= 1
        if not self._batch_depth and self._dirty:
            self._dirty = False
            self._advance()
            self._allocate()
            self._reschedule()

    def advance(self):
        self._advance()

    # ------------------------------------------------------------------------------------ internals
    cdef Flow _add(self, long long nbytes, tuple path, long long level, long long cap, object on_target, object tag,
                   long long not_before, DmaPath owner):
        self._advance()
        cdef Flow flow = Flow.__new__(Flow)
        flow.fid = self._next_fid
        flow.path = path
        flow.level = level
        flow.cap = cap
        flow._remaining = <i128>nbytes * PS_PER_S
        flow._target = 0
        flow.rate = 0
        flow.on_target = on_target
        flow.tag = tag
        flow.sig = None  # (path, level, cap), made only when its id is not found without it (_sid_of)
        flow.not_before = not_before
        flow.sid = -1
        flow.rank = 0
        flow.finish = -1
        flow._owner = owner
        self._next_fid += 1
        self._insert(flow)
        self._changed()
        return flow

    cdef int _resume(self, Flow flow, object target_units) except -1:
        self._advance()
        flow._target = max(target_units, 0)
        self._insert(flow)
        self._changed()
        return 0

    cdef int _set_target(self, Flow flow, object target_units) except -1:
        flow.finish = -1
        self._advance()
        flow._target = max(target_units, 0)
        self._changed()
        return 0

    cdef long long _intern(self, tuple sig) except -1:
        """A new signature's id; every signature's rank again (the flows present re-ordered by it)."""
        cdef Flow flow
        cdef long long sid = len(self._sigs)
        self._sig_ids[sig] = sid
        self._sigs.append(sig)
        sigs = self._sigs
        rank = [0] * len(sigs)
        for place, i in enumerate(sorted(range(len(sigs)), key=lambda i: sigs[i])):
            rank[i] = place
        self._sig_rank = rank
        for flow in self.flows:
            flow.rank = (<long long>rank[flow.sid] << FID_BITS) | flow.fid
        self.flows.sort(key=_rank)
        return sid

    cdef long long _sid_of(self, Flow flow) except -1:
        """Its signature's id: looked up by its path's identity and its (level, cap), else by the signature, else a
        new one."""
        cdef dict known
        key = id(flow.path)
        known = self._sid_by_path.get(key)
        if known is None:
            known = self._sid_by_path[key] = {}
            self._paths_seen.append(flow.path)
        # (level, cap) as one int where the level is small (a DMA priority, 0 for an operand stream)
        if 0 <= flow.level < 4 and 0 <= flow.cap < (<long long>1 << 60):
            pair = (flow.cap << 2) | flow.level
        else:
            pair = (flow.level, flow.cap)
        sid = known.get(pair)
        if sid is not None:
            return sid
        flow.sig = (flow.path, flow.level, flow.cap)
        sid = self._sig_ids.get(flow.sig)
        if sid is None:
            sid = self._intern(flow.sig)
        if len(known) < 4096:  # a path's (level, cap) pairs; beyond, a run of ever-new caps is looked up by signature
            known[pair] = sid
        return sid

    cdef int _insert(self, Flow flow) except -1:
        """Into the flows in the allocation's order (signature, then fid)."""
        cdef Flow other
        cdef long long key
        cdef Py_ssize_t i
        if flow.sid < 0:
            flow.sid = self._sid_of(flow)
            if flow.fid >= (<long long>1 << FID_BITS):
                raise OverflowError("more flows than the native core's order key counts")
        flow.finish = -1
        key = flow.rank = (<long long>self._sig_rank[flow.sid] << FID_BITS) | flow.fid
        flows = self.flows
        i = len(flows)
        while i > 0:
            other = <Flow>flows[i - 1]
            if other.rank > key:
                i -= 1
            else:
                break
        flows.insert(i, flow)
        return 0

    cdef inline void _advance(self) noexcept:
        cdef long long now = self.env.now
        cdef long long dt = now - self.last_update
        cdef Flow flow
        if dt > 0:
            for flow in self.flows:
                flow._remaining -= <i128>flow.rate * dt
            self.last_update = now

    cdef int _changed(self) except -1:
        if self._batch_depth:
            self._dirty = True
        else:
            self._advance()
            self._allocate()
            self._reschedule()
        return 0

    cdef int _allocate(self) except -1:
        cdef Flow flow
        cdef Py_ssize_t i, n
        cdef long long rate
        flows = self.flows
        n = len(flows)
        if not n:
            return 0
        key = tuple([(<Flow>f).sid for f in flows])
        rates = self._memo.get(key)
        if rates is None:
            sigs = self._sigs
            self.allocations += 1
            rates = solve_rates(tuple([sigs[i] for i in key]), self.capacity, self.shared_capacity,
                                self.turnaround_ppm)
            if len(self._memo) >= MEMO_MAX:
                self._memo.clear()
            self._memo[key] = rates
        for i in range(n):
            flow = <Flow>flows[i]
            rate = rates[i]
            if flow.rate != rate:
                flow.rate = rate
                flow.finish = -1
        return 0

    cdef long long _soonest(self, long long now) except -2:
        """In how many ps the first flow reaches its target (-1: none ever does); each flow's finish time kept while
        its rate and target stay."""
        cdef long long soonest = -1
        cdef long long dt, finish, rate
        cdef i128 left
        cdef Flow flow
        for flow in self.flows:
            rate = flow.rate
            if rate:
                finish = flow.finish
                if finish < 0:
                    left = flow._remaining - flow._target
                    finish = now + (<long long>ceil_div(left, rate) if left > 0 else 0)
                    flow.finish = finish
                dt = (finish if finish > flow.not_before else flow.not_before) - now
                if dt < 0:
                    dt = 0
            elif flow._remaining <= flow._target:
                dt = flow.not_before - now if flow.not_before > now else 0
            else:
                continue
            if soonest < 0 or dt < soonest:
                soonest = dt
        return soonest

    cdef int _reschedule(self) except -1:
        cdef long long now = self.env.now
        cdef long long soonest = self._soonest(now)
        cdef long long when
        if soonest < 0:
            self._generation += 1
            self._tick_at = -1
            return 0
        when = now + soonest
        if when == self._tick_at:
            return 0
        self._generation += 1
        self._tick_at = when
        self.env.push(when, NORMAL, K_FLOW_TICK, self, self._generation)
        return 0

    cdef int _on_tick(self, long long generation) except -1:
        cdef Flow flow
        cdef long long now
        if generation != self._generation:
            return 0  # superseded by a later change
        self._tick_at = -1
        self._advance()
        now = self.env.now
        reached = []
        staying = []
        for flow in self.flows:
            if flow._remaining <= flow._target and flow.not_before <= now:
                reached.append(flow)
            else:
                staying.append(flow)
        self.flows = staying
        self.begin()
        self._dirty = True  # the flows that reached their targets leave: re-allocate (and re-arm) at the end
        for flow in reached:
            flow.rate = 0
            if flow._owner is not None:
                flow._owner._flow_reached(flow)
            elif flow._op is not None:
                flow._op._stream_reached()
            elif flow.on_target is not None:
                flow.on_target(flow)
        self.end()
        return 0


def _rank(Flow flow):
    return flow.rank


# ============================================================================================== arrays operations
cdef class Operation(Wake):
    """An arrays operation as chipsim.sim.engine.Simulation._compute runs it on SimPy, one object instead of a
    generator, an event and a flow callback per operand stream: alone until it ends (`quiet_until` and its streams
    within what their paths give one flow), one wait of its time; else its fixed part, then its HBM operand stream,
    then its SRAM one, each a flow capped at its bytes over its time alone. The same queue entries at the same times
    as that generator's: a process yielding it resumes when it ends, and receives the time it took (ps)."""

    cdef FlowNetwork network
    cdef long long start
    cdef long long hbm_bytes
    cdef long long hbm_ps
    cdef tuple hbm_path
    cdef long long sram_bytes
    cdef long long sram_ps
    cdef tuple sram_path  # None: no SRAM stream (left, or none)

    cdef int _stream(self, long long nbytes, long long alone_ps, tuple path) except -1:
        """chipsim.sim.engine.Simulation._stream: a flow that alone ends after exactly `alone_ps`."""
        cdef long long cap = <long long>ceil_div(<i128>nbytes * PS_PER_S, alone_ps)
        cdef Flow flow = self.network._add(nbytes, path, 0, cap, None, None, self.env.now + alone_ps, None)
        flow._op = self
        return 0

    cdef int _step(self) except -1:
        """The fixed time is over, or a stream is done: the next stream, or the end."""
        cdef tuple path
        if self.hbm_path is not None:
            path, self.hbm_path = self.hbm_path, None
            self._stream(self.hbm_bytes, self.hbm_ps, path)
        elif self.sram_path is not None:
            path, self.sram_path = self.sram_path, None
            self._stream(self.sram_bytes, self.sram_ps, path)
        else:  # done: the waiting process resumes now, as it would on the last stream's event
            self._value = self.env.now - self.start
            callbacks = self.callbacks
            self.callbacks = None
            for callback in callbacks:
                callback(self)
        return 0

    cdef int _stream_reached(self) except -1:
        # the stream's own event, triggered now (processed after what is already scheduled for now)
        self.env.push(self.env.now, NORMAL, K_OPERATION, self, 0)
        return 0


cdef inline bint _within_alone_rate(long long nbytes, long long alone_ps, long long alone_rate):
    """Whether a stream, capped at its bytes over its time alone, gets that cap from its path alone (then, with
    nothing else running, it ends at exactly its own time)."""
    return not (nbytes and alone_ps > 0 and ceil_div(<i128>nbytes * PS_PER_S, alone_ps) > alone_rate)


cpdef Operation operation(FlowNetwork network, long long ps, long long fixed, long long hbm_bytes, tuple hbm_path,
                          long long hbm_alone_rate, long long sram_bytes, long long sram_ps, object sram_path,
                          long long sram_alone_rate):
    """Start an arrays operation now (chipsim.sim.engine._Work's time, fixed part, HBM operand bytes, SRAM operand
    bytes and time; `sram_path` None without experts staged in SRAM) and return it for a process to yield."""
    cdef Loop env = network.env
    cdef Operation op = Operation.__new__(Operation)
    cdef long long start = env.now
    cdef long long hbm_ps = ps - fixed - sram_ps
    cdef bint streams_hbm = hbm_bytes != 0 and hbm_ps > 0
    cdef bint streams_sram = sram_bytes != 0 and sram_ps > 0 and sram_path is not None
    op.env = env
    op.callbacks = []
    op._ok = True
    op.network = network
    op.start = start
    op.hbm_path = op.sram_path = None
    cdef bint alone = (network.quiet_until(start + ps) and _within_alone_rate(hbm_bytes, hbm_ps, hbm_alone_rate)
                       and (sram_path is None or _within_alone_rate(sram_bytes, sram_ps, sram_alone_rate)))
    if alone or not (streams_hbm or streams_sram):  # alone until it ends, or nothing streams: one wait of its time
        op._value = ps
        env.push(start + ps, NORMAL, K_WAKE, op, 0)
    else:
        op._value = _PENDING
        fixed += (0 if streams_hbm else hbm_ps) + (0 if streams_sram else sram_ps)
        if streams_hbm:
            op.hbm_bytes, op.hbm_ps, op.hbm_path = hbm_bytes, hbm_ps, hbm_path
        if streams_sram:
            op.sram_bytes, op.sram_ps, op.sram_path = sram_bytes, sram_ps, sram_path
        if fixed:
            env.push(start + fixed, NORMAL, K_OPERATION, op, 0)
        else:
            op._step()
    return op


# ============================================================================================== the DMA queue
cdef class Transfer:
    """chipsim.sim.dma.Transfer: `remaining` and `boundary` in units of 1e-12 byte."""

    cdef public long long tid
    cdef public long long nbytes
    cdef public int priority
    cdef public object tag
    cdef public int state
    cdef i128 _remaining
    cdef i128 _boundary
    cdef public long long issue_ps
    cdef public long long data_start_ps
    cdef public long long data_end_ps
    cdef public long long finish_ps
    cdef public bint setup_done
    cdef public bint cancelled
    cdef public long long moved_bytes
    cdef public long long descriptors
    cdef public Flow flow
    cdef public long long setup_end  # ps: when its setup ends (while in the path's in_setup heap)
    cdef public long long not_before_ps  # its setup starts no earlier (the host enqueues it then)

    @property
    def remaining(self):
        return self._remaining

    @property
    def boundary(self):
        return self._boundary


cdef class _DmaBatch:
    cdef DmaPath path

    def __enter__(self):
        self.path._batch_depth += 1
        self.path.network.begin()
        return self.path

    def __exit__(self, *exc):
        cdef DmaPath path = self.path
        path._batch_depth -= 1
        if path._touched and not path._batch_depth:
            path._settle()
        path.network.end()


def _no_landing(tr):
    return None


cdef inline int _remove(list items, object item) except -1:
    """list.remove for an item compared by identity (transfers are), without a method call."""
    cdef Py_ssize_t i
    for i in range(len(items)):
        if items[i] is item:
            del items[i]
            return 0
    raise ValueError("not in the list")


cdef inline bint _setup_before(Transfer a, Transfer b) noexcept:
    return a.setup_end < b.setup_end or (a.setup_end == b.setup_end and a.tid < b.tid)


cdef int _setup_push(list heap, Transfer tr) except -1:
    """heapq.heappush on (setup_end, tid): the order of chipsim.sim.dma's (end, tid, transfer) tuples."""
    cdef Py_ssize_t i = len(heap), parent
    heap.append(tr)
    while i > 0:
        parent = (i - 1) >> 1
        if _setup_before(tr, <Transfer>heap[parent]):
            heap[i] = heap[parent]
            i = parent
        else:
            break
    heap[i] = tr
    return 0


cdef Transfer _setup_pop(list heap):
    """heapq.heappop of the same."""
    cdef Transfer top = <Transfer>heap[0]
    cdef Transfer last = <Transfer>heap.pop()
    cdef Py_ssize_t n = len(heap), i = 0, child
    if n:
        while True:
            child = 2 * i + 1
            if child >= n:
                break
            if child + 1 < n and _setup_before(<Transfer>heap[child + 1], <Transfer>heap[child]):
                child += 1
            if _setup_before(<Transfer>heap[child], last):
                heap[i] = heap[child]
                i = child
            else:
                break
        heap[i] = last
    return top


cdef class DmaPath:
    """chipsim.sim.dma.DmaPath in C: the same queues, engines, setups, preemption at chunk boundaries,
    cancels and landings; a batch that changed nothing does not settle."""

    cdef public Loop env
    cdef public FlowNetwork network
    cdef public tuple flow_path
    cdef public long long latency_ps
    cdef public long long setup_ps
    cdef public long long engines
    cdef i128 _chunk_units
    cdef public long long free_engines
    cdef public list queue_demand  # FIFO (a list: popped at its head, C calls, not deque methods)
    cdef public list queue_prefetch
    cdef public list flowing
    cdef public list paused
    cdef public list in_setup  # transfers in their setup: a heap by (setup_end, tid)
    cdef public long long demands_live
    cdef long long _setup_tick_at
    cdef int _batch_depth
    cdef _DmaBatch _batch
    cdef public object on_landed
    cdef public bint preempt
    cdef public bint demand_first
    cdef dict _landing
    cdef long long _next_tid
    cdef public long long bytes_moved
    cdef public long long transfers_done
    cdef public long long descriptors_submitted
    cdef public object recorder
    cdef public long long flow_cap  # bytes/s no transfer's data moves faster than (0: none): chipsim.sim.dma's
    cdef bint _touched

    def __init__(self, Loop env, bandwidth_bytes_per_s, latency_ps, setup_ps, engines, chunk_bytes, on_landed=None,
                 preempt=True, demand_first=True, network=None, path=None):
        if (network is None) == (bandwidth_bytes_per_s is None):
            raise ValueError("give either a bandwidth or a network with a path")
        if (bandwidth_bytes_per_s is not None and bandwidth_bytes_per_s <= 0) or engines <= 0 or chunk_bytes <= 0:
            raise ValueError("bandwidth, engines and chunk size must be positive")
        self.env = env
        if network is None:
            network = FlowNetwork(env, ["dma"], [int(bandwidth_bytes_per_s or 0)])
            path = network.path(("dma", WRITE))
        elif path is None:
            raise ValueError("a network needs the path its transfers cross")
        self.network = network
        self.flow_path = path
        self.latency_ps = int(latency_ps)
        self.setup_ps = int(setup_ps)
        self.engines = int(engines)
        self._chunk_units = <i128>int(chunk_bytes) * PS_PER_S
        self.free_engines = self.engines
        self.queue_demand = []
        self.queue_prefetch = []
        self.flowing = []
        self.paused = []
        self.in_setup = []
        self.demands_live = 0
        self._setup_tick_at = -1
        self._batch_depth = 0
        self._batch = _DmaBatch.__new__(_DmaBatch)
        self._batch.path = self
        self.on_landed = on_landed or _no_landing
        self.preempt = preempt
        self.demand_first = demand_first
        self._landing = {}
        self._next_tid = 0
        self.bytes_moved = 0
        self.transfers_done = 0
        self.descriptors_submitted = 0
        self.recorder = None
        self.flow_cap = 0
        self._touched = False

    @property
    def chunk_units(self):
        return self._chunk_units

    # ------------------------------------------------------------------------------------ public
    def submit(self, long long nbytes, int priority, tag=None, long long descriptors=1, long long not_before_ps=0):
        cdef Transfer tr = Transfer.__new__(Transfer)
        self._touched = True
        tr.tid = self._next_tid
        tr.nbytes = nbytes
        tr.priority = priority
        tr.tag = tag
        tr.state = QUEUED
        tr._remaining = 0
        tr._boundary = 0
        tr.issue_ps = self.env.now
        tr.data_start_ps = -1
        tr.data_end_ps = -1
        tr.finish_ps = -1
        tr.setup_done = False
        tr.cancelled = False
        tr.moved_bytes = 0
        tr.descriptors = descriptors
        tr.flow = None
        tr.not_before_ps = not_before_ps
        self.descriptors_submitted += descriptors
        self._next_tid += 1
        if priority == DEMAND:
            self.demands_live += 1
        if priority == DEMAND and self.demand_first:
            self.queue_demand.append(tr)
        else:
            self.queue_prefetch.append(tr)
        self._settle()
        return tr

    def promote(self, Transfer tr):
        self._touched = True
        if tr.priority == DEMAND or tr.state == DONE or tr.data_end_ps >= 0:
            return
        tr.priority = DEMAND
        self.demands_live += 1
        if tr.state == QUEUED:
            if self.demand_first:
                _remove(self.queue_prefetch, tr)
                self.queue_demand.append(tr)
        elif tr.state == PAUSED:
            _remove(self.paused, tr)
            tr.state = QUEUED
            self.queue_demand.insert(0, tr)
        elif tr.state == DRAINING:
            tr.state = ACTIVE
            self.network._set_target(tr.flow, 0)
        self._settle()

    def cancel(self, Transfer tr):
        self._touched = True
        if tr.state == DONE or tr.cancelled:
            return
        tr.cancelled = True
        if tr.priority == DEMAND and tr.data_end_ps < 0:
            self.demands_live -= 1
            tr.priority = PREFETCH
        if tr.state == QUEUED:
            _remove(self.queue_demand if tr in self.queue_demand else self.queue_prefetch, tr)
            if tr.setup_done:
                self._end(tr, <i128>tr.nbytes * PS_PER_S - tr._remaining, True)
            else:
                tr.state = DONE
                tr.data_end_ps = tr.finish_ps = self.env.now
                self.on_landed(tr)
        elif tr.state == PAUSED:
            _remove(self.paused, tr)
            self._end(tr, <i128>tr.nbytes * PS_PER_S - tr._remaining, True)
        elif tr.state == ACTIVE or tr.state == DRAINING:
            self._set_boundary(tr)
        self._settle()

    def batch(self):
        return self._batch

    def queued_bytes(self):
        cdef Transfer t
        cdef long long total = 0  # bytes: far below 2^63
        self.network._advance()
        for t in self.queue_demand:
            total += t.nbytes
        for t in self.queue_prefetch:
            total += t.nbytes
        for t in self.in_setup:
            if not t.cancelled:
                total += t.nbytes
        for t in self.flowing:
            total += <long long>ceil_div(t.flow._remaining, PS_PER_S)
        for t in self.paused:
            total += <long long>ceil_div(t._remaining, PS_PER_S)
        return total

    def _now(self):
        return self.env.now

    # ------------------------------------------------------------------------------------ internals
    cdef int _settle(self) except -1:
        if not self._batch_depth:
            self._touched = False
            self.network.begin()
            self._dispatch()
            self.network.end()
            self._reschedule_setups()
            if self.recorder is not None:
                self.recorder.sample(self)
        return 0

    cdef int _start_data(self, Transfer tr) except -1:
        tr.state = ACTIVE
        self.flowing.append(tr)
        if not tr.setup_done:
            tr.setup_done = True
            tr.data_start_ps = self.env.now
            tr.flow = self.network._add(tr.nbytes, self.flow_path, 0, self.flow_cap, None, tr, 0, self)
        else:
            self.network._resume(tr.flow, 0)
        return 0

    cdef int _setup_over(self, Transfer tr) except -1:
        if tr.cancelled:
            self.free_engines += 1
            if self.recorder is not None:
                self.recorder.release(tr, self.env.now)
            self._end(tr, 0, False)
        else:
            if self.recorder is not None:
                self.recorder.next_phase(tr, self.env.now, "data")
            self._start_data(tr)
        return 0

    cdef int _dispatch(self) except -1:
        cdef Transfer tr
        queue_demand = self.queue_demand
        queue_prefetch = self.queue_prefetch
        if self.demands_live == 0 and self.paused:
            for tr in sorted(self.paused, key=_tid, reverse=True):
                tr.state = QUEUED
                queue_prefetch.insert(0, tr)
            del self.paused[:]
        while self.free_engines > 0 and (queue_demand or (queue_prefetch and (self.demands_live == 0
                                                                               or not self.preempt))):
            tr = <Transfer>(queue_demand.pop(0) if queue_demand else queue_prefetch.pop(0))
            self.free_engines -= 1
            if self.recorder is not None:
                self.recorder.take(tr, self.env.now, "data" if tr.setup_done else "setup")
            if tr.setup_done:
                self._start_data(tr)
            else:
                tr.state = SETUP
                tr.setup_end = max(self.env.now, tr.not_before_ps) + self.setup_ps * tr.descriptors
                _setup_push(self.in_setup, tr)
        if self.preempt and self.flowing:
            flowing = self.flowing
            demand = bool(queue_demand)
            if not demand:
                for tr in flowing:
                    if tr.priority == DEMAND:
                        demand = True
                        break
            if demand:
                for tr in flowing:
                    if tr.priority == PREFETCH and tr.state == ACTIVE:
                        self._set_boundary(tr)
        return 0

    cdef int _set_boundary(self, Transfer tr) except -1:
        cdef i128 total, done_units, next_boundary
        self.network._advance()
        total = <i128>tr.nbytes * PS_PER_S
        done_units = total - tr.flow._remaining
        next_boundary = ceil_div(done_units, self._chunk_units) * self._chunk_units
        tr._boundary = total - next_boundary if total > next_boundary else 0
        tr.state = DRAINING
        self.network._set_target(tr.flow, tr._boundary)
        return 0

    cdef int _flow_reached(self, Flow flow) except -1:
        cdef Transfer tr = <Transfer>flow.tag
        cdef long long now = self.env.now
        tr._remaining = flow._remaining if flow._remaining > 0 else 0
        _remove(self.flowing, tr)
        self.free_engines += 1
        if self.recorder is not None:
            self.recorder.release(tr, now)
        if flow._remaining <= 0:
            if tr.priority == DEMAND:
                self.demands_live -= 1
            self.transfers_done += 1
            self._end(tr, <i128>tr.nbytes * PS_PER_S, True)
        elif tr.cancelled:
            self._end(tr, <i128>tr.nbytes * PS_PER_S - tr._remaining, True)
        else:
            tr.state = PAUSED
            self.paused.append(tr)
        self._settle()
        return 0

    cdef int _reschedule_setups(self) except -1:
        cdef long long when
        if not self.in_setup:
            return 0
        when = (<Transfer>self.in_setup[0]).setup_end
        if when == self._setup_tick_at:
            return 0
        self._setup_tick_at = when
        self.env.push(when, NORMAL, K_DMA_SETUP, self, when)
        return 0

    cdef int _on_setup_tick(self, long long when) except -1:
        cdef long long now
        if when != self._setup_tick_at:
            return 0  # an earlier setup took the wake-up's place; that one covers this
        self._setup_tick_at = -1
        now = self.env.now
        in_setup = self.in_setup
        self.network.begin()
        while in_setup and (<Transfer>in_setup[0]).setup_end <= now:
            self._setup_over(_setup_pop(in_setup))
        self._dispatch()
        self.network.end()
        self._reschedule_setups()
        if self.recorder is not None:
            self.recorder.sample(self)
        return 0

    cdef int _end(self, Transfer tr, i128 moved_units, bint latency) except -1:
        cdef long long now = self.env.now
        cdef long long moved, finish
        tr._remaining = 0
        moved = tr.moved_bytes = <long long>ceil_div(moved_units, PS_PER_S)
        tr.data_end_ps = now
        finish = tr.finish_ps = now + self.latency_ps if latency else now
        self.bytes_moved += moved
        tr.state = DONE
        tr.flow = None
        group = self._landing.get(finish)
        if group is None:
            self._landing[finish] = [tr]
            self.env.push(finish, NORMAL, K_DMA_LANDING, self, finish)
        else:
            group.append(tr)
        return 0

    cdef int _on_landing(self, long long when) except -1:
        landing = self._landing.pop(when)
        on_landed = self.on_landed
        for tr in landing:
            on_landed(tr)
        return 0


def _tid(Transfer tr):
    return tr.tid
