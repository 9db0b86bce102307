"""speedtorch::gather_dequant and the serving formats (speedtorch.serving): rows equal a plain-torch dequantization
bit for bit on every route (CPU, pinned table over UVA, GPU table, pageable table through staging, CUDA graph),
the conversion from a trained table is close to it, layouts are the documented ones, bad input raises."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import speedtorch
from speedtorch.serving import QuantizedRows, format_row_bytes, gather_dequant, quantize_rows

FORMATS = ["bf16", "int8_rowwise", "fp8_e4m3_ue8m0"]


def ue8m0(e: torch.Tensor) -> torch.Tensor:
    """2 ** (e - 127) in float32, built from its bits (e = 0: the subnormal 2 ** -127)."""
    e = e.to(torch.int32)
    bits = torch.where(e == 0, torch.full_like(e, 1 << 22), e << 23)
    return torch.where(e == 255, torch.full_like(e, 0x7FC00000), bits).view(torch.float32)


def reference_dequantize(table: torch.Tensor, format: str, dim: int) -> torch.Tensor:
    """The documented layouts decoded in plain torch: each value in float32 with one rounding, then bfloat16."""
    if format == "bf16":
        return (table.view(torch.bfloat16) if table.dtype == torch.uint8 else table)[:, :dim].clone()
    if format == "int8_rowwise":  # [fp16 scale][fp16 bias][dim codes]: code * scale + bias (exact in float64)
        scale = table[:, 0:2].contiguous().view(torch.float16).double()
        bias = table[:, 2:4].contiguous().view(torch.float16).double()
        return (table[:, 4:4 + dim].double() * scale + bias).float().to(torch.bfloat16)
    # [dim e4m3 codes][dim / 32 ue8m0 bytes]: code * 2 ** (byte - 127)
    codes = table[:, :dim].contiguous().view(torch.float8_e4m3fn).float()
    scales = ue8m0(table[:, dim:dim + dim // 32]).repeat_interleave(32, 1)
    return (codes * scales).to(torch.bfloat16)


def trained_table(n=300, dim=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(n, dim, generator=g) * torch.rand(n, 1, generator=g) * 3
    table[5] = 0.0  # a row of zeros: scale 0 (int8), the smallest ue8m0 (fp8)
    table[6] = 1e-30  # tiny values
    return table


@pytest.mark.parametrize("format", FORMATS)
def test_cpu_rows_equal_the_reference(format):
    weights = trained_table()
    table = quantize_rows(weights, format)
    ids = torch.randint(0, 300, (7, 11))
    out = gather_dequant(table, ids, format, 64)
    assert out.dtype == torch.bfloat16 and out.shape == (7, 11, 64)
    assert torch.equal(out, reference_dequantize(table, format, 64)[ids])
    assert torch.equal(gather_dequant(table, ids.int(), format, 64), out)


@pytest.mark.parametrize("format", FORMATS)
def test_conversion_is_close_to_the_trained_table(format):
    weights = trained_table()
    rows = QuantizedRows.from_table(weights, format).dequantize().float()
    if format == "bf16":
        torch.testing.assert_close(rows, weights.to(torch.bfloat16).float())
    elif format == "int8_rowwise":  # half a step of 255 over the row's range (float16 scale), plus bf16 rounding
        step = ((weights.amax(1) - weights.amin(1)) / 255).unsqueeze(1)
        assert bool(((rows - weights).abs() <= 0.65 * step + 0.01 * weights.abs() + 1e-6).all())
    else:  # e4m3 keeps 3 mantissa bits: within 1/16 of the block's largest value
        block_max = weights.abs().reshape(300, 2, 32).amax(2).repeat_interleave(32, 1)
        assert bool(((rows - weights).abs() <= block_max / 16 + 1e-30).all())
    assert torch.equal(rows[5], torch.zeros(64))


def test_layouts_are_the_documented_ones():
    assert format_row_bytes("int8_rowwise", 128) == 132 and format_row_bytes("int8_rowwise", 128, 16) == 144
    assert format_row_bytes("fp8_e4m3_ue8m0", 256) == 264  # DeepSeek-V4.1's Engram rows
    assert quantize_rows(torch.randn(3, 256), "fp8_e4m3_ue8m0", row_alignment=1).shape == (3, 264)
    weights = torch.tensor([[-1.0, 0.0, 2.0, 3.0]])
    row = quantize_rows(weights, "int8_rowwise")
    assert row.shape == (1, 16)
    assert row[0, 0:2].view(torch.float16).item() == pytest.approx(4 / 255, rel=1e-3)  # scale first, then bias
    assert row[0, 2:4].view(torch.float16).item() == -1.0
    assert row[0, 4:8].tolist() == [0, 64, 191, 255]
    fp8 = quantize_rows(torch.full((1, 32), 3.0), "fp8_e4m3_ue8m0")
    assert fp8[0, 32].item() == 127 - 7  # 3 / 448 -> scale 2 ** -7; codes 3 * 128 = 384
    assert fp8[0, :32].view(torch.float8_e4m3fn).float().unique().tolist() == [384.0]


@pytest.mark.parametrize("format", ["int8_rowwise", "fp8_e4m3_ue8m0"])
def test_unpadded_and_odd_strides(format):
    weights = trained_table(dim=96)
    table = quantize_rows(weights, format, row_alignment=1)  # 100 or 99 bytes a row: byte-wide loads
    wide = torch.zeros(300, table.shape[1] + 7, dtype=torch.uint8)
    wide[:, :table.shape[1]] = table
    ids = torch.randint(0, 300, (50,))
    expected = reference_dequantize(table, format, 96)[ids]
    assert torch.equal(gather_dequant(table, ids, format, 96), expected)
    assert torch.equal(gather_dequant(wide, ids, format, 96), expected)


@pytest.mark.parametrize(
    ("table", "format", "dim", "error", "message"),
    [
        (torch.zeros(4, 16, dtype=torch.uint8), "int4", 8, ValueError, "unknown row format 'int4'"),
        (torch.zeros(4, 16), "int8_rowwise", 8, RuntimeError, "must be uint8"),
        (torch.zeros(4, 16, dtype=torch.uint8), "int8_rowwise", 16, ValueError, "takes 20 bytes but the table's rows"),
        (torch.zeros(4, 40, dtype=torch.uint8), "fp8_e4m3_ue8m0", 36, ValueError, "multiple of 32"),
        (torch.zeros(4, 16, dtype=torch.float16), "bf16", 8, RuntimeError, "bfloat16"),
        (torch.zeros(16, dtype=torch.uint8), "bf16", 8, RuntimeError, "2-D"),
    ],
)
def test_bad_arguments(table, format, dim, error, message):
    with pytest.raises(error, match=message):
        gather_dequant(table, torch.tensor([0]), format, dim)


def test_bad_indices():
    table = quantize_rows(torch.randn(10, 32), "fp8_e4m3_ue8m0")
    with pytest.raises(IndexError, match="holds 10 at flat position 1"):
        gather_dequant(table, torch.tensor([3, 10]), "fp8_e4m3_ue8m0", 32)
    with pytest.raises(IndexError, match="holds -1"):
        gather_dequant(table, torch.tensor([-1]), "fp8_e4m3_ue8m0", 32)
    with pytest.raises(RuntimeError, match="int64 or int32"):
        gather_dequant(table, torch.tensor([1.0]), "fp8_e4m3_ue8m0", 32)


def test_opcheck():
    for format in FORMATS:
        table = quantize_rows(torch.randn(20, 32), format, pinned=False)
        torch.library.opcheck(torch.ops.speedtorch.gather_dequant.default,
                              (table, torch.randint(0, 20, (3, 4)), format, 32))


@pytest.mark.parametrize("format", FORMATS)
def test_saved_rows_open_mapped(tmp_path, format):
    rows = QuantizedRows.from_table(trained_table(), format)
    rows.save(tmp_path / "engram.npy")
    for pin in (False, True):
        opened = QuantizedRows.open(tmp_path / "engram.npy", pin=pin)
        assert (opened.format, opened.dim, opened.num_rows) == (format, 64, 300)
        ids = torch.randint(0, 300, (40,))
        assert torch.equal(opened.gather(ids), rows.gather(ids))


# Rows and record of different saves: int8 and fp8 rows of dim 32 are both 48 bytes wide at row_alignment 16, so
# int8 rows read as fp8 (or the reverse) decode without any error, to wrong values.
PAIR_DIM = 32
_KILLED_SAVER = r"""
import os, sys
import torch
import speedtorch.data
from speedtorch.serving import QuantizedRows

