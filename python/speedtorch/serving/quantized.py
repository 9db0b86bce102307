"""Serving formats for embedding rows: bf16, row-wise int8 and block-scaled fp8, read with
:func:`gather_dequant` (``speedtorch::gather_dequant``, which dequantizes to bfloat16 inside the gather kernel).

Layouts (``csrc/core/row_formats.h``; docs/engram.md). A quantized table is ``uint8 (num_rows, row_stride)``:

- ``"bf16"``: ``dim`` bfloat16 values (the table may also be a ``bfloat16 (num_rows, dim)`` tensor).
- ``"int8_rowwise"``: FBGEMM's INT8 inference row (``IntNBitTableBatchedEmbeddingBagsCodegen``): a float16 scale, a
  float16 bias, then ``dim`` uint8 codes; ``value = code * scale + bias``; rows padded to 16 bytes.
- ``"fp8_e4m3_ue8m0"``: DeepSeek-V4.1's Engram row: ``dim`` float8 e4m3fn codes, then ``dim / 32`` ue8m0 bytes
  (one power-of-two scale ``2 ** (byte - 127)`` per block of 32 elements); ``value = code * scale``.

:func:`quantize_rows` writes them from a trained float table, chunk by chunk (no table-sized temporary);
:class:`QuantizedRows` holds one with its format, saves and opens it (in shared memory for every process of a host,
or memory-mapped from a file larger than RAM).
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from typing import NamedTuple, Optional, Union

import torch

from ..ops import pinned_empty
from .rank_preserving_rounding import rank_preserving_codes

__all__ = ["FORMATS", "gather_dequant", "quantize_rows", "format_row_bytes", "QuantizedRows"]

FORMATS = ("bf16", "int8_rowwise", "fp8_e4m3_ue8m0")
FP8_BLOCK = 32
_INT8_QPARAM_BYTES = 4
_FP8_MAX = 448.0

PathLike = Union[str, os.PathLike]
_RECORD_SUFFIX = ".format.json"


def gather_dequant(table: torch.Tensor, indices: torch.Tensor, format: str, dim: int,
                   device: Optional[Union[torch.device, str]] = None) -> torch.Tensor:
    """Rows ``indices`` (int32/int64, any shape) of a table in ``format``, dequantized to bfloat16: shape
    ``indices.shape + (dim,)`` on ``device`` if given, else on the indices' device.

    A pinned host table read by a GPU goes through one kernel that reads the rows over UVA and dequantizes them as
    it writes; a pageable one (a file larger than RAM mapped without page-locking) through CPU threads, pinned
    staging and the copy engine. Bad indices raise ``IndexError`` as :func:`speedtorch.gather`'s do."""
    return torch.ops.speedtorch.gather_dequant(table, indices, format, int(dim),
                                               None if device is None else torch.device(device))


