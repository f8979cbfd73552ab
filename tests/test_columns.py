"""chipsim/analysis/columns.py gives every results.csv column a meaning, and only columns the code writes: the
documentation's columns page is generated from it, so a column added without a meaning, or a meaning left for a
column that is gone, fails here."""

from __future__ import annotations

import contextlib
import csv
import io

from conftest import THOR

from chipsim.analysis import columns
from chipsim.analysis.report import CSV_COLUMNS
from chipsim.cli import main
from chipsim.policies.base import phase_names
from chipsim.serve.metrics import SERVED_COLUMNS
from chipsim.sim.metrics import BATCH_COLUMNS, REQUEST_COLUMNS, SPECULATIVE_COLUMNS, UNION_COLUMN

DEEPSEEK = THOR.replace("thor.yaml", "thor-deepseek-v2-lite.yaml")


def _csv_header(tmp_path, config: str, overrides: list[str], specs: list[str]) -> list[str]:
    out = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
    argv = ["run", config, "--out", str(out), "--jobs", "1"]
    for o in overrides:
        argv += ["--set", o]
    for s in specs:
        argv += ["--policy", s]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(argv) == 0
    with open(out / "results.csv", newline="") as f:
        return next(csv.reader(f))


def test_every_run_column_has_a_meaning_in_csv_order():
    assert list(columns.RUN_COLUMNS) == CSV_COLUMNS


def test_each_mode_lists_exactly_the_columns_the_code_names():
    modes = {title.split(" (")[0]: set(cols) for title, cols in columns.MODE_COLUMNS.items()}
    assert modes["several tokens a step"] == {UNION_COLUMN}
    assert set(REQUEST_COLUMNS) <= modes["a whole request"]
    assert modes["a batch"] == set(BATCH_COLUMNS)
    assert modes["speculative decoding"] == set(SPECULATIVE_COLUMNS)
    assert modes["served requests"] == set(SERVED_COLUMNS)


def test_every_column_the_runs_write_has_a_meaning_and_every_meaning_a_column(tmp_path):
    """Every decode policy (with the variants that report other columns) on DeepSeek-V2-Lite, whose trace carries
    every predictor, and thor in each mode: the union of their results.csv headers is the registry."""
    specs = phase_names("decode") + ["promoe:cache=false", "oracle:lookahead=0"]
    seen = set(_csv_header(tmp_path, DEEPSEEK, ["workload.max_tokens=4"], specs))
    seen |= set(_csv_header(tmp_path, DEEPSEEK, ["workload.max_tokens=4", "model.expert_bits=8"], ["floe"]))
    request = ["workload.prompt_tokens=8", "workload.output_tokens=3"]
    seen |= set(_csv_header(tmp_path, THOR, request, ["on-demand:keep=0.5+apex", "fiddler-prefill+lru"]))
    seen |= set(_csv_header(tmp_path, THOR, ["workload.batch=2", "workload.max_tokens=4"], ["apex"]))
    seen |= set(_csv_header(tmp_path, THOR, ["workload.speculative.draft_tokens=2", "workload.max_tokens=4"],
                            ["apex"]))
    served = ["workload.requests=2", "workload.arrivals.closed_users=1", "workload.prompt_tokens=8",
              "workload.output_tokens=3"]
    seen |= set(_csv_header(tmp_path, THOR, served, ["apex"]))
    documented = set(columns.all_columns())
    assert seen - documented == set(), "results.csv columns with no meaning in chipsim/analysis/columns.py"
    assert documented - seen == set(), "meanings in chipsim/analysis/columns.py for columns no run wrote"