real_save_npy = speedtorch.data.save_npy

def save_then_die(tensor, path):
    real_save_npy(tensor, path)
    os._exit(3)  # the process dies once the rows are replaced, before their record is written

speedtorch.data.save_npy = save_then_die
QuantizedRows.from_table(torch.randn(40, 32) * 4, "fp8_e4m3_ue8m0").save(sys.argv[1])
"""


def _int8_then_fp8():
    int8 = QuantizedRows.from_table(trained_table(40, PAIR_DIM, seed=1), "int8_rowwise")
    fp8 = QuantizedRows.from_table(trained_table(40, PAIR_DIM, seed=2), "fp8_e4m3_ue8m0")
    assert int8.table.shape == fp8.table.shape  # nothing in the rows tells the formats apart
    return int8, fp8


def test_a_save_killed_between_rows_and_record_is_refused(tmp_path):
    path = tmp_path / "rows.npy"
    int8, _ = _int8_then_fp8()
    int8.save(path)
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root / "python"), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", _KILLED_SAVER, str(path)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 3, done.stderr
    assert not torch.equal(speedtorch.data.load_npy(path, pinned=False), int8.table)  # the new rows are in place
    for verify in (True, False):  # the old int8 record used to read the new fp8 rows as int8
        with pytest.raises(RuntimeError, match=r"has no record .*rows.npy.format.json .*a save that did not finish"):
            QuantizedRows.open(path, verify=verify)


def test_rows_and_record_of_different_saves_are_refused(tmp_path):
    path = tmp_path / "rows.npy"
    int8, fp8 = _int8_then_fp8()
    int8.save(path)
    old_record = (tmp_path / "rows.npy.format.json").read_bytes()
    fp8.save(path)
    (tmp_path / "rows.npy.format.json").write_bytes(old_record)  # the old record beside the new rows
    with pytest.raises(RuntimeError, match=r"holds other rows than its record .*the files are of different saves"):
        QuantizedRows.open(path)
    fp8.save(path)
    assert torch.equal(QuantizedRows.open(path).dequantize(), fp8.dequantize())


def test_a_save_that_fails_writing_the_rows_keeps_the_old_pair(tmp_path, monkeypatch):
    path = tmp_path / "rows.npy"
    int8, fp8 = _int8_then_fp8()
    int8.save(path)

    def interrupted(tensor, target):
        raise KeyboardInterrupt  # speedtorch.save_npy stops at Ctrl-C, leaving the old file

    monkeypatch.setattr(speedtorch.data, "save_npy", interrupted)
    with pytest.raises(KeyboardInterrupt):
        fp8.save(path)
    opened = QuantizedRows.open(path)
    assert opened.format == "int8_rowwise" and torch.equal(opened.dequantize(), int8.dequantize())


def test_a_save_racing_an_open_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "rows.npy"
    int8, fp8 = _int8_then_fp8()
    int8.save(path)
    real_open_npy = speedtorch.data.open_npy

    def open_then_save(*args, **kwargs):
        table = real_open_npy(*args, **kwargs)
        fp8.save(path)  # another process saving while this one maps the rows
        return table

    monkeypatch.setattr(speedtorch.data, "open_npy", open_then_save)
    with pytest.raises(RuntimeError, match="was saved again while it was being opened; open it again"):
        QuantizedRows.open(path, verify=False)


def test_a_record_without_a_content_hash_opens_only_unverified(tmp_path):
    path = tmp_path / "rows.npy"
    int8, _ = _int8_then_fp8()
    int8.save(path)
    (tmp_path / "rows.npy.format.json").write_text(json.dumps({"format": "int8_rowwise", "dim": PAIR_DIM}))
    with pytest.raises(RuntimeError, match="names no content hash to check the rows against"):
        QuantizedRows.open(path)
    assert torch.equal(QuantizedRows.open(path, verify=False).dequantize(), int8.dequantize())


def test_the_record_names_format_dim_shape_and_hash(tmp_path):
    path = tmp_path / "rows.npy"
    int8, _ = _int8_then_fp8()
    content_hash = int8.save(path)
    record = json.loads((tmp_path / "rows.npy.format.json").read_text())
    assert record == {"format": "int8_rowwise", "dim": PAIR_DIM, "shape": list(int8.table.shape),
                      "rows_hash": content_hash}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.npy", "rows.npy.format.json"]  # no temporaries


# --- GPU routes ----------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("format", FORMATS)
def test_gpu_routes_equal_the_reference(format, transfer_settings):
    weights = trained_table(n=20_000, dim=128)
    pinned = quantize_rows(weights, format)
    expected_all = reference_dequantize(pinned, format, 128)
    small = torch.randint(0, 20_000, (3, 50))
    large = torch.randint(0, 20_000, (9000,))  # sorted by row first once the table counts as spread
    for ids in (small, large):
        expected = expected_all[ids]
        for index_device in ("cpu", "cuda"):
            got = gather_dequant(pinned, ids.to(index_device), format, 128, "cuda")
            assert got.is_cuda and torch.equal(got.cpu(), expected)
        assert torch.equal(gather_dequant(pinned.cuda(), ids.cuda(), format, 128).cpu(), expected)  # GPU table
        pageable = pinned.clone()  # ordinary memory: CPU threads read it, the copy engine moves the raw rows
        assert torch.equal(gather_dequant(pageable, ids, format, 128, "cuda").cpu(), expected)
    transfer_settings(uva_reach_bytes=0)  # every large batch sorted
    assert torch.equal(gather_dequant(pinned, large.cuda(), format, 128).cpu(), expected_all[large])
    transfer_settings(uva_fraction=0.5, small_transfer_bytes=0)  # half the rows through CPU threads and staging
    for index_device in ("cpu", "cuda"):
        got = gather_dequant(pinned, large.to(index_device), format, 128, "cuda")
        assert torch.equal(got.cpu(), expected_all[large])


@pytest.mark.gpu
def test_gpu_bad_index_deferred_leaves_nan_and_raises_later(deferred_checks):
    table = quantize_rows(torch.randn(100, 64), "fp8_e4m3_ue8m0")
    out = gather_dequant(table, torch.tensor([4, 100, 7], device="cuda"), "fp8_e4m3_ue8m0", 64)
    with pytest.raises(IndexError, match="holds 100 at flat position 1"):
        speedtorch.check_index_errors()
    assert torch.isnan(out[1].float().cpu()).all()
    assert torch.equal(out[[0, 2]].cpu(), reference_dequantize(table, "fp8_e4m3_ue8m0", 64)[[4, 7]])


@pytest.mark.gpu
@pytest.mark.parametrize("count", [1024, 6000])
def test_gpu_capture_and_replay(count, transfer_settings):
    """A decode-size batch, and one large enough to be sorted by row inside the graph (the table counted as spread)."""
    transfer_settings(uva_reach_bytes=0)
    table = quantize_rows(trained_table(n=5000, dim=256), "fp8_e4m3_ue8m0")
    expected_all = reference_dequantize(table, "fp8_e4m3_ue8m0", 256)
    ids = torch.randint(0, 5000, (count,), device="cuda")
    gather_dequant(table, ids, "fp8_e4m3_ue8m0", 256)  # warm-up outside the graph
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gather_dequant(table, ids, "fp8_e4m3_ue8m0", 256)
    for _ in range(3):
        ids.copy_(torch.randint(0, 5000, (count,), device="cuda"))
        graph.replay()
        assert torch.equal(out.cpu(), expected_all[ids.cpu()])


@pytest.mark.gpu
def test_gpu_capture_refuses_a_pageable_table():
    pageable = quantize_rows(torch.randn(100, 32), "fp8_e4m3_ue8m0", pinned=False)
    ids = torch.randint(0, 100, (16,), device="cuda")
    with pytest.raises(RuntimeError, match="pageable host memory"):  # CPU threads would read it: a replay cannot
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            gather_dequant(pageable, ids, "fp8_e4m3_ue8m0", 32)


@pytest.mark.gpu
@pytest.mark.parametrize("format", ["int8_rowwise", "fp8_e4m3_ue8m0"])
@pytest.mark.parametrize("rows_in_flight", [1, 2, 4, 8])
def test_gpu_uva_groups_equal_the_cpu_rows(format, rows_in_flight, transfer_settings):
    """The UVA kernel reads a group of rows a warp, as many as fill `uva_rows_in_flight` loads a lane, and converts
    one group while the next is read. At every setting, rows out equal the CPU loop's bit for bit: dim-256 rows
    padded to 16 bytes (seven fp8 rows a group at four loads) and unpadded (narrower loads), rows larger than a warp's
    loads (one row a group, read in chunks); sorted, unsorted and locality-sorted indices, int64 and int32, batches
    that end in a partial group, and a decode-size one."""
    transfer_settings(uva_rows_in_flight=rows_in_flight, uva_fraction=1.0, sort_uva_indices=0)
    g = torch.Generator().manual_seed(rows_in_flight)
    for dim, alignment, n in ((256, 16, 12_000), (256, 1, 12_000), (1024, 16, 6000), (4096, 16, 2000)):
        table = quantize_rows(trained_table(n=n, dim=dim), format, row_alignment=alignment)
        unsorted = torch.randint(0, n, (9001,), generator=g)
        batches = [unsorted, unsorted.int(), torch.unique(unsorted), unsorted[:37]]
        for ids in batches:
            expected = gather_dequant(table, ids, format, dim, "cpu")
            assert torch.equal(gather_dequant(table, ids.cuda(), format, dim).cpu(), expected), (dim, alignment)
        with speedtorch.transfer_config_override(sort_uva_indices=1, uva_reach_bytes=0):  # sorted on the GPU first
            got = gather_dequant(table, unsorted.cuda(), format, dim)
        assert torch.equal(got.cpu(), gather_dequant(table, unsorted, format, dim, "cpu")), (dim, alignment)


@pytest.mark.gpu
@pytest.mark.parametrize("format", ["int8_rowwise", "fp8_e4m3_ue8m0"])
@pytest.mark.parametrize("sort", [0, 1])
def test_gpu_bad_index_in_a_large_batch_deferred(format, sort, deferred_checks, transfer_settings):
    """A bad index inside a group of a large batch, its rows read in batch order or sorted by row first: its row
    alone is NaN, the others equal the CPU's, and the error names its position in the batch."""
    transfer_settings(sort_uva_indices=sort, uva_reach_bytes=0)
    table = quantize_rows(trained_table(n=8000, dim=256), format)
    ids = torch.randint(0, 8000, (9000,), generator=torch.Generator().manual_seed(sort))
    ids[4321] = 8000
    out = gather_dequant(table, ids.cuda(), format, 256)
    with pytest.raises(IndexError, match="holds 8000 at flat position 4321"):
        speedtorch.check_index_errors()
    good = torch.ones(9000, dtype=torch.bool)
    good[4321] = False
    assert torch.isnan(out[4321].float().cpu()).all()
    assert torch.equal(out[good].cpu(), gather_dequant(table, ids[good], format, 256, "cpu"))


