"""Driving JupyterLab 4 from Playwright: open a notebook, wait for its kernel, run it, read it.

The server runs with ``--LabApp.expose_app_in_browser``, so ``window.jupyterapp`` is the
application: commands run through ``app.commands.execute`` (``runmenu:run-all`` is the Run menu's
"Run All Cells"), and cell outputs are read from the notebook model, where an ``error`` output
is told apart from a ``stderr`` stream (both render with
``data-mime-type="application/vnd.jupyter.stderr"`` in the DOM).
"""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Where the lessons come from (override only to debug the suite on other notebooks).
LESSONS_DIR = Path(os.environ.get("MHA_COURSE_LESSONS_DIR", REPO / "notebooks"))
#: The cell tag that marks a deliberate error: nbval expects the exception, and JupyterLab's Run
#: All carries on past the cell (without it, Run All stops there for the learner).
RAISES_TAG = "raises-exception"


def lessons() -> list[Path]:
    """The numbered lessons (``NN_topic.ipynb``), in course order."""
    return sorted(LESSONS_DIR.glob("[0-9][0-9]_*.ipynb"))


def notebooks() -> list[Path]:
    """Every notebook the suite runs in JupyterLab: the lessons, then the others (the app's
    ``app.ipynb``, which ``make app`` serves with Voila, runs in JupyterLab too). The
    appendices (``appendix_*.ipynb``) need PyTorch: without it they are left out, as ``make
    nbval`` leaves them out."""
    others = sorted(set(LESSONS_DIR.glob("*.ipynb")) - set(lessons()))
    if importlib.util.find_spec("torch") is None:
        others = [p for p in others if not p.name.startswith("appendix_")]
    return lessons() + others


# Finds the open NotebookPanel for a path. Every script below starts with it.
_FIND = """
const app = window.jupyterapp;
const panel = app && Array.from(app.shell.widgets('main')).find(
  w => w.context && w.context.path === path && w.content && w.sessionContext);
"""


def open_lab(page, server) -> None:
    """Load JupyterLab (token in the URL) and wait until it has restored its layout."""
    page.goto(server.lab_url("lab"))
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell", timeout=60_000)
    page.evaluate("async () => { await window.jupyterapp.restored; }")


def open_notebook(page, path: str) -> None:
    """Open ``path`` (relative to the server root) as a notebook and wait for its panel."""
    page.evaluate(
        "async (path) => { await window.jupyterapp.commands.execute('docmanager:open', {path}); }",
        path,
    )
    page.wait_for_function(
        f"(path) => {{ {_FIND} return !!(panel && panel.context.isReady); }}",
        arg=path,
        timeout=60_000,
    )


def close_notebook(page, path: str) -> None:
    """Close the notebook's panel without saving (the kernel is stopped separately)."""
    page.evaluate(
        f"""(path) => {{ {_FIND}
          if (panel) {{ panel.context.model.dirty = false; panel.dispose(); }}
        }}""",
        path,
    )


def panel_id(page, path: str) -> str:
    """The DOM id of the notebook's panel, to scope locators to it."""
    return page.evaluate(f"(path) => {{ {_FIND} return panel.id; }}", path)


def dialog_text(page) -> str | None:
    """Text of an open JupyterLab dialog (e.g. "Select Kernel"), if any."""
    dialog = page.locator(".jp-Dialog")
    return dialog.first.inner_text() if dialog.count() else None


