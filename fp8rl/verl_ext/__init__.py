"""The verl backend: the paper's full-scale runs on verl + vLLM on Ray (docs/verl_backend.md),
and fp8rl's method inside verl (FSDP actor, vLLM rollout).

A backend room, sibling of ``fp8rl.tiny``: it uses ``numerics``, ``rl``, ``rewards``, ``runs``,
``config`` and the tiny world (``world``), never ``tiny`` or ``experiments``. Modules (import
them directly; this file imports nothing, so ``import fp8rl.verl_ext`` stays cheap):

- ``backend``: :class:`~fp8rl.verl_ext.backend.VerlBackend`, the ``backend=verl`` protocol;
- ``settings``: its checks, resolution and the run-config keys it does not read;
- ``presets``: the models it knows (Hugging Face ids, architecture facts);
- ``translate``: a resolved run config -> the ``python -m verl.trainer.main_ppo`` overrides;
- ``verl_config``: verl's own config composed and built offline (the translation's check);
- ``hooks``: the config classes that carry fp8rl's settings into verl (FP8 engine,
  Calibrated Clipping, rollout scaling), checked where verl builds them;
- ``fp8_engine``: FP8 training and the BF16 shadow in verl's FSDP2 engine;
- ``calibrated_actor``: Calibrated Clipping in verl's actor worker; ``actor_trainer`` (GPU
  only) and ``trainer_plugin``: the V1 trainer that places it;
- ``data``: the shared benchmark files and verl's parquet; ``reward``: the math reward;
- ``launch``: running verl into the run store; ``ingest``: verl's logs -> the run store;
- ``cost``: GPU time per step, an estimate;
- ``tiny_world``: a tiny model's run prepared from the tiny world (base model, parquet);
- ``dist_calibration``: Calibrated Clipping over the global batch of data-parallel ranks;
- ``rollout_quant``, ``vllm_rollout``, ``vllm_plugin``: vLLM rollout weights per tensor,
  channel or 128x128 block, and the hook that installs them on each weight sync;
- ``cpu``, ``cpu_rollout``: verl's real trainer on this CPU (``cluster=local_cpu``): the CPU
  platform, and a rollout server on fp8rl's sampler (``fp8rl.sampling``) with fp8rl's rollout
  quantisation, registered in verl's registries.
"""
