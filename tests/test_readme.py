"""README.md stays short and true: at most 200 lines (issue #45), its table of the main job's columns is the code's
own (chipsim.analysis.docs_gen.table_columns; CHIPSIM_DOCS_UPDATE=1 rewrites it), every link in it reaches a file
of the repository, and the common tasks it lists name only config keys, policies and files that exist. Its console
block (the main job and what it prints) is run by tests/test_docs_examples.py."""

from __future__ import annotations

import os
import re
import shlex

from conftest import ROOT

from chipsim.analysis.docs_gen import table_columns
from chipsim.hw.config import iter_key_specs, load_config
from chipsim.policies.base import make_policy, make_request_policies, split_request_spec

README = os.path.join(ROOT, "README.md")
REGION = re.compile(r"(<!-- generated: table-columns [^\n]*-->\n)(.*?)(<!-- end generated -->)", re.DOTALL)
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _text() -> str:
    with open(README, encoding="utf-8") as f:
        return f.read()


def test_readme_is_at_most_200_lines():
    assert len(_text().splitlines()) <= 200


def test_readme_column_table_is_the_codes():
    text = _text()
    match = REGION.search(text)
    assert match, "README.md lost its generated table-columns region"
    want = table_columns() + "\n"
    if os.environ.get("CHIPSIM_DOCS_UPDATE") == "1" and match.group(2) != want:
        with open(README, "w", encoding="utf-8") as f:
            f.write(text[:match.start(2)] + want + text[match.end(2):])
        return
    assert match.group(2) == want, "README.md's column table differs from the code's (CHIPSIM_DOCS_UPDATE=1 rewrites)"


def test_readme_links_reach_files():
    targets = [t for t in LINK.findall(_text()) if "://" not in t]
    assert targets, "README.md links to nothing"
    missing = [t for t in targets if not os.path.exists(os.path.join(ROOT, t))]
    assert missing == []


def _task_commands() -> list[list[str]]:
    """The `chipsim run` and `chipsim sweep` commands of README's bash blocks, continuation lines joined."""
    bodies = re.findall(r"^```bash\n(.*?)^```", _text(), re.MULTILINE | re.DOTALL)
    joined = "\n".join(bodies).replace("\\\n", " ")
    lines = [line.split("#")[0].split("&&")[0] for line in joined.splitlines()]
    return [shlex.split(line) for line in lines if line.strip().startswith(("chipsim run", "chipsim sweep"))]


def test_readme_tasks_name_real_keys_policies_and_configs():
    """Each `chipsim run` or `sweep` of the tasks loads its config with its --set values (and each --grid value)
    through the real loader (a wrong key or value fails as it would for a user) and builds each of its policies;
    a `path/to/` value stands for the reader's own file, so only its key is checked."""
    keys = {key for key, *_ in iter_key_specs()}
    commands = _task_commands()
    assert len(commands) >= 5 and any(argv[1] == "sweep" for argv in commands)
    for argv in commands:
        pairs = list(zip(argv, argv[1:]))
        sets = [value for flag, value in pairs if flag == "--set"]
        assert {s.split("=")[0] for s in sets if "path/to/" in s} <= keys
        sets = [s for s in sets if "path/to/" not in s]
        grids = [[f"{key}={v}" for v in values.split(",")]
                 for key, values in (g.split("=", 1) for flag, g in pairs if flag == "--grid")]
        for point in ([[*sets, value] for grid in grids for value in grid] or [sets]):
            load_config(os.path.join(ROOT, argv[2]), point)
        for spec in (value for flag, value in pairs if flag == "--policy"):
            if split_request_spec(spec):
                make_request_policies(spec, {}, "on-demand")
            else:
                make_policy(spec, {})
