"""`chipsim report DIR`: one self-contained HTML page of a run or sweep directory — the table's numbers as
results.csv has them, one curve per policy for a sweep, the same bytes twice, bad input in one line with nothing
written, and (where Debian's Chromium is installed) every figure drawn by the page opened from disk."""

import csv
import html
import json
import os
import re
import shutil
import subprocess

import pytest
from conftest import THOR

from chipsim.cli import main

POLICIES = ["no-prefetch", "promoe", "oracle"]
SHORT = ["--set", "workload.max_tokens=8", "--jobs", "1"]
RUN_FIGURES = ["fig-latency-energy", "fig-per-layer-stall_ms", "fig-per-layer-overlap", "fig-energy-categories",
               "fig-energy-components"]
CHROMIUM = shutil.which("chromium")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "run"
    policies = [arg for name in POLICIES for arg in ("--policy", name)]
    assert main(["run", THOR, *policies, "--out", str(out), *SHORT]) == 0
    return out


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "sweep"
    assert main(["sweep", THOR, "--grid", "expert_buffer.capacity_mib=48,192", "--policy", "no-prefetch", "--policy",
                 "oracle", "--out", str(out), "--quiet", *SHORT]) == 0
    return out


def _report(directory, *extra) -> str:
    assert main(["report", str(directory), *extra]) == 0
    return (directory / "report.html").read_text(encoding="utf-8") if not extra else ""


def _csv_rows(path):
    with open(path, encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _plotly_calls(page: str) -> dict[str, list[dict]]:
    """div id -> the traces the page hands Plotly.newPlot for it (the JSON after the id)."""
    calls = {}
    for match in re.finditer(r'Plotly\.newPlot\(\s*"([^"]+)",\s*', page):
        traces, _ = json.JSONDecoder().raw_decode(page, match.end())
        calls[match.group(1)] = traces
    return calls


def test_run_report_is_self_contained_and_shows_results_csv_numbers(run_dir, capsys):
    page = _report(run_dir)
    assert f"wrote {run_dir / 'report.html'}" in capsys.readouterr().out
    # nothing fetched: no script or stylesheet from elsewhere, plotly's JS inline (once)
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)\s*=", page, re.I)
    assert page.count("<script") == 1 + len(RUN_FIGURES)
    run = json.loads((run_dir / "results.json").read_text())["run"]
    for key in ("config_sha256", "trace_sha256", "code_sha256"):
        assert run[key] in page
    for row in _csv_rows(run_dir / "results.csv"):
        assert f"<td class=\"text\">{row['policy']}</td>" in page
        for key, fmt in (("latency_ms_per_token", "{:.3f}"), ("latency_p99_ms", "{:.3f}"),
                         ("energy_mj_per_token", "{:.2f}"), ("edp_mj_ms", "{:.1f}")):
            assert f"<td>{fmt.format(float(row[key]))}</td>" in page
    calls = _plotly_calls(page)
    assert list(calls) == RUN_FIGURES
    latency = calls["fig-latency-energy"][0]  # the bars carry results.csv's values themselves
    assert latency["x"] == POLICIES
    assert latency["y"] == [float(r["latency_ms_per_token"]) for r in _csv_rows(run_dir / "results.csv")]
    assert [t["name"] for t in calls["fig-per-layer-stall_ms"]] == POLICIES


def test_same_directory_gives_the_same_bytes(run_dir, tmp_path):
    first, second = tmp_path / "a.html", tmp_path / "b.html"
    _report(run_dir, "--out", str(first))
    _report(run_dir, "--out", str(second))
    assert first.read_bytes() == second.read_bytes()
    assert not re.search(rb'id="[0-9a-f]{8}-[0-9a-f]{4}-', first.read_bytes())  # no random (UUID) div ids


def test_sweep_report_draws_one_curve_per_policy_with_a_metric_menu(sweep_dir):
    page = _report(sweep_dir)
    (figure,) = _plotly_calls(page).values()
    assert [t["name"] for t in figure] == ["no-prefetch", "oracle"]
    rows = _csv_rows(sweep_dir / "results.csv")
    for trace in figure:
        mine = [r for r in rows if r["policy"] == trace["name"]]
        assert trace["x"] == [48, 192]
        assert trace["y"] == [float(r["latency_ms_per_token"]) for r in mine]
    assert '"label":"E mJ (energy_mj_per_token)"' in page  # the menu switches the metric
    assert "expert_buffer.capacity_mib" in page and "<td class=\"text\">192</td>" in page


