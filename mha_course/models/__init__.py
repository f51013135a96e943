"""The models wing: what learns. Lessons 08 and 09.

What lives here: the synthetic copy and reverse tasks (``tasks``), lesson 08's tiny
attention-only model with its loss and backward pass (``tiny_model``), Adam and the training loop
(``train``), the pattern scores and ablations that show what each head learned
(``specialisation``), and the two tiny models trained once and shipped for the app
(``trained_models``, with ``trained_models.npz``). Lesson 09's GPT, its tokenizer and corpus
arrive here too.

What it may import: the attention itself (the package's top-level modules: the layer, masks,
positions, the block, the backward pass) and NumPy. Never the widgets, the checks or the
grading tools, which build on this wing. Import from the module, not from the package's
``__init__``, so nothing here depends on the order in which ``mha_course`` re-exports names.
"""
