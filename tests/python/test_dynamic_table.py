"""Tables that grow (speedtorch.nn.dynamic_embedding; docs/dynamic_tables.md) against a reference of the same semantics
written with a plain Python dict (the index) and nn.Embedding (the rows): random skewed streams of raw int64 ids
with admission and eviction, on the CPU exactly (slots, admissions, evictions, counts) and on the GPU (``gpu``)."""

from __future__ import annotations

import collections
import contextlib
import copy
import io
import pickle

import pytest
import torch

import speedtorch
from speedtorch.nn.dynamic_embedding import DynamicHostEmbedding, IdIndex
from speedtorch.nn import HostEmbedding


class ReferenceIndex:
    """csrc/embedding/id_index.h's rules with a dict, an OrderedDict and min() over the rows."""

    def __init__(self, capacity, admit_after, policy, candidate_capacity):
        self.capacity, self.k, self.policy, self.pool_size = capacity, admit_after, policy, candidate_capacity
        self.slot, self.key = {}, {}  # key -> slot, slot -> key
        self.count, self.last, self.stamp = {}, {}, {}  # per key
        self.size = self.step = self.clock = 0
        self.pool = collections.OrderedDict()  # candidate -> sightings, least recently seen first

    def advance_step(self):
        self.step += 1

    def _touch(self, key):
        self.count[key] += 1
        self.last[key] = self.step
        self.clock += 1
        self.stamp[key] = self.clock

    def _victim(self):
        free = [k for k in self.slot if self.last[k] < self.step]
        if not free:
            return None
        if self.policy == "lru":
            return min(free, key=lambda k: self.stamp[k])
        return min(free, key=lambda k: (self.count[k], self.stamp[k]))

    def _remember(self, key, sightings):
        if self.k == 1 or self.pool_size == 0:
            return
        self.clock += 1
        if key in self.pool:
            self.pool[key] = sightings
            self.pool.move_to_end(key)
            return
        if len(self.pool) == self.pool_size:
            self.pool.popitem(last=False)
        self.pool[key] = sightings

    def assign(self, ids):
        new = {}  # first occurrence order
        for key in ids:
            if key in self.slot:
                self._touch(key)
            else:
                new[key] = new.get(key, 0) + 1
        admitted, evicted = [], []
        busy = False
        for key, seen in new.items():
            sightings = seen + self.pool.get(key, 0)
            slot = None
            if not busy and sightings >= self.k:
                if self.size < self.capacity:
                    slot, self.size = self.size, self.size + 1
                else:
                    victim = self._victim()
                    if victim is None:
                        busy = True
                    else:
                        slot = self.slot.pop(victim)
                        evicted.append((victim, slot))
                        for table in (self.count, self.last, self.stamp):
                            del table[victim]
            if slot is None:
                self._remember(key, sightings)
                continue
            self.pool.pop(key, None)
            self.slot[key], self.key[slot] = slot, key
            self.count[key], self.last[key] = sightings, self.step
            self.clock += 1
            self.stamp[key] = self.clock
            admitted.append(slot)
        return [self.slot.get(key, -1) for key in ids], admitted, evicted


def skewed_ids(generator, n, universe):
    """n raw ids drawn from `universe` (a tensor of distinct int64 values) with a power-law skew."""
    ranks = (torch.rand(n, generator=generator) ** 3 * len(universe)).long()
    return universe[ranks]


def raw_universe(generator, size):
    """About `size` distinct raw ids spread over the whole int64 range, negative ones included, in random order."""
    values = torch.unique(torch.randint(-(2**62), 2**62, (size,), generator=generator, dtype=torch.int64))
    return values[torch.randperm(len(values), generator=generator)]


CONFIGS = [
    # capacity, admit_after, policy, candidate_capacity
    (16, 1, "lru", 0),
    (16, 1, "lfu", 0),
    (24, 2, "lru", 40),
    (24, 3, "lfu", 8),
    (64, 2, "lfu", 200),
]


@pytest.mark.parametrize("capacity,admit_after,policy,pool", CONFIGS)
def test_index_matches_the_reference(capacity, admit_after, policy, pool):
    generator = torch.Generator().manual_seed(capacity * 7 + admit_after)
    universe = raw_universe(generator, 300)
    index, reference = IdIndex(capacity, admit_after, policy, pool), ReferenceIndex(capacity, admit_after, policy,
                                                                                    pool)
    for batch in range(60):
        ids = skewed_ids(generator, int(torch.randint(1, 40, (1,), generator=generator)), universe)
        if batch % 5 != 4:  # now and then two lookups share a step (gradient accumulation)
            index.advance_step()
            reference.advance_step()
        slots, admitted, evicted_keys, evicted_slots = index.assign(ids)
        want_slots, want_admitted, want_evicted = reference.assign(ids.tolist())
        assert slots.tolist() == want_slots, f"batch {batch}"
        assert admitted.tolist() == want_admitted
        assert list(zip(evicted_keys.tolist(), evicted_slots.tolist())) == want_evicted
        if batch == 30:  # a restored index goes on exactly as the original
            index = IdIndex.from_state(index.state())
    keys = index.keys().tolist()
    assert keys == [reference.key[slot] for slot in range(reference.size)]
    assert index.counts().tolist() == [reference.count[k] for k in keys]
    assert index.last_steps().tolist() == [reference.last[k] for k in keys]
    assert index.candidates() == len(reference.pool)
    assert index.find(torch.tensor(keys)).tolist() == list(range(len(keys)))


def test_long_lru_streams_compact_the_queue_of_sightings_in_order():
    # LRU keeps a queue of sightings, compacted past 2 x size + 1024 entries: thousands of sightings of few ids.
    generator = torch.Generator().manual_seed(4)
    universe = raw_universe(generator, 20)
    index, reference = IdIndex(8, 1, "lru", 0), ReferenceIndex(8, 1, "lru", 0)
    for batch in range(500):
        ids = skewed_ids(generator, 10, universe)
        index.advance_step()
        reference.advance_step()
        assert index.assign(ids)[0].tolist() == reference.assign(ids.tolist())[0], f"batch {batch}"
        if batch == 250:
            index = IdIndex.from_state(index.state())


