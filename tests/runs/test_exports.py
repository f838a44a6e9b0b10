"""Where exported HF checkpoints live: complete ``hf/step_<n>/`` directories by step, never
a half-written one."""

from __future__ import annotations

import pytest

from fp8rl.runs import atomic_directory, hf_export_dir, list_hf_exports


def test_complete_exports_are_listed_by_step(tmp_path) -> None:
    assert list_hf_exports(tmp_path) == {}
    for step in (10, 0):
        with atomic_directory(hf_export_dir(tmp_path, step)) as tmp:
            (tmp / "config.json").write_text("{}")
    (tmp_path / "hf" / "step_00000005").mkdir()  # no config.json: not an export
    (tmp_path / "hf" / ".tmp-step_00000007.1.abc").mkdir()  # an interrupted export
    exports = list_hf_exports(tmp_path)
    assert list(exports) == [0, 10]
    assert exports[10] == tmp_path / "hf" / "step_00000010"
    with pytest.raises(ValueError, match="non-negative int"):
        hf_export_dir(tmp_path, -1)