@pytest.mark.gpu
def test_gpu_auto_split_is_uva_alone_for_gpu_indices(transfer_settings):
    """The automatic split stages a share through CPU threads only for indices on the host: GPU indices would first
    have to come back to the host for it (a wait before the kernel is queued)."""
    transfer_settings(uva_reach_bytes=0, small_transfer_bytes=0, staged_gbps_per_thread=100.0, staged_max_gbps=100.0)
    table = quantize_rows(trained_table(n=5000, dim=256), "fp8_e4m3_ue8m0")
    ids = torch.randint(0, 5000, (6000,))
    expected = gather_dequant(table, ids, "fp8_e4m3_ue8m0", 256, "cpu")
    for index_device, staged in (("cuda", False), ("cpu", True)):
        speedtorch.reset_stats()
        got = gather_dequant(table, ids.to(index_device), "fp8_e4m3_ue8m0", 256, "cuda")
        assert torch.equal(got.cpu(), expected)
        stats = speedtorch.stats()
        assert (stats["staged_gather_rows"] > 0) is staged, index_device
        assert stats["uva_gather_rows"] + stats["staged_gather_rows"] == 6000


# --- values a format cannot hold --------------------------------------------------------------------------------


def test_int8_refuses_a_row_whose_float16_bias_would_be_infinite():
    """The bias (the row's smallest value) is float16: -70000 used to be stored as -inf, and the row decoded as
    -inf everywhere."""
    weights = torch.randn(8, 32)
    weights[3, 7] = -70000.0
    with pytest.raises(ValueError, match=r"row 3's smallest value -70000.0 is beyond float16's range \(\+-65504\)"):
        quantize_rows(weights, "int8_rowwise")
    weights[3, 7] = 0.0
    weights[5] = 1e5  # every value large: the bias is too
    with pytest.raises(ValueError, match=r"row 5's smallest value 100000.0 is beyond float16's range"):
        quantize_rows(weights, "int8_rowwise", chunk_rows=2)  # numbered in the table, not in the chunk