def wait_for_kernel(page, server, path: str, timeout: float = 60.0) -> str:
    """Wait until a kernel is attached, connected and idle; return its name.

    The toolbar says "idle" for a moment before any kernel exists, so this requires the
    session's kernel itself (name, connection, status), the toolbar's kernel name, and the
    server's own view (``/api/sessions``: a session for ``path`` whose kernel is idle).
    """
    script = f"""(path) => {{ {_FIND}
      if (!panel) return null;
      const sc = panel.sessionContext;
      const kernel = sc.session && sc.session.kernel;
      if (!kernel || !sc.isReady || kernel.connectionStatus !== 'connected'
          || kernel.status !== 'idle') return null;
      const label = panel.node.querySelector('.jp-Toolbar-kernelName');
      const shown = label ? label.textContent.trim() : '';
      if (!shown || shown === 'No Kernel') return null;
      return {{name: kernel.name, id: kernel.id, shown}};
    }}"""
    deadline = time.monotonic() + timeout
    while True:
        found = page.evaluate(script, path)
        if found:
            sessions = server.api("sessions")
            mine = [s for s in sessions if s["path"] == path and s.get("kernel")]
            if any(
                s["kernel"]["id"] == found["id"] and s["kernel"]["execution_state"] == "idle"
                for s in mine
            ):
                return found["name"]
        if time.monotonic() > deadline:
            raise AssertionError(
                f"no idle kernel for {path} after {timeout:.0f} s; "
                f"page: {found}; dialog: {dialog_text(page)!r}; "
                f"sessions: {server.api('sessions')}"
            )
        page.wait_for_timeout(250)


def run_all(page, path: str, timeout: float = 300.0) -> None:
    """Clear the outputs, run every cell with ``runmenu:run-all``, wait until all finished.

    The command's promise resolves before the cells have run, and the kernel goes idle between
    cells, so finished means: no prompt shows ``[*]``, the kernel is idle, and every non-empty
    code cell has an execution count (or, when run-all stopped at an error, none changed for 3 s).
    ``timeout`` guards against a hang, not a slow machine: lesson 09 needs about 40 CPU seconds,
    which a busy machine stretches past two minutes.
    """
    page.evaluate(
        f"""async (path) => {{ {_FIND}
          app.shell.activateById(panel.id);
          await app.commands.execute('notebook:clear-all-cell-outputs');
          if (!app.commands.hasCommand('runmenu:run-all'))
            throw new Error('JupyterLab has no runmenu:run-all command');
          window.__mhaRunAll = 'running';
          window.__mhaQuiet = null;
          app.commands.execute('runmenu:run-all').then(
            () => {{ window.__mhaRunAll = 'done'; }},
            (err) => {{ window.__mhaRunAll = 'failed: ' + err; }});
        }}""",
        path,
    )
    page.wait_for_function(
        f"""(path) => {{ {_FIND}
          if (window.__mhaRunAll.startsWith('failed')) return true;
          if (window.__mhaRunAll !== 'done') return false;
          const kernel = panel.sessionContext.session.kernel;
          const code = panel.content.widgets.filter(
            c => c.model.type === 'code' && c.model.sharedModel.getSource().trim() !== '');
          const busy = code.some(c => c.promptNode && c.promptNode.textContent.includes('*'));
          const counted = code.filter(c => c.model.executionCount !== null).length;
          if (busy || kernel.status !== 'idle') {{ window.__mhaQuiet = null; return false; }}
          if (counted === code.length) return true;
          // Cells left unnumbered (run-all stopped at an error): done once nothing moved for 3 s.
          // Only after an error that stops Run All: the kernel can report 'idle' for a moment
          // while a long cell still runs (a tqdm widget's messages), and an off-screen cell's
          // prompt is not drawn, so quiet alone does not mean stopped.
          const stopped = code.some(c => !(c.model.getMetadata('tags') || []).includes(
              'raises-exception') && c.model.outputs.toJSON().some(o => o.output_type === 'error'));
          if (!stopped) {{ window.__mhaQuiet = null; return false; }}
          const now = Date.now();
          if (!window.__mhaQuiet || window.__mhaQuiet.counted !== counted)
            window.__mhaQuiet = {{counted, since: now}};
          return now - window.__mhaQuiet.since > 3000;
        }}""",
        arg=path,
        timeout=timeout * 1000,
        polling=250,
    )
    state = page.evaluate("() => window.__mhaRunAll")
    assert state == "done", f"runmenu:run-all {state}"


