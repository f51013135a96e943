"""Attention across devices: p simulated devices in one process, and the schemes that split a
layer or a sequence over them.

Taught in ``notebooks/11_parallel.ipynb`` (its deep dive
``notebooks/deep_dives/11a_parallel_at_scale.ipynb``), except :mod:`~mha_course.parallel.precision`,
taught in ``notebooks/12_precision.ipynb``. What lives here:

- :mod:`~mha_course.parallel.collectives`: the devices and the collectives that move arrays
  between them (all-reduce, all-gather, reduce-scatter, all-to-all, a ring pass), every one
  built from point-to-point sends that count the bytes each device sends and receives;
  :class:`~mha_course.parallel.collectives.Meta` placeholders run the same schedules on shapes
  alone, so the bytes of a 128k-token layer are counted without allocating it;
- :mod:`~mha_course.parallel.tensor`: tensor parallelism (Megatron-LM): the layer's heads split
  over the devices, one all-reduce per attention block and per MLP;
- :mod:`~mha_course.parallel.ring` and :mod:`~mha_course.parallel.ulysses`: sequence (context)
  parallelism two ways, ring attention with its contiguous, zig-zag and striped layouts, and
  DeepSpeed-Ulysses' all-to-all;
- :mod:`~mha_course.parallel.memory`: the activation memory of training, per device, under
  tensor and sequence parallelism, with and without recomputation;
- :mod:`~mha_course.parallel.packing`: several documents packed in one row, kept apart by
  ``cu_seqlens`` (a block-diagonal mask and positions that restart);
- :mod:`~mha_course.parallel.precision`: attention in low precision (bfloat16, float16, 8-bit
  floats) and what must stay float32.

What it may import: the attention itself (the top level of ``mha_course``) and NumPy, nothing
above (no models, checks, grading or widgets): a model is taken by duck typing, so the wing sits
just above the top level.
"""