def test_int8_refuses_a_row_whose_float16_scale_would_be_infinite():
    weights = torch.zeros(4, 32)
    weights[2, 0], weights[2, 1] = -60000.0, 2e7  # (max - min) / 255 = 78667 > 65504; the bias fits
    with pytest.raises(ValueError, match=r"row 2 spans -60000.0 to 20000000.0, wider than int8_rowwise's float16 "
                                         r"scale holds"):
        quantize_rows(weights, "int8_rowwise")


def test_int8_keeps_large_values_its_scale_and_bias_hold():
    weights = torch.zeros(2, 32)
    weights[0, 1] = 1e5  # beyond float16, but the bias is 0 and the scale 392: representable
    weights[1] = torch.linspace(-65000.0, 65000.0, 32)
    rows = QuantizedRows.from_table(weights, "int8_rowwise").dequantize().float()
    assert bool(rows.isfinite().all())
    step = ((weights.amax(1) - weights.amin(1)) / 255).unsqueeze(1)
    assert bool(((rows - weights).abs() <= 0.65 * step + 0.01 * weights.abs()).all())


@pytest.mark.parametrize("format", ["int8_rowwise", "fp8_e4m3_ue8m0"])
@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_quantized_formats_refuse_nan_and_infinities(format, value):
    weights = torch.randn(6, 32)
    weights[4, 9] = value
    with pytest.raises(ValueError, match=rf"row 4 holds {value!r} \(column 9\); {format} rows hold finite values"):
        quantize_rows(weights, format)


