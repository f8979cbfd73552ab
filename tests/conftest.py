import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
# OpenMP's idle threads (PyTorch's, numpy's BLAS) sleep rather than spin, unless the caller says otherwise; set
# before either is imported and inherited by every subprocess. The tests' kernels are tiny: at each one's end a
# spinning thread holds a core that another process on this shared two-core machine (or the other thread) needs.
# Two sessions side by side replaying on the CPU (test_hwreplay_host.py): 12-17 s each spinning, 7-9 s passive;
# alone, 4.1 s and 4.8 s.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from chipsim.workload.models import MODELS, ModelShape  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
THOR = os.path.join(ROOT, "hwconfigs", "thor.yaml")
# roles for the tiny config: one unified memory, experts read where they are stored, so nothing is ever fetched
# (tests/test_components.py checks what that machine does)
IN_PLACE = ("roles:\n  operand_memory: lpddr5x\n  operand_link: none\n  expert_staging: in-place\n  host_link: none\n"
            "  in_package: none\n")


@pytest.fixture(scope="session", autouse=True)
def session_cache_dir(tmp_path_factory):
    """Tests never write into the user's cache ($CHIPSIM_CACHE_DIR or ~/.cache/chipsim): every test, and every
    subprocess it starts (they inherit os.environ), uses one temporary folder per test session, so calibrations
    stay warm within the session. A test that corrupts or counts cache entries points the variable at its own
    tmp_path (monkeypatch.setenv)."""
    folder = str(tmp_path_factory.mktemp("chipsim-cache"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CHIPSIM_CACHE_DIR", folder)
        yield folder


@pytest.fixture(scope="session")
def docs_site(tmp_path_factory):
    """The documentation site built once per session, as CI builds it (`mkdocs build --strict`): its checks of
    content (test_docs_site.py) and in a browser (test_docs_browser.py) read the same build."""
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (pip install -e '.[docs]')")
    pytest.importorskip("mkdocstrings", reason="the docs extra is not installed (pip install -e '.[docs]')")
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    assert "WARNING" not in done.stderr, done.stderr
    return out


@pytest.fixture
def thor_path():
    return THOR


def tiny_shape(num_layers: int = 3, *, num_experts: int = 8, top_k: int = 2, num_shared_experts: int = 0,
               ) -> ModelShape:
    """The tiny MoE the engine and policy tests run on: by default 8 experts top-2 per layer, d 256, expert FFN
    128 (one expert = 3 × 256 × 128 BF16 weights = 196,608 bytes), GQA attention, no dense layers; with
    shared experts a Qwen2-MoE-style block of the same width."""
    shared = {"num_shared_experts": num_shared_experts, "shared_expert_ffn": 128} if num_shared_experts else {}
    name = f"tiny-{num_layers}l-{num_experts}e-top{top_k}" + (f"-{num_shared_experts}s" if shared else "") + "-test"
    return ModelShape(
        name=name, hf_architecture="Qwen2MoeForCausalLM" if shared else "GraniteMoeForCausalLM",
        num_layers=num_layers, hidden_size=256, num_experts=num_experts, top_k=top_k, expert_ffn=128,
        vocab_size=1000, tie_embeddings=True, attention="gqa", num_heads=4, num_kv_heads=2, head_dim=64, **shared,
    )


class Tiny:
    """A registered tiny model and a writer of hand-made traces (helpers.hand_trace_arrays: perfect
    predictions unless told otherwise) with configs that start from hwconfigs/thor.yaml."""

    def __init__(self, shape: ModelShape, tmp_path):
        self.shape = shape
        self.tmp_path = tmp_path

    def routing(self, tokens: int = 6, seed: int = 3):
        from helpers import random_routing

        return random_routing(self.shape, tokens, seed=seed)

    def config(self, routed=None, *, name: str = "t", arrays: dict | None = None, meta: dict | None = None,
               edit=None, extra_yaml: str = "expert_buffer:\n  capacity_mib: 4\n", **trace_kw) -> str:
        """Write a trace whose routing is `routed` (default: `routing()`) and its config; returns the config.
        `trace_kw` go to hand_trace_arrays; `arrays` replace trace arrays (e.g. a predictor's ranking), `meta`
        entries are added to its meta (e.g. a quality record), and `edit(arrays, meta)` may change anything
        else before the trace is saved."""
        from helpers import hand_trace_arrays, write_trace_and_config

        routed = self.routing() if routed is None else routed
        trace_arrays, trace_meta = hand_trace_arrays(self.shape, routed, **trace_kw)
        trace_arrays.update(arrays or {})
        trace_meta.update(meta or {})
        if edit is not None:
            edit(trace_arrays, trace_meta)
        arrays, meta = trace_arrays, trace_meta
        return write_trace_and_config(self.tmp_path, self.shape, arrays, meta, name, extra_yaml)


@pytest.fixture
def tiny(request, tmp_path, monkeypatch) -> Tiny:
    """The tiny model (`tiny_shape`, with the test module's TINY_LAYERS layers, default 3), registered for the
    test, and its trace and config writer."""
    shape = tiny_shape(getattr(request.module, "TINY_LAYERS", 3))
    monkeypatch.setitem(MODELS, shape.name, shape)
    return Tiny(shape, tmp_path)


def native_core():
    """chipsim.sim.native (the fast path's C event core), or the test is skipped where the install did not build it."""
    from chipsim.sim.core import native_available

    if not native_available():
        pytest.skip("chipsim.sim.native was not built (no Cython or C compiler at install)")
    import chipsim.sim.native

    return chipsim.sim.native
