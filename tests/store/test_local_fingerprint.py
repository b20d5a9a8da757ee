"""What poll mode compares: a Triton-layout model directory's fingerprint, read with os.scandir."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from modelhost.store.local import LocalStore, model_versions


def _model(root: Path) -> Path:
    model = root / "m"
    (model / "1" / "nested").mkdir(parents=True)
    (model / "2").mkdir()
    (model / "config.pbtxt").write_text('name: "m"\n')
    (model / "1" / "model.onnx").write_bytes(b"one")
    (model / "1" / "nested" / "weights.bin").write_bytes(b"w")
    (model / "2" / "model.onnx").write_bytes(b"two")
    return model


def test_a_change_shows_in_the_part_it_touches(tmp_path: Path) -> None:
    model = _model(tmp_path)
    store = LocalStore(tmp_path)
    first = store.fingerprint("m")
    assert first is not None and sorted(first.versions) == [1, 2] and store.fingerprint("m") == first

    (model / "1" / "nested" / "weights.bin").write_bytes(b"w2")  # deep in version 1, rewritten in place
    nested = store.fingerprint("m")
    assert nested is not None and first.changed_versions(nested) == {1}

    (model / "labels.txt").write_text("cat\n")  # beside the config: every version
    (model / "0").mkdir()  # not a version directory (Triton skips numbers starting with 0): part of the config
    top = store.fingerprint("m")
    assert top is not None and nested.changed_versions(top) is None and sorted(top.versions) == [1, 2]

    (model / "0" / "extra").write_bytes(b"x")
    assert store.fingerprint("m") != top

    (model / "3").mkdir()
    added = store.fingerprint("m")
    assert added is not None and store.fingerprint("m") == added and sorted(added.versions) == [1, 2, 3]


def test_a_linked_file_counts_and_a_linked_directory_is_not_entered(tmp_path: Path) -> None:
    model = _model(tmp_path / "repo")
    outside = tmp_path / "outside"
    (outside / "tree").mkdir(parents=True)
    (outside / "weights.bin").write_bytes(b"a")
    (outside / "tree" / "file").write_bytes(b"a")
    os.symlink(outside / "weights.bin", model / "2" / "weights.bin")
    os.symlink(outside / "tree", model / "2" / "tree")
    store = LocalStore(tmp_path / "repo")
    first = store.fingerprint("m")

    (outside / "tree" / "file").write_bytes(b"longer")
    assert store.fingerprint("m") == first

    (outside / "weights.bin").write_bytes(b"longer")
    changed = store.fingerprint("m")
    assert first is not None and changed is not None and first.changed_versions(changed) == {2}


def test_fingerprints_read_together_are_each_ones_and_a_gone_model_is_none(tmp_path: Path) -> None:
    _model(tmp_path)
    store = LocalStore(tmp_path)
    assert store.fingerprints(["m", "absent"]) == {"m": store.fingerprint("m"), "absent": None}


def test_only_ascii_digits_name_a_version(tmp_path: Path) -> None:
    model = _model(tmp_path)
    for name in ("²", "٣", "01"):  # str.isdigit's, and one Triton skips
        (model / name).mkdir()
    fingerprint = LocalStore(tmp_path).fingerprint("m")
    assert fingerprint is not None and sorted(fingerprint.versions) == [1, 2]
    assert model_versions(model) == (1, 2)


def test_a_tree_deeper_than_the_recursion_limit_is_walked(tmp_path: Path) -> None:
    model = _model(tmp_path)
    deep = model / "1"
    for _ in range(400):
        deep = deep / "d"
    deep.mkdir(parents=True)
    store = LocalStore(tmp_path)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(250)  # the test's own frames and a few: a walk that recursed 400 deep would not fit
    try:
        first = store.fingerprint("m")
        (deep / "weights.bin").write_bytes(b"w")
        changed = store.fingerprint("m")
    finally:
        sys.setrecursionlimit(limit)
    assert first is not None and changed is not None and first.changed_versions(changed) == {1}
