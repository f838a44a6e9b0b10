"""The tiny backend's cost model: a base model shipped in data/base_models needs no build."""

from pathlib import Path

from fp8rl.config import RunConfig, override
from fp8rl.tiny.backend import TinyBackend
from fp8rl.tiny.sft import SHIPPED_DIR


def test_a_shipped_base_model_is_not_counted_as_a_build(tmp_path: Path) -> None:
    backend = TinyBackend()
    shipped = {p.name for p in SHIPPED_DIR.iterdir() if (p / "config.json").is_file()}
    study = backend.cost(override(RunConfig(), {"model.sft.steps": 1200}), tmp_path / "empty")
    assert study.setup_key in shipped and study.setup_done  # the study's base, empty cache
    other = backend.cost(override(RunConfig(), {"model.sft.steps": 7}), tmp_path / "empty")
    assert other.setup_key not in shipped and not other.setup_done
    (tmp_path / "cache" / other.setup_key).mkdir(parents=True)
    (tmp_path / "cache" / other.setup_key / "config.json").write_text("{}")
    assert backend.cost(
        override(RunConfig(), {"model.sft.steps": 7}), tmp_path / "cache"
    ).setup_done
