"""`modelhost embeddings ...`: make embedding tables from what users have.

    modelhost embeddings build TABLE --ids IDS.npy --vectors VECTORS.npy [--dtype float32|float16|int8]
    modelhost embeddings build TABLE --npz TABLE.npz                       (arrays "ids" and "vectors")
    modelhost embeddings build TABLE --parquet PART.parquet ... [--id-column id] [--vector-column vector]
    modelhost embeddings extract MODEL.onnx --repository DIR --name NAME [--min-bytes 1MiB] [--dtype ...]

`build` writes a new version of TABLE (a directory, created if new) and makes it current; a server serving the
table takes it at its next swap. Vectors are read as a memory map: a table larger than RAM builds.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from modelhost.embeddings.extract import DEFAULT_MIN_BYTES, ExtractError, extract
from modelhost.embeddings.rows import DTYPES
from modelhost.embeddings.table_files import TableError, write_version


def main(argv: Sequence[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.action == "build":
            return _build(args, parser)
        tables = extract(args.model, args.repository, args.name, args.min_bytes, args.dtype, args.max_batch_size)
    except (TableError, ExtractError, OSError, ValueError) as exc:
        print(f"modelhost embeddings: error: {exc}", file=sys.stderr)
        return 1
    for table in tables:
        print(f"{args.name}_{table.initializer}: {table.rows} x {table.dim} (Gather of '{table.indices}')")
    print(f"wrote ensemble '{args.name}' and its models to {args.repository}")
    return 0


def _build(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.parquet:
        ids, vectors = _read_parquet(args.parquet, args.id_column, args.vector_column)
    elif args.npz is not None:
        with np.load(args.npz, allow_pickle=False) as arrays:
            missing = {"ids", "vectors"} - set(arrays.files)
            if missing:
                parser.error(f"{args.npz} lacks array(s) {', '.join(sorted(missing))}")
            ids, vectors = arrays["ids"], arrays["vectors"]
    elif args.ids is not None and args.vectors is not None:
        ids = np.load(args.ids, allow_pickle=False)
        vectors = np.load(args.vectors, mmap_mode="r", allow_pickle=False)
    else:
        parser.error("give --ids and --vectors, --npz, or --parquet")
    default = np.array([float(v) for v in args.default.split(",")], np.float32) if args.default else None
    version = write_version(args.table, ids, vectors, args.dtype, default)
    print(f"{args.table}: {len(ids)} x {vectors.shape[1]} {args.dtype} written as {version.name}, now current")
    return 0


def _read_parquet(paths: list[Path], id_column: str, vector_column: str) -> tuple[np.ndarray, np.ndarray]:
    """ids [n] and vectors [n, dim] from Parquet files of an integer id column and a list-of-floats vector
    column, read a row group at a time."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError("Parquet input needs pyarrow: pip install 'modelhost[embeddings]'") from None
    ids, vectors = [], []
    for path in paths:
        reader = pq.ParquetFile(path)
        names = reader.schema_arrow.names
        for column in (id_column, vector_column):
            if column not in names:
                raise ValueError(f"{path.name} has no column '{column}' (its columns: {', '.join(names)})")
        for group in range(reader.num_row_groups):
            table = reader.read_row_group(group, columns=[id_column, vector_column])
            ids.append(table.column(id_column).to_numpy().astype(np.int64))
            lists = table.column(vector_column).combine_chunks()
            lengths = np.diff(lists.offsets.to_numpy())
            if len(lengths) and (lengths != lengths[0]).any():
                raise ValueError(f"{path.name}: column '{vector_column}' holds vectors of different lengths")
            width = int(lengths[0]) if len(lengths) else 0
            vectors.append(lists.flatten().to_numpy().astype(np.float32).reshape(len(lengths), width))
    if not ids:
        raise ValueError("the Parquet files hold no rows")
    widths = {part.shape[1] for part in vectors}
    if len(widths) > 1:
        raise ValueError(f"the Parquet files hold vectors of different lengths: {sorted(widths)}")
    return np.concatenate(ids), np.concatenate(vectors)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="modelhost embeddings", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = parser.add_subparsers(dest="action", required=True)
    build = actions.add_parser("build", help="write a table from (id, vector) arrays")
    build.add_argument("table", type=Path, help="the table's directory")
    build.add_argument("--ids", type=Path, help=".npy of int64 ids [n]")
    build.add_argument("--vectors", type=Path, help=".npy of vectors [n, dim]")
    build.add_argument("--npz", type=Path, help=".npz holding arrays ids and vectors")
    build.add_argument("--parquet", type=Path, nargs="+", help="Parquet file(s) of (id, vector) rows")
    build.add_argument("--id-column", default="id", help="the Parquet id column (default id)")
    build.add_argument("--vector-column", default="vector", help="the Parquet vector column (default vector)")
    build.add_argument("--dtype", choices=DTYPES, default="float32", help="how rows are stored (default float32)")
    build.add_argument("--default", help="the vector of ids the table does not hold, comma-separated "
                                         "(default: zeros)")
    take = actions.add_parser("extract", help="move an ONNX model's large Gather tables into the store")
    take.add_argument("model", type=Path, help="the ONNX model file")
    take.add_argument("--repository", type=Path, required=True, help="the model repository to write into")
    take.add_argument("--name", required=True, help="the ensemble's name")
    take.add_argument("--min-bytes", type=int, default=DEFAULT_MIN_BYTES,
                      help=f"the smallest initializer moved, in bytes (default {DEFAULT_MIN_BYTES})")
    take.add_argument("--dtype", choices=DTYPES, default="float32", help="how the tables' rows are stored")
    take.add_argument("--max-batch-size", type=int, default=1024, help="the models' max_batch_size")
    return parser
