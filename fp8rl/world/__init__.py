"""The tiny world, used by both backends: model presets and the model build, the offline
tokenizer, the task families (training mix, per-step draw seed, held-out sets), held-out
evaluation, the SFT base models and their Hugging Face export.

It sits above ``config`` and the ground floor and below the backends: ``fp8rl.tiny`` trains
on it, ``fp8rl.verl_ext`` prepares a tiny model's verl run from it. Evaluation samples with
``fp8rl.sampling`` (the SFT base's accuracy is measured when it is built); ``sampling``
never imports the world. Submodules are imported explicitly (``from fp8rl.world.tasks
import generate``); this package imports none of them eagerly.
"""
