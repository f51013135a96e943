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
  ``nbval-skip``), never ``# NBVAL_...`` comments that a learner would read as code;
- saves no path of the machine it was executed on: in tracebacks, error messages, printed text
  and plain-text results, ``/home/me/mha-course/mha_course/softmax.py`` is saved as
  ``mha_course/softmax.py`` and ``.../lib/python3.12/site-packages/numpy/...`` as
  ``<site-packages>/numpy/...`` (:func:`portable_paths`). nbval never compares tracebacks;
  ``tests/nbval_sanitize.cfg`` applies the same rewrites to the text it does compare.
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

#: Where an absolute path may start: not inside a word or a relative path (nor a URL's ``//``),
#: but right after a terminal colour code, as IPython's tracebacks print file names.
_START = r"(?:(?<=\x1b\[\dm)|(?<=\x1b\[\d\dm)|(?<![\w.~>/-]))"
_PART = r"/[\w.+@~-]+"  # one component of a path
#: The folders of the course's checkout: a path is kept from the first of them on.
CHECKOUT_FOLDERS = ("mha_course", "notebooks", "solutions", "exercises", "tests", "benchmarks")
#: Absolute paths of the machine a notebook ran on -> their stable form: ``(regex, replacement)``
#: applied in this order. tests/nbval_sanitize.cfg repeats them word for word, so that nbval
#: compares a fresh run's printed paths with the saved ones (tests/test_tidy.py checks it does).
PATH_REWRITES = (
    # an installed package: /x/.venv/lib/python3.12/site-packages/numpy/ -> <site-packages>/numpy/
    (rf"{_START}(?:{_PART})+?/(?:site|dist)-packages/", "<site-packages>/"),
    # the code of a notebook cell, as warnings name it: /tmp/ipykernel_123/456.py -> <cell>
    (rf"{_START}(?:{_PART})*?/ipykernel_\d+/\d+\.py\b", "<cell>"),
    # the course's own files: /home/me/mha-course/mha_course/softmax.py -> mha_course/softmax.py
    (rf"{_START}(?:{_PART})+?/(mha_course/)", r"\1"),
    (rf"{_START}(?:{_PART})+?/((?:{'|'.join(CHECKOUT_FOLDERS[1:])})/)", r"\1"),
    # the standard library: /usr/lib/python3.12/json/decoder.py -> <stdlib>/json/decoder.py
    (rf"{_START}(?:{_PART})*?/lib/python3\.\d+/", "<stdlib>/"),
)
_REWRITES = [(re.compile(regex), replace) for regex, replace in PATH_REWRITES]


def portable_paths(text: str) -> str:
    """``text`` with every absolute path of this machine in its stable form (see the module).

    Examples
    --------
    >>> portable_paths("File /home/me/course/mha_course/softmax.py:62, in softmax")
    'File mha_course/softmax.py:62, in softmax'
    >>> portable_paths("/srv/venv/lib/python3.12/site-packages/numpy/core.py:3: UserWarning")
    '<site-packages>/numpy/core.py:3: UserWarning'
    >>> portable_paths("https://github.com/org/repo/tree/main/mha_course/ and a/b/tests/x")
    'https://github.com/org/repo/tree/main/mha_course/ and a/b/tests/x'
    """
    for pattern, replace in _REWRITES:
        text = pattern.sub(replace, text)
    return text


def _texts(output):
    """``(container, key)`` of each text of ``output`` that may hold a path."""
    kind = output.get("output_type")
    if kind == "stream":
        yield output, "text"
    elif kind == "error":
        yield output, "evalue"
        for i in range(len(output.get("traceback", []))):
            yield output["traceback"], i
    elif kind in ("execute_result", "display_data") and "text/plain" in output.get("data", {}):
        yield output["data"], "text/plain"


def _portable_outputs(outputs) -> int:
    """Rewrite the paths in ``outputs`` in place (:func:`portable_paths`); return how many
    texts changed."""
    changed = 0
    for output in outputs:
        for container, key in _texts(output):
            text = container[key]
            new = (portable_paths(text) if isinstance(text, str)
                   else [portable_paths(line) for line in text])
            if new != text:
                container[key] = new
                changed += 1
    return changed


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
        _portable_outputs(cell.outputs)
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
        if _portable_outputs(copy.deepcopy(cell.get("outputs", []))):
            found.append(f"cell {index}: a path of the machine it ran on in its output")
    return found
