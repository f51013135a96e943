"""The grading tools: generate exercises, bundle assignments, check learners' notebooks.

Not taught in a lesson: this is the machinery behind ``make exercises``, ``make check EX=03``,
``make assign`` and ``python -m mha_course generate|check|assign``. It is a wing of its own,
apart from the teaching modules; the exercise checks it runs live in :mod:`mha_course.checks`.

Sub-wings by job, each module importing only modules before it in this order (and the checks):

- ``authoring``: what is written before anyone is graded: ``notebooks`` (reading and writing
  notebooks, cell metadata, exercise ids, ``ExerciseError``), ``generate`` (stubs, validation,
  ``generate`` and ``find_stale``, and the references a learner with only the wheel checks
  against), ``catalog`` (every exercise as data), ``assignment`` (the instructor's assignment
  file), ``bundle`` (exercises of several lessons in one notebook), ``tidy`` (notebook hygiene);
- ``reporting.verdicts``: per-cell records -> one verdict per exercise (pure functions, used by
  the running sub-wing);
- ``running``: checking one notebook: ``merge`` (the notebook the checker runs), ``limits``,
  ``account`` (without the sandbox, as root: a user of its own per kernel) and ``sandbox``
  (private package copies, the file guard, bubblewrap), ``remote``, ``session`` and ``grader``
  (grading mode's kernel side, conversation and pytest plugin), ``kernel`` (the kernel's entry
  point), ``nbval_plugin`` and ``run`` (strict nbval in a subprocess), ``outputs`` (where
  results go), ``check`` (merge -> run -> verdicts);
- ``reporting``: ``report`` (the text report, rows, the CSV), ``intake`` (a folder as an LMS
  download has it), ``grade`` (a whole class), ``gradebook`` and ``feedback``;
- ``export``: ``common`` (what the exports share: the assignment, a wheel of the course,
  files), ``to_nbgrader`` (an nbgrader source assignment) and ``to_gradescope`` (an autograder
  zip that grades with the course's own checker);
- ``workspace``: the learner's copies in ``my-work/``, which ``make lab`` opens (imports nothing
  of the course);
- ``cli``: the command line (``mha_course/__main__.py`` and the ``mha-course`` script).

``references/`` holds the data ``generate`` writes for the learner's self-check.

The trust model (what is isolated, what is not) is in the "Trust model" of docs/instructors.md.
"""
