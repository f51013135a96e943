"""Grading, authoring: what an author or instructor writes before anyone is graded.

Not taught in a lesson. ``notebooks`` reads and writes notebooks and their exercise metadata;
``generate`` writes ``exercises/`` from ``solutions/``; ``catalog`` holds every exercise as data;
``assignment`` is the instructor's assignment file; ``bundle`` puts exercises of several lessons
in one notebook; ``tidy`` keeps committed notebooks clean. Each imports only the ones before it
in this list (and the checks).
"""
