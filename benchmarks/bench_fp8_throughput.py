"""TorchAO float8 training (tensorwise, rowwise) vs BF16: forward + backward throughput of
the decoder-layer linears of Qwen3-8B, Qwen3-14B and Qwen2.5-32B (the paper's "up to 1.5x
for 8B-32B shapes"). Needs only torch, torchao and, on a GPU, Triton (for torch.compile).

    python benchmarks/bench_fp8_throughput.py                   # GPU: real shapes, 16384 tokens
    python benchmarks/bench_fp8_throughput.py --device cpu      # reduced shapes: NOT comparable
    python benchmarks/bench_fp8_throughput.py --json out.json --max-seconds 420

Each linear ``y = x W^T (+ b)`` with ``x`` of ``tokens x in`` runs as BF16 ``nn.Linear`` and
as TorchAO ``Float8Linear`` (``convert_to_float8_training`` with
``Float8LinearConfig.from_recipe_name(recipe)``, BF16 parameters and activations, as inside
an FSDP actor with BF16 mixed precision), forward and backward (``y.backward(dy)``: the
output, input-gradient and weight-gradient GEMMs). The decoder layer's row sums the seven
linears (q, k, v, o, gate, up, down) - the GEMM work of one layer, the quantity FP8
training speeds up; attention, norms and the optimiser are not in it. Speedup = BF16 time
/ FP8 time, both measured in this run on the same inputs.

On a GPU each FP8 module is ``torch.compile``d (``--no-compile`` for eager), as torchtitan
runs TorchAO float8: eager float8 adds unfused amax/scale/cast kernels (the BF16 linear is
one cuBLAS GEMM per pass either way). Sized for one run of at most 8 minutes on an H100/H200
(12 distinct shapes x 2 compiled FP8 recipes); ``--max-seconds`` starts no new shape after
its budget and reports the rest as n/a. On a CPU the script runs
a 1/16-width version of the same shapes on 1024 tokens with TorchAO's emulated GEMM
(``emulate=True``: FP32 matmul of the dequantised operands, since CPU ``_scaled_mm`` is
oneDNN's reference kernel on some CPUs) against native BF16 matmuls: a pipeline check whose
ratios say nothing about GPU throughput.

torchao on a machine that cannot install packages (torch 2.11 with Triton): torchao 0.18.0
is the release for torch >= 2.11 (its ``__init__`` loads its C++ extensions only from torch
2.11.0 on; the float8 training path is Python over ``torch._scaled_mm`` and needs none of
them). Its wheel, ``torchao-0.18.0-cp310-abi3-manylinux_2_24_x86_64.manylinux_2_28_x86_64
.whl`` (3.4 MB), is tagged ``cp310-abi3`` (any CPython >= 3.10) and imports straight from
the zip::

    pip download torchao==0.18.0 --no-deps -d wheels/      # where PyPI is reachable
    PYTHONPATH=wheels/torchao-0.18.0-cp310-abi3-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl \\
        python benchmarks/bench_fp8_throughput.py

(or ``unzip`` it into a folder and put that on ``PYTHONPATH``). The script prints where
torchao was imported from.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class Model:
    """The attention and MLP widths of one model (its Hugging Face ``config.json``)."""

    name: str
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    qkv_bias: bool
    source: str

    def linears(self) -> list[tuple[str, int, int, bool]]:
        """(name, out_features, in_features, bias) of the seven linears of a layer."""
        q, kv, h, i = (
            self.heads * self.head_dim,
            self.kv_heads * self.head_dim,
            self.hidden,
            self.intermediate,
        )
        b = self.qkv_bias
        return [
            ("q_proj", q, h, b),
            ("k_proj", kv, h, b),
            ("v_proj", kv, h, b),
            ("o_proj", h, q, False),
            ("gate_proj", i, h, False),
            ("up_proj", i, h, False),
            ("down_proj", h, i, False),
        ]

    def scaled(self, factor: int) -> Model:
        """The same layer at 1/factor of every width (head count kept, head_dim shrunk)."""
        return dataclasses.replace(
            self,
            name=f"{self.name} (1/{factor} width)",
            hidden=self.hidden // factor,
            intermediate=self.intermediate // factor,
            head_dim=self.head_dim // factor,
        )


#: hidden_size, intermediate_size, num_attention_heads, num_key_value_heads, head_dim from
#: each model's config.json on the Hugging Face Hub (Qwen2.5's head_dim is hidden/heads;
#: Qwen2.5 has q/k/v biases, Qwen3 none).
MODELS = (
    Model(
        "Qwen3-8B", 4096, 12288, 32, 8, 128, False,
        "https://huggingface.co/Qwen/Qwen3-8B-Base/blob/main/config.json",
    ),
    Model(
        "Qwen3-14B", 5120, 17408, 40, 8, 128, False,
        "https://huggingface.co/Qwen/Qwen3-14B-Base/blob/main/config.json",
    ),
    Model(
        "Qwen2.5-32B", 5120, 27648, 40, 8, 128, True,
        "https://huggingface.co/Qwen/Qwen2.5-32B/blob/main/config.json",
    ),
)  # fmt: skip
RECIPES = ("bf16", "tensorwise", "rowwise")
CPU_WIDTH_FACTOR = 16


def _fp8_config(recipe: str, emulate: bool) -> Any:
    from torchao.float8 import Float8LinearConfig

    return dataclasses.replace(Float8LinearConfig.from_recipe_name(recipe), emulate=emulate)


def _module(out_f: int, in_f: int, bias: bool, recipe: str, args: argparse.Namespace) -> nn.Module:
    from torchao.float8 import convert_to_float8_training

    torch.manual_seed(0)
    mod: nn.Module = nn.Sequential(nn.Linear(in_f, out_f, bias=bias))
    mod = mod.to(device=args.device, dtype=torch.bfloat16)
    if recipe != "bf16":
        mod = convert_to_float8_training(mod, config=_fp8_config(recipe, args.device == "cpu"))
    if args.compile and recipe != "bf16":  # BF16: one cuBLAS GEMM per pass, nothing to fuse
        mod = torch.compile(mod)
    return mod


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure_shape(out_f: int, in_f: int, bias: bool, args: argparse.Namespace) -> dict:
    """Seconds of one forward + backward per recipe, the recipes interleaved round by round
    (so a load change on the machine hits all of them alike); the best round is reported
    (with the median beside it), and each FP8 output's error against the BF16 linear."""
    g = torch.Generator(device=args.device).manual_seed(1)
    x = torch.randn(args.tokens, in_f, device=args.device, dtype=torch.bfloat16, generator=g)
    x.requires_grad_(True)
    dy = torch.randn(args.tokens, out_f, device=args.device, dtype=torch.bfloat16, generator=g)
    mods = {r: _module(out_f, in_f, bias, r, args) for r in RECIPES}
    outs: dict[str, torch.Tensor] = {}

    def step(recipe: str) -> None:
        mod = mods[recipe]
        x.grad = None
        for p in mod.parameters():
            p.grad = None
        y = mod(x)
        y.backward(dy)
        outs[recipe] = y.detach()

    for recipe in RECIPES:
        for _ in range(args.warmup):  # compiles on the first call
            step(recipe)
    _sync(args.device)
    times: dict[str, list[float]] = {r: [] for r in RECIPES}
    for _ in range(args.repeats):
        for recipe in RECIPES:
            t0 = time.perf_counter()
            for _ in range(args.iters):
                step(recipe)
            _sync(args.device)
            times[recipe].append((time.perf_counter() - t0) / args.iters)
    ref = outs["bf16"].float()
    return {
        r: {
            "seconds": min(times[r]),
            "median_seconds": statistics.median(times[r]),
            "rel_err_vs_bf16": float((outs[r].float() - ref).norm() / ref.norm()),
        }
        for r in RECIPES
    }


