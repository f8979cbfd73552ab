"""MkDocs hook: the pages that are written from the code or from the repository's own reports at build time.

- `<!-- generated: NAME -->` is replaced by chipsim.analysis.docs_gen.SECTIONS[NAME]() (config keys, policies,
  models, results.csv columns): the page lists exactly what the code knows.
- `<!-- include: FILE -->` is replaced by FILE from the repository root (REPRODUCTION.md, VALIDATION.md): the
  report is read, not copied, so the site shows the committed one. Their figures (results/reproduce/*/*.png,
  validation/figures/*.png) are added to the site under the same paths, so the reports' repository-relative
  links resolve from a page at the top of docs/.

An unknown marker or a missing file is an error, so a strict build fails rather than shipping a stale page.
"""

from __future__ import annotations

import glob
import os
import re

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = re.compile(r"<!-- (generated|include): ([\w./-]+) -->")
FIGURES = ("results/reproduce/*/*.png", "validation/figures/*.png")


def _replace(match: re.Match) -> str:
    from chipsim.analysis.docs_gen import SECTIONS

    kind, name = match.groups()
    if kind == "generated":
        if name not in SECTIONS:
            raise PluginError(f"docs: <!-- generated: {name} -->: no such section "
                              "(chipsim.analysis.docs_gen.SECTIONS)")
        return SECTIONS[name]()
    path = os.path.join(ROOT, name)
    if not os.path.isfile(path):
        raise PluginError(f"docs: <!-- include: {name} -->: no such file in the repository")
    with open(path, encoding="utf-8") as f:
        return f.read()


def on_page_markdown(markdown, page, config, files):
    return MARKER.sub(_replace, markdown)


def on_files(files, config):
    for pattern in FIGURES:
        for path in sorted(glob.glob(pattern, root_dir=ROOT)):
            files.append(File(path, src_dir=ROOT, dest_dir=config["site_dir"],
                              use_directory_urls=config["use_directory_urls"]))
    return files
