"""scripts/gpu_check.sh (make gpu-check): its arguments, what it would run (--dry-run), and
its install step for real against a local wheel built here (no network: a wheel of one tiny
package, installed with pip --target and with the zipfile fallback)."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_check.sh"


def gpu_check(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHON": sys.executable, **env},
    )


def local_wheel(where: Path, name: str = "fakeao", version: str = "0.1") -> Path:
    """A valid pure-Python wheel of package ``name`` (one module with a ``__version__``)."""
    files = {
        f"{name}/__init__.py": f'__version__ = "{version}"\n',
        f"{name}-{version}.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        ),
        f"{name}-{version}.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }

    def digest(text: str) -> str:
        raw = hashlib.sha256(text.encode()).digest()
        return "sha256=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    record = f"{name}-{version}.dist-info/RECORD"
    lines = [f"{path},{digest(text)},{len(text.encode())}" for path, text in files.items()]
    files[record] = "\n".join([*lines, f"{record},,"]) + "\n"
    wheel = where / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
    return wheel


def test_dry_run_says_what_the_gpu_machine_runs(tmp_path: Path) -> None:
    wheel = local_wheel(tmp_path)
    site, out = tmp_path / "site", tmp_path / "out"
    proc = gpu_check(
        "--dry-run",
        "--wheel",
        str(wheel),
        "--target",
        str(site),
        "--out",
        str(out),
        "--budget",
        "300",
        "--installer",
        "pip",
        "--",
        "--models",
        "Qwen3-8B",
    )
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split(": ", 1) for line in proc.stdout.splitlines() if ": " in line)
    py = sys.executable
    assert lines["install"] == (
        f"{py} -m pip install --no-index --no-deps --upgrade --target {site} {wheel}"
    )
    assert f"PYTHONPATH={site}:{REPO}\n" in proc.stdout  # the wheel's folder, then the repo
    run = lines["run"]
    assert run.startswith(f"timeout --signal=TERM --kill-after=15 300 {py} ")
    assert f"{REPO}/benchmarks/bench_fp8_throughput.py --out {out} --max-seconds 180" in run
    assert run.endswith(f"--models Qwen3-8B 2>&1 | tee {out}/log.txt")
    assert not site.exists() and not out.exists()  # a dry run writes nothing
    unzip = gpu_check("--dry-run", "--wheel", str(wheel), "--installer", "unzip")
    assert f"install: {py} -m zipfile -e {wheel} " in unzip.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bogus"], "unknown argument '--bogus' (benchmark options go after --)"),
        (["--budget", "60"], "at least 180"),
        (["--budget"], "--budget needs a value"),
        (["--installer", "conda"], "auto, pip or unzip"),
        (["--wheel", "/nowhere/torchao.whl"], "no wheel at '/nowhere/torchao.whl'"),
    ],
)
def test_bad_arguments_stop_with_the_reason(args: list[str], message: str) -> None:
    proc = gpu_check("--dry-run", *args)
    assert proc.returncode == 2 and message in proc.stderr


def test_without_a_wheel_it_says_how_to_get_one(tmp_path: Path) -> None:
    # a copy of the script in a repository without wheels/
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "gpu_check.sh").write_text(SCRIPT.read_text())
    proc = subprocess.run(
        ["bash", str(tmp_path / "scripts" / "gpu_check.sh"), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "pip download torchao==0.18.0 --no-deps -d wheels/" in proc.stderr


@pytest.mark.parametrize("installer", ["pip", "unzip"])
def test_the_install_step_puts_the_wheel_on_the_path(tmp_path: Path, installer: str) -> None:
    wheel = local_wheel(tmp_path)
    site = tmp_path / "site"
    proc = gpu_check(
        "--install-only", "--wheel", str(wheel), "--target", str(site), "--installer", installer
    )
    assert proc.returncode == 0, proc.stderr
    assert (site / "fakeao" / "__init__.py").is_file()
    assert f"fakeao 0.1 from {site}/fakeao/__init__.py" in proc.stdout  # imported from there
    if installer == "pip":  # a second install replaces the first (--upgrade), never fails
        again = gpu_check("--install-only", "--wheel", str(wheel), "--target", str(site))
        assert again.returncode == 0 and "fakeao 0.1 from" in again.stdout, again.stderr