def run(args: argparse.Namespace, models: tuple[Model, ...] = MODELS) -> dict:
    """Every linear of ``models`` (at 1/16 width on a CPU) in every recipe."""
    if args.device != "cuda":
        models = tuple(m.scaled(CPU_WIDTH_FACTOR) for m in models)
    cache: dict[tuple, dict] = {}
    start = time.perf_counter()
    rows = []
    for model in models:
        for name, out_f, in_f, bias in model.linears():
            row: dict[str, Any] = {"model": model.name, "linear": name, "out": out_f, "in": in_f}
            row["bias"] = bias
            key = (out_f, in_f, bias)
            if key not in cache:
                if time.perf_counter() - start > args.max_seconds:
                    cache[key] = {r: {"seconds": None, "skipped": "time budget"} for r in RECIPES}
                else:
                    cache[key] = measure_shape(out_f, in_f, bias, args)
                    ms = ", ".join(f"{r} {cache[key][r]['seconds'] * 1e3:.3f}" for r in RECIPES)
                    print(f"  {model.name} {name} {out_f}x{in_f}: {ms} ms", file=sys.stderr)
            row.update(cache[key])
            rows.append(row)
    return {"rows": rows, "models": [dataclasses.asdict(m) for m in models], "wall_s": 0.0}


