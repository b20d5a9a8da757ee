"""Regenerate the Python modules for modelhost's .proto files.

Run from the repository root after editing a .proto:
    python scripts/generate_protos.py
The generated *_pb2.py files are committed, so installing modelhost needs no protoc.
Generate them with grpcio-tools 1.66 (protobuf gencode 5.27): a runtime may be newer
than the gencode but never older, and tritonclient[grpc] keeps protobuf below 7, so
old gencode lets both live in one environment:
    python -m venv /tmp/protoc && /tmp/protoc/bin/pip install grpcio-tools==1.66.2
    /tmp/protoc/bin/python scripts/generate_protos.py
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTOS = [
    "modelhost/config/model_config.proto",
    "modelhost/protocols/tfserving/predict.proto",
    "modelhost/protocols/tfserving/apis.proto",
    "modelhost/protocols/kserve_v2/grpc_service.proto",
    "modelhost/protocols/torchserve/inference.proto",
    "modelhost/protocols/torchserve/management.proto",
]


def main() -> int:
    command = [sys.executable, "-m", "grpc_tools.protoc", f"-I{ROOT}", f"--python_out={ROOT}", f"--pyi_out={ROOT}"]
    return subprocess.call(command + [str(ROOT / p) for p in PROTOS], cwd=ROOT)


if __name__ == "__main__":
    raise SystemExit(main())
