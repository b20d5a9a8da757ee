"""Edge values of every V2 datatype, for the tests that send each datatype through a protocol and back."""

from __future__ import annotations

import numpy as np

from modelhost.types import DATATYPE_DTYPES

STRINGS = ["", "plain ascii", "héllo wörld ✓", "日本語テキスト", "emoji 🚀", "a" * 300]


def extremes(datatype: str, binary: bool = True) -> np.ndarray:
    """A [2, n] batch holding the edge values of a datatype (NaN/inf only where JSON is not used)."""
    dtype = DATATYPE_DTYPES[datatype]
    if datatype == "BOOL":
        return np.array([[True, False, True, True], [False, False, True, False]])
    if datatype == "BYTES":
        return np.array([[s.encode() for s in STRINGS], [s.encode() for s in reversed(STRINGS)]], dtype=object)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        top = int(info.max)
        if datatype == "UINT64" and not binary:
            top = 2**63 - 1  # values >= 2**63 in JSON: see test_datatypes.py test_uint64_max_in_json_raw
        return np.array([[info.min, top, 0, 1], [top - 1, info.min + 1, top // 3, 7]], dtype=dtype)
    info = np.finfo(dtype)
    finite = [info.min, info.max, info.tiny, info.smallest_subnormal, -0.0, 0.0, 1 / 3, -2.5]
    special = [np.nan, np.inf, -np.inf, 1.0] if binary else [1.0, -1.0, 0.1, 1e-3]
    return np.array([finite[:4] + special[:2], finite[4:] + special[2:]], dtype=dtype)