def _speedup(bf16: float | None, fp8: float | None) -> str:
    return "n/a" if bf16 is None or fp8 is None else f"{bf16 / fp8:.2f}x"


def _layer_total(rows: list[dict], model: str, recipe: str) -> float | None:
    ts = [r[recipe]["seconds"] for r in rows if r["model"] == model]
    return None if any(t is None for t in ts) else sum(ts)


def table(result: dict, args: argparse.Namespace) -> str:
    """Markdown: per linear and per decoder layer, ms per fwd+bwd and the FP8 speedup."""
    unit = 1e3
    lines = [
        "| model | linear | out x in | tokens | BF16 (ms) | tensorwise (ms) | speedup "
        "| rowwise (ms) | speedup |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    rows = result["rows"]
    for model in dict.fromkeys(r["model"] for r in rows):
        for r in (r for r in rows if r["model"] == model):
            t = {k: r[k]["seconds"] for k in RECIPES}
            ms = {k: "n/a" if v is None else f"{v * unit:.3f}" for k, v in t.items()}
            lines.append(
                f"| {model} | {r['linear']} | {r['out']} x {r['in']} | {args.tokens} "
                f"| {ms['bf16']} | {ms['tensorwise']} | {_speedup(t['bf16'], t['tensorwise'])} "
                f"| {ms['rowwise']} | {_speedup(t['bf16'], t['rowwise'])} |"
            )
        tot = {k: _layer_total(rows, model, k) for k in RECIPES}
        ms = {k: "n/a" if v is None else f"{v * unit:.3f}" for k, v in tot.items()}
        lines.append(
            f"| **{model}** | **decoder layer (7 linears)** | | {args.tokens} | {ms['bf16']} "
            f"| {ms['tensorwise']} | **{_speedup(tot['bf16'], tot['tensorwise'])}** "
            f"| {ms['rowwise']} | **{_speedup(tot['bf16'], tot['rowwise'])}** |"
        )
    return "\n".join(lines)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(args: argparse.Namespace) -> dict:
    import torchao

    env = {
        "torch": torch.__version__,
        "torchao": getattr(torchao, "__version__", "unknown"),
        "torchao_from": str(Path(torchao.__file__).parent),
        "python": platform.python_version(),
        "device": args.device,
        "compile": args.compile,
        "tokens": args.tokens,
        "fp8_gemm": "torch._scaled_mm" if args.device == "cuda" else "TorchAO emulate=True",
        "comparable_to_paper": args.device == "cuda",
    }
    if args.device == "cuda":
        env["gpu"] = torch.cuda.get_device_name()
        env["capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
        try:
            import triton

            env["triton"] = triton.__version__
        except ImportError:
            env["triton"] = None
    else:
        env["cpu"] = _cpu_name()
        env["threads"] = torch.get_num_threads()
    return env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda if any")
    ap.add_argument("--tokens", type=int, default=None, help="default: 16384 (GPU), 1024 (CPU)")
    ap.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="torch.compile each module (default: on for GPU, off for CPU)",
    )
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=None, help="default: 20 (GPU), 3 (CPU)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    ap.add_argument(
        "--max-seconds",
        type=float,
        default=360.0,
        help="start no new shape after this many seconds (the rest: n/a)",
    )
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args()
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    gpu = args.device == "cuda"
    args.tokens = args.tokens or (16384 if gpu else 1024)
    args.compile = gpu if args.compile is None else args.compile
    args.iters = args.iters or (20 if gpu else 3)
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    env = environment(args)
    result = run(args)
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    result["environment"] = env
    result["command"] = " ".join(["python", *sys.argv])
    label = (
        f"GPU {env.get('gpu')}, torch {env['torch']}, torchao {env['torchao']}, "
        f"{'compiled' if args.compile else 'eager'}"
        if gpu
        else f"CPU ({env['cpu']}, {env['threads']} threads), torch {env['torch']}, torchao "
        f"{env['torchao']}, reduced 1/{CPU_WIDTH_FACTOR}-width shapes, FP8 = TorchAO emulated "
        "GEMM: NOT comparable to the paper's 1.5x"
    )
    rounds = f"best of {args.repeats} interleaved rounds of {args.iters}"
    print(f"{label}; fwd+bwd per call, {rounds} after {args.warmup} warm-ups\n")
    print(table(result, args))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