def wait_for_widgets(page, path: str, timeout: float = 15.0) -> bool:
    """Wait until every widget output is rendered as a widget; False if some are not in time."""
    try:
        page.wait_for_function(
            f"""(path) => {{ {_FIND}
              return panel.content.widgets.every(cell => {{
                if (cell.model.type !== 'code') return true;
                let views = 0;
                for (let i = 0; i < cell.model.outputs.length; i++) {{
                  const data = cell.model.outputs.get(i).toJSON().data;
                  if (data && data['application/vnd.jupyter.widget-view+json']) views++;
                }}
                return views === 0 || cell.outputArea.node.querySelectorAll(
                  '.jupyter-widgets.widget-box, .jupyter-widgets.widget-inline-hbox, '
                  + '.jupyter-widgets.widget-output').length >= views;
              }});
            }}""",
            arg=path,
            timeout=timeout * 1000,
            polling=250,
        )
    except Exception as exc:  # playwright's TimeoutError; the caller's assertion explains
        if "Timeout" not in type(exc).__name__:
            raise
        return False
    return True


def cell_report(page, path: str) -> list[dict]:
    """Every code cell: its index, source, tags, execution count, prompt, outputs as seen.

    ``tags`` are the cell's metadata tags, as JupyterLab loaded them; ``outputs`` lists the
    model's output types ("stream:stderr", "error", "display_data", ...); ``errors`` holds
    "ename: evalue" of each error output; ``dom_stderr`` counts the rendered outputs marked
    application/vnd.jupyter.stderr; ``widget_views`` the widget outputs; ``rendered_widgets``
    the rendered ipywidgets; ``text`` the cell's rendered output text.
    """
    return page.evaluate(
        f"""(path) => {{ {_FIND}
          return panel.content.widgets.map((cell, index) => {{
            if (cell.model.type !== 'code') return null;
            const outputs = [], errors = [];
            let widgetViews = 0;
            for (let i = 0; i < cell.model.outputs.length; i++) {{
              const out = cell.model.outputs.get(i).toJSON();
              outputs.push(out.output_type === 'stream'
                           ? 'stream:' + out.name : out.output_type);
              if (out.output_type === 'error') errors.push(out.ename + ': ' + out.evalue);
              if (out.data && out.data['application/vnd.jupyter.widget-view+json'])
                widgetViews++;
            }}
            const area = cell.outputArea.node;
            return {{
              index,
              source: cell.model.sharedModel.getSource(),
              tags: cell.model.getMetadata('tags') || [],
              count: cell.model.executionCount,
              prompt: cell.promptNode ? cell.promptNode.textContent.trim() : '',
              outputs, errors, widget_views: widgetViews,
              dom_stderr: area.querySelectorAll(
                '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]').length,
              rendered_widgets: area.querySelectorAll('.jupyter-widgets.widget-box, '
                + '.jupyter-widgets.widget-inline-hbox, .jupyter-widgets.widget-output').length,
              text: area.textContent,
            }};
          }}).filter(c => c !== null);
        }}""",
        path,
    )


