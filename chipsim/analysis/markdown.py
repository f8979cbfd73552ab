"""Markdown tables for the documentation site's generated sections (chipsim.analysis.docs_gen and docs_concepts)."""

from __future__ import annotations


def cell(text) -> str:
    """A value safe inside a Markdown table cell: pipes escaped, line breaks folded."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def code(text) -> str:
    """`text` as inline code; nothing for an empty value."""
    return f"`{text}`" if text not in ("", None) else ""


def table(header: tuple[str, ...], rows) -> str:
    """A Markdown table: the header, its rule, then one line per row, each cell made safe by `cell`."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
