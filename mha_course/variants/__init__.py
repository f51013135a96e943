"""The variants of attention in recent models, each built on the top level's attention.

Most are lesson 13's (``notebooks/13_attention_2025.ipynb``); MLA is taught in lesson 06, RoPE
scaling in lesson 05, linear attention in lesson 07 and the state-space view in deep dive 13c, as
each module's docstring says. Imports
point down: this wing may import the top level, never another wing.

- :mod:`~mha_course.variants.mla`: multi-head latent attention (DeepSeek-V2/V3) and its latent
  cache;
- :mod:`~mha_course.variants.rope_scaling`: stretching RoPE past its training length (position
  interpolation, NTK-aware, YaRN) and YaRN's softmax scale for MLA;
- :mod:`~mha_course.variants.sinks`: attention sinks (a learned logit every query may attend to);
- :mod:`~mha_course.variants.logit_control`: soft-capping, QK-norm and differential attention;
- :mod:`~mha_course.variants.gated_attention`: a sigmoid gate on each head's output;
- :mod:`~mha_course.variants.sparse_attention`: block-sparse attention with a compressed branch;
- :mod:`~mha_course.variants.linear_attention`: kernel feature maps instead of the softmax, and
  :mod:`~mha_course.variants.delta_rule`: the delta rule's fast-weight memory, and
  :mod:`~mha_course.variants.ssd`: linear attention with a decay as a masked matrix, a recurrence
  and a chunked scan (Mamba-2's state-space duality);
- :mod:`~mha_course.variants.entropy`: the attention entropy these variants are judged by.
"""
