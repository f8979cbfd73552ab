"""Library functions raise errors, never SystemExit; each command's main() turns them into one line (issue #38):
gpuconfig.render on a microbenchmark without a usable per-kernel or graph launch time, and trace.train on a
built model whose counts are not its shape's."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from chipsim.errors import InputError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MICROBENCH = os.path.join(ROOT, "validation", "h200-microbench.json")


def _microbench() -> dict:
    with open(MICROBENCH) as f:
        return json.load(f)


def test_render_names_the_file_and_key_of_a_missing_per_kernel_time():
    from chipsim.hwreplay.gpuconfig import render

    mb = _microbench()
    mb["tiny_kernels"]["graph_us_per_kernel"] = "n/a"
    assert render(mb, "eager", source="mb.json").startswith("# chipsim hardware config")  # eager reads the other one
    with pytest.raises(InputError, match=r"^mb\.json: tiny_kernels\.graph_us_per_kernel: no usable graph per-kernel "
                                         r"time: n/a$"):
        render(mb, "graph", source="mb.json")


def test_render_names_the_file_and_key_of_a_missing_graph_launch_time():
    from chipsim.hwreplay.gpuconfig import render

    mb = _microbench()
    del mb["graph_launch"]
    with pytest.raises(InputError, match=r"^mb\.json: graph_launch\.us_per_one_kernel_graph: no graph launch time: "
                                         r"None$"):
        render(mb, "graph", source="mb.json")


def test_gpuconfig_reports_a_bad_microbenchmark_in_one_line(tmp_path):
    mb = _microbench()
    mb["tiny_kernels"]["gpu_us_per_kernel"] = None
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(mb))
    out = tmp_path / "out.yaml"
    run = subprocess.run([sys.executable, "-m", "chipsim.hwreplay.gpuconfig", str(bad), "--out", str(out)],
                         capture_output=True, text=True, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=ROOT, CHIPSIM_CACHE_DIR=str(tmp_path / "cache")))
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr == f"chipsim: error: {bad}: tiny_kernels.gpu_us_per_kernel: expected a number, got None\n"
    assert not out.exists()


def test_a_built_model_is_checked_against_its_shape():
    pytest.importorskip("transformers")
    from chipsim.tracegen import train
    from chipsim.workload.models import get_model

    model, _, _ = train.build_model("granite-3.1-1b-a400m", train.TINY_WIDTH, 97, 64, 0, "cpu")
    assert train.checked_counts(model, get_model("granite-3.1-1b-a400m"))["num_layers"] == 24
    with pytest.raises(train.ShapeMismatchError, match="^built model has num_layers=24, the shape phi-mini-moe says 32$"):
        train.checked_counts(model, get_model("phi-mini-moe"))


def test_train_reports_a_shape_mismatch_in_one_line(tmp_path, monkeypatch, capsys):
    """A model whose counts are not its shape's (here granite-1b's model built for --shape phi-mini-moe, as a bug
    in build_config would): main prints one line and exits 1 before it trains or writes anything."""
    pytest.importorskip("transformers")
    from chipsim.tracegen import train

    data = tmp_path / "data"
    data.mkdir()
    np.save(data / "train.npy", np.arange(4000, dtype=np.uint16) % 97)
    np.save(data / "heldout.npy", np.arange(1000, dtype=np.uint16) % 97)
    (data / "meta.json").write_text(json.dumps({"vocab_size": 97}))
    build = train.build_model
    monkeypatch.setattr(train, "build_model", lambda name, *args: build("granite-3.1-1b-a400m", *args))
    rc = train.main(["--shape", "phi-mini-moe", "--data", str(data), "--out", str(tmp_path / "out"), "--tiny",
                     "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 1
    assert err == "chipsim: error: built model has num_layers=24, the shape phi-mini-moe says 32\n"
    assert list((tmp_path / "out").iterdir()) == []  # nothing trained, nothing written


@pytest.mark.parametrize("shape", ["qwen3-30b-a3b", "gpt-oss-20b", "ernie-4.5-21b-a3b", "granite-4.0-h-tiny",
                                   "moonlight-16b-a3b"])
def test_the_2025_architectures_have_a_training_recipe_at_their_published_counts(shape):
    """train.build_config builds each 2025-26 class at tiny width with the shape's layers, dense first layers,
    experts, top-k and shared experts (what a trace of it must match), and its layer types where it has them."""
    pytest.importorskip("transformers")
    from chipsim.tracegen import train
    from chipsim.workload.models import get_model

    model, cfg, aux = train.build_model(shape, train.TINY_WIDTH, 97, 64, 0, "cpu")
    counts = train.checked_counts(model, get_model(shape))  # raises on any count that differs
    assert counts["num_layers"] == get_model(shape).num_layers and aux["coef"] > 0
    want = get_model(shape).layer_types
    if want:  # gpt-oss's alternating windows, Granite-4.0-H's Mamba2 positions (transformers: linear_attention)
        built = ["mamba" if t in ("mamba", "linear_attention") else t for t in cfg.layer_types]
        assert [t == "mamba" for t in built] == [t == "mamba" for t in want]
        if "sliding_attention" in want:
            assert built == list(want) and cfg.sliding_window == get_model(shape).sliding_window
