"""Checks for the exercises in ``solutions/`` and ``exercises/``: they say what is wrong, in words.

Used by ``exercises/NN_*.ipynb`` (the exercises for ``notebooks/01_matmul.ipynb`` onwards).
Each exercise ``NN.M`` has one public ``check_<name>(fn)`` that

1. calls your function on seeded inputs whose dimensions all differ (B=2, T=3, S=5, d_k=4, d_v=6
   and the like), so a transposed axis cannot hide;
2. compares the result with the package's reference, computed now (not numbers frozen in a
   file);
3. if they differ, runs the known wrong versions (no √d_k, softmax over the wrong axis, the mask
   applied after the softmax, ...) on the same inputs and, when one matches yours, names that
   mistake; otherwise checks properties (shape, dtype, no NaN, rows sum to 1, nothing above the
   causal diagonal) and reports the first that fails;
4. prints one line ``Exercise NN.M passed: <what was checked>`` on success, or raises
   :class:`CheckFailed` whose message starts with ``Exercise NN.M: ``.

An exercise that asks you to write something yourself names what it forbids (01.1: NumPy and
``mha_course.naive``; 01.6: NumPy; 02.1: every library softmax; 02.3: ``log_softmax`` and
``logsumexp``; 02.4: PyTorch; 03.2: ``scaled_dot_product_attention``; 03.3 and 03.4: the
package's masks; 03.5: the package's attention and masks; 04.1 and 04.2: ``split_heads`` and
``merge_heads``; 04.3: ``MultiHeadAttention.from_per_head``; 04.4: ``param_count``; 04.5: the
layer; 04.6: calling the layer; and lessons 05 to 08 theirs); an answer that calls one fails with
``Exercise NN.M asks you to <task>; your answer calls <name>``. Every check probes several
shapes (different d_k, h and rank), so an answer that hard-codes a size fails.

An exception raised by your function becomes a :class:`CheckFailed` that quotes it, except
``NotImplementedError``: the exercise stub raises it (``Exercise NN.M: <task>``), and it passes
through unchanged, so the checker (``python -m mha_course check``) can report "not attempted".

The checks of lesson NN live in ``lessonNN.py`` (each lists its checks in ``__all__``), built
from the shared machinery in ``harness.py`` and the known wrong versions in ``variants.py``
(lesson 07's Triton kernel exercises, 07.7 to 07.11, in ``kernels.py``: their checks launch the
learner's kernel in Triton's interpreter on guarded memory, importing triton only then);
lesson 15's spot-the-bug drill, 26 exercises, has a sub-folder of its own, :mod:`drill
<mha_course.checks.drill>`, one module per group of exercises. A new lesson's checks arrive with
one line below: ``from .lessonNN import *``.

Examples
--------
>>> import numpy as np
>>> check_causal_mask(lambda T: np.tril(np.ones((T, T), dtype=bool)))
Exercise 03.3 passed: (T, T) bool masks for T = 1, 4, 7 match mha_course.causal_mask
"""

from .drill import *  # noqa: F403
from .harness import CheckFailed
from .kernels import *  # noqa: F403
from .lesson01 import *  # noqa: F403
from .lesson02 import *  # noqa: F403
from .lesson03 import *  # noqa: F403
from .lesson04 import *  # noqa: F403
from .lesson05 import *  # noqa: F403
from .lesson06 import *  # noqa: F403
from .lesson07 import *  # noqa: F403
from .lesson08 import *  # noqa: F403
from .lesson09 import *  # noqa: F403
from .lesson10 import *  # noqa: F403
from .lesson11 import *  # noqa: F403
from .lesson12 import *  # noqa: F403
from .lesson13 import *  # noqa: F403

__all__ = ["CheckFailed", *sorted(name for name in dir() if name.startswith("check_"))]
