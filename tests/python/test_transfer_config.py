"""speedtorch.transfer_config / set_transfer_config: the option names come from the C++ table
(csrc/transfer/transfer_policy.h, for_each_transfer_option), so Python lists none of its own."""

from __future__ import annotations

import pytest
import torch

import speedtorch


def test_names_come_from_the_library():
    names = list(torch.ops.speedtorch.transfer_option_names())
    assert len(names) == len(set(names)) and "uva_fraction" in names and "staged_max_gbps" in names
    assert list(speedtorch.transfer_config()) == names


def test_every_named_option_round_trips():
    for name, value in speedtorch.transfer_config().items():
        flags = ("sort_uva_indices", "optimizer_vec4", "calibrate_split")
        changed = 1.0 - value if name in flags else 0.25 if name == "uva_fraction" else value * 2
        with speedtorch.transfer_config_override(**{name: changed}) as inside:
            assert inside[name] == speedtorch.transfer_config()[name] == changed
        assert speedtorch.transfer_config()[name] == value


def test_unknown_option_lists_the_known_ones():
    message = "unknown transfer option 'no_such_option'; known options: uva_fraction, .*, staged_max_gbps"
    with pytest.raises(RuntimeError, match=message):
        speedtorch.set_transfer_config(no_such_option=1)


def test_override_restores_after_an_error_and_after_a_refused_value():
    before = speedtorch.transfer_config()
    with pytest.raises(ZeroDivisionError):
        with speedtorch.transfer_config_override(uva_fraction=0.5, staging_chunk_bytes=1 << 16):
            assert speedtorch.transfer_config()["staging_chunk_bytes"] == 1 << 16
            1 / 0  # noqa: B018
    assert speedtorch.transfer_config() == before
    # The second value is refused after the first was set: both are undone.
    with pytest.raises(RuntimeError, match="staging_chunk_bytes must be >= 4096, got 16"):
        with speedtorch.transfer_config_override(uva_fraction=0.5, staging_chunk_bytes=16):
            pass
    assert speedtorch.transfer_config() == before


def test_override_restores_only_what_it_set():
    before = speedtorch.transfer_config()
    with speedtorch.transfer_config_override(uva_fraction=0.5):
        speedtorch.set_transfer_config(staging_chunk_bytes=1 << 16)  # set inside the block, not by it: kept
    try:
        assert speedtorch.transfer_config() == dict(before, staging_chunk_bytes=float(1 << 16))
    finally:
        speedtorch.set_transfer_config(staging_chunk_bytes=before["staging_chunk_bytes"])
    with pytest.raises(RuntimeError, match="unknown transfer option 'bogus'"):
        with speedtorch.transfer_config_override(uva_fraction=0.5, bogus=1):
            pass
    assert speedtorch.transfer_config() == before


def test_deferred_checks_scope_restores_the_mode():
    assert torch.ops.speedtorch.deferred_index_checks() is False
    with speedtorch.deferred_index_checks():
        # CPU-only builds check every index on the host: nothing is ever deferred there.
        assert torch.ops.speedtorch.deferred_index_checks() is ("cuda=none" not in speedtorch.build_info())
        with speedtorch.deferred_index_checks(False):
            assert torch.ops.speedtorch.deferred_index_checks() is False
    assert torch.ops.speedtorch.deferred_index_checks() is False


def test_a_table_keeps_its_own_settings():
    table = speedtorch.PinnedEmbedding(10, 4, torch.float32)
    before = speedtorch.transfer_config()
    assert table.transfer_options() == {}
    table.set_transfer_option("uva_fraction", 0.0)
    table.set_transfer_option("staging_chunk_bytes", 1 << 16)
    assert table.transfer_options() == {"uva_fraction": 0.0, "staging_chunk_bytes": float(1 << 16)}
    assert speedtorch.transfer_config() == before  # the process's settings are untouched
    with pytest.raises(RuntimeError, match="PinnedEmbedding.set_transfer_option: unknown transfer option 'bogus'"):
        table.set_transfer_option("bogus", 1.0)
    with pytest.raises(RuntimeError, match="uva_fraction must be in \\[0, 1\\]"):
        table.set_transfer_option("uva_fraction", 2.0)
    assert table.transfer_options()["uva_fraction"] == 0.0  # a refused value is not kept
    # The table's calls run with its settings; the results are the same, only the route differs.
    ids = torch.tensor([3, 1, 3])
    torch.testing.assert_close(table.gather(ids, None), table.table()[ids], rtol=0, atol=0)
    table.clear_transfer_options()
    assert table.transfer_options() == {}


def test_table_settings_from_torchscript():
    @torch.jit.script
    def configure(table: torch.classes.speedtorch.PinnedEmbedding) -> dict[str, float]:
        table.set_transfer_option("uva_fraction", 0.75)
        return table.transfer_options()

    assert configure(speedtorch.PinnedEmbedding(4, 2, torch.float32)) == {"uva_fraction": 0.75}


@pytest.mark.gpu
def test_a_tables_split_is_its_own_and_stays_with_it(deferred_checks):
    """With deferred checks a UVA-only transfer flags a bad CUDA index for check_index_errors, while a staged share
    checks its indices on the host before any copy and raises at once: which one happens shows the split in force.
    The process says UVA only; one table says staged only, in whichever thread it is used."""
    import threading

    rows, dim = 4000, 32
    ids = torch.randint(0, rows, (3000,), device="cuda")
    ids[17] = rows + 5
    with speedtorch.transfer_config_override(uva_fraction=1.0, uva_reach_bytes=0, small_transfer_bytes=0):
        staged = speedtorch.PinnedEmbedding(rows, dim, torch.float32)
        staged.set_transfer_option("uva_fraction", 0.0)
        plain = speedtorch.PinnedEmbedding(rows, dim, torch.float32)
        raised = []

        def use_staged():
            try:
                staged.gather(ids, None)
            except IndexError as error:
                raised.append(error)

        worker = threading.Thread(target=use_staged)
        worker.start()
        worker.join()
        assert len(raised) == 1 and "holds 4005 at flat position 17" in str(raised[0])
        plain.gather(ids, None)  # UVA: flagged, not raised
        speedtorch.gather(plain.table(), ids)  # the free op: the process's settings, UVA
        with pytest.raises(IndexError, match="holds 4005 at flat position 17"):
            speedtorch.check_index_errors()