def _fails(args, capsys, expected: str):
    assert main(["report", *map(str, args)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("chipsim: error: ") and expected in err, err


def test_bad_input_is_one_line_and_writes_nothing(run_dir, tmp_path, capsys):
    _fails([tmp_path / "absent"], capsys, "absent: not a directory")
    _fails([tmp_path], capsys, "no results.json (chipsim run --out) or sweep.json")
    cases = {"notjson": "{", "noresults": '{"run": {}}', "norows": '{"run": {}, "results": []}'}
    record = json.loads((run_dir / "results.json").read_text())
    del record["results"][1]["latency_ms_per_token"]
    cases["nolatency"] = json.dumps(record)
    record = json.loads((run_dir / "results.json").read_text())
    record["results"][0]["latency_ms_per_token"] = float("nan")  # (json.dumps writes NaN, as an edit could)
    cases["nanlatency"] = json.dumps(record)
    record = json.loads((run_dir / "results.json").read_text())
    record["results"][2]["energy_mj_per_token"] = -5
    cases["negenergy"] = json.dumps(record)
    record = json.loads((run_dir / "results.json").read_text())
    record["results"][1]["per_layer"]["overlap"][3] = float("inf")
    cases["infoverlap"] = json.dumps(record)
    messages = {"notjson": "results.json: not JSON", "noresults": "results.json: key 'results' missing",
                "norows": "key 'results' holds no rows", "nolatency": "results[1].latency_ms_per_token: missing",
                "nanlatency": "results[0].latency_ms_per_token: nan is not a finite number",
                "negenergy": "results[2].energy_mj_per_token: -5 is below 0",
                "infoverlap": "results[1].per_layer.overlap[3]: inf is not a finite number"}
    for name, text in cases.items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / "results.json").write_text(text)
        _fails([folder], capsys, messages[name])
        assert os.listdir(folder) == ["results.json"]  # no page, no temporary file
    _fails([run_dir, "--out", tmp_path / "nowhere" / "r.html"], capsys, "does not exist")
    assert not (tmp_path / "nowhere").exists()


def _browser_dom(page, profile) -> str:
    """The page's DOM after headless Chromium opened it from disk (file://) and its scripts ran. Flags as the
    machine's notes give them: no sandbox as root, no background connections on a closed network."""
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                           "--no-first-run", "--disable-background-networking", "--disable-component-update",
                           "--disable-sync", f"--user-data-dir={profile}", "--virtual-time-budget=5000",
                           "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=60).stdout


# picks the sweep menu's entry for E mJ as a click would, then leaves the figure's y title and values on <body>
PICK_ENERGY = """<script>
const gd = document.getElementById("fig-sweep-0");
const pick = gd.layout.updatemenus[0].buttons.find(b => b.label.includes("(energy_mj_per_token)"));
Plotly.update(gd, pick.args[0], pick.args[1]).then(() => {
  document.body.dataset.ytitle = gd.layout.yaxis.title.text;
  document.body.dataset.y = JSON.stringify(gd.data.map(t => Array.from(t.y)));
});
</script>"""


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")
def test_pages_draw_from_disk_in_headless_chromium(run_dir, sweep_dir, tmp_path):
    page = run_dir / "browser.html"
    _report(run_dir, "--out", str(page))
    dom = _browser_dom(page, tmp_path / "profile")
    for div_id in RUN_FIGURES:  # plotly marks a div it has drawn into
        assert re.search(rf'id="{div_id}" class="[^"]*js-plotly-plot', dom), div_id
    legend = re.findall(r'class="legendtext"[^>]*data-unformatted="([^"]+)"', dom)
    assert all(policy in legend for policy in POLICIES)
    # the sweep's metric menu: its entry for energy puts results.csv's energies on the curves
    page = tmp_path / "sweep.html"
    _report(sweep_dir, "--out", str(page))
    page.write_text(page.read_text(encoding="utf-8").replace("</body>", PICK_ENERGY + "</body>"), encoding="utf-8")
    body = re.search(r"<body[^>]*>", _browser_dom(page, tmp_path / "profile")).group(0)
    assert 'data-ytitle="E mJ (energy_mj_per_token)"' in body
    rows = _csv_rows(sweep_dir / "results.csv")
    energies = [[float(r["energy_mj_per_token"]) for r in rows if r["policy"] == p] for p in ("no-prefetch", "oracle")]
    assert json.loads(html.unescape(re.search(r'data-y="([^"]+)"', body).group(1))) == energies
