"""Which on-disk format for embedding tables: the measurement behind modelhost/embeddings/table_files.py.

    pip install rocksdict lmdb      # the two candidates modelhost does not depend on
    python benchmarks/embedding_formats.py [--rows 4000000] [--dim 64] [--batch 2000] [--batches 30]

One table of --rows x --dim float32 vectors under random int64 ids, written three ways:
- `flat`: modelhost's format (sorted ids in RAM, rows in 4 KiB blocks read with O_DIRECT by 16 threads);
- `rocksdb`: RocksDB through rocksdict, 8-byte keys, direct reads, a bloom filter, an 8 MiB block cache, the
  batch read with one multi-get;
- `lmdb`: LMDB through py-lmdb (a B+tree in a memory map), the batch read key by key in one read transaction
  of an environment opened for the batch (a live map keeps its pages resident, whatever the page cache is told).
Each batch is --batch distinct ids drawn uniformly: the misses of one ranking request, all cold. Before every
batch the OS page cache is emptied of the table's files (posix_fadvise DONTNEED), so every format reads the disk.
Reported: build seconds and bytes on disk, then per batch the median and p90 milliseconds, and the process's RSS
growth over the run (a memory-mapped format's pages count there, and nothing bounds them but the table's size).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from modelhost.embeddings.disk_rows import DiskRows  # noqa: E402
from modelhost.embeddings.table_files import ROWS, current_version, read_ids, read_meta, write_version  # noqa: E402


def forget_pages(directory: Path) -> None:
    """Drop the page cache's copies of every file under `directory`."""
    for path in directory.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def size_mb(directory: Path) -> float:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file()) / 1e6


def build_flat(work: Path, ids: np.ndarray, vectors: np.ndarray) -> tuple[object, Path]:
    write_version(work / "flat", ids, vectors, "float32")
    version = current_version(work / "flat")
    meta = read_meta(version)
    sorted_ids = read_ids(version, meta)
    disk = DiskRows(version / ROWS, meta, ThreadPoolExecutor(16))

    def lookup(batch: np.ndarray) -> np.ndarray:
        rows = np.searchsorted(sorted_ids, batch)
        order = np.argsort(rows)
        vectors = np.empty((len(batch), meta.dim), dtype=np.float32)
        vectors[order] = meta.codec.decode(disk.read(rows[order]))
        return vectors
    return lookup, work / "flat"


def build_rocksdb(work: Path, ids: np.ndarray, vectors: np.ndarray) -> tuple[object, Path]:
    from rocksdict import BlockBasedOptions, Cache, Options, Rdict, ReadOptions, WriteBatch

    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.set_use_direct_reads(True)
    table = BlockBasedOptions()
    table.set_block_cache(Cache(8 << 20))
    table.set_bloom_filter(10, False)
    options.set_block_based_table_factory(table)
    db = Rdict(str(work / "rocksdb"), options)
    keys = ids.astype(">i8")
    for start in range(0, len(ids), 100_000):
        batch = WriteBatch(raw_mode=True)
        for key, row in zip(keys[start:start + 100_000], vectors[start:start + 100_000], strict=True):
            batch.put(key.tobytes(), row.tobytes())
        db.write(batch)
    db.flush()
    db.compact_range(None, None)

    read_options = ReadOptions()
    read_options.set_async_io(True)  # RocksDB reads a multi-get's blocks concurrently where it can

    def lookup(batch: np.ndarray) -> np.ndarray:
        values = db.get([key.tobytes() for key in batch.astype(">i8")], read_opt=read_options)
        return np.frombuffer(b"".join(values), dtype=np.float32).reshape(len(batch), -1)
    return lookup, work / "rocksdb"


def build_lmdb(work: Path, ids: np.ndarray, vectors: np.ndarray) -> tuple[object, Path]:
    import lmdb

    env = lmdb.open(str(work / "lmdb"), map_size=4 * vectors.nbytes + (1 << 30), readahead=False,
                    writemap=False, metasync=False, sync=False)
    keys = ids.astype(">i8")
    for start in range(0, len(ids), 100_000):
        with env.begin(write=True) as txn:
            for key, row in zip(keys[start:start + 100_000], vectors[start:start + 100_000], strict=True):
                txn.put(key.tobytes(), row.tobytes())
    env.sync(True)
    env.close()

    def lookup(batch: np.ndarray) -> np.ndarray:
        # Opened per batch: pages a live memory map holds stay resident whatever the page cache is told.
        reader = lmdb.open(str(work / "lmdb"), readonly=True, lock=False, readahead=False)
        try:
            with reader.begin() as txn:
                values = [txn.get(key.tobytes()) for key in batch.astype(">i8")]
        finally:
            reader.close()
        return np.frombuffer(b"".join(values), dtype=np.float32).reshape(len(batch), -1)
    return lookup, work / "lmdb"


BUILDS = {"flat": build_flat, "rocksdb": build_rocksdb, "lmdb": build_lmdb}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=2000)
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--work", type=Path, default=None, help="a directory on the disk to measure")
    parser.add_argument("--formats", default="", help="some of flat,rocksdb,lmdb (default: all)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    ids = rng.choice(np.iinfo(np.int64).max, args.rows, replace=False).astype(np.int64)
    vectors = rng.standard_normal((args.rows, args.dim), dtype=np.float32)
    work = Path(tempfile.mkdtemp(dir=args.work))
    print(f"{args.rows:,} x {args.dim} float32 ({vectors.nbytes / 1e9:.2f} GB), batches of {args.batch} cold ids")
    try:
        for name, build in BUILDS.items():
            if args.formats and name not in args.formats.split(","):
                continue
            started = time.perf_counter()
            lookup, directory = build(work, ids, vectors)
            built = time.perf_counter() - started
            check = rng.choice(args.rows, 50, replace=False)
            assert np.array_equal(lookup(ids[check]), vectors[check]), name  # type: ignore[operator]
            rss = rss_mb()
            times = []
            for _ in range(args.batches):
                batch = ids[rng.choice(args.rows, args.batch, replace=False)]
                forget_pages(directory)
                started = time.perf_counter()
                lookup(batch)  # type: ignore[operator]
                times.append((time.perf_counter() - started) * 1000)
            times.sort()
            print(f"{name:8} build {built:6.1f} s  {size_mb(directory):7.0f} MB on disk  batch p50 "
                  f"{statistics.median(times):7.1f} ms  p90 {times[int(len(times) * 0.9)]:7.1f} ms  "
                  f"RSS +{rss_mb() - rss:6.1f} MB", flush=True)
            shutil.rmtree(directory)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"max RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
