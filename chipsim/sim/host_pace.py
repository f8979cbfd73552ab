"""The host thread that enqueues the program (issue #44 item 1; host_frontend.launch_issue_ns, copy_issue_ns,
event_issue_ns, launch_queue_depth).

Software drives a GPU from one host thread: it enqueues each launch, copy and event in program order, and each call
costs it time of its own. The machine starts no step before the host has enqueued it. The host never waits for the
machine except where the program synchronises (a read-back, a pageable copy, host-CPU experts: `synced`) and where
the launch queue is full: it may hold at most `depth` steps the machine has not yet reached, so a call that would
hold more waits until the machine reaches the oldest. Where the host enqueues faster than the machine runs, it is
ahead and costs nothing; where it is slower, it sets the pace.

Approximations: a copy's step counts as reached when the simulator issues it (its bytes may wait longer behind
others in the copy engine's queue); one run of compute's launches count as reached at its start, and are held back
together until the last of them may enter the queue; a call of more steps than the queue holds waits only for the
step before it. The host also waits where nothing is left to enqueue: a served run's next arrival, a speculative
step's draft.
"""

from __future__ import annotations

from collections import deque


class HostPace:
    """The host's clock: when it has enqueued every step so far, and when the machine reached the last `depth`."""

    def __init__(self, launch_ps: int, copy_ps: int, event_ps: int, depth: int) -> None:
        self.launch_ps = launch_ps
        self.copy_ps = copy_ps
        self.event_ps = event_ps
        self.depth = depth  # 0: no bound
        self.free_ps = 0  # when the host has enqueued every step so far
        self.busy_ps = 0  # the host's time spent enqueueing, in all
        self.launches = self.copies = self.events = 0  # the steps it has enqueued, by kind
        self._reached: deque[int] = deque(maxlen=depth or 1)  # when the machine reached each of the last steps

    def enqueue(self, launches: int, copies: int, events: int) -> tuple[int, int]:
        """The host enqueues these steps after every earlier one: (when it starts them, when it has enqueued all)."""
        steps = launches + copies + events
        start = self.free_ps
        reached = self._reached
        if self.depth:
            # the last of the new steps may enter the queue once the machine has reached the step `depth` before it
            back = len(reached) + steps - 1 - self.depth
            if back >= 0 and reached:
                gate = reached[min(back, len(reached) - 1)]
                if gate > start:
                    start = gate
        self.launches += launches
        self.copies += copies
        self.events += events
        cost = launches * self.launch_ps + copies * self.copy_ps + events * self.event_ps
        self.free_ps = start + cost
        self.busy_ps += cost
        return start, self.free_ps

    def enqueue_now(self, launches: int, copies: int, events: int, now_ps: int) -> int:
        """Enqueue steps the machine takes as soon as they are enqueued (a copy's, an event's): reached then, at
        `now_ps` at the earliest. Returns when the host has enqueued them."""
        _, done = self.enqueue(launches, copies, events)
        self.reached(launches + copies + events, max(now_ps, done))
        return done

    def reached(self, steps: int, at_ps: int) -> None:
        """The machine reached `steps` steps (the last enqueued) at `at_ps`."""
        if self.depth:
            for _ in range(min(steps, self.depth)):
                self._reached.append(at_ps)

    def synced(self, now_ps: int) -> None:
        """The host waited for the machine until `now_ps` (a read-back, a pageable copy, its own experts)."""
        if now_ps > self.free_ps:
            self.free_ps = now_ps

    def start_delay(self, launches: int, waits: int, work_ps: int, now_ps: int) -> int:
        """Enqueue a run of compute: `waits` event waits and `launches` launches, taking `work_ps` on the machine
        alone, reached now at the earliest. Returns how long the machine waits for the host before it starts: the
        first launch must be enqueued before it starts, and the last before its own share of the work runs (the
        launches taken as equal parts of the work)."""
        if not launches:
            return 0
        start, done = self.enqueue(launches, 0, waits)
        first = start + (done - start) // launches
        last_share = work_ps // launches
        delay = max(0, first - now_ps, done + last_share - (now_ps + work_ps))
        self.reached(launches + waits, now_ps + delay)
        return delay
