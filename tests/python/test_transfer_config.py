"""speedtorch.transfer_config / set_transfer_config: the option names come from the C++ table
(csrc/transfer/transfer_policy.h, for_each_transfer_option), so Python lists none of its own."""

from __future__ import annotations

import threading

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
            # The blocks of the main thread are its own: this thread sets the same for itself.
            try:
                process_like = dict(uva_fraction=1.0, uva_reach_bytes=0, small_transfer_bytes=0)
                with speedtorch.deferred_index_checks(), speedtorch.transfer_config_override(**process_like):
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


def _two_overlapping_blocks(make_block, values, first_out, read):
    """Runs ``make_block(value)`` in two threads at once: both enter, then the ``first_out`` one (0 or 1) leaves
    while the other is still inside, then the other. Returns what each thread read inside (on entry, and again
    after the first one left) and after its block, and what the main thread read while both were inside."""
    inside = threading.Barrier(3)
    release = [threading.Event(), threading.Event()]
    seen = [[], []]
    failures = []

    def run(k):
        try:
            with make_block(values[k]):
                inside.wait(timeout=30)
                seen[k].append(read())
                release[k].wait(timeout=30)
                seen[k].append(read())
            seen[k].append(read())
        except BaseException as error:  # reported by the main thread
            failures.append(error)
            inside.abort()

    threads = [threading.Thread(target=run, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    inside.wait(timeout=30)
    main_inside = read()
    for k in (first_out, 1 - first_out):
        release[k].set()
        threads[k].join(timeout=30)
    assert not failures, failures
    return seen, main_inside


@pytest.mark.parametrize("first_out", [0, 1])
def test_override_blocks_in_two_threads_stay_in_their_thread_whatever_the_exit_order(first_out):
    """Each block used to save and restore the process's value: two overlapping blocks in two threads saw each
    other's values and, ending in the order they began, left max_sms at 4 (was 0) (issue 31). Now a block's
    settings are its thread's: the other thread and the main thread never see them, and nothing is left behind."""
    before = speedtorch.transfer_config()
    seen, main_inside = _two_overlapping_blocks(lambda sms: speedtorch.transfer_config_override(max_sms=sms),
                                                (4, 8), first_out, lambda: speedtorch.transfer_config()["max_sms"])
    assert seen == [[4, 4, before["max_sms"]], [8, 8, before["max_sms"]]]
    assert main_inside == before["max_sms"]
    assert speedtorch.transfer_config() == before


@pytest.mark.parametrize("first_out", [0, 1])
def test_deferred_check_blocks_in_two_threads_stay_in_their_thread_whatever_the_exit_order(first_out):
    """The same for deferred index checks: two overlapping blocks used to leave deferred checks on."""
    if "cuda=none" in speedtorch.build_info():
        pytest.skip("CPU-only builds never defer index checks")
    seen, main_inside = _two_overlapping_blocks(speedtorch.deferred_index_checks, (True, True), first_out,
                                                torch.ops.speedtorch.deferred_index_checks)
    assert seen == [[True, True, False], [True, True, False]]
    assert main_inside is False
    assert torch.ops.speedtorch.deferred_index_checks() is False


def test_process_settings_reach_a_thread_inside_its_block_for_the_names_it_does_not_set():
    before = speedtorch.transfer_config()
    with speedtorch.transfer_config_override(max_sms=4):
        speedtorch.set_transfer_config(max_sms=6, uva_blocks_per_sm=2)
        try:
            inside = speedtorch.transfer_config()
            assert (inside["max_sms"], inside["uva_blocks_per_sm"]) == (4, 2)  # the block's name stays the block's
        finally:
            speedtorch.set_transfer_config(max_sms=before["max_sms"], uva_blocks_per_sm=before["uva_blocks_per_sm"])
    assert speedtorch.transfer_config() == before


def test_a_block_ends_on_the_thread_that_began_it():
    """A block's settings are its thread's: ending it on another thread is refused (it would remove nothing), and
    they end with their thread."""
    before = speedtorch.transfer_config()
    block = speedtorch.transfer_config_override(max_sms=4)
    thread = threading.Thread(target=block.__enter__)
    thread.start()
    thread.join()
    assert speedtorch.transfer_config() == before
    with pytest.raises(RuntimeError, match="this thread holds no transfer settings with id .* set on another thread"):
        block.__exit__(None, None, None)
    assert speedtorch.transfer_config() == before


def test_torchscript_sets_a_thread_override_with_the_ops():
    """TorchScript and C++ have no `with`: the push op returns an id for the pop op, on the same thread."""

    @torch.jit.script
    def max_sms_inside(sms: int) -> float:
        entry = torch.ops.speedtorch.push_transfer_overrides(["max_sms"], [float(sms)])
        value = torch.ops.speedtorch.get_transfer_option("max_sms")
        torch.ops.speedtorch.pop_transfer_overrides(entry)
        return value

    before = speedtorch.transfer_config()["max_sms"]
    assert max_sms_inside(3) == 3
    assert speedtorch.transfer_config()["max_sms"] == before
    with pytest.raises(RuntimeError, match="2 names but 1 values"):
        torch.ops.speedtorch.push_transfer_overrides(["max_sms", "uva_fraction"], [1.0])


@pytest.mark.gpu
def test_gpu_deferred_checks_of_one_thread_leave_another_thread_checking():
    """Two threads gather the same bad CUDA index at once: the one inside a deferred block gets no error (the kernel
    flags it for check_index_errors), the other raises at once."""
    table = speedtorch.pinned_empty(100, 8)
    bad = torch.tensor([1, 100], device="cuda")
    both = threading.Barrier(2)
    outcome = {}

    def deferred():
        with speedtorch.deferred_index_checks():
            both.wait(timeout=30)
            speedtorch.gather(table, bad)
            torch.cuda.synchronize()
            outcome["deferred"] = "returned"
            both.wait(timeout=30)

    def checked():
        both.wait(timeout=30)
        try:
            speedtorch.gather(table, bad)
            outcome["checked"] = "returned"
        except IndexError as error:
            outcome["checked"] = str(error)
        both.wait(timeout=30)

    threads = [threading.Thread(target=deferred), threading.Thread(target=checked)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert outcome["deferred"] == "returned"
    assert "holds 100 at flat position 1" in outcome["checked"]
    with pytest.raises(IndexError, match="holds 100 at flat position 1"):
        speedtorch.check_index_errors()
    speedtorch.check_index_errors()  # cleared


def test_transfers_without_the_host_move_every_row_on_the_gpu_unless_a_split_was_set():
    # A prefetch's gathers run inside it: a staged share would hold the calling thread (the model's launcher).
    before = speedtorch.transfer_config()
    assert before["uva_fraction"] < 0  # the automatic split
    with speedtorch.ops.transfers_without_the_host():
        assert speedtorch.transfer_config()["uva_fraction"] == 1.0
    assert speedtorch.transfer_config() == before
    with speedtorch.transfer_config_override(uva_fraction=0.4):  # the caller's own split is kept
        with speedtorch.ops.transfers_without_the_host():
            assert speedtorch.transfer_config()["uva_fraction"] == 0.4
    with pytest.raises(ZeroDivisionError):
        with speedtorch.ops.transfers_without_the_host():
            1 / 0  # noqa: B018
    assert speedtorch.transfer_config() == before
