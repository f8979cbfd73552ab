"""The concept pages' generated sections (chipsim.analysis.docs_concepts) say what the code and the repository's files
say: thor.yaml's energy entries and ASSUMPTIONs, the trace arrays, and rows quoted from REPRODUCTION.md."""

from __future__ import annotations

import pytest

from chipsim.analysis import docs_concepts as dc
from chipsim.analysis.docs_gen import SECTIONS


def _first_cells(table: str) -> list[str]:
    return [row.split("|")[1].strip() for row in table.splitlines()[2:]]


def test_every_concept_section_is_registered_and_renders_a_table():
    for name in dc.SECTIONS:
        assert SECTIONS[name] is dc.SECTIONS[name]
        assert SECTIONS[name]().startswith("| "), name


def test_the_assumptions_table_lists_the_keys_the_sweep_test_holds_to_a_sweep():
    listed = [cell.strip("`") for cell in _first_cells(dc.assumptions())]
    assert listed == dc.assumed_keys(dc.THOR) and len(listed) >= 15
    assert "none" not in [row.split("|")[4].strip() for row in dc.assumptions().splitlines()[2:]]


def test_the_energy_table_prices_every_entry_of_thors_ledger_but_the_measured_ones():
    from chipsim.hw.config import load_config
    from chipsim.sim.energy import EnergyTable

    hw = load_config(dc.THOR, ["memory.hbm.timing_model=closed-form", "memory.lpddr5x.timing_model=closed-form"]).hw
    ledger = set(EnergyTable.from_config(hw).category_of) - {"arrays_profiled"}  # thor lists no measured energies
    rows = dc.energy_table().splitlines()[2:]
    assert {row.split("|")[3].strip().strip("`") for row in rows} == ledger
    hbm = next(row for row in rows if row.startswith("| `memory.hbm.energy_pj_per_bit`"))
    assert "on-chip active" in hbm and "APEX Table III" in hbm  # in the package, and its source quoted


def test_a_short_comment_is_joined_by_the_block_above_its_key(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("compute:\n  # why this value: a long explanation\n  leak: 1.0  # ASSUMPTION\n"
                      "  mac: 0.9  # a source that says enough on its own, at length\n")
    keys = dc.commented_keys(str(config))
    assert [(k, v) for k, v, *_ in keys] == [("compute.leak", "1.0"), ("compute.mac", "0.9")]
    assert dc._source(*keys[0][2:]) == "ASSUMPTION (why this value: a long explanation)"
    assert dc._source(*keys[1][2:]) == "a source that says enough on its own, at length"


def test_the_trace_arrays_table_lists_every_array_a_trace_may_hold():
    from chipsim.trace.format import CORE_ARRAYS
    from chipsim.trace.predictor_arrays import RECORDED

    listed = [cell.strip("`") for cell in _first_cells(dc.trace_arrays())]
    assert listed == list(CORE_ARRAYS) + [s.name for s in RECORDED]


def test_report_rows_quotes_the_rows_asked_for_and_refuses_what_the_report_lacks(tmp_path):
    report = tmp_path / "R.md"
    report.write_text("# R\n\n## exp: a title\n\ntext\n\n| result | value |\n| --- | --- |\n| a | 1 |\n| b | 2 |\n\n"
                      "after\n\n## other\n")
    assert dc.report_rows("exp:", ("b",), str(report)) == "| result | value |\n| --- | --- |\n| b | 2 |"
    assert dc.report_rows("exp:", path=str(report)).count("\n") == 3
    for heading, rows, why in (("missing", (), "no section"), ("other", (), "no table"), ("exp:", ("c",), "no row")):
        with pytest.raises(ValueError, match=why):
            dc.report_rows(heading, rows, str(report))


def test_the_expert_formats_table_lists_every_named_format():
    from chipsim.hw.expert_formats import FORMATS

    assert [cell.strip("`") for cell in _first_cells(dc.expert_formats())] == list(FORMATS)
