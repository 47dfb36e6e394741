"""A model package for SGLang's ``SGLANG_EXTERNAL_MODEL_PACKAGE``: the tests' tiny language model.

SGLang imports every module of this package and registers each ``EntryClass`` as a model
architecture; the test model directory's ``config.json`` names ``TinyTraceLMForCausalLM``.
"""
