"""Rank-preserving rounding (speedtorch.serving) through quantize_rows(rank_items=...): int8 codes that keep each row's
best items, by dot product, in the float rows' order, read back by speedtorch::gather_dequant as the server reads
them."""

from __future__ import annotations

import pytest
import torch

from speedtorch.serving import gather_dequant, quantize_rows

ROWS, ITEMS, DIM = 3000, 300, 16


def int8_rows(table: torch.Tensor, **options) -> tuple[torch.Tensor, torch.Tensor]:
    """(the uint8 rows, what gather_dequant reads from them as float32)."""
    rows = quantize_rows(table, "int8_rowwise", pinned=False, row_alignment=4, **options)
    return rows, gather_dequant(rows, torch.arange(table.shape[0]), "int8_rowwise", table.shape[1]).float()


def order_kept(table: torch.Tensor, served: torch.Tensor, items: torch.Tensor, k: int) -> torch.Tensor:
    """Per row: whether its k best items come out the same and in the same order."""
    return ((table @ items.T).topk(k).indices == (served @ items.T).topk(k).indices).all(1)


@pytest.fixture(scope="module")
def table_and_items():
    generator = torch.Generator().manual_seed(0)
    table = torch.randn(ROWS, DIM, generator=generator)
    table[5] = 0.25  # a constant row: scale 0, every code reads the bias
    return table, torch.randn(ITEMS, DIM, generator=generator)


def test_rows_keep_their_top_k_order_where_nearest_rounding_swaps_near_ties(table_and_items):
    table, items = table_and_items
    _, nearest = int8_rows(table)
    _, ranked = int8_rows(table, rank_items=items, rank_k=10)
    kept_nearest = float(order_kept(table, nearest, items, 10).float().mean())
    kept = float(order_kept(table, ranked, items, 10).float().mean())
    assert kept_nearest < 0.95 and kept >= 0.99, (kept_nearest, kept)


def test_codes_move_at_most_one_step_from_nearest_rounding_with_the_same_scales(table_and_items):
    table, items = table_and_items
    nearest_rows, _ = int8_rows(table)
    ranked_rows, ranked = int8_rows(table, rank_items=items, rank_k=10)
    assert torch.equal(ranked_rows[:, :4], nearest_rows[:, :4])  # float16 scale and bias
    moved = (ranked_rows[:, 4:].int() - nearest_rows[:, 4:].int()).abs()
    assert int(moved.max()) == 1 and int(moved[5].max()) == 0
    # Each value within 1.5 steps of the float one, plus the bfloat16 rounding of what is served.
    step = torch.from_numpy(ranked_rows[:, :2].numpy().copy().view("float16")).float()
    assert bool(((ranked - table).abs() <= 1.5 * step + ranked.abs() * 2.0 ** -8).all())


def test_more_k_than_items_keeps_the_order_of_every_item(table_and_items):
    table, items = table_and_items
    few = items[:6]
    _, nearest = int8_rows(table, rank_items=None)
    _, ranked = int8_rows(table, rank_items=few, rank_k=50)
    assert float(order_kept(table, ranked, few, 6).float().mean()) >= max(
        0.99, float(order_kept(table, nearest, few, 6).float().mean()))


def test_rank_items_must_fit_the_rows_and_the_format(table_and_items):
    table, items = table_and_items
    with pytest.raises(ValueError, match="rank_items applies to int8_rowwise rows, not 'fp8_e4m3_ue8m0'"):
        quantize_rows(torch.randn(4, 32), "fp8_e4m3_ue8m0", rank_items=torch.randn(3, 32))
    with pytest.raises(ValueError, match=r"rank_items must be a float \(num_items, 16\) tensor"):
        quantize_rows(table, "int8_rowwise", rank_items=items[:, :8])
    with pytest.raises(ValueError, match="rank_k must be >= 1, got 0"):
        quantize_rows(table, "int8_rowwise", rank_items=items, rank_k=0)
