"""Grading, running: checking one notebook, with the learner's code kept at a distance.

Not taught in a lesson. ``merge`` builds the notebook the checker runs; ``limits`` and
``sandbox`` bound and isolate the learner's kernel; ``remote``, ``session`` and ``grader`` are
grading mode's two sides; ``kernel`` is the kernel's entry point; ``nbval_plugin`` and ``run``
run strict nbval in a subprocess; ``outputs`` decides where results go; ``check`` is the loop
merge -> run -> verdicts. Imports: the authoring sub-wing, the reporting sub-wing's verdicts, the
checks.
"""
