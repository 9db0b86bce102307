"""A recommender whose user table is a speedtorch.PinnedEmbedding, written in TorchScript so that it serves and
trains without Python: a C++ server (server_main.cpp) answers lookups and top-k from it, a C++ trainer
(train_main.cpp) runs its `train_step` for N steps.

    python torchscript_examples/recommender_model.py --out model.pt --batches batches.pt

writes the scripted model (torch.jit.save; the user table goes inline or to a sidecar file, see
docs/persistence.md) and a scripted container of training batches that the C++ trainer reads.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Tuple

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import speedtorch  # noqa: E402


class Recommender(torch.nn.Module):
    """score(user, item) = <user row, item row> + bias. Users: a PinnedEmbedding trained by its fused Adam; items
    and bias: dense parameters trained by SGD inside train_step."""

    def __init__(self, num_users: int, num_items: int, dim: int, seed: int = 0):
        super().__init__()
        users = speedtorch.PinnedEmbedding(num_users, dim)
        users.set_optimizer("adam", {"lr": 0.05}, True)
        users.normal_(0.0, 0.1, seed)
        self.users = users
        gen = torch.Generator().manual_seed(seed + 1)
        self.items = torch.nn.Parameter(torch.randn(num_items, dim, generator=gen) * 0.1)
        self.bias = torch.nn.Parameter(torch.zeros(1))

    def forward(self, user_ids: torch.Tensor, item_ids: torch.Tensor) -> torch.Tensor:
        return self.score(user_ids, item_ids)

    @torch.jit.export
    def num_users(self) -> int:
        return self.users.num_rows()

    @torch.jit.export
    def score(self, user_ids: torch.Tensor, item_ids: torch.Tensor) -> torch.Tensor:
        rows = self.users.gather(user_ids, None)
        return (rows * self.items[item_ids]).sum(-1) + self.bias

    @torch.jit.export
    def lookup(self, user_ids: torch.Tensor) -> torch.Tensor:
        return self.users.gather(user_ids, None)

    @torch.jit.export
    def top_k(self, user_id: int, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
        row = self.users.gather(torch.tensor([user_id], device=self.items.device), None)[0]
        scores = self.items.detach() @ row + self.bias.detach()
        top = torch.topk(scores, min(k, scores.numel()))
        return top.indices, top.values

    @torch.jit.export
    def update_rows(self, user_ids: torch.Tensor, rows: torch.Tensor) -> None:
        self.users.scatter_(user_ids, rows)

    @torch.jit.export
    def train_step(self, user_ids: torch.Tensor, item_ids: torch.Tensor, labels: torch.Tensor, lr: float
                   ) -> torch.Tensor:
        unique, inverse = torch._unique(user_ids, sorted=True, return_inverse=True)
        rows = self.users.gather(unique, None).detach().requires_grad_()
        scores = (rows[inverse] * self.items[item_ids]).sum(-1) + self.bias
        loss = F.binary_cross_entropy_with_logits(scores, labels)
        grads = torch.autograd.grad([loss], [rows, self.items, self.bias])
        g_rows, g_items, g_bias = grads[0], grads[1], grads[2]
        assert g_rows is not None and g_items is not None and g_bias is not None
        self.users.apply_gradients(unique, g_rows)
        with torch.no_grad():
            self.items.sub_(lr * g_items)
            self.bias.sub_(lr * g_bias)
        return loss.detach()


class Batches(torch.nn.Module):
    """Training batches as tensors of a scripted module: what the C++ trainer reads with torch::jit::load."""

    def __init__(self, users: torch.Tensor, items: torch.Tensor, labels: torch.Tensor):
        super().__init__()
        self.register_buffer("users", users)
        self.register_buffer("items", items)
        self.register_buffer("labels", labels)

    def forward(self, i: int) -> List[torch.Tensor]:
        return [self.users[i], self.items[i], self.labels[i]]


def make_batches(num_users: int, num_items: int, count: int, size: int, seed: int = 0) -> Batches:
    gen = torch.Generator().manual_seed(seed)
    users = torch.randint(0, num_users, (count, size), generator=gen)
    items = torch.randint(0, num_items, (count, size), generator=gen)
    # A rule a dot product can learn, so the loss falls: users and items match when their ids share parity.
    labels = ((users % 2) == (items % 2)).float()
    return Batches(users, items, labels)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batches", type=Path)
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--items", type=int, default=1_000)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--num-batches", type=int, default=20)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--sidecar", help="save the user table to this file beside the model (docs/persistence.md; "
                        "needed above SPEEDTORCH_INLINE_MAX_BYTES)")
    args = parser.parse_args()
    model = torch.jit.script(Recommender(args.users, args.items, args.dim))
    if args.sidecar:
        model.users.set_sidecar(args.sidecar)
    speedtorch.jit_save(model, args.out)  # atomic: a failed save keeps the model file that was there
    if args.batches:
        speedtorch.jit_save(torch.jit.script(make_batches(args.users, args.items, args.num_batches, args.batch)),
                            args.batches)
    return 0


if __name__ == "__main__":
    sys.exit(main())
