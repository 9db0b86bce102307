"""Serving copies of the example recommender (torchscript_examples/quantized_recommender.py): a trained float32 user
table converted to fp16, bf16, row-wise int8 or fp8 and served read-only from host RAM, by the scripted model and by
its AOTInductor package; every answer checked against the library's own dequantized rows (QuantizedRows, which
reads the same files with speedtorch::gather_dequant). The C++ programs come from the CMake build, as in
test_torchscript_examples.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import torch

import speedtorch
from speedtorch.serving.quantized import QuantizedRows

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "torchscript_examples"))
import load_test  # noqa: E402
import quantized_accuracy  # noqa: E402
import quantized_recommender  # noqa: E402
import recommender_aoti  # noqa: E402
import recommender_model  # noqa: E402

BUILD = Path(os.environ.get("SPEEDTORCH_BUILD_DIR", ROOT / "build")) / "torchscript_examples"
SERVES_PACKAGES = torch.__version__ >= (2, 10)  # as test_torchscript_examples.py
USERS, ITEMS, DIM = 400, 30, 32


def binary(name: str) -> str:
    path = BUILD / name
    if not path.exists():
        pytest.skip(f"{path} not built")
    return str(path)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A scripted recommender trained a few steps (its table's fused Adam), saved: (folder, model)."""
    folder = tmp_path_factory.mktemp("quantized")
    model = torch.jit.script(recommender_model.Recommender(USERS, ITEMS, DIM, seed=3))
    batches = recommender_model.make_batches(USERS, ITEMS, 4, 256, seed=5)
    for i in range(4):
        model.train_step(batches.users[i], batches.items[i], batches.labels[i], 0.5)
    speedtorch.jit_save(model, folder / "model.pt")
    return folder, model


@pytest.fixture(scope="module")
def int8_copy(trained):
    """The int8 serving copy of the trained model, saved and loaded back: (path of its model file, loaded copy)."""
    folder, model = trained
    path = folder / "model_int8.pt"
    speedtorch.jit_save(torch.jit.script(quantized_recommender.convert(model, "int8_rowwise",
                                                                       folder / "users_int8.npy")), path)
    return path, torch.jit.load(str(path))


def library_rows(table_file, table_format: str, ids: torch.Tensor) -> torch.Tensor:
    """The rows as the library reads the converted file: QuantizedRows (speedtorch::gather_dequant), or the float16
    file itself."""
    if table_format == "fp16":
        return speedtorch.data.open_npy(table_file).index_select(0, ids).float()
    return QuantizedRows.open(table_file).gather(ids).float()


@pytest.mark.parametrize("table_format", quantized_recommender.SERVING_FORMATS)
def test_serving_copy_answers_with_the_librarys_dequantized_rows(trained, tmp_path, table_format):
    _, model = trained
    table_file = tmp_path / "users.npy"
    path = tmp_path / "model.pt"
    speedtorch.jit_save(torch.jit.script(quantized_recommender.convert(model, table_format, table_file)), path)
    copy = torch.jit.load(str(path))
    assert path.stat().st_size < copy.table.nbytes  # the rows stay in their file, mapped at load
    ids = torch.randint(0, USERS, (3, 50))
    rows = library_rows(table_file, table_format, ids.flatten()).view(3, 50, DIM)
    assert torch.equal(copy.lookup(ids), rows)
    items = torch.randint(0, ITEMS, (3, 50))
    expected = (rows * model.items.detach()[items]).sum(-1) + model.bias.detach()
    torch.testing.assert_close(copy.score(ids, items), expected, rtol=1e-6, atol=1e-7)
    top_items, top_scores = copy.top_k(7, 5)
    all_scores = model.items.detach() @ library_rows(table_file, table_format, torch.tensor([7]))[0] + model.bias
    assert torch.equal(top_items, torch.topk(all_scores.detach(), 5).indices)
    # Close to the float32 model: within what each format keeps of a row (int8: 1.5 steps of 1/255 of the row's
    # range, 2/255 of its largest value at most: the rank-preserving codes are one step off nearest rounding at most).
    tolerance = {"fp16": 1e-3, "bf16": 1e-2, "int8_rowwise": 1.3e-2, "fp8_e4m3_ue8m0": 7e-2}[table_format]
    exact = model.lookup(ids).detach()
    assert float((copy.lookup(ids) - exact).abs().max()) <= tolerance * float(exact.abs().max())
    with pytest.raises(torch.jit.Error, match="read-only serving copy"):
        copy.update_rows(ids[0], rows[0])


def test_int8_copy_takes_at_most_a_third_and_a_half_of_the_float32_table(trained, int8_copy):
    # Issue 27's target, with the default 4-byte row alignment (36-byte rows at dim 32; FBGEMM's 16 takes 48).
    _, model = trained
    _, copy = int8_copy
    assert copy.table.nbytes * 3.5 <= model.users.table().nbytes
    assert copy.table.nbytes == USERS * 36


def test_a_serving_copy_refuses_a_table_file_that_is_not_its_own(trained, tmp_path):
    # An fp8 file of dim 32 has the int8 file's shape (36-byte rows): only the content hash tells them apart.
    _, model = trained
    copy = torch.jit.script(quantized_recommender.convert(model, "int8_rowwise", tmp_path / "users.npy"))
    speedtorch.jit_save(copy, tmp_path / "model.pt")
    quantized_recommender.convert(model, "fp8_e4m3_ue8m0", tmp_path / "other.npy")
    shutil.copyfile(tmp_path / "other.npy", tmp_path / "users.npy")
    with pytest.raises(Exception, match="holds other rows than the model was converted with"):
        torch.jit.load(str(tmp_path / "model.pt"))


