"""Rank-preserving rounding of row-wise int8 codes: the codes of each row chosen so that the row's best items, scored
by dot product against an item table, come out in the float32 order (which items, and in which order).

Nearest rounding keeps every value within half a step (1/510 of the row's range), but a retrieval model's best
items often score within a few 1e-5 of each other: the error of the row along the difference of two near-tied items
swaps them. A row usually has more codes (dim) than its top k has fragile pairs, so codes one step off nearest can
cancel the error along those few directions while leaving it nearly as small elsewhere. Per row:

1. the pairs whose order makes the answer: neighbours among the k + 1 best items, and the k-th best against the next
   ``extra`` items; for each pair the direction ``item_a - item_b`` over its score gap ``g`` (near-ties weigh most);
2. the weighted squared error ``e^T H e`` (``H = sum d d^T / g^2``, ``e`` the dequantized row minus the float row) is
   lowered by moving one code up or down a step at a time, the best move each round, while one helps;
3. rows whose top-k order still differs then also try moves of two codes at once (the few left after step 2).

The dequantized value is modelled exactly as ``speedtorch::gather_dequant`` computes it (``q * scale + bias`` in
float32 with one rounding, then bfloat16), so what is optimized is what is served. Scales and biases stay those of
nearest rounding; only codes move, each at most MAX_STEPS (one) from nearest. A constant added to every score (a
global bias) does not change the order; per-item biases are not modelled.
"""

from __future__ import annotations

import torch

__all__ = ["rank_preserving_codes"]

#: Items compared with the k-th best beyond it (the ones that could enter the top k).
EXTRA_ITEMS = 20
#: How far a code may move from nearest rounding: the largest error of a value stays within 1.5 steps.
MAX_STEPS = 1
_SINGLE_MOVE_ROUNDS_PER_DIM = 4
_PAIR_MOVE_ROUNDS = 64
_PAIR_CHUNK_ROWS = 256


