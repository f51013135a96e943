"""The grading tools: generate exercises, bundle assignments, check learners' notebooks.

Not taught in a lesson: this is the machinery behind ``make exercises``, ``make check EX=03``,
``make assign`` and ``python -m mha_course generate|check|assign``. It is a wing of its own,
apart from the teaching modules; the exercise checks it runs live in :mod:`mha_course.checks`.

Modules, each importing only the ones above it in this list:

- ``notebooks``: reading and writing notebooks, cell metadata, exercise ids, ``ExerciseError``;
- ``generate``: stubs, validating solution notebooks, ``generate`` and ``find_stale``;
- ``bundle``: ``build_bundle`` and ``assign`` (exercises from several lessons in one notebook);
- ``merge``: ``reference_for`` and ``merge_learner``, the notebook the checker runs;
- ``verdicts``: per-cell records -> one verdict per exercise (pure functions);
- ``nbval_plugin``: the pytest plugin of the nbval run (per-cell records, dead-kernel watch);
- ``run``: running nbval in a subprocess, the backstop timeout, killing the process tree;
- ``check``: ``check_notebook``, the loop of merge -> run -> verdicts;
- ``report``: the text report, the summary table and the CSV;
- ``cli``: the command line (``mha_course/__main__.py`` and the ``mha-course`` script).
"""
