"""``python -m mha_course generate | check | assign``: see :mod:`mha_course.grading.cli`."""

import sys

# jsonschema (imported by nbformat) loads the optional rfc3987_syntax for its "iri" format
# checker, which compiles 38 grammars as it is imported (2-4 s of every command's start);
# nbformat validates without format checkers. The checker's runs start pytest the same way
# (mha_course.grading.running.run.PYTEST_MAIN).
sys.modules.setdefault("rfc3987_syntax", None)

from .grading.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