def test_bf16_keeps_nan_and_infinities():
    weights = torch.tensor([[float("inf"), float("-inf"), float("nan"), 1.0]])
    rows = quantize_rows(weights, "bf16").float()
    assert rows[0, 0] == float("inf") and rows[0, 1] == float("-inf") and rows[0, 2].isnan() and rows[0, 3] == 1.0


@pytest.mark.parametrize(
    ("format", "value", "kind"),
    [("bf16", 3.4e38, "bfloat16"), ("bf16", 1e39, "bfloat16"), ("int8_rowwise", 1e39, "float32"),
     ("fp8_e4m3_ue8m0", -1e39, "float32")],
)
def test_finite_values_beyond_the_conversion_type_are_refused(format, value, kind):
    """A finite value the conversion turns into an infinity (float32's 3.4e38 rounds to bfloat16's inf; a float64
    table's 1e39 to float32's)."""
    weights = torch.randn(3, 32, dtype=torch.float64)
    weights[1, 2] = value
    with pytest.raises(ValueError, match=rf"row 1 holds {re.escape(repr(value))} \(column 2\), beyond {kind}'s range"):
        quantize_rows(weights, format)


def test_fp8_scales_span_float32s_range():
    weights = torch.zeros(2, 32)
    weights[0] = torch.arange(32) * 1e37 - 1.6e38
    weights[0, 0], weights[0, 1] = -3e38, 3e38
    weights[1, 0] = 1e-38
    rows = QuantizedRows.from_table(weights, "fp8_e4m3_ue8m0").dequantize().float()
    assert bool(rows.isfinite().all())
    assert bool(((rows - weights).abs() <= weights.abs().amax(1, keepdim=True) / 16).all())
