"""Driving JupyterLab 4 from Playwright: open a notebook, wait for its kernel, run it, read it.

The server runs with ``--LabApp.expose_app_in_browser``, so ``window.jupyterapp`` is the
application: commands run through ``app.commands.execute`` (``runmenu:run-all`` is the Run menu's
"Run All Cells"), and cell outputs are read from the notebook model, where an ``error`` output
is told apart from a ``stderr`` stream (both render with
``data-mime-type="application/vnd.jupyter.stderr"`` in the DOM).
"""

from __future__ import annotations

import time

# Finds the open NotebookPanel for a path. Every script below starts with it.
_FIND = """
const app = window.jupyterapp;
const panel = app && Array.from(app.shell.widgets('main')).find(
  w => w.context && w.context.path === path && w.content && w.sessionContext);
"""


def open_notebook(page, server, path: str) -> None:
    """Open ``path`` (relative to the server root) in JupyterLab and wait for its panel."""
    page.goto(server.lab_url(f"lab/tree/{path}"))
    page.wait_for_function(
        f"(path) => {{ {_FIND} return !!(panel && panel.context.isReady); }}",
        arg=path,
        timeout=60_000,
    )


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


def run_all(page, path: str, timeout: float = 120.0) -> None:
    """Clear the outputs, run every cell with ``runmenu:run-all``, wait until all finished.

    The command's promise resolves before the cells have run, and the kernel goes idle between
    cells, so finished means: no prompt shows ``[*]``, the kernel is idle, and every non-empty
    code cell has an execution count (or, when run-all stopped at an error, none changed for 3 s).
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


def cell_report(page, path: str) -> list[dict]:
    """Every code cell: its index, source, execution count, prompt, outputs as seen.

    ``outputs`` lists the model's output types ("stream:stderr", "error", "display_data", ...);
    ``errors`` holds "ename: evalue" of each error output; ``dom_stderr`` counts the rendered
    outputs marked application/vnd.jupyter.stderr; ``widget_views`` the widget outputs;
    ``rendered_widgets`` the rendered ipywidgets; ``text`` the cell's rendered output text.
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


def screenshot_notebook(page, path: str, file, max_height: int = 16_000) -> None:
    """Screenshot the whole notebook: hide the side bar, grow the window to its height."""
    height = page.evaluate(
        f"""(path) => {{ {_FIND}
          if (!app.shell.leftCollapsed) app.commands.execute('application:toggle-left-area');
          const scroller = panel.content.node;
          scroller.scrollTop = 0;
          return scroller.scrollHeight + (window.innerHeight - scroller.clientHeight);
        }}""",
        path,
    )
    size = page.viewport_size
    page.set_viewport_size({"width": size["width"], "height": min(int(height) + 40, max_height)})
    page.wait_for_timeout(500)  # layout and images settle
    page.screenshot(path=file)
    page.set_viewport_size(size)


def shutdown_kernel(server, path: str) -> None:
    """Stop this notebook's kernel, so the next lesson does not share the two cores with it."""
    for session in server.api("sessions"):
        if session["path"] == path:
            server.api(f"sessions/{session['id']}", method="DELETE")
