"""Every link into a section of another course notebook (``05_layer_to_model.ipynb#6.-The-...``)
lands on a heading that exists.

JupyterLab gives each rendered Markdown heading an ``id``: the heading's text as displayed
(inline Markdown such as backticks, emphasis and links rendered away) with every space replaced
by ``-``; a link ``NN_name.ipynb#that-id`` scrolls to it, and a stale one silently opens the
notebook at its top. ``tests/test_notebook_hygiene.py`` checks that the linked notebooks exist;
this checks the part after ``#``.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(
    p.relative_to(ROOT).as_posix()
    for folder in ("notebooks", "notebooks/deep_dives", "solutions", "exercises")
    for p in (ROOT / folder).glob("*.ipynb")
)
ANCHORED_LINK = re.compile(
    r"\]\(((?:\.\./){0,2}(?:notebooks/|exercises/|solutions/)?(?:deep_dives/)?\d\d[a-z]?_\w+\.ipynb)"
    r"#([^)\s]+)\)")
HEADING = re.compile(r"^ {0,3}#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def anchor(heading: str) -> str:
    """JupyterLab's id of a Markdown heading: its displayed text, spaces turned into '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link shows its text
    text = re.sub(r"`([^`]*)`", r"\1", text)  # code spans show their content
    text = re.sub(r"(\*\*|__|\*|(?<!\w)_(?=\S)|(?<=\S)_(?!\w))", "", text)  # emphasis markers
    return text.strip().replace(" ", "-")


@cache
def anchors_of(path: Path) -> frozenset[str]:
    nb = nbformat.read(path, as_version=4)
    return frozenset(anchor(h) for c in nb.cells if c.cell_type == "markdown"
                     for h in HEADING.findall(c.source))


def broken_anchors(path: str, root: Path = ROOT) -> list[str]:
    """The anchored links of notebook ``root / path`` whose target has no such heading."""
    here = root / path
    broken = []
    for i, cell in enumerate(nbformat.read(here, as_version=4).cells):
        if cell.cell_type != "markdown":
            continue
        for link, target in ANCHORED_LINK.findall(cell.source):
            notebook = (here.parent / link).resolve()
            if notebook.is_file() and target not in anchors_of(notebook):
                broken.append(f"{path} cell {i}: {link}#{target}")
    return broken


@pytest.mark.parametrize("path", NOTEBOOKS)
def test_every_link_to_a_section_of_a_notebook_lands_on_one_of_its_headings(path):
    broken = broken_anchors(path)
    assert not broken, "links to headings that do not exist: " + "; ".join(broken)


def test_anchors_are_the_displayed_heading_text_with_dashes():
    assert anchor("6. The block around attention: residual, LayerNorm and RMSNorm") == (
        "6.-The-block-around-attention:-residual,-LayerNorm-and-RMSNorm")
    assert anchor("2.2 The whole model, inline, against the package's `GPT`") == (
        "2.2-The-whole-model,-inline,-against-the-package's-GPT")
    assert anchor("**Bold** and *emphasis* keep d_k") == "Bold-and-emphasis-keep-d_k"


def test_a_stale_anchor_is_reported(tmp_path):
    target = tmp_path / "notebooks" / "05_x.ipynb"
    target.parent.mkdir()
    nbformat.write(nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("## 6. The block around attention: residual and RMSNorm")]),
        target)
    source = target.parent / "09_y.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(
        "see [§6](05_x.ipynb#6.-The-block-around-attention:-residual-and-LayerNorm) and "
        "[§6 again](05_x.ipynb#6.-The-block-around-attention:-residual-and-RMSNorm)")]), source)
    assert broken_anchors("notebooks/09_y.ipynb", root=tmp_path) == [
        "notebooks/09_y.ipynb cell 0: "
        "05_x.ipynb#6.-The-block-around-attention:-residual-and-LayerNorm"]
