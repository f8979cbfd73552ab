"""Speculative decoding as a step shape (workload.speculative): a draft proposes up to k tokens after the step's
input token; the model runs the input and the drafts through every layer in one pass (a verify step of m = 1 + drafts
tokens, costed as a chunk whose first token attends over the context, as a decode step does, and each later one over
one more); the leading drafts that equal the text's next tokens are accepted, and the model's own prediction after them
is one more token. A step so yields accepted + 1 tokens, and the next step's input is the last of them.

Drafts (`draft`):
- prompt-lookup (Saxena 2023, "prompt lookup decoding"; vLLM's n-gram speculator): the tokens that followed the most
  recent earlier occurrence of the longest suffix (`ngram` tokens, then shorter, down to one) of the text so far;
  accepted while they equal the trace's own next tokens (its `token_ids`): acceptance is measured, not assumed. A
  step where no suffix recurs proposes nothing and is a plain decode step.
- rate: a draft model proposing k tokens every step, each accepted with probability `acceptance` given the earlier
  ones were (a seeded draw; an ASSUMPTION swept by experiments/speculative_decode.yaml).

The plan of steps is fixed before the run (it depends on the text and the seed, not on timing). A verify step routes
every one of its tokens with the trace's routing of the text's tokens at those positions: for a rejected draft the
real token differs and so may its experts, which the trace cannot say (an approximation: the drafted token's routing
is taken to be the true token's). The draft's own time is `draft_ms_per_step` per verify step, spent before it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from chipsim.hw.compute_formula import ArrayModel, OpCost
from chipsim.hw.config import HardwareConfig
from chipsim.workload.batch import BatchLayer, every_token_head, step_layers
from chipsim.workload.decode import DecodeWorkload, dense_weights
from chipsim.workload.prefill import ExpertGemms, launch_grouped, prefill_group_builders


def is_speculative(hw: HardwareConfig) -> bool:
    return hw.workload.speculative.draft_tokens > 0


@dataclass(frozen=True)
class SpecStep:
    """One step: input token `first` (a trace position), `tokens` verified (the input and its drafts), `accepted`
    drafts kept; it yields accepted + 1 tokens."""

    first: int
    tokens: int
    accepted: int


def prompt_lookup(ids: np.ndarray, p: int, k: int, ngram: int) -> list[int]:
    """Up to k draft tokens after position p: those that followed the most recent earlier occurrence of the longest
    suffix of ids[:p + 1] (ngram tokens, then shorter) that recurs; none where no suffix recurs."""
    for n in range(min(ngram, p), 0, -1):
        suffix = ids[p - n + 1:p + 1]
        ends = np.nonzero(ids[n - 1:p] == suffix[-1])[0] + n - 1  # earlier positions ending like the suffix
        for end in ends[::-1]:
            if np.array_equal(ids[end - n + 1:end + 1], suffix):
                return [int(x) for x in ids[end + 1:min(end + 1 + k, p + 1)]]
    return []


def plan_steps(hw: HardwareConfig, token_ids: np.ndarray, tokens: int) -> list[SpecStep]:
    """The steps that decode `tokens` tokens (positions 0 .. tokens - 1 as inputs, as a plain run's steps are)."""
    s = hw.workload.speculative
    rng = np.random.default_rng(s.seed)
    ids = np.asarray(token_ids[:tokens])
    steps, p = [], 0
    while p < tokens:
        room = min(s.draft_tokens, tokens - 1 - p)  # the drafts' positions stay among the run's tokens
        if s.draft == "prompt-lookup":
            drafts = prompt_lookup(ids, p, room, s.ngram)
            accepted = 0
            while accepted < len(drafts) and drafts[accepted] == int(ids[p + 1 + accepted]):
                accepted += 1
            proposed = len(drafts)
        else:
            proposed, accepted = room, 0
            while accepted < room and rng.random() < s.acceptance:
                accepted += 1
        steps.append(SpecStep(p, 1 + proposed, accepted))
        p += accepted + 1
    return steps


@dataclass
class SpecWorkload:
    """The verify steps of a speculative run, costed on the decode workload's arrays: `steps` as planned; `verify(m)`
    the layers and head of a step of m tokens (m > 1; a step of one token is the decode step itself)."""

    steps: tuple[SpecStep, ...]
    draft_ps: int
    _build: Callable[[int], tuple[tuple[BatchLayer, ...], OpCost]]
    expert: ExpertGemms  # expert(n): one routed expert as a GEMM over the step's n tokens routed to it
    _verify: dict[int, tuple[tuple[BatchLayer, ...], OpCost]] = field(default_factory=dict)

    def verify(self, tokens: int) -> tuple[tuple[BatchLayer, ...], OpCost]:
        built = self._verify.get(tokens)
        if built is None:
            built = self._verify[tokens] = self._build(tokens)
        return built


def build_speculative(hw: HardwareConfig, decode: DecodeWorkload, token_ids: np.ndarray, tokens: int
                      ) -> SpecWorkload:
    """The planned steps of decoding `tokens` tokens, and the costs of their verify steps."""
    m = decode.model
    am = ArrayModel(hw)
    grouped = launch_grouped(am)
    offset = decode.context_length - 1  # the input token attends over the context (its own included), as decoding

    def build(n: int) -> tuple[tuple[BatchLayer, ...], OpCost]:
        b = prefill_group_builders(am, m, hw, offset, n)
        built = {name: grouped(name, fn()) for name, fn in b.items() if fn is not None and name not in ("expert", "head")}
        head = grouped("head", every_token_head(am, m, dense_weights(hw), n))
        assert head is not None
        return step_layers(m, built), head

    steps = tuple(plan_steps(hw, token_ids, tokens))
    draft_ps = round(hw.workload.speculative.draft_ms_per_step * 1e9)
    return SpecWorkload(steps, draft_ps, build, ExpertGemms(hw, decode, am))
