"""SpeedTorch 0.1.6, the 2019 library speedtorch succeeds, run beside our paths in bench/transfer.py, bench/train.py
and bench/sweep.py. This file owns loading it and driving its switchers the way its README does.

Its distribution name is ours too, so it is not pip-installed into the environment: `make seed-speedtorch` downloads
the wheel (hash-pinned, bench/seed-speedtorch.txt) into build-deps/seed-speedtorch, a git-ignored folder that is
carried to the GPU machine (which has no network), and `load()` imports ``SpeedTorch`` from there.

SpeedTorch keeps a full collection as a CuPy array in pinned host memory (``CPUPinn=True``: its allocator calls
``cudaHostAlloc``) and swaps rows with CuPy fancy indexing and DLPack. Two adaptations, made here and not in its
files, let it run on today's libraries:
- CuPy renamed its DLPack calls (``cupy.fromDlpack`` -> ``cupy.from_dlpack``, ``ndarray.toDlpack()`` ->
  ``ndarray.__dlpack__()``; the old names are deprecated in CuPy 14 and gone after): they are pointed at the new
  ones before SpeedTorch is imported.
- torch >= 2.0's Adam keeps its step count as a tensor; SpeedTorch's OptimizerFactory would create the state with
  the int 0, which Adam rejects. `SeedSpeedTorchWay` creates the Adam state the way Adam does, so the factory finds
  it made and leaves it (its own code path for an optimizer that has stepped).

    python bench/seed_speedtorch.py               # imports it and says from where (needs CuPy; a GPU is not needed)
"""

from __future__ import annotations

import importlib
import sys
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SEED_DIR = ROOT / "build-deps" / "seed-speedtorch"
VERSION = "0.1.6"
#: The label of SpeedTorch's rows and way in every benchmark's output.
LABEL = f"SpeedTorch {VERSION}"


class SeedUnavailable(RuntimeError):
    """SpeedTorch cannot be run here; the message says what is missing."""


def _adapt_cupy(cupy) -> None:
    """Point SpeedTorch's CuPy calls at the names CuPy 14 keeps (module attributes and a method of the Python-level
    ``cupy.ndarray`` class, so SpeedTorch's files stay as published)."""
    # cupy.from_dlpack takes the PyCapsule SpeedTorch passes (torch.utils.dlpack.to_dlpack) as fromDlpack did.
    cupy.fromDlpack = cupy.from_dlpack
    # torch.utils.dlpack.from_dlpack takes the capsule __dlpack__() returns, as it took toDlpack()'s.
    cupy.ndarray.toDlpack = lambda self: self.__dlpack__()


def load(need_gpu: bool = True):
    """Imports SpeedTorch 0.1.6 from build-deps/seed-speedtorch, CuPy adapted; returns (SpeedTorch, cupy). Raises
    SeedUnavailable with what is missing (the folder, CuPy, a GPU)."""
    if not (SEED_DIR / "SpeedTorch" / "__init__.py").is_file():
        raise SeedUnavailable(f"{LABEL} is not installed in {SEED_DIR} (run `make seed-speedtorch` where PyPI can be "
                              "reached, and carry build-deps/ to the GPU machine)")
    if not (SEED_DIR / f"SpeedTorch-{VERSION}.dist-info").is_dir():
        raise SeedUnavailable(f"{SEED_DIR} holds another SpeedTorch than {VERSION} (run `make seed-speedtorch` again)")
    try:
        import cupy
    except ImportError as e:
        raise SeedUnavailable(f"CuPy is not installed ({e}); {LABEL} is built on it") from None
    if need_gpu and not torch.cuda.is_available():
        raise SeedUnavailable(f"no GPU: {LABEL}'s collections are CuPy arrays, which need one")
    _adapt_cupy(cupy)
    module = sys.modules.get("SpeedTorch")
    if module is None:
        sys.path.insert(0, str(SEED_DIR))
        try:
            module = importlib.import_module("SpeedTorch")
        finally:
            sys.path.remove(str(SEED_DIR))
    where = Path(module.__file__).resolve()
    if not where.is_relative_to(SEED_DIR.resolve()):
        raise SeedUnavailable(f"`import SpeedTorch` found {where}, not the copy in {SEED_DIR}")
    return module, cupy


def availability(need_gpu: bool = True) -> str | None:
    """None when SpeedTorch can run here, else the reason it cannot (for the benchmarks' 'skipped' line)."""
    try:
        load(need_gpu)
    except SeedUnavailable as e:
        return str(e)
    return None


def build_or_report(what: str, build):
    """`build()`, or None after a line saying why when SpeedTorch fails here (a 2019 library on today's CuPy and
    torch): the benchmark goes on with the other ways' figures. The traceback goes to stderr."""
    try:
        return build()
    except Exception as e:  # noqa: BLE001 - any failure of the third-party code leaves it out, said aloud
        traceback.print_exc()
        print(f"{LABEL}: {what} failed, left out ({type(e).__name__}: {e})", flush=True)
        return None


