"""Notebook hygiene: what a committed notebook of the course may and may not carry.

Not taught in a lesson: the maintainers' tool behind ``make notebook NB=...`` (execute, then tidy)
and ``python -m mha_course tidy [--check] PATH...``; ``tests/test_notebook_hygiene.py`` holds
every notebook to it. A tidy notebook

- names the kernel that ipykernel installs (:data:`KERNELSPEC`), so JupyterLab does not rewrite
  the metadata on open and mark the file modified;
- carries no per-cell ``execution`` timing metadata (it changes at every run, dirtying git);
- carries no saved widget state (``metadata.widgets``) and no output of a live widget (without
  the state, JupyterLab can only show "Error displaying widget" or the raw ``VBox(...)`` text);
  the widget appears when the learner runs the cell;
- marks nbval's exceptions with cell tags only (``nbval-ignore-output``, ``raises-exception``,
  ``nbval-skip``), never ``# NBVAL_...`` comments that a learner would read as code.
"""

from __future__ import annotations

import copy
import re

KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
#: ``# NBVAL_...`` comment -> the cell tag nbval reads instead.
MARKER_TAGS = {
    "NBVAL_IGNORE_OUTPUT": "nbval-ignore-output",
    "NBVAL_RAISES_EXCEPTION": "raises-exception",
    "NBVAL_SKIP": "nbval-skip",
    "NBVAL_CHECK_OUTPUT": "nbval-check-output",
}
MARKER_LINE = re.compile(r"^[ \t]*#[ \t]*(NBVAL_[A-Z_]+)[ \t]*\n?", re.MULTILINE)


def tidy(nb):
    """Return a tidy copy of ``nb`` (an nbformat notebook); ``nb`` itself is not changed.

    Examples
    --------
    >>> import nbformat
    >>> nb = nbformat.v4.new_notebook()
    >>> nb.cells.append(nbformat.v4.new_code_cell("# NBVAL_IGNORE_OUTPUT\\nprint(1)"))
    >>> cell = tidy(nb).cells[0]
    >>> cell.source, cell.metadata["tags"]
    ('print(1)', ['nbval-ignore-output'])
    """
    nb = copy.deepcopy(nb)
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type != "code":
            continue
        markers = [m.group(1) for m in MARKER_LINE.finditer(cell.source)]
        if markers:
            cell.source = MARKER_LINE.sub("", cell.source)
            tags = list(cell.metadata.get("tags", []))
            for marker in markers:
                tag = MARKER_TAGS.get(marker, marker.lower().replace("_", "-"))
                if tag not in tags:
                    tags.append(tag)
            cell.metadata["tags"] = tags
        cell.outputs = [out for out in cell.get("outputs", [])
                        if WIDGET_VIEW not in out.get("data", {})]
    return nb


def problems(nb) -> list[str]:
    """What keeps ``nb`` from being tidy, one line each (empty: tidy)."""
    found = []
    if nb.metadata.get("kernelspec") != KERNELSPEC:
        found.append(f"kernelspec is {nb.metadata.get('kernelspec')!r}, not {KERNELSPEC!r}")
    if "widgets" in nb.metadata:
        found.append("saved widget state in metadata.widgets")
    for index, cell in enumerate(nb.cells):
        if "execution" in cell.metadata:
            found.append(f"cell {index}: execution timing metadata")
        if cell.cell_type != "code":
            continue
        for marker in MARKER_LINE.findall(cell.source):
            found.append(f"cell {index}: a '# {marker}' comment (use the cell tag instead)")
        if any(WIDGET_VIEW in out.get("data", {}) for out in cell.get("outputs", [])):
            found.append(f"cell {index}: the saved output of a live widget")
    return found
