"""The models wing: what learns. Lessons 08 to 12.

What lives here: lesson 08's synthetic copy and reverse tasks (``tasks``), its tiny
attention-only model with its loss and backward pass (``tiny_model``), Adam and the training loop
(``train``), the pattern scores and ablations that show what each head learned
(``specialisation``), and the two tiny models trained once and shipped (``trained_models``, with
``trained_models.npz``). Lesson 09's GPT (``gpt``, its sizes ``gpt_config``, its fast training
step ``gpt_fast``, its training loop ``gpt_train``), the character ``tokenizer``, the
Shakespeare ``corpus``, next-token ``sampling``, what its heads read on real text
(``text_heads``) and the recipes that trained what ships (``shakespeare``). Lesson 10's draft
model (``draft``). Lesson 13's GPT with 2025's attention block (``gpt_variants``), its
logit-growth runs (``logit_growth``) and the one-head capacity fit (``head_capacity``).

What it may import: the attention itself (the package's top-level modules: the layer, masks,
positions, the block, the backward pass) and NumPy. Never the widgets, the checks or the
grading tools, which build on this wing. Import from the module, not from the package's
``__init__``, so nothing here depends on the order in which ``mha_course`` re-exports names.
"""
