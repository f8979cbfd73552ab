"""What each step of a served run runs (workload.scheduler.kind): a scheduler sees the server's waiting and running
requests at a step's start, admits waiting ones (first come, first served: the queue's head is admitted or nobody
is; chipsim.serve.server.Server.admit checks the KV cache and the trace windows) and returns the step's parts
(chipsim.workload.served.Part). A new scheduler is a subclass registered by name.

- static: a batch of up to max_sequences requests is admitted only when the last one has finished; it prefills
  (prompt chunks, up to max_step_tokens a step), then decodes until its last request is done.
- continuous (Orca, Yu et al. OSDI 2022; vLLM's default before chunked prefill): requests are admitted at every
  step while max_sequences allows; a step prefills whenever an admitted request has prompt left (decode waits),
  otherwise decodes every running request.
- chunked (Sarathi-Serve, Agrawal et al. OSDI 2024): every step decodes every running request that has its first
  token, and fills the rest of its max_step_tokens with prompt chunks, first come first.
Prompt chunks are at most workload.prefill_chunk_tokens (0: no limit but the step's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from chipsim.serve.server import Server
    from chipsim.workload.served import Part

SCHEDULERS: dict[str, type["Scheduler"]] = {}


def register(cls: type["Scheduler"]) -> type["Scheduler"]:
    SCHEDULERS[cls.name] = cls
    return cls


class Scheduler:
    name: ClassVar[str] = ""

    def __init__(self, max_step_tokens: int, chunk_tokens: int):
        self.max_step_tokens = max_step_tokens
        self.chunk_tokens = chunk_tokens or max_step_tokens

    def step(self, server: "Server") -> list["Part"]:
        """The next step's parts (empty: nothing can run until a request arrives)."""
        raise NotImplementedError

    def prefill_first(self, server: "Server") -> list["Part"]:
        """Prompt chunks while any admitted request has prompt left, else a decode token of every running one."""
        budget = self.max_step_tokens
        parts = server.prefill_parts(budget, self.chunk_tokens)
        return parts or server.decode_parts(budget)


@register
class Static(Scheduler):
    name = "static"

    def step(self, server: "Server") -> list["Part"]:
        if not server.running:
            server.admit()
        return self.prefill_first(server)


@register
class Continuous(Scheduler):
    name = "continuous"

    def step(self, server: "Server") -> list["Part"]:
        server.admit()
        return self.prefill_first(server)


@register
class Chunked(Scheduler):
    name = "chunked"

    def step(self, server: "Server") -> list["Part"]:
        server.admit()
        parts = server.decode_parts(self.max_step_tokens)
        return parts + server.prefill_parts(self.max_step_tokens - len(parts), self.chunk_tokens)
