"""Kernels: attention as fast code runs it, beside the readable path. Lesson 07.

Taught in ``notebooks/07_flash_attention.ipynb``. The top level writes each step of attention
once, for the reader; this wing holds the same computation ordered for a machine, each tested
equal to the readable one:

- :mod:`~mha_course.kernels.tiled`: FlashAttention-2's loop in NumPy, one (block, block) tile of
  scores at a time with an online softmax, and the log-sum-exp it saves for the backward pass;
- :mod:`~mha_course.kernels.lean`: every fast path of the NumPy course: the layer's forward
  ordered for speed and memory, the softmax a block of rows at a time (L2-sized), and tiled
  attention with its four CPU savings (``Tricks``);
- :mod:`~mha_course.kernels.triton_flash` (lesson 07's deep dive,
  ``notebooks/deep_dives/07c_triton_kernels.ipynb``): FlashAttention-2's forward and backward as
  Triton kernels, run by Triton's interpreter without a GPU, and the bytes they move. It needs
  the ``kernels`` extra (triton, torch), so this ``__init__`` never imports it: import
  ``mha_course.kernels.triton_flash`` yourself;
- :mod:`~mha_course.kernels.traffic` (the same deep dive): the bytes those kernels move, counted
  in Triton's interpreter and in closed form; it imports neither triton nor torch;
- :mod:`~mha_course.kernels.triton_common` (importing triton and torch, the interpreter chosen
  without a GPU, the argument checks) and :mod:`~mha_course.kernels.triton_compile` (the kernels
  compiled to PTX without a GPU): ``triton_flash`` re-exports what the deep dive uses of them.

What it may import: the attention itself (the top level) and NumPy; nothing above it imports
it except the serving wing (split-KV decoding runs the tiled loop), the widgets (the tile
stepper), the checks and the lessons.
"""
