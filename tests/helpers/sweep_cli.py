"""sweep.py as a real process, the way a user runs it (for the end-to-end CLI tests)."""

from __future__ import annotations

import os
import runpy
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from room_rules import REPO

#: torch.save on a full disk: the second call saves into /dev/full (the first checkpoint
#: is written; the second fails as a full disk makes torch fail: a RuntimeError
#: "unexpected pos" raised while handling the OSError ENOSPC).
FULL_DISK_AT_SECOND_SAVE = """
import torch
_real_save, _calls = torch.save, []
def _save(obj, f, *args, **kwargs):
    _calls.append(1)
    if len(_calls) == 2:
        with open("/dev/full", "wb") as full:
            return _real_save(obj, full, *args, **kwargs)
    return _real_save(obj, f, *args, **kwargs)
torch.save = _save
"""


def ctrl_c_as_at_a_terminal() -> None:
    """For a child process (``preexec_fn``): SIGINT's default action, whatever the test
    runner's shell set (a background job ignores SIGINT, and Python then never installs
    the handler that raises KeyboardInterrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("HYDRA_FULL_ERROR", None)
    return env


def _command(args: tuple[str, ...], patch: str) -> list[str]:
    if not patch:
        return [sys.executable, str(REPO / "sweep.py"), *args]
    # the patch, then sweep.py as __main__ in the same interpreter (its own exit status)
    run = f"import runpy, sys\nsys.argv = {[str(REPO / 'sweep.py'), *args]!r}\n"
    run += "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    return [sys.executable, "-c", patch + "\n" + run]


def sweep(
    cwd: Path, *args: str, timeout: float = 400, patch: str = ""
) -> subprocess.CompletedProcess:
    """``python sweep.py <args>`` in ``cwd`` with fp8rl importable; text output captured.
    HYDRA_FULL_ERROR is cleared so the output is what a user sees by default. ``patch``:
    Python run first in the same process (a fault to inject, e.g.
    :data:`FULL_DISK_AT_SECOND_SAVE`)."""
    return subprocess.run(
        _command(args, patch),
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def sweep_interrupted(
    cwd: Path,
    *args: str,
    once: Path,
    timeout: float = 300,
    sig: signal.Signals = signal.SIGINT,
) -> subprocess.CompletedProcess:
    """``python sweep.py <args>`` sent ``sig`` (SIGINT: Ctrl-C; SIGTERM: what ``timeout``
    and schedulers send) as soon as the file ``once`` (a glob pattern's path, e.g.
    ``runs/test/*/metrics.jsonl``) exists and is not empty."""
    proc = subprocess.Popen(
        _command(args, ""),
        cwd=cwd,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ctrl_c_as_at_a_terminal,
    )
    deadline = time.monotonic() + timeout
    pattern = str(once.relative_to(once.anchor))
    while time.monotonic() < deadline and proc.poll() is None:
        if any(p.stat().st_size for p in Path(once.anchor).glob(pattern)):
            proc.send_signal(sig)
            break
        time.sleep(0.02)
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def sweep_here(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], *args: str
) -> subprocess.CompletedProcess:
    """sweep.py run as ``__main__`` in this process (for commands that end before Hydra
    starts: no interpreter start-up per case, and monkeypatches apply), with the exit
    status a shell would see."""
    monkeypatch.setattr(sys, "argv", [str(REPO / "sweep.py"), *args])
    capfd.readouterr()
    code: int | str | None = 0
    try:
        runpy.run_path(str(REPO / "sweep.py"), run_name="__main__")
    except SystemExit as stop:
        code = stop.code
    if isinstance(code, str):  # sys.exit("message"): the interpreter prints it, status 1
        print(code, file=sys.stderr)
        code = 1
    out = capfd.readouterr()
    return subprocess.CompletedProcess(args, code or 0, out.out, out.err)
