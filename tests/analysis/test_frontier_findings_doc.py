"""docs/study/frontier_findings.md reads the generated pilot report (and the Table-2 report
and the frontier protocol it cites) and adds no measured number of its own: every decimal
number it quotes must occur in one of those files, so a regenerated report with other
numbers makes this test fail until the prose is updated."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DECIMAL = re.compile(r"(?<![\w.])[+-]?\d+\.\d+(?![\w.]*\d)")


def _sources() -> str:
    files = [
        ROOT / "docs/reports/frontier_pilot/README.md",
        ROOT / "docs/study/frontier_protocol.md",
        *sorted((ROOT / "docs/reports/table2").glob("*.md")),
    ]
    return "\n".join(p.read_text() for p in files)


def _holds(text: str, number: str) -> bool:
    """`number` occurs in `text` as a whole number (3.5 is not found inside 13.55)."""
    return re.search(rf"(?<![\d.]){re.escape(number)}(?!\d)", text) is not None


def test_holds_matches_whole_numbers_only() -> None:
    assert _holds("drawdown 3.5 points", "3.5")
    assert not _holds("13.55", "3.5") and not _holds("3.55", "3.5")


def test_every_decimal_in_the_frontier_findings_is_in_its_sources() -> None:
    findings = (ROOT / "docs/study/frontier_findings.md").read_text()
    quoted = DECIMAL.findall(findings)
    assert len(quoted) >= 40  # the lever and loop sections quote the report's numbers
    sources = _sources()
    missing = sorted({q for q in quoted if not _holds(sources, q.lstrip("+"))})
    assert not missing, f"frontier_findings.md quotes numbers no source holds: {missing}"


def test_the_findings_state_the_reports_verdict() -> None:
    findings = (ROOT / "docs/study/frontier_findings.md").read_text()
    report = (ROOT / "docs/reports/frontier_pilot/README.md").read_text()
    verdict = report.split("## Verdict: the study's regime", 1)[1].split("\n## ", 1)[0]
    assert "**No regime** (rule 4)" in verdict
    assert "**No regime** (the protocol's rule 4)" in findings