def format_row_bytes(format: str, dim: int, row_alignment: int = 1) -> int:
    """Bytes of one row of ``dim`` elements in ``format``, rounded up to a multiple of ``row_alignment``."""
    if format not in FORMATS:
        raise ValueError(f"unknown row format {format!r}; known: {', '.join(FORMATS)}")
    if format == "fp8_e4m3_ue8m0" and dim % FP8_BLOCK:
        raise ValueError(f"fp8_e4m3_ue8m0 rows have one scale per {FP8_BLOCK} elements: dim must be a multiple of "
                         f"{FP8_BLOCK}, got {dim}")
    raw = {"bf16": 2 * dim, "int8_rowwise": _INT8_QPARAM_BYTES + dim,
           "fp8_e4m3_ue8m0": dim + dim // FP8_BLOCK}[format]
    return -(-raw // row_alignment) * row_alignment


def _ue8m0_values(exponent_bytes: torch.Tensor) -> torch.Tensor:
    """ue8m0 bytes as the float32 powers of two they stand for (byte 0 is 2**-127, a subnormal; 255 is NaN)."""
    e = exponent_bytes.to(torch.int32)
    bits = torch.where(e == 0, torch.full_like(e, 0x00400000), e << 23)
    bits = torch.where(e == 255, torch.full_like(e, 0x7FC00000), bits)
    return bits.view(torch.float32)


def _first(mask: torch.Tensor) -> tuple[int, ...]:
    """The index of the first True of ``mask`` (which holds one), as ints."""
    return tuple(int(i) for i in mask.nonzero()[0])


def _check_values(source: torch.Tensor, rows: torch.Tensor, first_row: int, format: str) -> None:
    """Refuses values a ``format`` row cannot hold, naming the row, the column and the value: finite values that the
    conversion (to bfloat16 for ``bf16``, else to float32) turns into infinities, and, for the quantized formats,
    NaN and infinities (int8 codes and e4m3 codes with power-of-two scales have none; bf16 keeps them as they are).
    ``source``: the table's rows as given; ``rows``: the same converted (to bfloat16 or float32)."""
    converted = rows.isinf() & source.isfinite()
    if bool(converted.any()):
        r, c = _first(converted)
        kind = "bfloat16" if format == "bf16" else "float32"
        raise ValueError(f"quantize_rows: row {first_row + r} holds {source[r, c].item()!r} (column {c}), beyond "
                         f"{kind}'s range (+-{torch.finfo(rows.dtype).max:.5g}), which {format} rows are converted "
                         f"through; scale the table down")
    if format == "bf16":
        return
    bad = ~rows.isfinite()
    if bool(bad.any()):
        r, c = _first(bad)
        raise ValueError(f"quantize_rows: row {first_row + r} holds {rows[r, c].item()!r} (column {c}); {format} "
                         f"rows hold finite values only")


def _quantize_int8(rows: torch.Tensor, out: torch.Tensor, rank_items: Optional[torch.Tensor], rank_k: int,
                   first_row: int = 0) -> int:
    """Writes the rows' int8 form into ``out``; returns how many rows' top ``rank_k`` order differs (0 without
    ``rank_items``). Rows whose bias (their smallest value) or scale does not fit in float16 are refused, naming the
    row (``first_row`` is the first one's number in the table): stored, either would be an infinity."""
    low, high = rows.amin(1), rows.amax(1)
    bias = low.to(torch.float16)
    if bool(bias.isinf().any()):
        r = _first(bias.isinf())[0]
        raise ValueError(f"quantize_rows: row {first_row + r}'s smallest value {low[r].item()!r} is beyond float16's "
                         f"range (+-65504): int8_rowwise stores it as the row's float16 bias. Scale the table down, "
                         f"or use fp8_e4m3_ue8m0 (whose scales span float32's range)")
    scale = ((high - low) / 255.0).to(torch.float16)
    if bool(scale.isinf().any()):
        r = _first(scale.isinf())[0]
        raise ValueError(f"quantize_rows: row {first_row + r} spans {low[r].item()!r} to {high[r].item()!r}, wider "
                         f"than int8_rowwise's float16 scale holds ((max - min) / 255 <= 65504). Scale the table "
                         f"down, or use fp8_e4m3_ue8m0 (whose scales span float32's range)")
    s, b = scale.float().unsqueeze(1), bias.float().unsqueeze(1)
    codes = torch.where(s > 0, ((rows - b) / torch.where(s > 0, s, torch.ones_like(s))).round(), torch.zeros_like(rows))
    codes = codes.clamp(0, 255)
    differing = 0
    if rank_items is not None:
        codes, differing = rank_preserving_codes(rows, codes, s, b, rank_items, rank_k)
    out[:, 0:2] = scale.view(torch.uint8).view(-1, 2)
    out[:, 2:4] = bias.view(torch.uint8).view(-1, 2)
    out[:, 4:4 + rows.shape[1]] = codes.to(torch.uint8)
    return differing


def _quantize_fp8(rows: torch.Tensor, out: torch.Tensor) -> None:
    n, dim = rows.shape
    blocks = rows.reshape(n, dim // FP8_BLOCK, FP8_BLOCK)
    ratio = blocks.abs().amax(2) / _FP8_MAX
    # The smallest power of two >= ratio (ceil(log2)), exactly: frexp gives ratio = m * 2**k with m in [0.5, 1).
    mantissa, exponent = torch.frexp(ratio)
    exponent = exponent - (mantissa == 0.5).to(exponent.dtype)
    exponent = torch.where(ratio > 0, exponent, torch.full_like(exponent, -127)).clamp(-127, 127)
    scale_bytes = (exponent + 127).to(torch.uint8)
    scale = _ue8m0_values(scale_bytes)
    codes = (blocks / scale.unsqueeze(2)).clamp(-_FP8_MAX, _FP8_MAX).to(torch.float8_e4m3fn)
    out[:, :dim] = codes.reshape(n, dim).view(torch.uint8)
    out[:, dim:dim + dim // FP8_BLOCK] = scale_bytes


def quantize_rows(table: torch.Tensor, format: str, *, row_alignment: int = 16, pinned: bool = True,
                  chunk_rows: int = 1 << 16, rank_items: Optional[torch.Tensor] = None,
                  rank_k: int = 10) -> torch.Tensor:
    """A trained float table (``(num_rows, dim)``, any float dtype and device) written in ``format``, in host memory
    (exact-size pinned memory unless ``pinned=False``), ``chunk_rows`` rows at a time.

    ``"bf16"`` returns a ``bfloat16 (num_rows, dim)`` tensor; the quantized formats a ``uint8 (num_rows, stride)`` one,
    ``stride`` = :func:`format_row_bytes` rounded up to ``row_alignment`` (16, FBGEMM's, by default: rows then start
    16-byte aligned for the kernel's widest loads; 1 keeps DeepSeek-V4.1's unpadded 264-byte fp8 rows of dim 256).
    int8: per row, ``scale = (max - min) / 255`` and ``bias = min`` in float16, codes rounded to nearest. fp8: per
    block of 32, the smallest power of two ``scale >= amax / 448``, codes ``x / scale`` rounded to nearest e4m3.

    Values a format cannot hold raise ``ValueError`` naming the row and the value (stored, they would decode wrong:
    as infinities, NaN or clamped): int8 rows whose smallest value lies beyond float16's +-65504 (the bias) or whose
    range exceeds 255 x 65504 (the scale); NaN and infinities in int8 and fp8 rows (bf16 keeps them); finite values
    beyond the range of the type a row is converted through (bfloat16 for ``bf16``, float32 for the others: a
    float64 table's 1e39). fp8's power-of-two scales span float32's range.

    ``rank_items`` (int8 only): the ``(num_items, dim)`` vectors the rows are scored against by dot product (a
    retrieval model's item table). Each row's codes are then chosen, a step or two from nearest rounding, so that its
    ``rank_k`` best items come out in the float rows' order (:mod:`speedtorch.rank_preserving_rounding`; the
    example recommender's top-10 answers go from 69% to over 99% the float32 model's, docs/torchscript.md)."""
    if table.dim() != 2 or not table.is_floating_point():
        raise ValueError(f"quantize_rows: table must be a 2-D float tensor, got {table.dtype} of shape "
                         f"{tuple(table.shape)}")
    n, dim = table.shape
    if rank_items is not None:
        if format != "int8_rowwise":
            raise ValueError(f"quantize_rows: rank_items applies to int8_rowwise rows, not {format!r}")
        if rank_items.dim() != 2 or rank_items.shape[1] != dim or not rank_items.is_floating_point():
            raise ValueError(f"quantize_rows: rank_items must be a float (num_items, {dim}) tensor (the rows' dim), "
                             f"got {rank_items.dtype} of shape {tuple(rank_items.shape)}")
        if rank_k < 1:
            raise ValueError(f"quantize_rows: rank_k must be >= 1, got {rank_k}")
    stride = format_row_bytes(format, dim, row_alignment if format != "bf16" else 1)
    if format == "bf16":
        out = pinned_empty(n, dim, dtype=torch.bfloat16) if pinned else torch.empty(n, dim, dtype=torch.bfloat16)
    else:
        out = pinned_empty(n, stride, dtype=torch.uint8) if pinned else torch.zeros(n, stride, dtype=torch.uint8)
    starts = range(0, n, chunk_rows)
    if rank_items is not None and len(starts) > 1 and os.environ.get("SPEEDTORCH_PROGRESS") != "0":
        from tqdm import tqdm  # a rank-preserving conversion takes about a minute a million rows of dim 32

        starts = tqdm(starts, desc="rank-preserving int8", unit="chunk")
    with torch.no_grad():
        for begin in starts:
            source = table[begin:begin + chunk_rows].detach().cpu()
            rows = source.to(torch.bfloat16 if format == "bf16" else torch.float32)
            _check_values(source, rows, begin, format)
            target = out[begin:begin + rows.shape[0]]
            if format == "bf16":
                target.copy_(rows)
            elif format == "int8_rowwise":
                _quantize_int8(rows, target, rank_items, rank_k, begin)
            else:
                _quantize_fp8(rows, target)
    return out


class QuantizedRows:
    """A table in one of :data:`FORMATS` with what reading it needs (format, dim): ``gather(indices, device)``.

    ``save(path)`` writes ``path`` (a ``.npy`` NumPy reads: the raw rows), then its record ``path + ".format.json"``
    (format, dim, the rows' shape and content hash); ``QuantizedRows.open(path, pin=...)`` maps them back without
    copying: pinned (page-locked, read by the GPU over UVA; on ``/dev/shm`` every process of the host that opens the
    file shares one copy in RAM) or, with ``pin=False``, pageable (a file larger than RAM: rows are read by CPU
    threads as the pages fault in). Rows and record of different saves are refused, never decoded in the wrong
    format (int8 and fp8 rows of dim 32 have the same width): see :meth:`save` and :meth:`open`."""

    def __init__(self, table: torch.Tensor, format: str, dim: int):
        format_row_bytes(format, dim)  # validates the pair
        self.table, self.format, self.dim = table, format, int(dim)

    @classmethod
    def from_table(cls, table: torch.Tensor, format: str, **options) -> "QuantizedRows":
        """:func:`quantize_rows` of a trained float table (options as there)."""
        return cls(quantize_rows(table, format, **options), format, table.shape[1])

    @property
    def num_rows(self) -> int:
        """Rows of the table."""
        return self.table.shape[0]

    def nbytes(self) -> int:
        """Bytes of the table: every row in its format (codes with their scales, biases and padding)."""
        return self.table.numel() * self.table.element_size()

    def gather(self, indices: torch.Tensor, device: Optional[Union[torch.device, str]] = None) -> torch.Tensor:
        """Rows ``indices`` (any shape) dequantized to bfloat16, shaped ``indices.shape + (dim,)``, on ``device``
        (default: the indices'): :func:`gather_dequant`."""
        return gather_dequant(self.table, indices, self.format, self.dim, device)

    def dequantize(self) -> torch.Tensor:
        """Every row as bfloat16, on the CPU (for checks and small tables)."""
        return self.gather(torch.arange(self.num_rows), "cpu")

    def save(self, path: PathLike) -> str:
        """Writes the rows and their record; returns the rows' content hash (:func:`speedtorch.save_npy`'s).

        Each file is replaced atomically, in an order that never pairs rows with another save's record: the old
        record is removed first, the rows are written, then the new record (which names their content hash). A
        crash in between leaves rows without a record, which :meth:`open` refuses; an error while the rows are
        written (Ctrl-C, a full disk) leaves the old rows, and their record is put back."""
        from ..data import save_npy

        path = os.fspath(path)
        record_path = path + _RECORD_SUFFIX
        rows = self.table if self.table.dtype != torch.bfloat16 else self.table.view(torch.uint8)
        previous = _read_bytes(record_path)
        if previous is not None:
            os.unlink(record_path)
            _sync_folder(record_path)  # the removal reaches the disk before the new rows can
        try:
            content_hash = save_npy(rows, path)
        except BaseException:
            if previous is not None:
                _write_atomically(record_path, previous, path)
            raise
        record = {"format": self.format, "dim": self.dim, "shape": list(rows.shape), "rows_hash": content_hash}
        _write_atomically(record_path, json.dumps(record).encode(), path)
        return content_hash

    @classmethod
    def open(cls, path: PathLike, *, pin: bool = True, verify: bool = True) -> "QuantizedRows":
        """The rows of :meth:`save`, memory-mapped read-only (see the class), in the format their record names.

        Refused (``RuntimeError``) when the record is missing (a save that did not finish, or a file copied without
        it), names another shape, or changed while the rows were mapped (a save racing this open: open again), and,
        with ``verify``, when the rows' content hash is not the one the record names (files of two saves put
        together; a record of an earlier speedtorch names none). ``verify`` reads every row once (as pinning does);
        ``verify=False`` skips that for a file larger than RAM: the save order still refuses a crashed save."""
        from ..data import content_hash, open_npy

        path = os.fspath(path)
        record = _read_record(path)
        table = open_npy(path, "r", pin=pin)
        if _read_bytes(path + _RECORD_SUFFIX) != record.raw:
            raise RuntimeError(f"QuantizedRows.open: {path} was saved again while it was being opened; open it again")
        meta = record.fields
        if "shape" in meta and list(table.shape) != meta["shape"]:
            raise RuntimeError(f"QuantizedRows.open: {path} holds rows of shape {list(table.shape)} but its record "
                               f"{path}{_RECORD_SUFFIX} names {meta['shape']}: the files are of different saves")
        if verify:
            if "rows_hash" not in meta:
                raise RuntimeError(f"QuantizedRows.open: the record {path}{_RECORD_SUFFIX} (written by an earlier "
                                   f"speedtorch) names no content hash to check the rows against; save the rows "
                                   f"again, or open them with verify=False")
            found = content_hash(table)
            if found != meta["rows_hash"]:
                raise RuntimeError(f"QuantizedRows.open: {path} holds other rows than its record "
                                   f"{path}{_RECORD_SUFFIX} names (content hash {found}, recorded "
                                   f"{meta['rows_hash']}): the files are of different saves; save the rows again")
        return cls(table, meta["format"], meta["dim"])

    def __repr__(self) -> str:
        return f"QuantizedRows({self.num_rows} rows, format={self.format!r}, dim={self.dim}, {self.nbytes()} bytes)"


# --- the record file beside saved rows (QuantizedRows.save / open) ---------------------------------------------------


class _Record(NamedTuple):
    raw: bytes  # the file's bytes, to tell whether it changed
    fields: dict


def _read_bytes(path: str) -> Optional[bytes]:
    """The bytes of the file at ``path``, or None when there is none."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def _read_record(path: str) -> _Record:
    raw = _read_bytes(path + _RECORD_SUFFIX)
    if raw is None:
        raise RuntimeError(f"QuantizedRows.open: {path} has no record {path}{_RECORD_SUFFIX} (its format and dim): a "
                           f"save that did not finish (the record is written last), or rows copied without it; save "
                           f"the rows again")
    return _Record(raw, json.loads(raw))


def _sync_folder(path: str) -> None:
    """Flushes the folder holding ``path`` to disk, so that a removal or rename in it survives a crash."""
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomically(path: str, data: bytes, rows_path: str) -> None:
    """Writes ``data`` to ``path`` as speedtorch's saves write theirs: a temporary beside it, flushed to disk, renamed
    over it, the folder flushed; readers see the old file or the new one. It gets the permissions of ``rows_path``
    (the rows it describes)."""
    fd, temporary = tempfile.mkstemp(prefix=os.path.basename(path) + ".tmp-",
                                     dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if os.path.exists(rows_path):
            os.chmod(temporary, stat.S_IMODE(os.stat(rows_path).st_mode))
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    _sync_folder(path)