def screenshot_notebook(page, path: str, stem, max_height: int = 12_000) -> list:
    """Screenshot the whole notebook: hide the side bar, grow the window to the notebook's height.

    A notebook taller than ``max_height`` pixels is saved in parts, scrolled one window apart:
    ``<stem>.png``, ``<stem>-2.png``, ... Returns the files.
    """
    scroller = f"""{_FIND}
      const outer = panel.content.outerNode
        || panel.content.node.querySelector('.jp-WindowedPanel-outer') || panel.content.node;
      // The notebook pads its end so it can scroll past the last cell: measure to that cell.
      const bottom = () => {{
        const last = Math.max(...panel.content.widgets.map(
          c => c.node.isConnected ? c.node.getBoundingClientRect().bottom : -Infinity));
        return Math.ceil(last - outer.getBoundingClientRect().top + outer.scrollTop + 16);
      }};"""
    page.evaluate(
        f"""(path) => {{ {_FIND}
          if (!app.shell.leftCollapsed) app.commands.execute('application:toggle-left-area');
          panel.content.deselectAll();
        }}""",
        path,
    )
    size = page.viewport_size
    # Cells are attached to the page lazily, in idle time: wait until all are there.
    page.wait_for_function(
        f"""(path) => {{ {_FIND}
          return panel.content.widgets.every(
            c => c.node.isConnected && c.node.getBoundingClientRect().height > 0);
        }}""",
        arg=path,
        timeout=15_000,
    )
    window, files, top, part = size["height"], [], 0, 1
    try:
        # Off-screen cells have estimated heights until drawn: grow the window until it fits.
        for _ in range(4):
            chrome, total = page.evaluate(
                f"""(path) => {{ {scroller}
                  return [window.innerHeight - outer.clientHeight, bottom()]; }}""",
                path,
            )
            if total + chrome <= window or window >= max_height:
                break
            window = min(total + chrome + 40, max_height)
            page.set_viewport_size({"width": size["width"], "height": window})
            page.wait_for_timeout(300)
        while True:
            total = page.evaluate(f"(path) => {{ {scroller} return bottom(); }}", path)
            if part > 1 and total - top + chrome + 40 < window:  # the last part: only the rest
                window = total - top + chrome + 40
                page.set_viewport_size({"width": size["width"], "height": window})
            page.evaluate(
                f"""([path, top]) => {{ {scroller} outer.scrollTop = top; }}""", [path, top]
            )
            page.wait_for_timeout(400)  # layout, images and widgets settle
            file = stem.with_name(f"{stem.name}.png" if part == 1 else f"{stem.name}-{part}.png")
            page.screenshot(path=file)
            files.append(file)
            if top + window - chrome >= total or part >= 10:
                return files
            top += window - chrome
            part += 1
    finally:
        page.set_viewport_size(size)


def shutdown_kernel(server, path: str) -> None:
    """Stop this notebook's kernel, so the next lesson does not share the two cores with it."""
    for session in server.api("sessions"):
        if session["path"] == path:
            server.api(f"sessions/{session['id']}", method="DELETE")


def lesson_problems(cells: list[dict], blocked: list[str]) -> list[str]:
    """What is wrong with a lesson's run in JupyterLab, one line each (empty: nothing).

    ``cells`` is :func:`cell_report` after Run All; ``blocked`` the requests the page tried to
    send away from 127.0.0.1 meanwhile. A lesson passes when every non-empty code cell ran, in
    order, from a fresh kernel (execution counts 1..N), only cells tagged ``raises-exception``
    raised and each of them did, no output renders as an error, every widget rendered, and the
    page asked nothing of the network.
    """
    found = []
    ran = [c for c in cells if c["source"].strip()]
    for c in ran:
        tagged = RAISES_TAG in c.get("tags", [])
        if c["errors"] and not tagged:
            found.append(f"cell {c['index']} raised {c['errors'][0]!r} without the "
                         f"'{RAISES_TAG}' tag (Run All stops there for learners)")
        if tagged and not c["errors"]:
            found.append(f"cell {c['index']} is tagged '{RAISES_TAG}' but raised nothing")
        # Rendered stderr that is neither a warning stream nor an expected error is a rendering
        # error ("Javascript Error: ...").
        allowed = c["outputs"].count("stream:stderr") + len(c["errors"])
        if c["dom_stderr"] > allowed:
            found.append(f"cell {c['index']} renders an error: {c['text'][:300]}")
        if "Error displaying widget" in c["text"]:
            found.append(f"cell {c['index']}: {c['text'][:300]}")
        # Without the ipywidgets lab extension a widget falls back to its text repr.
        if c["rendered_widgets"] < c["widget_views"]:
            found.append(f"cell {c['index']}: {c['widget_views']} widget(s) not rendered: "
                         f"{c['text'][:200]}")
    counts = [c["count"] for c in ran]
    if counts != list(range(1, len(ran) + 1)):
        stopped = [c["index"] for c in ran if c["count"] is None]
        found.append(f"execution counts {counts} are not 1..{len(ran)}"
                     + (f"; cells {stopped[:5]} never ran" if stopped else ""))
    found.extend(f"request left 127.0.0.1 (blocked): {url}" for url in blocked)
    return found
