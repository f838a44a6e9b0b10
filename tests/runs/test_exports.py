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


def test_an_export_a_kill_left_moved_aside_is_listed_and_put_back(tmp_path) -> None:
    from fp8rl.runs.atomic import OLD_PREFIX

    with atomic_directory(hf_export_dir(tmp_path, 3)) as tmp:
        (tmp / "config.json").write_text("{}")
    step3 = hf_export_dir(tmp_path, 3)
    aside = step3.with_name(f"{OLD_PREFIX}{step3.name}.999999999.0123abcd")
    step3.rename(aside)  # a re-export killed between its two renames (no RENAME_EXCHANGE)
    assert list_hf_exports(tmp_path) == {3: aside}
    with atomic_directory(hf_export_dir(tmp_path, 4)) as tmp:  # any export there recovers
        (tmp / "config.json").write_text("{}")
    assert list_hf_exports(tmp_path) == {3: step3, 4: hf_export_dir(tmp_path, 4)}
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == ["step_00000003", "step_00000004"]
