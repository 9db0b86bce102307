"""Optimizer-step benchmark: speedtorch.ContiguousParams (the optimizer and gradient clipping over one flat buffer)
against today's PyTorch optimizers over the separate parameters, side by side in one run, with ratios.

One step = clip_grad_norm_ + optimizer.step() (+ assert_buffer_is_valid() for the flat variants, as the rules ask);
gradients are random and fixed, as after a backward. Variants:
  plain        torch.optim over the parameters, foreach=False (a few kernels per parameter)
  foreach      foreach=True (multi-tensor kernels; PyTorch's CUDA default)
  fused        fused=True (one fused kernel per chunk of parameters)
  contig       the same optimizer, foreach=False, over ContiguousParams.contiguous() (the seed's way)
  contig+fused fused=True over the flat buffer
Models (synthetic shapes, no torchvision): "resnet50" = ResNet-50's 161 parameter tensors (25.56M parameters);
"4-large" = 4 tensors of the same total size. On CPU and, when available, on the GPU.

    python bench/contiguous.py                     # both models, Adam and SGD, CPU and GPU
    python bench/contiguous.py --devices cuda --rounds 7 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import speedtorch  # noqa: E402
from speedtorch.cli.benchmarking import format_table, median_seconds  # noqa: E402


def resnet50_shapes() -> list[tuple[int, ...]]:
    """The parameter shapes of torchvision's resnet50 (conv weights, batch-norm weight/bias, fc), in order."""
    shapes: list[tuple[int, ...]] = [(64, 3, 7, 7), (64,), (64,)]
    in_ch = 64
    for planes, blocks in [(64, 3), (128, 4), (256, 6), (512, 3)]:
        for block in range(blocks):
            shapes += [(planes, in_ch, 1, 1), (planes,), (planes,)]
            shapes += [(planes, planes, 3, 3), (planes,), (planes,)]
            shapes += [(planes * 4, planes, 1, 1), (planes * 4,), (planes * 4,)]
            if block == 0:
                shapes += [(planes * 4, in_ch, 1, 1), (planes * 4,), (planes * 4,)]
            in_ch = planes * 4
    shapes += [(1000, 2048), (1000,)]
    return shapes


MODELS = {
    "resnet50": resnet50_shapes,
    "4-large": lambda: [(2048, 3120)] * 4,
}

OPTIMIZERS = {
    "adam": lambda params, **kw: torch.optim.Adam(params, lr=1e-3, **kw),
    "sgd": lambda params, **kw: torch.optim.SGD(params, lr=1e-2, momentum=0.9, **kw),
}

# variant -> (optimizer kwargs, clip_grad_norm_ foreach, over the flat buffer)
VARIANTS = {
    "plain": ({"foreach": False}, False, False),
    "foreach": ({"foreach": True}, True, False),
    "fused": ({"fused": True}, True, False),
    "contig": ({"foreach": False}, False, True),
    "contig+fused": ({"fused": True}, False, True),
}


def make_params(shapes, device: str, seed: int = 0) -> list[nn.Parameter]:
    """Random parameters with random gradients (never zeros), the same for every variant."""
    gen = torch.Generator().manual_seed(seed)
    params = []
    for shape in shapes:
        p = nn.Parameter(torch.randn(shape, generator=gen).mul_(0.05).to(device))
        p.grad = torch.randn(shape, generator=gen).to(device)
        params.append(p)
    return params


def one_step(optimizer_name: str, variant: str, params: list[nn.Parameter], max_norm: float):
    """Builds the optimizer for `variant`; returns (step callable, seconds it took to wrap the parameters)."""
    opt_kwargs, clip_foreach, flat = VARIANTS[variant]
    wrap_s = 0.0
    wrapper = None
    targets: list[torch.Tensor] = params
    if flat:
        start = time.perf_counter()
        wrapper = speedtorch.ContiguousParams(params)
        if params[0].is_cuda:
            torch.cuda.synchronize()
        wrap_s = time.perf_counter() - start
        targets = wrapper.contiguous()
    opt = OPTIMIZERS[optimizer_name](targets, **opt_kwargs)

    def step():
        nn.utils.clip_grad_norm_(targets, max_norm, foreach=clip_foreach)
        opt.step()
        if wrapper is not None:
            wrapper.assert_buffer_is_valid()

    return step, wrap_s


def run(device: str, models: list[str], optimizers: list[str], rounds: int, reps: int, warmup: int) -> list[dict]:
    """All variants of a (model, optimizer) stay alive and are timed in turn, `rounds` times `reps` steps each: load
    from other processes falls on every variant alike. Reported: the median over the rounds of each round's
    median."""
    rows = []
    for model in models:
        shapes = MODELS[model]()
        numel = sum(torch.Size(s).numel() for s in shapes)
        for optimizer_name in optimizers:
            group, steps = [], {}
            for variant in VARIANTS:
                row = {"device": device, "model": f"{model} ({len(shapes)} t, {numel / 1e6:.1f}M)",
                       "optimizer": f"{optimizer_name}+clip", "variant": variant}
                try:
                    step, wrap_s = one_step(optimizer_name, variant, make_params(shapes, device), max_norm=1.0)
                    median_seconds(step, reps=1, warmup=warmup)
                    steps[variant] = step
                    if wrap_s:
                        row["wrap_ms"] = wrap_s * 1e3
                except RuntimeError as err:  # e.g. a fused kernel this build or device lacks
                    row["note"] = str(err).splitlines()[0][:60]
                group.append(row)
            times: dict[str, list[float]] = {v: [] for v in steps}
            for _ in range(rounds):
                for variant, step in steps.items():
                    times[variant].append(median_seconds(step, reps=reps, warmup=0))
            for row in group:
                if row["variant"] in times:
                    row["ms"] = statistics.median(times[row["variant"]]) * 1e3
            base = {r["variant"]: r.get("ms") for r in group}
            for r in group:
                for ref in ("plain", "foreach", "fused"):
                    if r.get("ms") and base.get(ref):
                        r[f"x_{ref}"] = base[ref] / r["ms"]
            steps.clear()
            rows += group
            print(format_table(group, ["device", "model", "optimizer", "variant", "ms", "x_plain", "x_foreach",
                                       "x_fused", "wrap_ms", "note"]), flush=True)
            print()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default_devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    parser.add_argument("--devices", type=lambda s: s.split(","), default=default_devices)
    parser.add_argument("--models", type=lambda s: s.split(","), default=list(MODELS))
    parser.add_argument("--optimizers", type=lambda s: s.split(","), default=list(OPTIMIZERS))
    parser.add_argument("--rounds", type=int, default=5, help="times each variant is timed, in turn")
    parser.add_argument("--reps", type=int, default=None, help="steps per round (default: 3 CPU, 20 GPU)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write all results here")
    args = parser.parse_args()

    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads"
          + (f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ", no GPU"))
    print("x_<ref> = <ref> ms / this row's ms (> 1: faster than <ref>); wrap_ms = one-time ContiguousParams cost")
    print()
    rows = []
    for device in args.devices:
        reps = args.reps or (20 if device.startswith("cuda") else 3)
        rows += run(device, args.models, args.optimizers, args.rounds, reps, args.warmup)
    if args.json:
        args.json.write_text(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(),
                                         "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
