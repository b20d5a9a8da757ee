"""The KServe manifests under deploy/kserve, KServe's vendored CRD schemas, and the runtime's command line.

`validator(kind)` checks a manifest as `kubectl apply --validate=strict` would: against the served version's
openAPIV3Schema, with an unknown field an error. Structural schemas do not say `additionalProperties: false`;
the API server prunes unknown fields and strict field validation reports them, so every object schema here is
closed unless it keeps unknown fields (`x-kubernetes-preserve-unknown-fields`) or is a map (`additionalProperties`).
The API server validates `metadata` itself (the CRD schema says only `type: object`): here, against the
ObjectMeta fields a checked-in manifest sets, and KServe's rule for InferenceService names.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "deploy" / "kserve"
SCHEMAS = Path(__file__).parent / "kserve_schema"
MODEL_DIR = "/mnt/models"  # where KServe's storage initializer leaves a storageUri's files
# (apiVersion, kind) -> the vendored openAPIV3Schema of the CRD's served version.
SCHEMA_FILES = {
    ("serving.kserve.io/v1alpha1", "ClusterServingRuntime"): "clusterservingruntime.v1alpha1.json",
    ("serving.kserve.io/v1beta1", "InferenceService"): "inferenceservice.v1beta1.json",
}
DNS_1123_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
ISVC_NAME = "[a-z]([-a-z0-9]*[a-z0-9])?"  # KServe's IsvcNameFmt (inference_service_validation.go)
_PORT_FLAG = re.compile(r"--(?P<flag>[a-z-]+-port)=(?P<port>\d+)")


class StrictLoader(yaml.SafeLoader):
    """YAML as kubectl's strict validation reads it: a key given twice in one mapping is an error."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        keys = [self.construct_object(key, deep=deep) for key, _ in node.value]
        twice = sorted({str(key) for key in keys if keys.count(key) > 1})
        if twice:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate field(s) {', '.join(twice)}",
                                                    node.start_mark)
        return super().construct_mapping(node, deep=deep)


def load_all(text: str) -> list[dict[str, Any]]:
    return [document for document in yaml.load_all(text, Loader=StrictLoader) if document is not None]


def manifests() -> Iterator[tuple[str, dict[str, Any]]]:
    """(file name relative to deploy/kserve, document) for every YAML document there."""
    for path in sorted(MANIFESTS.rglob("*.yaml")):
        for document in load_all(path.read_text()):
            yield str(path.relative_to(MANIFESTS)), document


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [document for _, document in manifests() if document.get("kind") == kind]


def runtime() -> dict[str, Any]:
    (document,) = of_kind("ClusterServingRuntime")
    return document


def runtime_container() -> dict[str, Any]:
    (container,) = [c for c in runtime()["spec"]["containers"] if c["name"] == "kserve-container"]
    return container


def _metadata_schema(kind: str) -> dict[str, Any]:
    strings = {"type": "object", "additionalProperties": {"type": "string"}}
    name = ISVC_NAME if kind == "InferenceService" else DNS_1123_LABEL
    return {
        "type": "object", "required": ["name"], "additionalProperties": False,
        "properties": {"name": {"type": "string", "pattern": f"^{name}$", "maxLength": 63},
                       "namespace": {"type": "string", "pattern": f"^{DNS_1123_LABEL}$"},
                       "labels": strings, "annotations": strings},
    }


def _close(schema: dict[str, Any]) -> None:
    """Close every object schema reached through properties, items and map values, in place."""
    if schema.get("type") == "object" and "additionalProperties" not in schema \
            and not schema.get("x-kubernetes-preserve-unknown-fields"):
        schema["additionalProperties"] = False
    for child in schema.get("properties", {}).values():
        _close(child)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            _close(schema[key])


@cache
def _schema(api_version: str, kind: str) -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((SCHEMAS / SCHEMA_FILES[api_version, kind]).read_text())
    _close(schema)
    schema["properties"]["metadata"] = _metadata_schema(kind)
    schema["properties"]["apiVersion"] = {"enum": [api_version]}
    schema["properties"]["kind"] = {"enum": [kind]}
    schema["required"] = sorted({*schema.get("required", ()), "apiVersion", "kind", "metadata", "spec"})
    return schema


def validation_errors(document: dict[str, Any]) -> list[str]:
    """What strict validation says about a manifest: "path: message" lines, empty when it is valid."""
    key = (document.get("apiVersion"), document.get("kind"))
    if key not in SCHEMA_FILES:
        return [f"no vendored schema for apiVersion {key[0]!r} kind {key[1]!r}"]
    validator = jsonschema.Draft4Validator(_schema(*key))
    return [f"{'.'.join(map(str, error.absolute_path)) or '(root)'}: {error.message}"
            for error in validator.iter_errors(document)]


def port_flags(args: list[str]) -> dict[str, int]:
    """{"http-port": 8080, ...} from the runtime's `--*-port=N` arguments."""
    return {m["flag"]: int(m["port"]) for arg in args if (m := _PORT_FLAG.fullmatch(arg))}
