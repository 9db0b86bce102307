"""What the processes spawned by test_distributed.py run: real torch.distributed ranks (Gloo on CPU), each writing
its results (or its error) to a file the test reads. Kept apart from the tests so the children import no pytest.

Every rank knows every rank's batch (seeded by step and rank), so the test can train a single-process reference on
their concatenation. With SPEEDTORCH_TEST_DIST_BACKEND=nccl the ranks use NCCL, one GPU each (the multi-GPU run),
and their tables feed the GPUs over UVA.
"""

from __future__ import annotations

import datetime
import os
import time
import traceback

import torch
import torch.distributed as dist

#: Where the ranks compute: the CPU with Gloo, a GPU per rank with NCCL (set by run()).
DEVICE = torch.device("cpu")

# (name, options) of every optimizer, with options that exercise their state.
OPTIMIZERS = [
    ("sgd", {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}),
    ("adagrad", {"lr": 0.1, "initial_accumulator_value": 0.1}),
    ("adam", {"lr": 0.01, "amsgrad": 1}),
    ("adamw", {"lr": 0.01, "weight_decay": 0.1}),
    ("adamax", {"lr": 0.01}),
    ("rmsprop", {"lr": 0.01, "momentum": 0.5, "centered": 1}),
    ("adadelta", {"lr": 1.0}),
    ("asgd", {"lr": 0.01, "t0": 2}),
    ("rprop", {"lr": 0.01}),
    ("rowwise_adagrad", {"lr": 0.1, "weight_decay": 0.01}),
]


def initial_table(num_rows: int, dim: int) -> torch.Tensor:
    return torch.randn(num_rows, dim, generator=torch.Generator().manual_seed(1234))