def _dequantize(codes: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """What gather_dequant returns for these codes, as float32 (see csrc/core/row_formats.h)."""
    return (codes.double() * scale.double() + bias.double()).float().bfloat16().float()


def _pair_weights(rows: torch.Tensor, items: torch.Tensor, k: int) -> torch.Tensor:
    """H (rows, dim, dim): the sum over a row's deciding pairs of d d^T / gap^2."""
    scores = rows @ items.T
    t = min(k + EXTRA_ITEMS, items.shape[0])
    k = min(k, t - 1)
    top_scores, top = scores.topk(t, dim=1)
    vectors = items[top]  # (rows, t, dim)
    directions = torch.cat([vectors[:, :k] - vectors[:, 1:k + 1], vectors[:, k - 1:k] - vectors[:, k + 1:]], 1)
    gaps = torch.cat([top_scores[:, :k] - top_scores[:, 1:k + 1], top_scores[:, k - 1:k] - top_scores[:, k + 1:]], 1)
    # Exact ties have no order to keep; a floor relative to the scores keeps their weight finite.
    floor = 1e-6 * top_scores[:, :1].abs().clamp_min(1e-6)
    weighted = directions / gaps.clamp_min(0).maximum(floor).unsqueeze(2)
    return weighted.transpose(1, 2) @ weighted


def _moves(codes, nearest, scale, bias, current):
    """Every one-step move of one code that stays within MAX_STEPS of nearest rounding and 0-255: (candidate codes
    (rows, 2 dim), change of the served value (0 for a move not allowed), coordinate)."""
    dim = codes.shape[1]
    low, high = (nearest - MAX_STEPS).clamp_min(0), (nearest + MAX_STEPS).clamp_max(255)
    candidates = torch.cat([torch.maximum(codes - 1, low), torch.minimum(codes + 1, high)], 1)
    change = _dequantize(candidates, scale, bias) - current.repeat(1, 2)
    return candidates, change, torch.arange(dim, device=codes.device).repeat(2)


def _improve_by_single_moves(rows, codes, nearest, scale, bias, H) -> torch.Tensor:
    diagonal = H.diagonal(dim1=1, dim2=2)
    active = torch.arange(rows.shape[0], device=rows.device)
    for _ in range(_SINGLE_MOVE_ROUNDS_PER_DIM * rows.shape[1]):
        current = _dequantize(codes[active], scale[active], bias[active])
        error = current - rows[active]
        h_error = (H[active] @ error.unsqueeze(2)).squeeze(2)
        loss = (error * h_error).sum(1)
        candidates, change, coordinate = _moves(codes[active], nearest[active], scale[active], bias[active], current)
        gain = 2 * change * h_error[:, coordinate] + change * change * diagonal[active][:, coordinate]
        best, which = gain.min(1)
        moving = best < -1e-6 * loss  # a relative margin: float noise must not cycle
        if not bool(moving.any()):
            break
        active, which = active[moving], which[moving]
        codes[active, coordinate[which]] = candidates[moving, which]
    return codes


def _improve_by_pair_moves(rows, codes, nearest, scale, bias, H) -> torch.Tensor:
    for _ in range(_PAIR_MOVE_ROUNDS):
        current = _dequantize(codes, scale, bias)
        error = current - rows
        h_error = (H @ error.unsqueeze(2)).squeeze(2)
        loss = (error * h_error).sum(1)
        candidates, change, coordinate = _moves(codes, nearest, scale, bias, current)
        single = 2 * change * h_error[:, coordinate] + change * change * H.diagonal(dim1=1, dim2=2)[:, coordinate]
        h_moves = H[:, coordinate][:, :, coordinate]
        pair = single.unsqueeze(2) + single.unsqueeze(1) + 2 * change.unsqueeze(2) * change.unsqueeze(1) * h_moves
        pair.masked_fill_(coordinate.unsqueeze(1) == coordinate.unsqueeze(0), float("inf"))  # one code, two moves
        best_pair, which_pair = pair.flatten(1).min(1)
        best_single, which_single = single.min(1)
        moving = torch.minimum(best_pair, best_single) < -1e-6 * loss
        if not bool(moving.any()):
            break
        first = torch.where(best_pair < best_single, which_pair // coordinate.numel(), which_single)
        second = torch.where(best_pair < best_single, which_pair % coordinate.numel(), which_single)
        index = moving.nonzero().squeeze(1)
        for move in (first, second):
            codes[index, coordinate[move[index]]] = candidates[index, move[index]]
    return codes


def _order_differs(rows, codes, scale, bias, items, k) -> torch.Tensor:
    k = min(k, items.shape[0])
    expected = (rows @ items.T).topk(k, dim=1).indices
    served = (_dequantize(codes, scale, bias) @ items.T).topk(k, dim=1).indices
    return (expected != served).any(1)


def rank_preserving_codes(rows: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor,
                          items: torch.Tensor, k: int) -> tuple[torch.Tensor, int]:
    """Codes for float32 ``rows`` (n, dim) that keep each row's ``k`` best ``items`` (m, dim), by dot product, in the
    float32 order; starts from ``codes`` (n, dim, float32 values 0-255, nearest rounding) with the rows' float32
    ``scale`` and ``bias`` (n, 1) as stored (float16 values). Returns (codes, rows whose order still differs)."""
    if items.shape[0] < 2 or k < 1:
        return codes, 0
    items = items.detach().float().to(rows.device)
    codes = codes.clone()
    block = max(256, (1 << 24) // rows.shape[1] ** 2)  # H takes dim^2 floats a row
    left = 0
    for start in range(0, rows.shape[0], block):
        part = slice(start, start + block)
        r, c, s, b = rows[part], codes[part], scale[part], bias[part]
        H = _pair_weights(r, items, k)
        nearest = c.clone()
        c = _improve_by_single_moves(r, c, nearest, s, b, H)
        differs = _order_differs(r, c, s, b, items, k).nonzero().squeeze(1)
        for begin in range(0, differs.numel(), _PAIR_CHUNK_ROWS):
            chosen = differs[begin:begin + _PAIR_CHUNK_ROWS]
            c[chosen] = _improve_by_pair_moves(r[chosen], c[chosen], nearest[chosen], s[chosen], b[chosen],
                                               H[chosen])
        left += int(_order_differs(r[differs], c[differs], s[differs], b[differs], items, k).sum())
        codes[part] = c
    return codes, left
