"""Grading, export: the course's exercises for other graders.

Not taught in a lesson. ``common`` is what the exports share (the assignment, a wheel of the
course, files); ``nbgrader`` writes an nbgrader source assignment; ``gradescope`` an autograder
zip that grades with the course's own checker. Imports: the other grading sub-wings.
"""
