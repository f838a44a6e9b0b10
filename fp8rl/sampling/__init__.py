"""The KV-cache sampler with its rollout-quantisation hook (``fp8rl.sampling.sampler``), a
room below both backends (DESIGN.md): the tiny trainer's rollouts and verl's CPU rollout
server (``fp8rl.verl_ext.cpu_rollout``) sample with the same code. It uses only
``fp8rl.numerics``. This file imports nothing."""
