"""Hand-made traces and configs for tests (no generator involved)."""

from __future__ import annotations

import numpy as np

from chipsim.trace import format as tf
from chipsim.workload.models import ModelShape


def hand_trace_arrays(model: ModelShape, routed: np.ndarray, apex_rank: np.ndarray | None = None,
                      apex_score: float = 0.0, apex_theta: np.ndarray | None = None) -> tuple[dict, dict]:
    """A schema-valid trace whose routing is `routed` (T, L, k); predictions default to perfect rankings."""
    T, L, k = routed.shape
    n = model.num_experts
    m = min(n, 2 * k)
    routed = routed.astype(np.uint8)
    rank = np.empty((T, L, n), dtype=np.uint8)
    for t in range(T):
        for layer in range(L):
            rest = [e for e in range(n) if e not in set(routed[t, layer].tolist())]
            rank[t, layer] = np.array(list(routed[t, layer]) + rest, dtype=np.uint8)
    if apex_rank is None:
        apex_rank = rank.copy()
    if apex_theta is None:
        apex_theta = np.tile(np.linspace(0.0, 5.0, n - k + 1, dtype=np.float32), (L, 1))
    none = np.full((T, L, m), tf.NO_EXPERT, dtype=np.uint8)
    arrays = {
        "routed_ids": routed,
        "routed_weights": np.full((T, L, k), 1.0 / k, dtype=np.float16),
        "router_rank": rank,
        "router_rank_prob": np.full((T, L, m), 1.0 / n, dtype=np.float16),
        "apex_rank": apex_rank.astype(np.uint8),
        "apex_score": np.full((T, L), apex_score, dtype=np.float32),
        "apex_theta": apex_theta.astype(np.float32),
        "promoe_rank": none.copy(),
        "pregate_rank": none.copy(),
        "floe_rank": none.copy(),
        "draft_ids": np.full((T, L, tf.DRAFT_DEPTH, k), tf.NO_EXPERT, dtype=np.uint8),
        "draft_conf": np.zeros((T, L, tf.DRAFT_DEPTH), dtype=np.float16),
        "train_expert_counts": np.ones((L, n), dtype=np.int64),
        "moe_layers": np.arange(model.first_dense_layers, model.num_layers, dtype=np.int16),
        "token_ids": np.zeros(T, dtype=np.int32),
    }
    meta = {
        "schema_version": tf.SCHEMA_VERSION,
        "synthetic": True,
        "model": {
            "name": model.name,
            "num_layers": model.num_layers,
            "first_dense_layers": model.first_dense_layers,
            "num_experts": n,
            "top_k": k,
            "num_shared_experts": model.num_shared_experts,
        },
        "provenance": {"description": "hand-made test trace"},
    }
    return arrays, meta


def random_routing(model: ModelShape, tokens: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    L, n, k = model.num_moe_layers, model.num_experts, model.top_k
    return np.array([[rng.permutation(n)[:k] for _ in range(L)] for _ in range(tokens)], dtype=np.uint8)


def write_hand_trace(path, model: ModelShape, routed: np.ndarray, **kw) -> str:
    arrays, meta = hand_trace_arrays(model, routed, **kw)
    tf.save(path, arrays, meta)
    return str(path)


def write_trace_and_config(tmp_path, model: ModelShape, arrays: dict, meta: dict, name: str = "t",
                           extra_yaml: str = "expert_buffer:\n  capacity_mib: 4\n") -> str:
    """Save a trace and a config that starts from hwconfigs/thor.yaml, runs `model` on it and adds
    `extra_yaml`; returns the config path."""
    import os

    thor = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "hwconfigs", "thor.yaml")
    trace = tmp_path / f"{name}.npz"
    tf.save(trace, arrays, meta)
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(f"base: {thor}\nmodel:\n  name: {model.name}\nworkload:\n  trace: {trace}\n{extra_yaml}")
    return str(cfg)


def run_policies_recording_plans(cfg: str, specs, overrides=(), record_plans: bool = True) -> dict:
    """label -> (SimResult, [(t, layer, execute, substituted, dropped) per routed layer]) of each policy,
    or label -> SimResult when record_plans is False."""
    from chipsim.runner import prepare, simulate

    prep = prepare(cfg, list(overrides), specs)
    out = {}
    for policy in prep.policies:
        plans = []
        if record_plans:
            original = policy.on_route

            def on_route(ctx, t, layer, routed, _orig=original, _plans=plans):
                plan = _orig(ctx, t, layer, routed)
                _plans.append((t, layer, list(plan.execute), plan.substituted, plan.dropped))
                return plan

            policy.on_route = on_route
        result = simulate(prep, policy, record_events=record_plans)
        out[policy.label] = (result, plans) if record_plans else result
    return out


# thor's components: `chipsim keys` lists a component's keys once per kind (memory.<name>.channels, ...)
THOR_COMPONENTS = {"memory.<name>.": ("memory.hbm.", "memory.lpddr5x."), "links.<serial link>.": ("links.pcie.",),
                   "links.<die-to-die link>.": ("links.ucie.",)}


def thor_keys() -> list[tuple[str, str]]:
    """(dotted key, type name) of every config key as thor.yaml spells it: each component kind's keys under
    thor's names of that kind."""
    from chipsim.hw.config import iter_keys

    out = []
    for key, tp, _ in iter_keys():
        generic = next((g for g in THOR_COMPONENTS if key.startswith(g)), None)
        names = [name + key[len(generic):] for name in THOR_COMPONENTS[generic]] if generic else [key]
        out += [(name, tp) for name in names if "<" not in name]
    return out


def routing_peek_policy():
    """A policy that checks, at every step of several tokens, that no token's routing is readable before its step
    routes it: none at the step's start, at each layer's routing exactly its tokens' up to that layer (their union is
    what routed). Its checks raise inside the run."""
    import pytest

    from chipsim.policies.base import Policy, PolicyError

    class Peek(Policy):
        name = "peek"
        batch_support = "reads the routing of its step's tokens"

        def on_token_start(self, ctx, t):
            for token in ctx.step_tokens:
                with pytest.raises(PolicyError, match="has not routed yet"):
                    ctx.trace_routed(token, 0)

        def on_route(self, ctx, t, layer, routed):
            union = set()
            for token in ctx.step_tokens:
                union.update(ctx.trace_routed(token, layer))
                if layer + 1 < ctx.num_moe_layers:
                    with pytest.raises(PolicyError, match="has not routed yet"):
                        ctx.trace_routed(token, layer + 1)
            assert union == set(routed)
            return super().on_route(ctx, t, layer, routed)

    return Peek("peek")


def module_error(capsys, main, argv) -> str:
    """python -m MODULE ARGV as run_module_main runs it: exit 2 and one line on stderr, no traceback, nothing on
    stdout; returns the line."""
    import pytest

    from chipsim.errors import run_module_main

    with pytest.raises(SystemExit) as exc:
        run_module_main(lambda: main(argv))
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert exc.value.code == 2 and len(lines) == 1 and lines[0].startswith("chipsim: error: "), captured
    assert "Traceback" not in captured.err and captured.out == ""
    return lines[0]
