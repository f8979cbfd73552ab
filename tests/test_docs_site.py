"""The documentation site builds with warnings as errors, and its reference pages list what the code knows: every
config key, policy parameter, bundled model and results.csv column (each computed here from the code, not typed),
the Python API's entry points, and the reproduction and validation reports with every figure they link."""

from __future__ import annotations

import glob
import html
import importlib.util
import os
import posixpath
import re

import pytest
from conftest import ROOT

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None,
    reason="the docs extra is not installed (pip install -e '.[docs]'): the site cannot be built")

# a report's links to its figures, relative to the repository root (where docs/hooks.py places them in the site)
FIGURE_LINK = re.compile(r"\]\(((?:results/reproduce|validation/figures)/[^)\s]+\.png)\)")


@pytest.fixture
def site(docs_site):
    """The site as CI builds it (`mkdocs build --strict`), built once per session (conftest.docs_site)."""
    return docs_site


def _page(site, name: str) -> str:
    with open(os.path.join(site, name, "index.html"), encoding="utf-8") as f:
        return html.unescape(f.read())


def test_config_keys_page_lists_every_key_and_policy_parameter(site):
    from chipsim.hw.config import iter_key_specs
    from chipsim.policies import REGISTRY

    page = _page(site, "reference/config-keys")
    keys = [key for key, *_ in iter_key_specs()]
    keys += [f"policies.{name}.{param}" for name, cls in REGISTRY.items() for param in cls.param_specs()]
    assert [k for k in keys if f"<code>{k}</code>" not in page] == []


def test_policies_page_lists_every_policy_and_its_parameters(site):
    from chipsim.policies import REGISTRY

    page = _page(site, "reference/policies")
    missing = [name for name, cls in REGISTRY.items() if f"<code>{name}</code>" not in page or cls.summary not in page]
    missing += [f"{name}.{p}" for name, cls in REGISTRY.items() for p, spec in cls.param_specs().items()
                if f"<code>{p}</code>" not in page or spec.doc not in page]
    assert missing == []


def test_models_page_lists_every_bundled_model(site):
    from chipsim.workload.models import MODELS

    page = _page(site, "reference/models")
    assert [name for name in MODELS if f"<code>{name}</code>" not in page] == []


def test_columns_page_lists_every_column_with_its_meaning(site):
    from chipsim.analysis.columns import all_columns

    page = _page(site, "reference/columns")
    assert [c for c in all_columns() if f"<code>{c}</code>" not in page] == []


def test_api_page_documents_the_entry_points(site):
    page = _page(site, "reference/api")
    for name in ("chipsim.policies.base.Policy", "chipsim.policies.base.SimContext", "chipsim.runner.prepare",
                 "chipsim.runner.simulate", "chipsim.analysis.sweep.run_sweep"):
        assert f'id="{name}"' in page, name


@pytest.mark.parametrize("report, page", [("REPRODUCTION.md", "reproduction"), ("VALIDATION.md", "validation")])
def test_reports_are_pages_with_every_figure_they_link(site, report, page):
    with open(os.path.join(ROOT, report), encoding="utf-8") as f:
        figures = sorted(set(FIGURE_LINK.findall(f.read())))
    assert figures, f"{report} links no figures: FIGURE_LINK is out of date"
    text = _page(site, page)
    assert [p for p in figures if not os.path.isfile(os.path.join(site, p))] == []
    # the page links each where it lies: relative to the page's folder (site/<page>/index.html)
    assert [p for p in figures if f'"{posixpath.relpath(p, page)}"' not in text] == []


def test_reproduce_tutorial_lists_every_experiment_with_its_title(site):
    import yaml

    page = _page(site, "tutorials/reproduce-the-papers")
    paths = sorted(glob.glob(os.path.join(ROOT, "experiments", "*.yaml")))
    assert paths, "no experiments/*.yaml: the list would be empty"
    names = {os.path.basename(p)[:-5]: yaml.safe_load(open(p, encoding="utf-8"))["title"] for p in paths}
    assert [n for n, title in names.items() if f"<code>{n}</code>" not in page or title not in page] == []
