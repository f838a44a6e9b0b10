"""Child process for the run-store tests: ``python _worker.py <mode> '<json args>'``.

Each mode does one thing the tests need a separate process for: compute a run id,
hold a run's lock, train a toy model and crash, or die in the middle of a write.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

from fp8rl.runs import Decision, RngStreams, Run, RunStore, TrainState, run_id_for

TOY_CONFIG: dict[str, Any] = {"model": {"width": 4}, "steps": 10, "ckpt_every": 3, "seed": 0}


def toy_train(run: Run, crash_after: int | None = None) -> None:
    """A deterministic little training loop that logs, evaluates and checkpoints.

    Every RNG stream (python, numpy, torch) feeds the metrics, so a resume that
    missed one of them would log different numbers than an uninterrupted run.
    """
    import numpy as np
    import torch

    cfg = run.config
    random.seed(cfg["seed"])
    np.random.seed(cfg["seed"])
    torch.manual_seed(cfg["seed"])
    model = torch.nn.Linear(cfg["model"]["width"], 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = {"position": 0}
    state = TrainState()
    state.register("model", model)
    state.register("optimizer", optimizer)
    state.register("rng", RngStreams())
    state.register_value("loader", lambda: dict(loader), loader.update)

    start = 0
    if run.decision is Decision.RESUME:
        checkpoint = run.load_checkpoint()
        state.load_state_dict(checkpoint.state)
        start = checkpoint.step + 1
    for step in range(start, cfg["steps"]):
        x = torch.randn(8, cfg["model"]["width"])
        y = x.sum(dim=1, keepdim=True) + random.gauss(0.0, 0.1) + float(np.random.rand())
        loss = ((model(x) - y) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        loader["position"] += 8
        run.log_metrics(
            step, {"loss": loss.item(), "w0": model.weight[0, 0].item(), **loader}, durable=False
        )
        if step % 3 == 2:
            run.log_eval(step, {"acc": float(torch.rand(()))}, durable=False)
        if crash_after is not None and step == crash_after:
            os._exit(1)  # no cleanup at all: status stays "running", the kernel drops the lock
        if (step + 1) % cfg["ckpt_every"] == 0:
            run.save_checkpoint(step, state.state_dict(), keep_last=2)
    run.mark("done")


def _arm_os_write_kill() -> None:
    """The next os.write writes half its bytes, then the process is SIGKILLed."""
    real_write = os.write

    def torn_write(fd: int, data: Any) -> int:
        data = bytes(data)
        real_write(fd, data[: len(data) // 2])
        os.kill(os.getpid(), signal.SIGKILL)
        return 0  # never reached

    os.write = torn_write


def _arm_torch_save_kill() -> None:
    """The next torch.save writes a partial zip header, then the process is SIGKILLed."""
    import torch

    def torn_save(obj: Any, f: Any) -> None:
        f.write(b"PK\x03\x04 half a checkpoint")
        f.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    torch.save = torn_save


def main(mode: str, args: dict[str, Any]) -> None:
    if mode == "run-id":
        print(run_id_for(args["config"]))
        return
    store = RunStore(args["root"])
    run = store.open_run(args.get("experiment", "exp"), args.get("config", TOY_CONFIG))
    if mode == "hold-lock":
        Path(args["ready"]).write_text(str(os.getpid()))
        time.sleep(120)
    elif mode == "train":
        toy_train(run, crash_after=args.get("crash_after"))
    elif mode == "kill-in-status":
        run.mark("running", "before")
        _arm_os_write_kill()
        run.mark("running", "after")
    elif mode == "kill-in-metrics":
        for step in range(3):
            run.log_metrics(step, {"loss": 1.0 / (step + 1)})
        run.save_checkpoint(1, {"step": 1})
        _arm_os_write_kill()
        run.log_metrics(3, {"loss": 0.25, "padding": "x" * 1000})
    elif mode == "kill-in-checkpoint":
        run.save_checkpoint(0, {"value": 0}, keep_last=5)
        run.save_checkpoint(1, {"value": 1}, keep_last=5)
        _arm_torch_save_kill()
        run.save_checkpoint(2, {"value": 2}, keep_last=5)
    elif mode == "churn":
        import torch

        step = 0
        while True:  # until the parent kills us, at a moment it picks at random
            run.log_metrics(step, {"loss": 1.0 / (step + 1), "hist": list(range(3000))})
            run.mark("running", f"step {step}")
            run.save_checkpoint(step, {"w": torch.full((200_000,), float(step))}, keep_last=2)
            step += 1
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]))
