"""Writes the fuzz targets' checked-in inputs: tests/fuzz/template/ (the small valid save fuzz_embedding_files
starts from) and the seeds under tests/fuzz/corpus/<target>/. Run once when the file formats change, with the
library built:

    SPEEDTORCH_LIBRARY=build/libspeedtorch_ops.so PYTHONPATH=python python3 tests/fuzz/make_corpus.py

Seeds cover what the parsers must accept (each dtype, .npy versions 1.0 to 3.0, 0-d and empty arrays, saves with
and without an optimizer, both state layouts) and what they must reject with a message (Fortran order, big-endian,
structured dtypes, truncation, a wrong magic or length, broken or mismatched meta files). Crashing inputs the fuzzer
found are added by hand as crash-*.
"""

from __future__ import annotations

import io
import json
import shutil
import struct
import tempfile
from pathlib import Path

import numpy as np
import torch

import speedtorch

HERE = Path(__file__).resolve().parent
SEPARATOR = b"\n@@speedtorch-fuzz-file@@\n"


def npy_bytes(array, version=None) -> bytes:
    out = io.BytesIO()
    if version is None:
        np.lib.format.write_array(out, array, allow_pickle=False)
    else:
        np.lib.format.write_array(out, array, version=version, allow_pickle=False)
    return out.getvalue()


def raw_header(text: str, major: int = 1, data: bytes = b"") -> bytes:
    body = text.encode("latin1")
    length = struct.pack("<H", len(body)) if major == 1 else struct.pack("<I", len(body))
    return b"\x93NUMPY" + bytes([major, 0]) + length + body + data


def npy_header_seeds() -> dict[str, bytes]:
    seeds = {}
    for dtype in ("f2", "f4", "f8", "i1", "i2", "i4", "i8", "u1", "u2", "b1"):
        seeds[f"valid-{dtype}-2d"] = npy_bytes(np.arange(6).astype(dtype).reshape(2, 3))
    seeds["valid-f4-0d"] = npy_bytes(np.array(1.5, dtype="f4"))
    seeds["valid-f4-1d"] = npy_bytes(np.arange(4, dtype="f4"))
    seeds["valid-f4-empty-rows"] = npy_bytes(np.zeros((0, 5), dtype="f4"))
    seeds["valid-f4-3d"] = npy_bytes(np.zeros((2, 3, 4), dtype="f4"))
    seeds["valid-v2"] = npy_bytes(np.arange(6, dtype="f4").reshape(3, 2), version=(2, 0))
    seeds["valid-v3"] = npy_bytes(np.arange(6, dtype="f4").reshape(3, 2), version=(3, 0))
    seeds["valid-python2-longs"] = raw_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 3L), }\n")
    seeds["valid-fortran-1d"] = npy_bytes(np.asfortranarray(np.arange(3, dtype="f4")))
    seeds["reject-fortran-2d"] = npy_bytes(np.asfortranarray(np.arange(6, dtype="f4").reshape(2, 3)))
    seeds["reject-big-endian"] = npy_bytes(np.arange(6, dtype=">f4").reshape(2, 3))
    seeds["reject-structured"] = npy_bytes(np.zeros(3, dtype=[("a", "<f4"), ("b", "<i4")]))
    seeds["reject-complex"] = npy_bytes(np.zeros(3, dtype="c8"))
    full = npy_bytes(np.arange(6, dtype="f4").reshape(2, 3))
    seeds["reject-truncated-header"] = full[:40]
    seeds["reject-truncated-preamble"] = full[:9]
    seeds["reject-bad-magic"] = b"\x93NUMPZ" + full[6:]
    seeds["reject-version-4"] = full[:6] + b"\x04\x00" + full[8:]
    seeds["reject-huge-length"] = raw_header("", major=2)[:8] + struct.pack("<I", 0xFFFFFFF0) + full[10:]
    seeds["reject-unknown-key"] = raw_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}\n")
    seeds["reject-missing-shape"] = raw_header("{'descr': '<f4', 'fortran_order': False}\n")
    seeds["reject-negative-dim"] = raw_header("{'descr': '<f4', 'fortran_order': False, 'shape': (-2, 3), }\n")
    seeds["reject-overflowing-shape"] = raw_header(
        "{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296), }\n")
    seeds["reject-unterminated"] = raw_header("{'descr': '<f4, 'fortran_order': False, 'shape': (2,)\n")
    return seeds


def template_table():
    """The save fuzz_embedding_files starts from: 5 x 3 float32 rows, Adam state beside them after two steps."""
    e = speedtorch.PinnedEmbedding(5, 3)
    e.copy_(torch.arange(15, dtype=torch.float32).reshape(5, 3) / 4)
    e.set_optimizer("adam", {"lr": 0.01}, True)
    e.apply_gradients(torch.tensor([0, 2, 2]), torch.ones(3, 3))
    e.apply_gradients(torch.tensor([4]), torch.full((1, 3), -0.5))
    return e


def saved_files(table, folder: Path, name: str) -> tuple[bytes, bytes, bytes]:
    table.save(str(folder / f"{name}.npy"))
    state = folder / f"{name}.state.npy"
    return ((folder / f"{name}.meta.json").read_bytes(), (folder / f"{name}.npy").read_bytes(),
            state.read_bytes() if state.exists() else b"")