def test_relative_table_paths_resolve_as_sidecars_do(trained, tmp_path, monkeypatch):
    _, model = trained
    monkeypatch.setenv("SPEEDTORCH_SIDECAR_DIR", str(tmp_path))
    copy = torch.jit.script(quantized_recommender.convert(model, "bf16", "users_bf16.npy"))
    assert (tmp_path / "users_bf16.npy").exists() and copy.table_path == "users_bf16.npy"
    speedtorch.jit_save(copy, tmp_path / "model.pt")
    ids = torch.arange(USERS)
    assert torch.equal(torch.jit.load(str(tmp_path / "model.pt")).lookup(ids), copy.lookup(ids))


def test_top_k_agreement_counts_recall_and_the_score_a_swap_loses():
    # quantized_accuracy.py's figures, on a model whose scores are the item ids: against a float32 top 3 of
    # [9, 8, 7], the answer [9, 7, 8] holds all three (recall 1) and loses 8 - 7 = 1 at rank 2; [9, 8, 5] holds two
    # and loses 7 - 5 = 2 at rank 3, the largest loss.
    class ScoresAreItemIds:
        def score(self, users, items):
            return items.float()

    recall, loss = quantized_accuracy.top_k_agreement(ScoresAreItemIds(), [0, 1], [[9, 7, 8], [9, 8, 5]],
                                                      [[9, 8, 7], [9, 8, 7]])
    assert recall == pytest.approx((1 + 2 / 3) / 2) and loss == 2.0
    assert quantized_accuracy.top_k_agreement(ScoresAreItemIds(), [0], [[9, 8]], [[9, 8]]) == (1.0, 0.0)


def test_server_serves_the_copy_checked_by_the_load_test_and_refuses_updates(trained, int8_copy):
    # The load test's --quantized option (Python clients: lookups, top-k and scores, each checked against the copy
    # run in Python) beside the float32 model, then the copy's server by hand.
    folder, _ = trained
    path, copy = int8_copy
    server = binary("speedtorch_server")
    out = subprocess.run([sys.executable, str(ROOT / "torchscript_examples" / "load_test.py"), "--server", server,
                          "--model", str(folder / "model.pt"), "--quantized", str(path), "--clients", "2",
                          "--requests", "30", "--warmup", "2", "--threads", "2"],
                         capture_output=True, text=True, timeout=300)
    print(out.stdout)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[-1] == "0 wrong answers"
    assert lines[2].split()[:2] == ["torchscript", "60"]
    assert lines[3].split()[:3] == ["torchscript", "int8_rowwise", "60"]
    with load_test.Server(server, str(path), threads=2) as srv:
        ids = [0, 399, 17, 17]
        status, body = srv.post("/lookup", {"ids": ids})
        assert status == 200
        assert torch.equal(torch.tensor(body["rows"]), library_rows(copy.table_path, "int8_rowwise",
                                                                    torch.tensor(ids)))
        status, body = srv.post("/update", {"ids": [3], "rows": [[0.5] * DIM]})
        assert status == 409 and "read-only int8_rowwise serving copy" in body["error"]
        with urllib.request.urlopen(srv.url + "/health", timeout=30) as answer:
            assert json.load(answer) == {"status": "ok", "users": USERS, "table": "int8_rowwise"}


@pytest.mark.skipif(not SERVES_PACKAGES, reason="AOTInductor packages are served with PyTorch >= 2.10")
def test_aoti_package_of_the_copy_serves_its_answers_and_checks_its_table_file(trained, int8_copy, tmp_path):
    # One compilation (about half a minute): the package reads the copy's file with speedtorch::gather_dequant.
    folder, _ = trained
    path, copy = int8_copy
    server = binary("speedtorch_server")  # skip before compiling a package the test cannot serve
    recommender_aoti.export_package(copy, tmp_path / "model_int8.pt2")
    table = str(folder / "users_int8.npy")
    with load_test.Server(server, str(tmp_path / "model_int8.pt2"), threads=2, table=table) as srv:
        result = load_test.run(srv, copy, clients=2, requests=20)
        assert result["failures"] == [] and result["requests"] == 40
        ids = list(range(0, USERS, 7))
        status, body = srv.post("/lookup", {"ids": ids})
        assert status == 200
        assert torch.equal(torch.tensor(body["rows"]), library_rows(table, "int8_rowwise", torch.tensor(ids)))
        assert srv.post("/update", {"ids": [3], "rows": [[0.5] * DIM]})[0] == 409
    # Another file of the same shape (the fp8 copy, 36-byte rows too) is refused before anything is served.
    quantized_recommender.convert(trained[1], "fp8_e4m3_ue8m0", tmp_path / "fp8.npy")
    out = subprocess.run([server, str(tmp_path / "model_int8.pt2"), "--table", str(tmp_path / "fp8.npy")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "holds other rows than the int8_rowwise table" in out.stderr, out.stderr


@pytest.mark.gpu
def test_serving_copy_on_the_gpu_reads_its_mapped_table_over_uva(int8_copy):
    # Moving the model moves items and bias; the table stays in host memory (page-locked) and the GPU reads it.
    path, copy = int8_copy
    ids = torch.randint(0, USERS, (64,))
    on_gpu = torch.jit.load(str(path)).to("cuda")
    assert on_gpu.table.device.type == "cpu"
    assert torch.equal(on_gpu.lookup(ids.cuda()).cpu(), copy.lookup(ids))
    with load_test.Server(binary("speedtorch_server"), str(path), threads=2, device="cuda") as srv:
        result = load_test.run(srv, copy, clients=2, requests=20)
        assert result["failures"] == [] and result["requests"] == 40