class SeedTransfer:
    """A `rows` x `dim` float32 collection in SpeedTorch's pinned CuPy memory (``ModelFactory(CPUPinn=True)``,
    normal init) and a model variable on `device`: `gather` is ``beforeForwardPass`` (rows to the variable),
    `scatter` is ``afterOptimizerStep`` (the variable's rows back), each with SpeedTorch's own synchronizations."""

    def __init__(self, rows: int, dim: int, device):
        speedtorch_2019, self.cupy = load()
        self.variable = torch.nn.Embedding(1, dim, device=device)  # batch-sized after the first swap
        self.switcher = speedtorch_2019.ModelFactory(self.variable, total_classes=rows, embed_dimension=dim,
                                                     CPUPinn=True)
        # normalDistributionInit writes its collection in place; uniformDistributionInit would hold a second one of
        # the same size (CuPy scales a fresh sample) in pinned memory while it runs.
        self.switcher.normalDistributionInit(0.0, 1.0)

    def probe(self) -> "SeedTransfer":
        """One gather and write-back of two rows: a failure shows when the way is built, not in the middle of timing."""
        ids = self.indices(torch.tensor([0, 1], device=self.variable.weight.device))
        self.gather(ids)
        self.scatter(ids)
        return self

    def indices(self, idx_gpu: torch.Tensor):
        """SpeedTorch indexes its CuPy array with what it is given: the batch's ids as a CuPy array on the GPU."""
        return self.cupy.from_dlpack(idx_gpu)

    def gather(self, idx) -> torch.Tensor:
        self.switcher.beforeForwardPass(idx)
        return self.variable.weight.data

    def scatter(self, idx) -> None:
        self.switcher.afterOptimizerStep(idx)


class SeedSpeedTorchWay:
    """The recommender of speedtorch.models.recommender trained SpeedTorch's way: the user table and its Adam state in
    pinned CuPy collections (``ModelFactory`` / ``OptimizerFactory`` with ``CPUPinn=True``), swapped into a
    batch-sized model variable before each forward pass and back after the optimizer step, with torch.optim.Adam
    (dense) on that variable. Its semantics are SpeedTorch's: one step count for all rows, and an id repeated within
    a batch keeps one copy's update (the last write wins). The item table and the loss are those of every other way
    (speedtorch.models.recommender's), so the ways differ only in the user table."""

    def __init__(self, num_rows: int, dim: int, num_items: int, device, lr: float = 1e-3):
        speedtorch_2019, self.cupy = load()
        self.model = torch.nn.Module()
        self.model.users = torch.nn.Embedding(1, dim, device=device)  # the batch variable; resized by each swap
        self.user_opt = torch.optim.Adam(self.model.parameters(), lr=lr)
        weight = self.model.users.weight
        state = self.user_opt.state[weight]
        state["step"] = torch.tensor(0.0)
        state["exp_avg"] = torch.zeros_like(weight)
        state["exp_avg_sq"] = torch.zeros_like(weight)
        self.user_switcher = speedtorch_2019.ModelFactory(self.model.users, total_classes=num_rows,
                                                          embed_dimension=dim, CPUPinn=True)
        self.user_switcher.normalDistributionInit(0.0, 0.1)
        self.opt_switcher = speedtorch_2019.OptimizerFactory(self.user_opt, num_rows, dim, self.model, "users",
                                                             CPUPinn=True)
        if getattr(self.opt_switcher, "optVarList", None) != ["exp_avg", "exp_avg_sq"]:
            raise SeedUnavailable(f"{LABEL}'s OptimizerFactory did not recognise torch's Adam")
        self.opt_switcher.optInit()
        from speedtorch.models.recommender import _ItemsMixin  # imported here: `main()` needs no speedtorch build

        self._items = _ItemsMixin
        _ItemsMixin._init_items(self, num_items, dim, device, lr)

    def step(self, users, items, labels):
        ids = self.cupy.from_dlpack(users.to(self.device))
        self.user_switcher.beforeForwardPass(ids)
        self.opt_switcher.beforeForwardPass(ids)
        # variableTransformer's dummy input: row i of the batch variable holds the batch's i-th id.
        positions = torch.arange(users.numel(), device=self.device)
        loss = self._items._loss(self, self.model.users(positions), items.to(self.device), labels.to(self.device))
        self.user_opt.zero_grad()
        self.item_opt.zero_grad()
        loss.backward()
        self.user_opt.step()
        self.item_opt.step()
        self.user_switcher.afterOptimizerStep(ids)
        self.opt_switcher.afterOptimizerStep(ids)
        return loss


def main() -> int:
    try:
        module, cupy = load(need_gpu=False)
    except SeedUnavailable as e:
        print(f"{LABEL}: {e}")
        return 1
    names = ("ModelFactory", "OptimizerFactory", "DataGadget")
    missing = [n for n in names if not hasattr(module, n)]
    print(f"{LABEL} imported from {Path(module.__file__).parent} (CuPy {cupy.__version__}, DLPack calls adapted; "
          f"GPU {'present' if torch.cuda.is_available() else 'absent'}); "
          + (f"missing: {missing}" if missing else f"has {', '.join(names)}"))
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
