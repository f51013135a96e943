"""The grading tools: generate exercises, bundle assignments, check learners' notebooks.

Not taught in a lesson: this is the machinery behind ``make exercises``, ``make check EX=03``,
``make assign`` and ``python -m mha_course generate|check|assign``. It is a wing of its own,
apart from the teaching modules; the exercise checks it runs live in :mod:`mha_course.checks`.

Modules, each importing only the ones above it in this list:

- ``notebooks``: reading and writing notebooks, cell metadata, exercise ids, ``ExerciseError``;
- ``generate``: stubs, validating solution notebooks, ``generate`` and ``find_stale``;
- ``catalog``: every exercise as data (id, lesson, title, stars, default points, the checks it
  calls, the functions the learner writes), read from ``solutions/``; ``parse_ids``;
- ``assignment``: the instructor's assignment file (exercises, points, title, due date) that
  ``assign`` writes and ``check --assignment`` grades against;
- ``bundle``: ``build_bundle`` and ``assign`` (exercises from several lessons in one notebook);
- ``merge``: ``reference_for`` and ``merge_learner``, the notebook the checker runs (the
  learner's answers and own cells found where they put them);
- ``verdicts``: per-cell records -> one verdict per exercise (pure functions);
- ``limits``: what one kernel may use (memory, processes, disk), how this machine enforces it
  (cgroups, rlimits, a size-limited ``/tmp``) and the words for a limit that was reached;
- ``sandbox``: the snapshot of the package each run gets a private copy of, the guard that puts
  back files a run changed, the run's folders, and the bubblewrap sandbox around the kernel;
- ``remote``: grading mode, the kernel's side: answering the grader's calls from inside the
  learner's kernel (values back as JSON and ``.npy``, never pickle);
- ``session``: grading mode, the grader's side of that conversation (proxies, callbacks,
  timeouts naming the learner's function);
- ``grader``: grading mode's pytest plugin: the reference's check cells run in the pytest
  process, calling into the kernel, plus the instructor's probes;
- ``kernel``: the kernel's entry point (the checks loaded before any learner code);
- ``nbval_plugin``: the pytest plugin of the nbval run (per-cell records through a pipe, the
  kernel it starts, dead-kernel watch);
- ``run``: running nbval in a subprocess, the backstop timeout, stopping everything a run
  started (and every run at once on Ctrl-C or SIGTERM);
- ``check``: ``Checker`` (the snapshots of one command) and ``check_notebook``, the loop of
  merge -> run -> verdicts;
- ``report``: the text report, folder mode's rows, the summary table, the CSV;
- ``intake``: a folder as an LMS download has it (Canvas and Moodle names, late markers, a
  roster, the newest of several copies, every skipped file named);
- ``gradebook``: grading mode's rows (points from the assignment), its table and its CSV;
- ``feedback``: one Markdown feedback file per student, without this machine's paths;
- ``outputs``: where a run writes its results, decided (or refused) before any work;
- ``grade``: checking a class: intake, the checks in parallel, a report per submission;
- ``export``, ``export_nbgrader``, ``export_gradescope``: the chosen exercises for nbgrader (a
  source assignment) and for Gradescope (an autograder zip, and the script it runs), with the
  course as a wheel;
- ``tidy``: notebook hygiene for maintainers;
- ``cli``: the command line (``mha_course/__main__.py`` and the ``mha-course`` script).

The trust model (what is isolated, what is not) is in the README's "Trust model" section.
"""
