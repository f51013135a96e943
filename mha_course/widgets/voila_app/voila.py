"""Voila's settings for the mha-course app: ``make app`` passes this folder as Voila's config path.

(A traitlets config file, read by Voila at start; not a module of the package.)

- 127.0.0.1 only, on the port ``make app`` asks for (no trying other ports: the printed URL is
  the one that works); the page template ``mha-course`` (``voila/templates/mha-course``: Voila's
  own, without the style sheets it would fetch from a CDN); no tracebacks sent to the page.
- A Content-Security-Policy header: the page may load and connect to this server only (``data:``
  and ``blob:`` are the page's own pictures), so even a widget or a link added later cannot make
  the visitor's browser fetch anything from the network.
- One kernel per visitor (Voila's default), stopped when the visitor leaves. Voila's page asks
  for that on ``beforeunload`` with a beacon that carries the ``_xsrf`` cookie, but Voila 0.5
  never sets that cookie, so the server refuses the request (403, "'_xsrf' argument missing from
  POST"; voila-dashboards/voila#1458) and every visit's kernel would run until the server
  stops. :func:`set_xsrf_cookie` sets it when the page is requested. Kernels whose page went away
  without saying so (a crashed browser, a closed laptop) are culled after ten idle minutes
  without a connection; a kernel with its page open is never culled.
"""

c = get_config()  # noqa: F821 (traitlets provides it)

c.Voila.ip = "127.0.0.1"
c.Voila.port_retries = 0
c.Voila.tornado_settings = {
    "headers": {
        "Content-Security-Policy": "; ".join([
            "default-src 'self'",
            "script-src 'self' 'unsafe-inline' 'unsafe-eval' blob:",
            "style-src 'self' 'unsafe-inline'",
            "img-src 'self' data: blob:",
            "font-src 'self' data:",
            "connect-src 'self' data: blob:",
            "worker-src 'self' blob:",
            "frame-ancestors 'self'",
            "form-action 'self'",
            "base-uri 'self'",
        ]),
    },
}
c.VoilaConfiguration.template = "mha-course"
c.VoilaConfiguration.show_tracebacks = False
c.VoilaConfiguration.strip_sources = True

c.MappingKernelManager.cull_idle_timeout = 600  # seconds idle and without a connected page
c.MappingKernelManager.cull_interval = 60
c.MappingKernelManager.cull_connected = False
c.MappingKernelManager.cull_busy = False


def set_xsrf_cookie(request_handler, notebook, cwd):
    """Voila's prelaunch hook: set the page's ``_xsrf`` cookie (tornado sets it when the token
    is first read), so the beacon that stops the visitor's kernel is accepted."""
    request_handler.xsrf_token  # noqa: B018 (read for its side effect)
    return None  # the notebook unchanged


c.VoilaConfiguration.prelaunch_hook = set_xsrf_cookie
