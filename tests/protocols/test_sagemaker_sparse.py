"""application/x-npz and text/libsvm decoding (sparse_payload), and the Triton container's bodies (triton_payloads):
every format scipy.sparse.save_npz writes, and hostile bodies refused naming the problem before anything big is
allocated."""

from __future__ import annotations

import io
import random
import zipfile

import numpy as np
import pytest
import scipy.sparse

from modelhost.errors import ModelhostError
from modelhost.protocols.sagemaker.media_types import MediaTypeError
from modelhost.protocols.sagemaker.payloads import decode_invocation
from modelhost.types import DEFAULT_LIMITS, RequestLimits, TensorSpec

ROW4 = (TensorSpec("x", "FP32", (-1, 4)),)
MATRIX = scipy.sparse.random(5, 4, density=0.4, format="csr", dtype=np.float64, random_state=2)


def npz(matrix: object, compressed: bool = True) -> bytes:
    buffer = io.BytesIO()
    scipy.sparse.save_npz(buffer, matrix, compressed=compressed)
    return buffer.getvalue()


def zipped(**arrays: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def rows(body: bytes, content_type: str, inputs: tuple[TensorSpec, ...] = ROW4,
         limits: RequestLimits = DEFAULT_LIMITS) -> np.ndarray:
    return decode_invocation(body, content_type, inputs, limits).request.inputs[inputs[0].name]


def refused(body: bytes, content_type: str = "application/x-npz", limits: RequestLimits = DEFAULT_LIMITS) -> str:
    with pytest.raises(ModelhostError) as info:
        rows(body, content_type, limits=limits)
    return info.value.message


@pytest.mark.parametrize("kind", ["csr", "csc", "coo"])
@pytest.mark.parametrize("compressed", [True, False])
def test_every_save_npz_format_becomes_the_dense_rows(kind: str, compressed: bool) -> None:
    decoded = rows(npz(MATRIX.asformat(kind), compressed), "application/x-npz")
    assert decoded.dtype == np.float32
    np.testing.assert_array_equal(decoded, MATRIX.toarray().astype(np.float32))


def test_coo_duplicates_add_up_as_scipy_does() -> None:
    matrix = scipy.sparse.coo_matrix(([1.0, 2.0], ([0, 0], [3, 3])), shape=(1, 4))
    np.testing.assert_array_equal(rows(npz(matrix), "application/x-npz"), [[0, 0, 0, 3]])


def test_libsvm_labels_optional_indices_zero_based() -> None:
    body = b"1 0:0.5 3:2\n\n2:-1e3\n  \n0 \n"
    np.testing.assert_array_equal(rows(body, "text/libsvm"), [[0.5, 0, 0, 2], [0, 0, -1000, 0], [0, 0, 0, 0]])


@pytest.mark.parametrize(("body", "problem"), [
    (b"1 a:1", "line 1: 'a:1' is not index:value"),
    (b"1 0:1 7", "line 1: '7' is not index:value"),
    (b"0:x", "line 1: the value in '0:x' is not a number"),
    (b"\n0:1 -1:2", "line 2: '-1:2' is not index:value"),
    (b"0:1 4:1", "feature index 4 is outside input 'x''s 4 columns"),
    (b"1 " + b"9" * 5000 + b":1", "is outside input 'x''s 4 columns"),
    (b"\xff", "not UTF-8"), (b"\n \n", "no lines with values"),
])
def test_bad_libsvm_names_the_line(body: bytes, problem: str) -> None:
    assert problem in refused(body, "text/libsvm")


def test_hostile_npz_is_refused_before_allocating() -> None:
    good = {"format": np.array(b"csr"), "shape": np.array([2, 4]), "data": np.ones(1), "indices": np.array([1]),
            "indptr": np.array([0, 1, 1])}
    np.testing.assert_array_equal(rows(zipped(**good), "application/x-npz"), [[0, 1, 0, 0], [0, 0, 0, 0]])
    huge = {**good, "shape": np.array([10**9, 4])}
    assert "the npz body for input 'x'" in refused(zipped(**huge), limits=RequestLimits(max_elements=1000))
    assert "outside the matrix's 4 columns" in refused(zipped(**{**good, "indices": np.array([4])}))
    assert "'indptr' must hold 3 non-decreasing" in refused(zipped(**{**good, "indptr": np.array([0, 2, 1])}))
    assert "'data' has 2 values" in refused(zipped(**{**good, "data": np.ones(2)}))
    assert "sparse format 'bsr' is not supported" in refused(zipped(**{**good, "format": np.array(b"bsr")}))
    assert "no 'indptr' array" in refused(zipped(**{k: v for k, v in good.items() if k != "indptr"}))
    assert "'shape' must be two non-negative integers" in refused(zipped(**{**good, "shape": np.array([-1, 4])}))
    pickled = io.BytesIO()
    np.save(pickled, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with_pickle = io.BytesIO()
    with zipfile.ZipFile(with_pickle, "w") as archive:
        for name, array in good.items():
            member = io.BytesIO()
            np.save(member, array)
            archive.writestr(f"{name}.npy", pickled.getvalue() if name == "data" else member.getvalue())
    assert "not a zip of .npy arrays" in refused(with_pickle.getvalue())


def test_a_zip_bomb_member_is_refused_by_its_size() -> None:
    bomb = io.BytesIO()
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, array in {"format": np.array(b"csr"), "shape": np.array([1, 4])}.items():
            member = io.BytesIO()
            np.save(member, array)
            archive.writestr(f"{name}.npy", member.getvalue())
        archive.writestr("data.npy", b"\0" * 50_000_000)  # 50 MB inflated from about 50 kB
    assert len(bomb.getvalue()) < 100_000
    assert "array 'data' is 50000000 bytes, more than its shape can need" in refused(bomb.getvalue())


def test_a_model_sparse_rows_cannot_fill_gets_a_415_listing_what_it_accepts() -> None:
    for inputs in [(TensorSpec("ids", "INT64", (-1, 4)),), (TensorSpec("x", "FP32", (-1, -1)),),
                   (TensorSpec("a", "FP32", (-1, 4)), TensorSpec("b", "FP32", (-1, 4)))]:
        for content_type in ("application/x-npz", "text/libsvm"):
            with pytest.raises(MediaTypeError) as info:
                rows(b"", content_type, inputs)
            assert info.value.status == 415 and "application/octet-stream" in info.value.message
            assert content_type not in info.value.message.split("accepts:")[1]


def test_octet_stream_binary_parts_must_be_framed_by_the_binary_type() -> None:
    header = b'{"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","parameters":{"binary_data_size":16}}]}'
    body = header + np.ones(4, np.float32).tobytes()
    with pytest.raises(ModelhostError, match="JSON"):
        rows(body, "application/octet-stream")
    typed = f"application/vnd.sagemaker-triton.binary+json; json-header-size=\"{len(header)}\""
    np.testing.assert_array_equal(rows(body, typed), np.ones((1, 4), np.float32))


def test_corrupted_npz_bodies_are_400s() -> None:
    """Bytes flipped anywhere in save_npz's output (zip structure, deflate stream, .npy headers, data): always a
    ModelhostError, never another exception (found so: zlib.error, NotImplementedError for a compression method)."""
    bodies = [npz(MATRIX.asformat(kind), compressed) for kind in ("csr", "coo") for compressed in (True, False)]
    chance = random.Random(5)
    for _ in range(400):
        body = bytearray(chance.choice(bodies))
        for _ in range(chance.randint(1, 4)):
            body[chance.randrange(len(body))] = chance.randrange(256)
        try:
            rows(bytes(body), "application/x-npz")
        except ModelhostError:
            pass