def embedding_seeds(meta: bytes, table: bytes, state: bytes, folder: Path) -> dict[str, bytes]:
    seeds = {"valid-template-meta": meta}
    doc = json.loads(meta)

    def edited(**changes) -> bytes:
        """The template's meta with members changed, without "meta_hash" (as an older save or a hand edit), so the
        change reaches the checks behind the meta's own hash."""
        d = {key: value for key, value in doc.items() if key != "meta_hash"}
        for key, value in changes.items():
            if value is None:
                d.pop(key, None)
            else:
                d[key] = value
        return json.dumps(d, indent=2).encode()

    seeds["valid-template-all-files"] = SEPARATOR.join([meta, table, state])
    seeds["valid-template-meta-unhashed"] = edited()
    seeds["reject-meta-hash"] = meta.replace(b'"lr": 0.01', b'"lr": 0.02')
    seeds["reject-meta-truncated"] = meta[: len(meta) // 2]
    seeds["reject-meta-not-object"] = b"[1, 2]"
    seeds["reject-meta-empty-object"] = b"{}"
    seeds["reject-format"] = edited(format="numpy")
    seeds["reject-version"] = edited(version=2)
    seeds["reject-missing-dim"] = edited(dim=None)
    seeds["reject-rows-mismatch"] = edited(num_rows=6)
    seeds["reject-dtype"] = edited(dtype="float64")
    seeds["reject-optimizer-width"] = edited(optimizer="sgd")
    seeds["reject-negative-step"] = edited(step=-1)
    seeds["reject-fractional-step"] = edited(step=2.5)
    seeds["reject-table-hash"] = edited(table_hash="0123456789abcdef")
    seeds["reject-state-hash"] = edited(state_hash="")
    seeds["reject-options-type"] = edited(options={"lr": "fast"})
    seeds["options-nan"] = meta.replace(b'"lr": 0.01', b'"lr": NaN')
    seeds["reject-deep-nesting"] = b'{"a": ' * 12 + b"1" + b"}" * 12
    seeds["reject-escapes"] = b'{"format": "speedtorch.\\u0065mbedding\\n\\"", "version": 1e400}'
    seeds["reject-table-truncated"] = SEPARATOR.join([meta, table[:-7]])
    seeds["reject-state-truncated"] = SEPARATOR.join([meta, table, state[:-5]])
    flipped = bytearray(table)
    flipped[-3] ^= 0x10
    seeds["reject-table-bit-flip"] = SEPARATOR.join([meta, bytes(flipped)])
    # Plain .npy files (no meta): rows only, float64 converts to float32.
    for dtype in ("f4", "f8", "f2"):
        seeds[f"valid-plain-{dtype}"] = SEPARATOR.join([b"", npy_bytes(np.arange(12, dtype=dtype).reshape(4, 3))])
    seeds["reject-plain-1d"] = SEPARATOR.join([b"", npy_bytes(np.arange(4, dtype="f4"))])
    seeds["reject-plain-int"] = SEPARATOR.join([b"", npy_bytes(np.arange(4, dtype="i4").reshape(2, 2))])
    # Other saves: bfloat16 with SGD momentum, state in a table of its own; float16 without an optimizer.
    bf16 = speedtorch.PinnedEmbedding(4, 5, torch.bfloat16)
    bf16.normal_(0.0, 1.0, 3)
    bf16.set_optimizer("sgd", {"lr": 0.1, "momentum": 0.9}, False)
    bf16.apply_gradients(torch.tensor([1, 3]), torch.ones(2, 5, dtype=torch.bfloat16))
    seeds["valid-bf16-sgd-apart"] = SEPARATOR.join(saved_files(bf16, folder, "bf16"))
    half = speedtorch.PinnedEmbedding(3, 4, torch.float16)
    half.uniform_(-1.0, 1.0, 4)
    m, t, _ = saved_files(half, folder, "half")
    seeds["valid-f16-no-optimizer"] = SEPARATOR.join([m, t])
    return seeds


def write_dir(folder: Path, files: dict[str, bytes]) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)


def main() -> None:
    crashes = {}
    for target in ("npy_header", "embedding_files"):  # keep the crashing inputs found before
        folder = HERE / "corpus" / target
        if folder.exists():
            crashes[target] = {p.name: p.read_bytes() for p in folder.glob("crash-*")}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        meta, table, state = saved_files(template_table(), folder, "t")
        write_dir(HERE / "template", {"t.meta.json": meta, "t.npy": table, "t.state.npy": state})
        write_dir(HERE / "corpus" / "npy_header", {**npy_header_seeds(), **crashes.get("npy_header", {})})
        write_dir(HERE / "corpus" / "embedding_files",
                  {**embedding_seeds(meta, table, state, folder), **crashes.get("embedding_files", {})})
    for target in ("npy_header", "embedding_files"):
        files = list((HERE / "corpus" / target).iterdir())
        print(f"{target}: {len(files)} seeds, {sum(f.stat().st_size for f in files)} bytes")


if __name__ == "__main__":
    main()