def test_large_batches_look_up_on_several_threads_alike():
    # Batches above 4,096 ids look the map up on several threads (helped_parallel_for) before the ordered pass.
    generator = torch.Generator().manual_seed(9)
    universe = raw_universe(generator, 6000)
    index, reference = IdIndex(10000, 2, "lfu", 10000), ReferenceIndex(10000, 2, "lfu", 10000)
    for _ in range(3):
        ids = skewed_ids(generator, 20000, universe)
        index.advance_step()
        reference.advance_step()
        assert index.assign(ids)[0].tolist() == reference.assign(ids.tolist())[0]
    assert index.find(universe).tolist() == [reference.slot.get(k, -1) for k in universe.tolist()]


@pytest.mark.parametrize("policy,admit_after", [("lru", 1), ("lfu", 2)])
def test_large_batches_with_evictions_match_the_reference(policy, admit_after):
    # Batched lookups read the map ahead of their probes, on several threads, and the admissions read ahead of their
    # inserts, through evictions and a map that grows between batches: the slots stay the reference's, and a
    # touch/admit split gives what assign gives.
    generator = torch.Generator().manual_seed(11)
    universe = raw_universe(generator, 30000)
    index, reference = IdIndex(9000, admit_after, policy, 20000), ReferenceIndex(9000, admit_after, policy, 20000)
    for batch in range(5):
        ids = skewed_ids(generator, 15000, universe)
        index.advance_step()
        reference.advance_step()
        if batch % 2:
            slots, admitted, evicted_keys, evicted_slots = index.admit(ids, index.touch(ids), None)
        else:
            slots, admitted, evicted_keys, evicted_slots = index.assign(ids)
        want_slots, want_admitted, want_evicted = reference.assign(ids.tolist())
        assert slots.tolist() == want_slots, f"batch {batch}"
        assert admitted.tolist() == want_admitted
        assert list(zip(evicted_keys.tolist(), evicted_slots.tolist())) == want_evicted
    assert index.find(universe).tolist() == [reference.slot.get(k, -1) for k in universe.tolist()]


def test_index_admit_refuses_slots_that_touch_cannot_give():
    index = IdIndex(8, 1, "lru", 0)
    with pytest.raises(RuntimeError, match=r"slots must be touch\(ids\)'s .*got -3"):
        index.admit(torch.tensor([5, 6]), torch.tensor([-1, -3]), None)
    assert index.size() == 0


def test_index_find_changes_nothing_and_keeps_shape():
    index = IdIndex(4, 1, "lru", 0)
    index.advance_step()
    index.assign(torch.tensor([5, 6]))
    before = index.state()
    assert index.find(torch.tensor([[5, 7], [6, 5]])).tolist() == [[0, -1], [1, 0]]
    assert torch.equal(index.state(), before)
    assert index.assign(torch.tensor([[9, 5]], dtype=torch.int32))[0].tolist() == [[2, 0]]


def test_index_refuses_bad_arguments():
    with pytest.raises(RuntimeError, match="capacity must be >= 1"):
        IdIndex(0, 1, "lru", 0)
    with pytest.raises(RuntimeError, match="policy must be 'lru' or 'lfu'"):
        IdIndex(4, 1, "fifo", 0)
    with pytest.raises(RuntimeError, match="candidate_capacity must be >= 1"):
        IdIndex(4, 2, "lru", 0)
    with pytest.raises(RuntimeError, match="ids must be int64"):
        IdIndex(4, 1, "lru", 0).assign(torch.tensor([1.0]))
    with pytest.raises(RuntimeError, match="capacity=4.*this one has capacity=5"):
        IdIndex(5, 1, "lru", 0).load_state(IdIndex(4, 1, "lru", 0).state())


def test_index_refuses_a_malformed_state_and_stays_as_it_was():
    source = IdIndex(6, 2, "lru", 4)  # ids get a slot at their second sighting
    for ids in ([10, 11, 12, 10], [11, 20, 21]):
        source.advance_step()
        source.assign(torch.tensor(ids))  # 10 and 11 take slots; 12, 20 and 21 are candidates
    good = source.state()
    header, first_candidate = 3, 3 + 6
    assert good[1, 3] >= 1 and good[2, 0] >= 1  # slots and candidates to make bad below
    target = IdIndex(6, 2, "lru", 4)
    target.advance_step()
    target.assign(torch.tensor([7, 7, 8]))
    before = target.state()

    def refused(bad, message):
        with pytest.raises(RuntimeError, match=message):
            target.load_state(bad)
        assert torch.equal(target.state(), before)  # nothing changed

    bad = good.clone()
    bad[first_candidate, 0] = bad[header, 0]  # a candidate that is also a slot's key
    refused(bad, f"key {int(bad[header, 0])} is held twice")
    bad = good.clone()
    bad[header, 2] = bad[1, 1] + 1  # seen after the current step
    refused(bad, "was last seen at step .* after the state's current step")
    target.load_state(good)
    assert torch.equal(target.state(), good)


def test_index_pickles():
    index = IdIndex(8, 2, "lfu", 4)
    index.advance_step()
    index.assign(torch.tensor([1, 1, 2, 3, 3, 3]))
    for copied in (copy.deepcopy(index), pickle.loads(pickle.dumps(index))):
        assert torch.equal(copied.state(), index.state())
    buffer = io.BytesIO()
    torch.save(index, buffer)
    buffer.seek(0)
    assert torch.equal(torch.load(buffer, weights_only=False).state(), index.state())


