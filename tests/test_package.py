"""The package installs and imports with the pinned stack."""

import importlib.metadata as md

import fp8rl


def test_package_imports() -> None:
    assert fp8rl.__doc__


def test_pinned_torch_is_the_cpu_build() -> None:
    # Any torch other than 2.13.0 would have pulled a CUDA build; catch drift early.
    assert md.version("torch").startswith("2.13.0")
    assert md.version("torchao") == "0.18.0"
