"""The verl backend: fp8rl's method inside verl (FSDP actor, vLLM rollout, Ray).

Modules are imported on demand (``import fp8rl.verl_ext.dist_calibration``); this package
imports nothing heavy itself.
"""