class _ScriptedLookup(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.index = IdIndex(8, 1, "lru", 0)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        self.index.advance_step()
        return self.index.assign(ids)[0]


def test_index_in_torchscript_and_jit_save(tmp_path):
    scripted = torch.jit.script(_ScriptedLookup())
    assert scripted(torch.tensor([5, 6, 5])).tolist() == [0, 1, 0]
    speedtorch.jit_save(scripted, tmp_path / "lookup.pt")
    loaded = torch.jit.load(str(tmp_path / "lookup.pt"))
    assert loaded(torch.tensor([6, 7])).tolist() == [1, 2] and loaded.index.size() == 3


# --- the module against a dict + nn.Embedding reference ---------------------------------------------------------


class ReferenceRows:
    """The module's new rows: the seed's generator draws blocks of min(4096, 2^20 // dim) rows of N(0, std^2) into
    one flat buffer; each admission takes the next rows of it, however many it admits."""

    def __init__(self, seed, dim, std=1.0):
        self.generator = torch.Generator().manual_seed(seed)
        self.block, self.std = min(4096, max(1, 2**20 // dim)), std
        self.buffer = torch.zeros(0, dim)

    def take(self, n):
        while len(self.buffer) < n:
            block = torch.randn(self.block, self.buffer.shape[1], generator=self.generator) * self.std
            self.buffer = torch.cat([self.buffer, block])
        rows, self.buffer = self.buffer[:n], self.buffer[n:]
        return rows


class ReferenceTable:
    """The module's semantics with ReferenceIndex and an nn.Embedding of `capacity` rows: a new row is the next of
    ReferenceRows (admission order), its optimizer state zeroed; ids without a row read zeros and get no update; the
    index step advances at a training lookup unless the last one's gradient is still pending."""

    def __init__(self, capacity, dim, admit_after, policy, pool, seed, optimizer, lr):
        self.index = ReferenceIndex(capacity, admit_after, policy, pool)
        self.rows = torch.nn.Embedding(capacity, dim)
        torch.nn.init.zeros_(self.rows.weight)
        self.adagrad = torch.zeros(capacity, dim) if optimizer == "adagrad" else None
        self.new_rows = ReferenceRows(seed, dim)
        self.lr, self.pending, self.evicted = lr, None, []

    def forward(self, ids):
        if self.pending is None:
            self.index.advance_step()
        slots, admitted, evicted = self.index.assign(ids.reshape(-1).tolist())
        with torch.no_grad():
            for key, slot in evicted:
                self.evicted.append((key, self.rows.weight[slot].clone()))
            if admitted:
                self.rows.weight[admitted] = self.new_rows.take(len(admitted))
                if self.adagrad is not None:
                    self.adagrad[admitted] = 0
        slots = torch.tensor(slots).reshape(ids.shape)
        self.pending = slots
        return self.rows(slots.clamp(min=0)) * (slots >= 0).unsqueeze(-1)

    @torch.no_grad()
    def step(self):
        # Dense, over every row: rows without a gradient have a zero one, which changes neither SGD's nor Adagrad's
        # rows or state, as the fused step leaves rows it is not given.
        grad = self.rows.weight.grad
        if grad is not None:
            if self.adagrad is None:
                self.rows.weight -= self.lr * grad
            else:
                self.adagrad += grad * grad
                self.rows.weight -= self.lr * grad / (self.adagrad.sqrt() + 1e-10)
        self.rows.weight.grad = None
        self.pending = None


@pytest.mark.parametrize("policy,admit_after,optimizer", [("lru", 1, "sgd"), ("lfu", 2, "adagrad"),
                                                          ("lru", 3, "adagrad")])
def test_module_trains_as_the_reference(policy, admit_after, optimizer):
    capacity, dim, lr, seed = 20, 4, 0.1, 11
    options = {"lr": lr} if optimizer == "sgd" else {"lr": lr, "eps": 1e-10}
    evicted = []
    module = HostEmbedding(None, dim, capacity=capacity, admit_after=admit_after, evict=policy, optimizer=optimizer,
                           optimizer_options=options, seed=seed, device="cpu",
                           on_evict=lambda keys, rows, state: evicted.extend(zip(keys.tolist(), rows)))
    assert isinstance(module, DynamicHostEmbedding)
    reference = ReferenceTable(capacity, dim, admit_after, policy, capacity, seed, optimizer, lr)
    generator = torch.Generator().manual_seed(3)
    universe = raw_universe(generator, 120)
    for batch in range(40):
        ids = skewed_ids(generator, 24, universe).reshape(4, 6)
        target = torch.randn(4, 6, dim, generator=generator)
        out, want = module(ids), reference.forward(ids)
        torch.testing.assert_close(out, want.detach(), rtol=1e-5, atol=1e-6)
        (out * target).sum().backward()
        (want * target).sum().backward()
        if batch % 4 != 3:  # gradient accumulation now and then: two lookups, one update
            module.step()
            reference.step()
    module.step()
    reference.step()
    assert module.index.keys().tolist() == [reference.index.key[s] for s in range(reference.index.size)]
    torch.testing.assert_close(module.table.table(), reference.rows.weight.detach(), rtol=1e-5, atol=1e-6)
    assert [k for k, _ in evicted] == [k for k, _ in reference.evicted] and evicted
    for (_, row), (_, want_row) in zip(evicted, reference.evicted):
        torch.testing.assert_close(row, want_row, rtol=1e-5, atol=1e-6)


def test_ids_without_a_row_read_zeros_and_get_no_update():
    module = HostEmbedding(None, 3, capacity=2, admit_after=2, optimizer="sgd", optimizer_options={"lr": 1.0},
                           device="cpu", seed=0)
    out = module(torch.tensor([7, 8, 8]))
    assert torch.equal(out[0], torch.zeros(3)) and out[1].abs().sum() > 0  # 7 seen once, 8 twice: admitted
    out.sum().backward()
    module.step()
    assert module.slots(torch.tensor([7, 8])).tolist() == [-1, 0]
    # Two rows, both looked up since the last update: a third id waits, reading zeros.
    module(torch.tensor([8, 9, 9])).sum().backward()
    out = module(torch.tensor([5, 5]))
    assert torch.equal(out, torch.zeros(2, 3)) and module.slots(torch.tensor([5])).item() == -1
    module.step()
    module(torch.tensor([5]))  # now the least recently used row (8) goes
    assert module.slots(torch.tensor([5, 8, 9])).tolist() == [0, -1, 1]


def test_eval_lookups_change_nothing():
    module = HostEmbedding(None, 2, capacity=4, device="cpu", seed=0)
    module(torch.tensor([1, 2]))
    state = module.index.state()
    module.eval()
    out = module(torch.tensor([1, 3]))
    assert torch.equal(module.index.state(), state) and torch.equal(out[1], torch.zeros(2))


def test_state_dict_save_load_and_copies_answer_the_same(tmp_path):
    def make():
        return HostEmbedding(None, 4, capacity=10, admit_after=2, evict="lfu", optimizer="adagrad", device="cpu",
                             seed=5)

    generator = torch.Generator().manual_seed(1)
    universe = raw_universe(generator, 40)
    module = make()
    for _ in range(12):
        module(skewed_ids(generator, 16, universe)).sum().backward()
        module.step()
    module.save(tmp_path / "t")
    copies = [DynamicHostEmbedding.load(tmp_path / "t", device="cpu"), copy.deepcopy(module),
              pickle.loads(pickle.dumps(module))]
    restored = make()
    restored.load_state_dict(module.state_dict())
    copies.append(restored)
    for _ in range(6):  # the same answers, admissions and evictions from here on
        ids = skewed_ids(generator, 16, universe)
        want = module(ids)
        want.sum().backward()
        module.step()
        for other in copies:
            out = other(ids)
            torch.testing.assert_close(out, want)
            out.sum().backward()
            other.step()
    for other in copies:
        assert torch.equal(other.index.state(), module.index.state())


# --- new rows: drawn in blocks, the same however admissions are batched -----------------------------------------


def _admit(module, ids, batch):
    """Admits ``ids`` (distinct, new) through training lookups of ``batch`` ids at a time."""
    for begin in range(0, len(ids), batch):
        module(ids[begin:begin + batch])


def test_new_rows_are_the_same_however_admissions_are_batched():
    # 10,000 ids admitted in one batch or in batches of 7 get the same rows: the k-th admitted row is row k of the
    # seed's stream of blocks (three blocks of 4,096 rows, the last partly taken).
    ids = raw_universe(torch.Generator().manual_seed(8), 10000)[:10000]
    assert len(ids) == 10000
    tables = []
    for batch in (len(ids), 7):
        module = HostEmbedding(None, 8, capacity=len(ids), optimizer=None, init_std=0.5, seed=3, device="cpu")
        _admit(module, ids, batch)
        assert module.slots(ids).tolist() == list(range(len(ids)))
        tables.append(module.table.table().clone())
    assert torch.equal(tables[0], tables[1])
    assert torch.equal(tables[0], ReferenceRows(3, 8, std=0.5).take(len(ids)))


def test_wide_rows_are_drawn_in_smaller_blocks():
    module = HostEmbedding(None, 1000, capacity=2500, optimizer=None, seed=4, device="cpu")
    assert module._row_draws.rows_per_block == 1048
    ids = torch.arange(2500) * 977
    _admit(module, ids, 300)
    assert torch.equal(module.table.table(), ReferenceRows(4, 1000).take(2500))


def test_rows_drawn_ahead_are_the_rows_taken_in_any_split():
    from speedtorch.nn._row_draws import RowDraws

    sizes = [3, 5000, 1, 4096, 4095, 700]
    plain = RowDraws(6, 2.0, torch.Generator().manual_seed(9))
    ahead = RowDraws(6, 2.0, torch.Generator().manual_seed(9))
    before = ahead.state()
    ahead.ensure(9000)
    state = ahead.state()  # drawing ahead takes nothing: the checkpoint stays
    assert torch.equal(state[0], before[0]) and state[1] == before[1] == 0
    got = []
    for i, n in enumerate(sizes):
        if i % 2:
            ahead.ensure(3 * n)
        want = plain.take(n)
        rows = ahead.take(n)
        assert rows.shape == (n, 6) and rows.dtype == torch.float32 and torch.equal(rows, want)
        got.append(rows)
    assert torch.equal(torch.cat(got), ReferenceRows(9, 6, std=2.0).take(sum(sizes)))
    assert plain.take(0).shape == (0, 6)


def test_prefetch_draws_the_next_forwards_rows():
    # The draw is the prefetch's (on TrainPipeline's thread beside the backward): the forward only takes the rows.
    module = _dynamic("cpu", "lru", 1, optimizer="sgd")
    module(torch.tensor([1, 2])).sum().backward()
    module.step()
    ids = torch.tensor([2, 3, 4, 3])
    module.prefetch(ids)
    drawn = module._row_draws.generator.get_state()
    module(ids)
    assert torch.equal(module._row_draws.generator.get_state(), drawn)  # no block drawn by the forward
    assert torch.equal(module.table.table()[2:4], ReferenceRows(7, 4).take(4)[2:])  # rows 0 and 1 were updated


@pytest.mark.gpu
def test_rows_drawn_for_a_gpu_module_are_pinned_and_copied_from_where_they_are():
    # _to_device's pin_memory() of a pinned slice is the slice itself: no staging copy before the GPU copy.
    from speedtorch.nn._row_draws import RowDraws

    draws = RowDraws(8, 1.0, torch.Generator().manual_seed(2))
    within = draws.take(100, pin=True)
    across = draws.take(4096, pin=True)  # rows of two blocks: a new pinned tensor
    for rows in (within, across):
        assert rows.is_pinned() and rows.pin_memory().data_ptr() == rows.data_ptr()
    assert torch.equal(torch.cat([within, across]), ReferenceRows(2, 8).take(4196))


def _mid_block(seed=6):
    """A module 4,096 + 904 rows into its stream of new rows, with blocks drawn ahead by a prefetch."""
    module = HostEmbedding(None, 4, capacity=12000, optimizer="sgd", seed=seed, device="cpu")
    _admit(module, torch.arange(5000) * 3 + 1, 1000)
    module.prefetch(torch.arange(5000) * 3 + 2)  # 5,000 ids without a row: two more blocks drawn ahead
    module.drop_prefetch()
    assert len(module._row_draws._blocks) > 1
    return module


def test_a_checkpoint_mid_block_gives_the_next_rows_as_continuing(tmp_path):
    module = _mid_block()
    state = module.state_dict()
    assert int(state["init_taken"]) == 5000 - 4096
    module.save(tmp_path / "t")
    restored = HostEmbedding(None, 4, capacity=12000, optimizer="sgd", seed=99, device="cpu")
    restored.load_state_dict(state)
    copies = [restored, DynamicHostEmbedding.load(tmp_path / "t", device="cpu"), copy.deepcopy(module),
              pickle.loads(pickle.dumps(module))]
    more = torch.arange(6000) * 3 + 2
    _admit(module, more, 1500)
    want = ReferenceRows(6, 4).take(11000)
    assert torch.equal(module.table.table()[:11000], want)
    for other in copies:
        _admit(other, more, 1500)
        assert torch.equal(other.table.table(), module.table.table())
        assert torch.equal(other.state_dict()["init_generator"], module.state_dict()["init_generator"])


def test_a_checkpoint_without_init_taken_still_loads(tmp_path):
    # Saved before rows were drawn in blocks: the generator's state is where the next rows start (none of a block
    # taken). A module mid-block, its checkpoint stripped of the count, starts its next rows at a new block.
    module = _mid_block()
    state = module.state_dict()
    del state["init_taken"], state["init_std"]
    module.save(tmp_path / "t")
    (tmp_path / "t.index_rng_taken.npy").unlink()
    pickled = module.__getstate__()
    del pickled["_init_taken"]
    from_pickle = DynamicHostEmbedding.__new__(DynamicHostEmbedding)
    from_pickle.__setstate__(pickle.loads(pickle.dumps(pickled)))
    restored = HostEmbedding(None, 4, capacity=12000, optimizer="sgd", seed=99, device="cpu")
    result = restored.load_state_dict(state)
    assert not result.missing_keys and not result.unexpected_keys
    want = ReferenceRows(6, 4).take(2 * 4096)[4096:4096 + 300]  # the second block again, from its start
    for other in (restored, DynamicHostEmbedding.load(tmp_path / "t", device="cpu"), from_pickle):
        _admit(other, torch.arange(300) * 3 + 2, 300)
        assert torch.equal(other.table.table()[5000:5300], want)


def test_a_checkpoint_carries_init_std(tmp_path):
    # The new rows' scale is the saved module's: a module built with another init_std draws the saved one's rows
    # after load_state_dict and DynamicHostEmbedding.load (unless load is given init_std).
    module = HostEmbedding(None, 4, capacity=100, optimizer="sgd", seed=3, init_std=0.01, device="cpu")
    _admit(module, torch.arange(10), 10)
    state = module.state_dict()
    assert float(state["init_std"]) == 0.01
    module.save(tmp_path / "t")
    restored = HostEmbedding(None, 4, capacity=100, optimizer="sgd", seed=3, device="cpu")  # init_std 1.0
    restored.load_state_dict(state)
    from_files = DynamicHostEmbedding.load(tmp_path / "t", device="cpu")
    rescaled = DynamicHostEmbedding.load(tmp_path / "t", device="cpu", init_std=0.5)
    assert restored.init_std == from_files.init_std == 0.01 and rescaled.init_std == 0.5
    more = torch.arange(10, 30)
    for other in (module, restored, from_files, rescaled):
        _admit(other, more, 20)
    assert torch.equal(restored.table.table(), module.table.table())
    assert torch.equal(from_files.table.table(), module.table.table())
    torch.testing.assert_close(rescaled.table.table()[10:30], module.table.table()[10:30] * 50)
    for bad in (torch.tensor(-1.0, dtype=torch.float64), torch.tensor(float("nan"), dtype=torch.float64),
                torch.tensor(1)):
        state["init_std"] = bad
        with pytest.raises(RuntimeError, match="init_std"):
            restored.load_state_dict(state)


def test_setting_init_std_rescales_the_rows_not_yet_handed_out():
    # Blocks drawn ahead (by a prefetch) are drawn again at the new scale: the next rows are the stream's, rescaled.
    module = _mid_block()
    module.init_std = 0.25
    assert module.init_std == 0.25 and float(module.state_dict()["init_std"]) == 0.25
    _admit(module, torch.arange(300) * 3 + 2, 300)
    torch.testing.assert_close(module.table.table()[5000:5300], ReferenceRows(6, 4).take(5300)[5000:] * 0.25)


def test_a_bad_init_taken_is_refused_before_anything_changes():
    module = _mid_block()
    target = HostEmbedding(None, 4, capacity=12000, optimizer="sgd", seed=1, device="cpu")
    before = target.state_dict()
    for bad in (torch.tensor(4096), torch.tensor(-1), torch.tensor(1.5)):
        state = module.state_dict()
        state["init_taken"] = bad
        with pytest.raises(RuntimeError, match="init_taken"):
            target.load_state_dict(state)
        after = target.state_dict()
        for key in before:
            if isinstance(before[key], torch.Tensor):
                assert torch.equal(after[key], before[key]), key


def test_export_with_a_predicate():
    module = HostEmbedding(None, 2, capacity=8, device="cpu", seed=0, optimizer=None)
    module(torch.tensor([10, 20, 20, 30, 30, 30]))
    keys, rows = module.export()
    assert keys.tolist() == [10, 20, 30] and torch.equal(rows, module.table.table()[:3])
    keys, rows = module.export(lambda keys, counts, last_steps: counts >= 2)
    assert keys.tolist() == [20, 30] and torch.equal(rows, module.table.table()[1:3])
    with pytest.raises(ValueError, match="bool mask of shape"):
        module.export(lambda keys, counts, last_steps: counts[:1] > 0)


def test_bags_and_the_collection_path():
    module = HostEmbedding(None, 3, capacity=8, mode="sum", device="cpu", seed=0, optimizer=None)
    ids, offsets = torch.tensor([4, 5, 4, 6]), torch.tensor([0, 2])
    out = module(ids, offsets)
    rows = module.table.table()
    torch.testing.assert_close(out, torch.stack([rows[0] + rows[1], rows[0] + rows[2]]))


def test_refusals_name_what_is_not_yet_supported():
    with pytest.raises(ValueError, match="capacity"):
        HostEmbedding(None, 4)
    with pytest.raises(ValueError, match="padding_idx and max_norm are not yet supported"):
        HostEmbedding(None, 4, padding_idx=0, capacity=4)
    with pytest.raises(ValueError, match="placement='gpu' is not yet supported"):
        HostEmbedding(None, 4, capacity=4, placement="gpu")
    with pytest.raises(ValueError, match="evict must be 'lru' or 'lfu'"):
        HostEmbedding(None, 4, capacity=4, evict="fifo")
    assert type(HostEmbedding(10, 4, device="cpu")) is HostEmbedding


# --- prefetch and TrainPipeline: batch t+1 mapped while step t computes ------------------------------------------


def _dynamic(device, policy, admit_after, optimizer="adagrad", evicted=None, **kwargs):
    on_evict = None if evicted is None else (lambda keys, rows, state: evicted.append((keys, rows, state)))
    return HostEmbedding(None, 4, capacity=24, admit_after=admit_after, evict=policy, optimizer=optimizer,
                         optimizer_options={"lr": 0.1}, seed=7, device=device, on_evict=on_evict, **kwargs)


def _everything(module):
    return {"rows": module.table.table().clone(), "state": module.table.state().clone(),
            "index": module.index.state()}


@pytest.mark.parametrize("policy,admit_after,ahead", [("lru", 2, False), ("lfu", 3, False), ("lru", 1, True)])
def test_prefetch_is_bit_identical_to_the_plain_loop(policy, admit_after, ahead, monkeypatch):
    # ahead: updates advance the rows read ahead (PrefetchedRows.advance, the GPU's way) instead of patching them.
    monkeypatch.setattr(HostEmbedding, "_advance_on_cpu", ahead)
    generator = torch.Generator().manual_seed(12)
    universe = raw_universe(generator, 90)
    batches = [skewed_ids(generator, 20, universe).reshape(4, 5) for _ in range(30)]
    targets = [torch.randn(4, 5, 4, generator=generator) for _ in batches]
    results = []
    for prefetch in (False, True):
        evicted = []
        module = _dynamic("cpu", policy, admit_after, evicted=evicted)
        outputs = []
        for t, (ids, target) in enumerate(zip(batches, targets)):
            out = module(ids)
            if prefetch and t + 1 < len(batches):
                module.prefetch(batches[t + 1])
                assert module._prefetched is not None
            (out * target).sum().backward()
            module.step()
            outputs.append(out.detach())
        results.append((torch.stack(outputs), _everything(module), evicted))
    (plain_out, plain, plain_evicted), (out, piped, piped_evicted) = results
    assert torch.equal(out, plain_out)
    for key in plain:
        assert torch.equal(piped[key], plain[key]), key
    assert plain_evicted, "the stream must evict"
    assert len(piped_evicted) == len(plain_evicted)
    for (k1, r1, s1), (k2, r2, s2) in zip(plain_evicted, piped_evicted):
        assert torch.equal(k1, k2) and torch.equal(r1, r2) and torch.equal(s1, s2)


@pytest.mark.parametrize("optimizer", ["adagrad", "adam"])
def test_steps_on_rows_read_ahead_write_the_table_with_the_same_bits(optimizer, monkeypatch):
    # With stream-ordered staging, a batch that admitted no new id is stepped on its rows read ahead and only written
    # back (the GPU's way on the CPU by the test switch); batches that admit ids take the table's own update.
    from speedtorch.nn._prefetched_rows import PrefetchedRows

    monkeypatch.setattr(HostEmbedding, "_advance_on_cpu", True)
    stepped = []
    step = PrefetchedRows.step
    monkeypatch.setattr(PrefetchedRows, "step", lambda self, *a: (stepped.append(1), step(self, *a))[1])
    generator = torch.Generator().manual_seed(5)
    universe = raw_universe(generator, 16)  # within the capacity: after the first batches, nothing new
    batches = [skewed_ids(generator, 12, universe).reshape(3, 4) for _ in range(12)]
    results = []
    with speedtorch.transfer_config_override(stream_ordered_staging=1):
        for prefetch in (False, True):
            module = _dynamic("cpu", "lru", 1, optimizer=optimizer)
            outputs = []
            for t, ids in enumerate(batches):
                out = module(ids)
                if prefetch and t + 1 < len(batches):
                    module.prefetch(batches[t + 1])
                (out * out).sum().backward()
                module.step()
                outputs.append(out.detach())
            results.append((torch.stack(outputs), _everything(module)))
    assert torch.equal(results[0][0], results[1][0])
    for key in results[0][1]:
        assert torch.equal(results[0][1][key], results[1][1][key]), key
    assert stepped  # some steps took the write-back way


def test_prefetched_rows_are_used_and_new_ids_admitted_at_forward():
    module = _dynamic("cpu", "lru", 1, optimizer="sgd")
    module(torch.tensor([1, 2])).sum().backward()
    ids = torch.tensor([[2, 3], [3, 1]])
    module.prefetch(ids)
    assert module.slots(torch.tensor([3])).item() == -1  # not admitted before its forward
    module.step()
    gathers = []
    table = module.table

    class Counting:
        def __getattr__(self, name):
            if name == "gather":
                gathers.append(1)
            return getattr(table, name)

    module.table = Counting()
    out = module(ids)
    module.table = table
    assert gathers == []  # 1 and 2 were read ahead; the admitted row (3) is placed as drawn, not read back
    assert module.slots(torch.tensor([1, 2, 3])).tolist() == [0, 1, 2]
    torch.testing.assert_close(out, table.table()[torch.tensor([[1, 2], [2, 0]])])


class _CountingIndex:
    """An IdIndex that counts the calls of each method (the module calls its index from Python only)."""

    def __init__(self, index):
        self.index, self.calls = index, collections.Counter()

    def __getattr__(self, name):
        self.calls[name] += 1
        return getattr(self.index, name)


def test_a_prefetched_forward_only_admits_and_trains_alike():
    # TrainPipeline over a dynamic table: each batch's ids are mapped once, by the prefetch (touch), and its forward
    # only admits the new ones (admit): no assign, touch or find at the forward, no second pass over the batch.
    batches = _user_batches(12)
    model = _RawUsers("cpu", "lru", 2)
    counting = _CountingIndex(model.users.index)
    model.users.index = counting
    pipeline = speedtorch.TrainPipeline(model, None, batches, device="cpu", prefetch=True)
    next(iter(pipeline))  # the first batch has no prefetch: its forward maps it (assign); batch 2 is prefetched
    counting.calls.clear()
    steps = sum(1 for _ in pipeline)
    assert steps == len(batches) - 1
    assert counting.calls["touch"] == steps - 1 and counting.calls["admit"] == steps  # the last batch: no next one
    assert counting.calls["assign"] == 0 and counting.calls["find"] == 0


@pytest.mark.parametrize("prefetch", [False, True])
def test_ids_without_a_row_get_a_zero_row_and_no_slot_in_the_gradient(prefetch):
    # admit_after=2: a first sighting gets no row. Its lookup reads zeros (a row past the distinct rows), and the
    # gradient names only the slots that exist: no -1 for the update to skip.
    module = HostEmbedding(None, 3, capacity=8, admit_after=2, optimizer="sgd", update="step", device="cpu", seed=0)
    module(torch.tensor([5, 6, 5])).sum().backward()  # 5 is admitted (two sightings), 6 is not
    module.step()
    ids = torch.tensor([[5, 7], [8, 5]])  # 7 and 8: first sightings
    if prefetch:
        module.prefetch(ids)
    out = module(ids)
    assert torch.equal(out[0, 1], torch.zeros(3)) and torch.equal(out[1, 0], torch.zeros(3))
    assert not torch.equal(out[0, 0], torch.zeros(3)) and torch.equal(out[0, 0], out[1, 1])
    out.sum().backward()
    grad = module._table_param.grad
    assert grad._indices().tolist() == [[0]]  # 5's slot only
    torch.testing.assert_close(grad._values(), torch.full((1, 3), 2.0))


@contextlib.contextmanager
def no_synchronising_call(device: str):
    """On a GPU: a synchronising torch call inside raises (torch.cuda.set_sync_debug_mode("error"))."""
    if device != "cuda":
        yield
        return
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def assert_gpu_matches_cpu(cpu, gpu):
    """(outputs, rows, index state) of the same run on the CPU and on a GPU: the same within float32 rounding."""
    torch.testing.assert_close(gpu[0], cpu[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gpu[1], cpu[1], rtol=1e-5, atol=1e-6)
    assert torch.equal(gpu[2], cpu[2])


@pytest.mark.gpu
def test_a_prefetched_forward_on_the_gpu_does_not_wait_for_it():
    # The forward of a prefetched batch (admission, the new rows' write, their merge with the rows read ahead) queues
    # its work without a synchronising torch call; the plain loop's results stay those of the CPU.
    generator = torch.Generator().manual_seed(9)
    universe = raw_universe(generator, 200)
    batches = [skewed_ids(generator, 64, universe) for _ in range(8)]
    results = []
    for device in ("cpu", "cuda"):
        module = HostEmbedding(None, 8, capacity=150, admit_after=1, optimizer="adagrad", seed=4, device=device)
        module(batches[0].to(device)).square().sum().backward()
        outputs = []
        for t in range(1, len(batches)):
            ids = batches[t].to(device)
            module.prefetch(ids)
            module.step()
            with no_synchronising_call(device):
                out = module(ids)
            out.square().sum().backward()
            outputs.append(out.detach().cpu())
        module.step()
        results.append((torch.cat(outputs), module.table.table().cpu(), module.index.state()))
    assert_gpu_matches_cpu(*results)


@pytest.mark.gpu
@pytest.mark.parametrize("training", [True, False])
def test_a_lookup_of_cpu_ids_on_the_gpu_does_not_wait_for_it(training):
    # Without a prefetch, CPU ids are mapped, their distinct slots found on the host and copied through pinned
    # memory, the new rows written and the rows gathered: no synchronising torch call (the GPU's unique would be
    # one), so the next batch's mapping can run while these rows move. Results stay those of the CPU.
    generator = torch.Generator().manual_seed(12)
    universe = raw_universe(generator, 300)
    batches = [skewed_ids(generator, 96, universe) for _ in range(6)]
    results = []
    for device in ("cpu", "cuda"):
        module = HostEmbedding(None, 8, capacity=120, admit_after=1, optimizer="adagrad", seed=5, device=device)
        module(batches[0]).square().sum().backward()  # rows for the lookups to read, in eval() too
        module.step()
        module.train(training)
        outputs = []
        for ids in batches[1:]:
            with no_synchronising_call(device), torch.set_grad_enabled(training):
                out = module(ids)
            if training:
                out.square().sum().backward()
                module.step()
            outputs.append(out.detach().cpu())
        results.append((torch.cat(outputs), module.table.table().cpu(), module.index.state()))
    assert_gpu_matches_cpu(*results)


def test_prefetch_during_gradient_accumulation_evicts_no_row_with_a_pending_gradient():
    # Capacity 4: batch 1's two ids, then batch 2's two, accumulated (no step): batch 3, prefetched while batch 2's
    # gradient is pending, cannot take their rows; after the step it can.
    module = HostEmbedding(None, 2, capacity=4, optimizer="sgd", device="cpu", seed=0)
    module(torch.tensor([1, 2])).sum().backward()
    second = torch.tensor([3, 4])
    module(second).sum().backward()
    third = torch.tensor([5, 6])
    module.prefetch(third)
    out = module(third)
    assert module.slots(torch.tensor([1, 2, 3, 4, 5, 6])).tolist() == [0, 1, 2, 3, -1, -1]
    assert torch.equal(out, torch.zeros(2, 2))
    out.sum().backward()
    module.step()
    module(third)
    assert module.slots(torch.tensor([5, 6])).tolist() == [0, 1]


class _RawUsers(torch.nn.Module):
    """A DynamicHostEmbedding of raw user ids and a torch table of items, scored by a dot product."""

    def __init__(self, device, policy, admit_after):
        super().__init__()
        torch.manual_seed(0)
        self.evicted = []
        self.users = _dynamic(device, policy, admit_after, evicted=self.evicted)
        self.items = torch.nn.Embedding(30, 4, device=device)

    def forward(self, batch):
        users, items, labels = batch
        logits = (self.users(users) * self.items(items)).sum(-1)
        return torch.nn.functional.binary_cross_entropy_with_logits(logits, labels), logits

    def sparse_inputs(self, batch):
        return [(self.users, batch[0])]


def _user_batches(count, pin=False):
    generator = torch.Generator().manual_seed(5)
    universe = raw_universe(generator, 70)
    out = []
    for _ in range(count):
        b = (skewed_ids(generator, 16, universe), torch.randint(0, 30, (16,), generator=generator),
             torch.randint(0, 2, (16,), generator=generator).float())
        out.append(tuple(t.pin_memory() for t in b) if pin else b)
    return out


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("policy,admit_after,beside", [("lru", 2, False), ("lfu", 2, False), ("lru", 2, True)])
def test_train_pipeline_over_a_dynamic_table_is_bit_identical(device, policy, admit_after, beside, monkeypatch):
    # beside: the next batch's mapping and prefetch, new rows drawn ahead included, on the pipeline's own thread
    # while the backward is queued (a GPU's way; on the CPU by the test switch), which the test checks it took.
    import threading

    from speedtorch.nn._row_draws import RowDraws

    threads, draws = [], []
    if beside:
        monkeypatch.setattr(speedtorch.TrainPipeline, "_beside_backward_on_cpu", True)
        prefetch = DynamicHostEmbedding.prefetch
        monkeypatch.setattr(DynamicHostEmbedding, "prefetch",
                            lambda self, ids: (threads.append(threading.current_thread().name), prefetch(self, ids))[1])
        ensure = RowDraws.ensure
        monkeypatch.setattr(RowDraws, "ensure",
                            lambda self, n, pin=False: (draws.append(threading.current_thread().name),
                                                        ensure(self, n, pin))[1])
    batches = _user_batches(25, pin=device == "cuda")
    runs = []
    for pipelined in (False, True):
        model = _RawUsers(device, policy, admit_after)
        optimizer = torch.optim.SGD(model.items.parameters(), lr=0.1)
        if pipelined:
            losses = [out[0].detach() for out in speedtorch.TrainPipeline(model, optimizer, batches, device=device)]
        else:
            losses = []
            for batch in batches:
                loss, _ = model(tuple(t.to(device) for t in batch))
                loss.backward()
                model.users.step()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                losses.append(loss.detach())
        if device == "cuda":
            torch.cuda.synchronize()
        runs.append((torch.stack(losses).cpu(), _everything(model.users), model.items.weight.detach().cpu(),
                     [k for k, _, _ in model.evicted]))
    (plain_losses, plain, plain_items, plain_evicted), (losses, piped, items, evicted) = runs
    assert torch.equal(losses, plain_losses)
    for key in plain:
        assert torch.equal(piped[key].cpu(), plain[key].cpu()), key
    assert torch.equal(items, plain_items)
    assert plain_evicted and len(evicted) == len(plain_evicted)
    assert all(torch.equal(a, b) for a, b in zip(evicted, plain_evicted))
    if beside:
        assert threads and all(name.startswith("speedtorch-prefetch") for name in threads)
        assert draws and all(name.startswith("speedtorch-prefetch") for name in draws)


@pytest.mark.gpu
def test_cuda_ids_map_as_cpu_ids_and_train_alike():
    generator = torch.Generator().manual_seed(2)
    universe = raw_universe(generator, 100)
    kwargs = dict(capacity=16, admit_after=2, evict="lru", optimizer="adagrad", seed=3)
    on_gpu = HostEmbedding(None, 8, device="cuda", **kwargs)
    on_cpu = HostEmbedding(None, 8, device="cpu", **kwargs)
    for _ in range(20):
        ids = skewed_ids(generator, 32, universe)
        out_gpu, out_cpu = on_gpu(ids.cuda()), on_cpu(ids)
        assert out_gpu.device.type == "cuda"
        torch.testing.assert_close(out_gpu.cpu(), out_cpu, rtol=1e-5, atol=1e-6)
        out_gpu.square().sum().backward()
        out_cpu.square().sum().backward()
        on_gpu.step()
        on_cpu.step()
    assert torch.equal(on_gpu.index.state(), on_cpu.index.state())
    slots = on_gpu.index.find(universe.cuda())
    assert slots.device.type == "cuda" and torch.equal(slots.cpu(), on_cpu.index.find(universe))


@pytest.mark.gpu
def test_cuda_index_assign_returns_slots_on_the_ids_device():
    index = IdIndex(4, 1, "lfu", 0)
    index.advance_step()
    slots, admitted, _, _ = index.assign(torch.tensor([[3, 4], [3, 5]], device="cuda"))
    assert slots.device.type == "cuda" and slots.tolist() == [[0, 1], [0, 2]]
    assert admitted.device.type == "cpu"
