"""The tiny CPU backend: the trainer loop on the tiny world (``fp8rl.world``), its batches,
timing, noise probe and the backend protocol.

Submodules are imported explicitly (``from fp8rl.tiny.train import train``);
this package imports none of them eagerly.
"""
