"""`modelhost embeddings extract` and `build`, as a user runs them: the example DeepFM's embedding tables moved
into the store, served beside the original by a real server, scores compared over a 500-candidate request."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from modelhost.embeddings.table_files import current_version, read_ids, read_meta
from modelhost.example_repository import DEEPFM_FIELDS, DEEPFM_VOCAB, write_example_repository
from tests.server import ServerProcess


def command(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "modelhost", "embeddings", *args], capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("extracted")
    write_example_repository(root)
    model = root / "deepfm" / "1" / "model.onnx"
    tiered = command("extract", str(model), "--repository", str(root), "--name", "deepfm_tiered")
    assert tiered.returncode == 0, tiered.stderr
    assert "deepfm_tiered_embedding: 100000 x 16 (Gather of 'feat_ids')" in tiered.stdout
    # Both tables, the second gathered by computed indices (ids - vocab): an index model runs first.
    split = command("extract", str(model), "--repository", str(root), "--name", "deepfm_split",
                    "--min-bytes", "100000", "--dtype", "float16")
    assert split.returncode == 0, split.stderr
    process = ServerProcess(root, "--embedding-cache-bytes", "1MiB")
    process.wait_ready()
    yield process
    process.stop()


def scores(server: ServerProcess, model: str, ids: np.ndarray, values: np.ndarray) -> np.ndarray:
    client = httpclient.InferenceServerClient(server.url)
    inputs = [httpclient.InferInput("feat_ids", list(ids.shape), "INT64"),
              httpclient.InferInput("feat_vals", list(values.shape), "FP32")]
    inputs[0].set_data_from_numpy(ids, binary_data=True)
    inputs[1].set_data_from_numpy(values, binary_data=True)
    result = client.infer(model, inputs)
    answer: np.ndarray = result.as_numpy("prob")
    return answer


def test_the_extracted_ensemble_scores_as_the_original_model(server: ServerProcess) -> None:
    rng = np.random.default_rng(3)
    ids = rng.integers(0, DEEPFM_VOCAB, (500, DEEPFM_FIELDS), dtype=np.int64)
    values = rng.random((500, DEEPFM_FIELDS), dtype=np.float32)
    original = scores(server, "deepfm", ids, values)
    for _ in range(2):  # cold, then from the cache
        np.testing.assert_allclose(scores(server, "deepfm_tiered", ids, values), original, rtol=1e-5, atol=1e-6)
    # float16 tables: close, not equal.
    np.testing.assert_allclose(scores(server, "deepfm_split", ids, values), original, atol=2e-3)


def test_build_writes_a_table_from_numpy_arrays(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    np.save(tmp_path / "ids.npy", rng.choice(1 << 50, 1000, replace=False))
    np.save(tmp_path / "vectors.npy", rng.standard_normal((1000, 8)).astype(np.float32))
    made = command("build", str(tmp_path / "table"), "--ids", str(tmp_path / "ids.npy"), "--vectors",
                   str(tmp_path / "vectors.npy"), "--dtype", "int8", "--default", "1,2,3,4,5,6,7,8")
    assert made.returncode == 0, made.stderr
    version = current_version(tmp_path / "table")
    meta = read_meta(version)
    assert (meta.rows, meta.dim, meta.dtype, meta.default[:2]) == (1000, 8, "int8", (1.0, 2.0))
    assert len(read_ids(version, meta)) == 1000
    bad = command("build", str(tmp_path / "other"), "--ids", str(tmp_path / "ids.npy"), "--vectors",
                  str(tmp_path / "ids.npy"))
    assert bad.returncode == 1 and "vectors must be [1000, dim]" in bad.stderr


def test_build_reads_parquet_files_of_id_and_vector_rows(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rng = np.random.default_rng(5)
    ids = rng.choice(1 << 50, 3000, replace=False)
    vectors = rng.standard_normal((3000, 8)).astype(np.float32)
    for part, rows in enumerate((slice(0, 1000), slice(1000, 3000))):  # two files, several row groups
        table = pa.table({"feature": ids[rows], "embedding": [list(v) for v in vectors[rows]]})
        pq.write_table(table, tmp_path / f"part-{part}.parquet", row_group_size=700)
    made = command("build", str(tmp_path / "table"), "--parquet", str(tmp_path / "part-0.parquet"),
                   str(tmp_path / "part-1.parquet"), "--id-column", "feature", "--vector-column", "embedding")
    assert made.returncode == 0, made.stderr
    from concurrent.futures import ThreadPoolExecutor

    from modelhost.embeddings.row_cache import SlotPool
    from modelhost.embeddings.table import EmbeddingTable
    with ThreadPoolExecutor(2) as pool:
        table = EmbeddingTable("t", tmp_path / "table", 0, pool, pool=SlotPool(32, 100))
        np.testing.assert_array_equal(table.lookup(ids[[0, 1500, 2999]]), vectors[[0, 1500, 2999]])
        table.close()
    bad = command("build", str(tmp_path / "other"), "--parquet", str(tmp_path / "part-0.parquet"))
    assert bad.returncode == 1 and "has no column 'id' (its columns: feature, embedding)" in bad.stderr
