"""The tiny CPU backend: tokenizer, tasks, model, sampler and trainer.

Submodules are imported explicitly (``from fp8rl.tiny.tasks import generate``);
this package imports none of them eagerly.
"""
