"""The example server speaks the Open Inference Protocol (KServe v2) to Triton's own client, tritonclient.http
(PyPI), unchanged: health, model metadata, and inference with JSON tensors and with binary tensors, for both of its
models ('lookup': ids -> rows; 'score': users, items -> scores), every answer checked against the scripted model
run in Python. Concurrent requests go through the dynamic batcher (issue 27)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "torchscript_examples"))
import load_test  # noqa: E402
import recommender_model  # noqa: E402

httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

BUILD = Path(os.environ.get("SPEEDTORCH_BUILD_DIR", ROOT / "build")) / "torchscript_examples"
USERS, ITEMS, DIM = 400, 30, 8


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    binary = BUILD / "speedtorch_server"
    if not binary.exists():
        pytest.skip(f"{binary} not built")
    folder = tmp_path_factory.mktemp("v2")
    model = torch.jit.script(recommender_model.Recommender(USERS, ITEMS, DIM))
    torch.jit.save(model, str(folder / "model.pt"))
    with load_test.Server(str(binary), str(folder / "model.pt"), threads=2, max_batch=256) as server:
        client = httpclient.InferenceServerClient(server.url[len("http://"):], concurrency=4)
        yield client, model
        client.close()


def lookup(client, ids: np.ndarray, binary: bool, dtype: str = "INT64"):
    tensor = httpclient.InferInput("ids", list(ids.shape), dtype)
    tensor.set_data_from_numpy(ids, binary_data=binary)
    out = httpclient.InferRequestedOutput("rows", binary_data=binary)
    return client.infer("lookup", [tensor], outputs=[out], request_id="r7")


def test_health_and_metadata(served):
    client, _ = served
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("lookup") and client.is_model_ready("score")
    assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
    meta = client.get_model_metadata("lookup")
    assert meta["inputs"] == [{"name": "ids", "datatype": "INT64", "shape": [-1]}]
    assert meta["outputs"] == [{"name": "rows", "datatype": "FP32", "shape": [-1, DIM]}]
    assert not client.is_model_ready("nope")


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_lookup_answers_the_models_rows(served, binary):
    client, model = served
    ids = np.array([[3, 399, 3], [0, 17, 250]], dtype=np.int64)  # any shape: rows come back in its shape
    result = lookup(client, ids, binary)
    rows = result.as_numpy("rows")
    assert rows.shape == (2, 3, DIM) and rows.dtype == np.float32
    np.testing.assert_array_equal(rows, model.lookup(torch.from_numpy(ids)).numpy())
    assert result.get_response()["id"] == "r7"
    rows32 = lookup(client, ids.astype(np.int32), binary, "INT32").as_numpy("rows")
    np.testing.assert_array_equal(rows32, rows)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_score_answers_the_models_scores(served, binary):
    client, model = served
    users = np.array([1, 2, 3, 399], dtype=np.int64)
    items = np.array([0, 29, 5, 5], dtype=np.int64)
    inputs = [httpclient.InferInput("users", [4], "INT64"), httpclient.InferInput("items", [4], "INT64")]
    inputs[0].set_data_from_numpy(users, binary_data=binary)
    inputs[1].set_data_from_numpy(items, binary_data=binary)
    result = client.infer("score", inputs, outputs=[httpclient.InferRequestedOutput("scores", binary_data=binary)])
    expected = model.score(torch.from_numpy(users), torch.from_numpy(items)).detach().numpy()
    np.testing.assert_allclose(result.as_numpy("scores"), expected, rtol=1e-5, atol=1e-6)


def test_concurrent_requests_each_get_their_own_rows(served):
    # Many requests at once: the batcher merges them, and each answer is still its own ids' rows.
    client, model = served
    rng = np.random.default_rng(0)
    requests = [rng.integers(0, USERS, size=int(rng.integers(1, 40))) for _ in range(48)]
    pending = []
    for ids in requests:
        tensor = httpclient.InferInput("ids", [len(ids)], "INT64")
        tensor.set_data_from_numpy(ids, binary_data=True)
        pending.append(client.async_infer("lookup", [tensor]))  # binary output: no outputs named
    for ids, handle in zip(requests, pending):
        np.testing.assert_array_equal(handle.get_result().as_numpy("rows"),
                                      model.lookup(torch.from_numpy(ids)).numpy())


def test_errors_reach_the_client_as_messages(served):
    client, _ = served
    with pytest.raises(InferenceServerException, match="unknown id 400 in 'ids'"):
        lookup(client, np.array([1, 400], dtype=np.int64), True)
    with pytest.raises(InferenceServerException, match="unknown model 'nope'"):
        tensor = httpclient.InferInput("ids", [1], "INT64")
        tensor.set_data_from_numpy(np.array([1], dtype=np.int64))
        client.infer("nope", [tensor])
    with pytest.raises(InferenceServerException, match="datatype INT64 or INT32"):
        tensor = httpclient.InferInput("ids", [1], "FP32")
        tensor.set_data_from_numpy(np.array([1.0], dtype=np.float32))
        client.infer("lookup", [tensor])
    with pytest.raises(InferenceServerException, match="one input, 'ids'"):
        tensor = httpclient.InferInput("users", [1], "INT64")
        tensor.set_data_from_numpy(np.array([1], dtype=np.int64))
        client.infer("lookup", [tensor])
    with pytest.raises(InferenceServerException, match="more than 256 elements"):
        lookup(client, np.zeros(257, dtype=np.int64), True)
