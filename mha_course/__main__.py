"""``python -m mha_course generate | check | assign``: see :mod:`mha_course.grading.cli`."""

import sys

from .grading.cli import main

if __name__ == "__main__":
    sys.exit(main())
