"""bench/transfer.py's check that `auto` is never slower than UVA alone (issue 30 item 4), over rows shaped as the
script records them on a GPU: which rows are compared, and when a line says FAIL."""

from __future__ import annotations

import pytest
from helpers import bench_module


@pytest.fixture(scope="module")
def transfer():
    return bench_module("transfer")


def row(way, ms, threads=16, dtype="float32", direction="h2d", rows="spread"):
    return {"threads": threads, "rows": rows, "dtype": dtype, "way": way, "dir": direction, "ms": ms}


def test_auto_is_compared_with_uva_alone_of_its_own_thread_count_dtype_and_timing(transfer):
    rows = [
        row("speedtorch auto", 1.73), row("speedtorch uva=1.00", 1.60),
        row("speedtorch auto", 1.55, threads=2), row("speedtorch uva=1.00", 1.60, threads=2),
        row("speedtorch auto, in turns with SpeedTorch 0.1.6", 23.97),  # issue 30's collapse
        row(transfer.AUTO_IN_TURNS, 1.62, dtype="float16"), row(transfer.UVA_IN_TURNS, 1.60, dtype="float16"),
        row(transfer.UVA_IN_TURNS, 1.0),  # paired with in-turns auto rows only
        row("speedtorch auto, CPU indices", 9.0),  # no UVA-alone row with CPU indices: not compared
        row("speedtorch auto", 2.0, dtype="bfloat16"),  # no UVA-alone row for it: not compared
    ]
    checks = transfer.auto_checks(rows)
    got = {(c["threads"], c["dtype"], c["way"]): (c["uva ms"], c["ok"]) for c in checks}
    assert got == {
        (16, "float32", "speedtorch auto"): (1.60, False),  # 8% slower
        (2, "float32", "speedtorch auto"): (1.60, True),
        (16, "float32", "speedtorch auto, in turns with SpeedTorch 0.1.6"): (1.60, False),
        (16, "float16", transfer.AUTO_IN_TURNS): (1.60, True),  # 1.2% slower: within the link's spread
    }


def test_each_check_prints_ok_or_fail_and_a_count(transfer, capsys):
    checks = transfer.auto_checks([row("speedtorch auto", 23.97), row("speedtorch uva=1.00", 1.60),
                                   row("speedtorch auto", 0.55, direction="d2h"),
                                   row("speedtorch uva=1.00", 0.60, direction="d2h")])
    transfer.print_checks(checks)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    assert lines[0].endswith("FAIL") and "23.970 ms vs 1.600 ms" in lines[0] and "h2d" in lines[0]
    assert lines[1].endswith("ok") and "d2h" in lines[1]
    assert lines[2].startswith("check auto <= UVA alone: 1 ok, 1 FAIL")


def test_busiest_threads_print_one_line(transfer, capsys):
    transfer.busy_threads("now", count=3)
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("busiest threads now")
