"""The widgets wing: what draws. Lessons 03, 04, 06, 07 and 08, and the app.

What lives here: the figures the lessons share (``plotting``: attention heatmaps, a grid of
heads, widget PNGs), the attention stepper (``stepper``, lesson 03), the h / d_k explorer
(``explorer``, lesson 04), the KV-cache memory calculator (``cache_memory``, lesson 06), the tile
stepper (``tile_stepper``, lesson 07), the head viewer (``head_viewer``, lesson 08), and the
app that puts four of them on one page (``app``, with Voila's settings and page template in
``voila_app/``: ``make app``).

What it may import: everything below it, the models wing (the shipped trained models, the task
vocabulary) and the attention itself, plus matplotlib and ipywidgets. Nothing else in the
package imports matplotlib or ipywidgets, and nothing imports this wing except the lessons, the
app notebook and the tests.
"""