def batch(step: int, rank: int, num_rows: int, size: int, dim: int):
    """Rank ``rank``'s ids at ``step`` (repeats within the batch, ids owned by every rank) and its loss weights."""
    g = torch.Generator().manual_seed(7919 * step + rank)
    ids = torch.randint(0, num_rows, (size,), generator=g)
    ids[: size // 4] = ids[size // 4: size // 2]  # repeated ids, always
    return ids, torch.randn(size, dim, generator=g)


def train(module, rank: int, steps: int, first_step: int, num_rows: int, size: int, dim: int, prefetch=False):
    prefetched = None
    for step in range(first_step, first_step + steps):
        ids, weights = batch(step, rank, num_rows, size, dim)
        if prefetched is not None:
            ids = prefetched  # the very tensor prefetch() was given: forward takes the rows it gathered
        (module(ids) * weights.to(DEVICE)).sum().backward()
        if prefetch:  # asked before step(): the module must wait for this step's updates by every rank
            prefetched = batch(step + 1, rank, num_rows, size, dim)[0]
            module.prefetch(prefetched)
        module.step()


def blocks(module) -> dict:
    """This rank's block of rows and state, and the step count."""
    sd = module.state_dict()
    return {"weight": sd["weight"].to_local().clone(), "optimizer_state": sd["optimizer_state"].to_local().clone(),
            "step": int(sd["optimizer_step"])}


# --- scenarios: each returns what the test compares ------------------------------------------------------------------

def scenario_train(rank, cfg):
    from speedtorch.distributed import DistributedHostEmbedding

    global DEVICE
    if cfg.get("device") == "cuda" and DEVICE.type == "cpu":  # GPU compute with Gloo between the ranks
        DEVICE = torch.device("cuda", rank % torch.cuda.device_count())
    out = {}
    for name, options in cfg["optimizers"]:
        m = DistributedHostEmbedding(cfg["rows"], cfg["dim"], optimizer=name, optimizer_options=options,
                                     device=DEVICE, reduction=cfg["reduction"], shm_dir=cfg["shm_dir"])
        m.table.copy_(initial_table(cfg["rows"], cfg["dim"]))
        train(m, rank, cfg["steps"], 0, cfg["rows"], cfg["batch"], cfg["dim"], prefetch=cfg.get("prefetch", False))
        out[name] = blocks(m)
        out[name]["bytes_sent"] = m.table.sharding.bytes_sent
    return out


def scenario_ddp(rank, cfg):
    """A model whose dense part DDP averages and whose table the module trains: both equal the reference."""
    from torch.nn.parallel import DistributedDataParallel

    from speedtorch.distributed import DistributedHostEmbedding

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = DistributedHostEmbedding(cfg["rows"], cfg["dim"], optimizer="adam",
                                                optimizer_options={"lr": 0.01}, device=DEVICE,
                                                shm_dir=cfg["shm_dir"], seed=0)
            self.dense = torch.nn.Linear(cfg["dim"], 1).to(DEVICE)  # initialised as the test's reference is

        def forward(self, ids):
            return self.dense(self.emb(ids)).squeeze(-1)

    torch.manual_seed(0)
    model = Model()
    model.emb.table.copy_(initial_table(cfg["rows"], cfg["dim"]))
    ddp = DistributedDataParallel(model, device_ids=[DEVICE.index] if DEVICE.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(cfg["steps"]):
        ids, weights = batch(step, rank, cfg["rows"], cfg["batch"], cfg["dim"])
        loss = (ddp(ids) - weights[:, 0].to(DEVICE)).pow(2).mean()
        loss.backward()
        model.emb.step()
        opt.step()
        opt.zero_grad()
    out = blocks(model.emb)
    out["dense"] = {k: v.cpu().clone() for k, v in model.dense.state_dict().items()}
    return out


def scenario_dcp_save(rank, cfg):
    """Trains, checkpoints with torch.distributed.checkpoint, trains on: returns the blocks at both points."""
    import torch.distributed.checkpoint as dcp

    from speedtorch.distributed import DistributedHostEmbedding

    m = DistributedHostEmbedding(cfg["rows"], cfg["dim"], optimizer="adam", optimizer_options={"lr": 0.01},
                                 device=DEVICE, shm_dir=cfg["shm_dir"])
    m.table.copy_(initial_table(cfg["rows"], cfg["dim"]))
    train(m, rank, cfg["steps"], 0, cfg["rows"], cfg["batch"], cfg["dim"])
    dcp.save({"emb": m.state_dict()}, checkpoint_id=cfg["checkpoint"])
    at_save = blocks(m)
    train(m, rank, cfg["more_steps"], cfg["steps"], cfg["rows"], cfg["batch"], cfg["dim"])
    return {"at_save": at_save, "after": blocks(m)}


def scenario_dcp_load(rank, cfg):
    """A fresh module (other values) loads the checkpoint in place, then trains on from where it was saved."""
    import torch.distributed.checkpoint as dcp

    from speedtorch.distributed import DistributedHostEmbedding

    m = DistributedHostEmbedding(cfg["rows"], cfg["dim"], optimizer="adam", optimizer_options={"lr": 0.01},
                                 device=DEVICE, shm_dir=cfg["shm_dir"], seed=5)
    state = {"emb": m.state_dict()}
    dcp.load(state, checkpoint_id=cfg["checkpoint"])
    m.load_state_dict(state["emb"])
    loaded = blocks(m)
    train(m, rank, cfg["more_steps"], cfg["steps"], cfg["rows"], cfg["batch"], cfg["dim"])
    return {"loaded": loaded, "after": blocks(m)}


def scenario_kill(rank, cfg):
    """Rank ``victim`` dies (SIGKILL-like exit) in the middle of a step; the others must fail, not hang, and their
    shared table must be the one of the last step every rank finished."""
    from speedtorch.distributed import DistributedHostEmbedding

    m = DistributedHostEmbedding(cfg["rows"], cfg["dim"], optimizer="adam", optimizer_options={"lr": 0.01},
                                 device=DEVICE, shm_dir=cfg["shm_dir"])
    m.table.copy_(initial_table(cfg["rows"], cfg["dim"]))
    train(m, rank, 1, 0, cfg["rows"], cfg["batch"], cfg["dim"])
    ids, weights = batch(1, rank, cfg["rows"], cfg["batch"], cfg["dim"])
    (m(ids) * weights.to(DEVICE)).sum().backward()
    if rank == cfg["victim"]:
        os._exit(9)
    start = time.monotonic()
    try:
        m.step()
    except Exception as e:  # noqa: BLE001 (what the test checks is that it raised, how soon, and what it said)
        return {"error": f"{type(e).__name__}: {e}", "seconds": time.monotonic() - start,
                "table": m.weight.clone(), "optimizer_state": m.table.state().clone(), "step": m.table.step_count()}
    return {"error": None, "seconds": time.monotonic() - start}


def _step_or_error(module, rank, step, cfg, forward=True, bad_id=False, empty=False,
                   step_after_error=True) -> str | None:
    """One training step of ``batch(step, rank)`` (without the forward when ``forward`` is False; with an id out of
    range at position 5 when ``bad_id``; forwarding no id when ``empty``), step() called even when the forward raised
    unless ``step_after_error`` is False; the first error raised, as text, or None."""
    ids, weights = batch(step, rank, cfg["rows"], cfg["batch"], cfg["dim"])
    if bad_id:
        ids[5] = cfg["rows"]
    if empty:
        ids, weights = ids[:0], weights[:0]
    error = None
    try:
        if forward:
            (module(ids) * weights.to(DEVICE)).sum().backward()
    except (IndexError, RuntimeError) as e:
        error = f"{type(e).__name__}: {e}"
    if error is not None and not step_after_error:
        return error
    try:
        module.step()
    except (IndexError, RuntimeError) as e:
        error = error or f"{type(e).__name__}: {e}"
    return error


def scenario_bad_ids(rank, cfg):
    """Step 1: rank ``bad_rank``'s batch holds an id out of range, and every rank carries on after any error it
    raised; step 2: rank ``empty_rank`` forwards no id; step 3: rank ``skipper`` runs no forward but calls step().
    Returns the errors, and the blocks after steps 0 to 2."""
    from speedtorch.distributed import DistributedHostEmbedding

    m = DistributedHostEmbedding(cfg["rows"], cfg["dim"], optimizer="adam", optimizer_options={"lr": 0.01},
                                 device=DEVICE, shm_dir=cfg["shm_dir"])
    m.table.copy_(initial_table(cfg["rows"], cfg["dim"]))
    errors = [_step_or_error(m, rank, 0, cfg)]
    errors.append(_step_or_error(m, rank, 1, cfg, bad_id=rank == cfg["bad_rank"]))
    errors.append(_step_or_error(m, rank, 2, cfg, empty=rank == cfg.get("empty_rank")))
    out = {"errors": errors, "blocks": blocks(m)}
    if rank == cfg.get("table_gather_rank"):  # one host only (a lookup there is no collective): the table itself
        try:
            m.table.gather(torch.tensor([[0, 1, 2], [3, cfg["rows"], 4]]))
        except IndexError as e:
            out["table_gather"] = str(e)
    if cfg.get("skipper") is not None:  # every rank raises in its first exchange of step 3 (and stops there)
        errors.append(_step_or_error(m, rank, 3, cfg, forward=rank != cfg["skipper"], step_after_error=False))
    return out


def scenario_two_tables(rank, cfg):
    """Tables A (every row 1.0) and B (every row 2.0) looked up by ids on every host: once by every rank alike, then
    with rank ``skipper`` skipping A's lookup, so that its lookup of B meets the others' lookup of A. Returns the
    values each lookup gave (or its error), per table."""
    from speedtorch.distributed import DistributedHostEmbedding

    tables = {}
    for name, value in (("A", 1.0), ("B", 2.0)):
        tables[name] = DistributedHostEmbedding(cfg["rows"], cfg["dim"], device=DEVICE, shm_dir=cfg["shm_dir"])
        tables[name].table.copy_(torch.full((cfg["rows"], cfg["dim"]), value))
    ids = torch.arange(cfg["rows"])
    out = {"aligned": [], "skipped": []}
    with torch.no_grad():
        for name in ("A", "B"):
            out["aligned"].append((name, tables[name](ids).unique().tolist()))
        for name in ("B",) if rank == cfg["skipper"] else ("A", "B"):
            try:
                out["skipped"].append((name, tables[name](ids).unique().tolist()))
            except RuntimeError as e:
                out["skipped"].append((name, f"{type(e).__name__}: {e}"))
                break  # the ranks no longer agree on where they are: stop, as docs/distributed.md says
    return out


def scenario_build(rank, cfg):
    """Builds a table with per-rank arguments (mismatches must be refused on every rank)."""
    from speedtorch.distributed import DistributedHostEmbedding

    kwargs = dict(cfg["kwargs"])
    kwargs.update(cfg.get("per_rank", {}).get(rank, {}))
    m = DistributedHostEmbedding(device=DEVICE, shm_dir=cfg["shm_dir"], **kwargs)
    block = m.state_dict()["weight"].to_local()
    # A block with a storage of its own is what DCP writes from shared memory without copying it.
    return {"host_rows": tuple(m.weight.shape), "block_storage_is_block": block.untyped_storage().nbytes() == block.nbytes,
            "block_shares_table": block.data_ptr() in range(m.weight.data_ptr(), m.weight.data_ptr() + m.weight.nbytes)}


def _ddp_host_table(rank, cfg, ignore):
    """A model holding a plain HostEmbedding (one table per process) inside DDP, computing where the rank computes
    (the CPU with Gloo, its GPU with NCCL), as docs/training.md's flow does. With ddp_ignore_host_tables the table is
    left alone (no broadcast, no gradient bucket) and the dense part is synchronised; without it, DDP broadcasts rank
    0's table at construction (a registered CPU parameter) on the CPU, and refuses a GPU model (the table's
    parameter lies on the CPU, the rest on the GPU): that refusal's text is returned."""
    from torch.nn.parallel import DistributedDataParallel

    from speedtorch.nn import HostEmbedding, ddp_ignore_host_tables, dense_parameters
    from speedtorch.optim import CombinedOptimizer, HostEmbeddingOptimizer

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = HostEmbedding(cfg["rows"], cfg["dim"], optimizer="adam", optimizer_options={"lr": 0.01},
                                     device=DEVICE, seed=100 + rank)  # each rank its own table
            torch.manual_seed(rank)  # and its own dense values: DDP makes them rank 0's
            self.dense = torch.nn.Linear(cfg["dim"], 1).to(DEVICE)

        def forward(self, ids):
            return self.dense(self.emb(ids)).squeeze(-1)

    model = Model()
    initial = model.emb.weight.clone()
    if ignore:
        ddp_ignore_host_tables(model)
    device_ids = [DEVICE.index] if DEVICE.type == "cuda" else None
    try:
        ddp = DistributedDataParallel(model, device_ids=device_ids)
    except ValueError as e:
        if ignore or DEVICE.type == "cpu":
            raise
        return {"refused": str(e)}
    after_wrap = model.emb.weight.clone()
    opt = CombinedOptimizer([HostEmbeddingOptimizer(model), torch.optim.SGD(dense_parameters(model), lr=0.1)])
    for step in range(cfg["steps"]):
        ids, weights = batch(step, rank, cfg["rows"], cfg["batch"], cfg["dim"])
        (ddp(ids) - weights[:, 0].to(DEVICE)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    return {"initial": initial, "after_wrap": after_wrap, "table": model.emb.weight.clone(),
            "steps": model.emb.table.step_count(),
            "dense": {k: v.cpu().clone() for k, v in model.dense.state_dict().items()}}


def _shared_arguments(rank, cfg):
    """DistributedHostEmbedding takes HostEmbedding's arguments (README: "with the same arguments"), and refuses
    those that cannot apply to a shared table with a reason."""
    from speedtorch.distributed import DistributedHostEmbedding

    refused = {}
    for name, value in (("update", "backward"), ("placement", "gpu"), ("max_norm", 1.0), ("cache_rows", 32)):
        try:
            DistributedHostEmbedding(cfg["rows"], cfg["dim"], device=DEVICE, shm_dir=cfg["shm_dir"], **{name: value})
            refused[name] = None
        except ValueError as e:
            refused[name] = str(e)
    m = DistributedHostEmbedding(cfg["rows"], cfg["dim"], 3, None, 2.0, True, True, mode="sum",
                                 include_last_offset=True, optimizer="sgd", optimizer_options={"lr": 0.5},
                                 update="step", state_beside_rows=True, placement="host", init_std=0.5, seed=1,
                                 dtype=torch.float32, device=DEVICE, shm_dir=cfg["shm_dir"])
    padding_row = m.weight[3].clone() if rank == 0 else None
    ids = torch.tensor([3, 1, 1, 3, 2])
    out = m(ids, torch.tensor([0, 2, 5]))
    out.sum().backward()
    m.step()
    return {"refused": refused, "padding_row_at_start": padding_row, "out_shape": tuple(out.shape),
            "padding_row": m.weight[3].clone() if rank == 0 else None, "steps": m.table.step_count()}


def scenario_standard_flows(rank, cfg):
    """The standard-flow checks of issue 25 in one launch (each launch costs seconds of process start): DDP around a
    model holding a HostEmbedding, with and without ddp_ignore_host_tables, and DistributedHostEmbedding's
    arguments."""
    return {"ddp_ignored": _ddp_host_table(rank, cfg, ignore=True),
            "ddp_plain": _ddp_host_table(rank, cfg, ignore=False),
            "shared_arguments": _shared_arguments(rank, cfg)}


def scenario_share_rows(rank, cfg):
    """Local rank 0 shares an fp8 serving table; every rank of its host reads the same rows from one copy."""
    from speedtorch.distributed import share_rows
    from speedtorch.serving.quantized import QuantizedRows

    mine = None
    if int(os.environ["LOCAL_RANK"]) == 0:
        mine = QuantizedRows.from_table(initial_table(cfg["rows"], 32), "fp8_e4m3_ue8m0")
    shared = share_rows(mine, shm_dir=cfg["shm_dir"])
    return {"rows": shared.gather(torch.arange(cfg["rows"]), "cpu"), "pinned": shared.table.is_pinned() or
            not torch.cuda.is_available(), "format": shared.format}


def scenario_pipeline(rank, cfg):
    """scenario_ddp's model trained twice on the same batches, by the plain loop and by speedtorch.TrainPipeline
    (which prefetches each next batch's rows): both results, which must be the same bits."""
    from torch.nn.parallel import DistributedDataParallel

    from speedtorch import TrainPipeline
    from speedtorch.distributed import DistributedHostEmbedding

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = DistributedHostEmbedding(cfg["rows"], cfg["dim"], optimizer="adam",
                                                optimizer_options={"lr": 0.01}, device=DEVICE,
                                                shm_dir=cfg["shm_dir"], seed=0)
            self.dense = torch.nn.Linear(cfg["dim"], 1).to(DEVICE)

        def forward(self, batch):
            ids, weights = batch
            return (self.dense(self.emb(ids)).squeeze(-1) - weights[:, 0]).pow(2).mean()

    batches = [batch(step, rank, cfg["rows"], cfg["batch"], cfg["dim"]) for step in range(cfg["steps"])]
    out = {}
    for way in ("plain", "pipelined"):
        torch.manual_seed(0)
        model = Model()
        model.emb.table.copy_(initial_table(cfg["rows"], cfg["dim"]))
        ddp = DistributedDataParallel(model, device_ids=[DEVICE.index] if DEVICE.type == "cuda" else None)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        if way == "plain":
            for b in batches:
                ddp(tuple(t.to(DEVICE) for t in b)).backward()
                model.emb.step()
                opt.step()
                opt.zero_grad()
        else:
            pipeline = TrainPipeline(ddp, opt, batches, device=DEVICE, sparse_inputs=lambda b: [(model.emb, b[0])],
                                     prefetch=cfg.get("prefetch", True))
            assert pipeline.host_modules == [model.emb]
            steps = sum(1 for _ in pipeline)
            assert steps == len(batches)
            out["prefetch"] = pipeline.prefetch  # "auto": the way every rank kept
        out[way] = blocks(model.emb)
        out[way]["dense"] = {k: v.cpu().clone() for k, v in model.dense.state_dict().items()}
    return out


# --- the table collection ------------------------------------------------------------------------------------------

# (name, rows, dim, pooling, features, optimizer): three groups, two of dim 4 (adam, with t0 read by two features;
# adagrad) and one of dim 6 (sgd), so a step moves the rows of three groups of two widths.
COLLECTION_TABLES = [("t0", 23, 4, "sum", ("a", "b"), None), ("t1", 17, 4, "mean", ("c",), "adagrad"),
                     ("t2", 31, 6, "sum", ("d",), "sgd")]
_TABLE_OPTIONS = {None: None, "adagrad": {"lr": 0.1}, "sgd": {"lr": 0.1, "momentum": 0.9}}
COLLECTION_FEATURES = [("a", 23), ("b", 23), ("c", 17), ("d", 31)]  # feature, its table's rows


def collection_configs():
    from speedtorch import TableConfig

    return [TableConfig(name, rows, dim, pooling=pooling, feature_names=features, optimizer=opt,
                        optimizer_options=_TABLE_OPTIONS[opt])
            for name, rows, dim, pooling, features, opt in COLLECTION_TABLES]


def collection_batch(step: int, rank: int, size: int, multi_hot: bool):
    """Rank ``rank``'s features at ``step``: a (size, features) one-hot tensor, or SparseFeatures with 0-3 ids per
    bag (empty bags included), and the regression targets."""
    from speedtorch import SparseFeatures

    g = torch.Generator().manual_seed(104729 * step + 31 * rank + (7 if multi_hot else 0))
    target = torch.randn(size, generator=g)
    if not multi_hot:
        return torch.stack([torch.randint(0, rows, (size,), generator=g) for _, rows in COLLECTION_FEATURES], 1), target
    lengths = torch.randint(0, 4, (len(COLLECTION_FEATURES), size), generator=g)
    values = torch.cat([torch.randint(0, rows, (int(lengths[f].sum()),), generator=g)
                        for f, (_, rows) in enumerate(COLLECTION_FEATURES)])
    return SparseFeatures([n for n, _ in COLLECTION_FEATURES], values, lengths.reshape(-1)), target


def concatenated_batches(batches, multi_hot: bool):
    """The ranks' batches as one (what single-process training on all of them takes)."""
    from speedtorch import SparseFeatures

    if not multi_hot:
        return torch.cat([f for f, _ in batches]), torch.cat([t for _, t in batches])
    features = [f for f, _ in batches]
    per_feature = len(COLLECTION_FEATURES)
    lengths, values = [], []
    for f in range(per_feature):
        for kjt in features:
            bag_lengths = kjt.lengths.view(per_feature, -1)
            start = int(bag_lengths[:f].sum())
            lengths.append(bag_lengths[f])
            values.append(kjt.values[start:start + int(bag_lengths[f].sum())])
    return (SparseFeatures(features[0].keys, torch.cat(values), torch.cat(lengths)),
            torch.cat([t for _, t in batches]))


def collection_initial(rows: int, dim: int, group: int) -> torch.Tensor:
    return torch.randn(rows, dim, generator=torch.Generator().manual_seed(4321 + group))


class CollectionModel(torch.nn.Module):
    """The collection and a linear layer on its pooled features: what the test trains on every rank under DDP and
    in one process (the reference)."""

    def __init__(self, collection):
        super().__init__()
        self.sparse = collection
        torch.manual_seed(0)
        self.dense = torch.nn.Linear(sum(d for _, _, d, _, feats, _ in COLLECTION_TABLES for _ in feats), 1)

    def forward(self, features):
        return self.dense(self.sparse(features)).squeeze(-1)


def scenario_collection(rank, cfg):
    """DistributedHostEmbeddingBagCollection under DDP, one-hot and multi-hot (a collection each), trained for
    cfg["steps"] steps (the pipeline's order with cfg["prefetch"]: the next batch prefetched before step()). Returns
    per variant each group's block of rows and state, its step count, the dense parameters, and how many
    exchanges the collection and its groups' own tables opened."""
    from torch.nn.parallel import DistributedDataParallel

    from speedtorch.distributed import DistributedHostEmbeddingBagCollection

    global DEVICE
    if cfg.get("device") == "cuda" and DEVICE.type == "cpu":  # GPU compute with Gloo between the ranks
        DEVICE = torch.device("cuda", rank % torch.cuda.device_count())
    out = {}
    for multi_hot in (False, True):
        collection = DistributedHostEmbeddingBagCollection(collection_configs(), optimizer="adam",
                                                           optimizer_options={"lr": 0.05}, device=DEVICE,
                                                           reduction=cfg["reduction"], shm_dir=cfg["shm_dir"])
        for g, module in enumerate(collection.groups):
            module.table.copy_(collection_initial(module.num_embeddings, module.embedding_dim, g))
        model = CollectionModel(collection).to(DEVICE)
        ddp = DistributedDataParallel(model, device_ids=[DEVICE.index] if DEVICE.type == "cuda" else None)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        batches = [collection_batch(step, rank, cfg["batch"], multi_hot) for step in range(cfg["steps"])]
        if cfg.get("pipeline"):  # TrainPipeline: it prefetches each next batch and steps the groups one by one
            from speedtorch import TrainPipeline

            class Loss(torch.nn.Module):
                def __init__(self, model):
                    super().__init__()
                    self.model = model

                def forward(self, batch):
                    return (self.model(batch[0]) - batch[1]).pow(2).mean()

            ddp = DistributedDataParallel(Loss(model), device_ids=[DEVICE.index] if DEVICE.type == "cuda" else None)
            pipeline = TrainPipeline(ddp, torch.optim.SGD(ddp.parameters(), lr=0.1), batches, device=DEVICE,
                                     sparse_inputs=lambda b: [(collection, b[0])])
            assert sum(1 for _ in pipeline) == len(batches)
        for step, (features, target) in enumerate([] if cfg.get("pipeline") else batches):
            (ddp(features) - target.to(DEVICE)).pow(2).mean().backward()
            if cfg.get("prefetch") and step + 1 < len(batches):
                collection.prefetch(batches[step + 1][0])  # before step(): gathered once every update is done
            collection.step()
            opt.step()
            opt.zero_grad()
        groups = []
        for module in collection.groups:
            sd = module.state_dict()
            groups.append({"weight": sd["weight"].to_local().clone(),
                           "optimizer_state": sd["optimizer_state"].to_local().clone(),
                           "step": int(sd["optimizer_step"]), "own_exchanges": module.table.sharding.headers.opened})
        out["multi_hot" if multi_hot else "one_hot"] = {
            "groups": groups, "dense": {k: v.cpu().clone() for k, v in model.dense.state_dict().items()},
            "exchanges": collection.sharding.headers.opened, "bytes_sent": collection.sharding.bytes_sent,
            "state_dict_keys": sorted(collection.state_dict())}
    if cfg.get("bad_id_rank") is not None:  # an id out of range on one rank: every rank raises, then all go on
        features = collection_batch(99, rank, cfg["batch"], False)[0]
        if rank == cfg["bad_id_rank"]:
            features[2, 3] = COLLECTION_FEATURES[3][1]  # feature d's table has that many rows
        with torch.no_grad():
            try:
                collection(features)
                out["bad_id"] = None
            except IndexError as e:
                out["bad_id"] = str(e)
            out["after_bad_id"] = tuple(collection(collection_batch(100, rank, cfg["batch"], False)[0]).shape)
            # Rank 0 asks for no row and no rank asks it for one (id 1 of every table is on host 0, owned by rank 1)
            # while the others exchange rows: it still takes part in every stage.
            ones = torch.ones(0 if rank == 0 else cfg["batch"], len(COLLECTION_FEATURES), dtype=torch.int64)
            out["idle_rank"] = collection(ones)[:1].clone()
    return out


SCENARIOS = {name[len("scenario_"):]: fn for name, fn in globals().items() if name.startswith("scenario_")}


def run(rank: int, world: int, port: int, local_world: int, scenario: str, cfg: dict, out_dir: str) -> None:
    """A rank's whole life: join the group, run the scenario, write ``<rank>.pt`` (or ``<rank>.err``)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_WORLD_SIZE=str(local_world),
                      LOCAL_RANK=str(rank % local_world), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    global DEVICE
    backend = os.environ.get("SPEEDTORCH_TEST_DIST_BACKEND", "gloo")
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        DEVICE = torch.device("cuda", torch.cuda.current_device())
    try:
        dist.init_process_group(backend, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=cfg.get("timeout", 60)))
        result = SCENARIOS[scenario](rank, cfg)
        torch.save(result, os.path.join(out_dir, f"{rank}.pt"))
        if scenario == "kill":  # a peer is gone: no group to tear down with it (NCCL's would wait for it)
            os._exit(0)
    except BaseException as e:  # noqa: BLE001
        with open(os.path.join(out_dir, f"{rank}.err"), "w") as f:
            f.write(f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
        os._exit(1)  # without waiting on peers that may be gone
    dist.destroy_process_group()
