"""Grading, reporting: from per-cell records to verdicts, reports, gradebooks and feedback.

Not taught in a lesson. ``verdicts`` turns nbval's records into one verdict per exercise (pure
functions); ``report`` prints and writes them; ``intake`` reads a class's submissions as an LMS
download has them; ``grade`` checks a whole class; ``gradebook`` and ``feedback`` write the
instructor's CSV and each student's Markdown. Imports: the authoring and running sub-wings.
"""
