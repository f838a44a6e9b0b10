"""docs/study/findings.md reads the generated Table-2 report and adds no measured number of
its own: every interval it quotes ("-1.2 [-1.6, -0.8]") must be in the report's files, so
a regenerated report with other numbers makes this test fail until the prose is updated."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INTERVAL = re.compile(r"[+-]?\d+\.\d \[[+-]?\d+\.\d, [+-]?\d+\.\d\]")


def test_every_interval_in_the_findings_is_in_the_report() -> None:
    findings = (ROOT / "docs/study/findings.md").read_text()
    report = "\n".join(p.read_text() for p in (ROOT / "docs/reports/table2").glob("*.md"))
    quoted = INTERVAL.findall(findings)
    assert len(quoted) >= 10  # the claims table quotes the accuracy verdicts
    missing = [q for q in quoted if q not in report]
    assert not missing, f"findings.md quotes intervals the report does not hold: {missing}"
