"""deploy/kserve's manifests against KServe's published CRD schemas (vendored: kserve_schema/README.md), strictly,
and each InferenceService example against what the ClusterServingRuntime declares."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from modelhost import __version__
from tests.deploy.kserve_manifests import (
    MANIFESTS,
    load_all,
    manifests,
    of_kind,
    port_flags,
    runtime,
    runtime_container,
    validation_errors,
)

EXAMPLES = of_kind("InferenceService")


def test_every_manifest_is_valid_under_the_crd_schema() -> None:
    found = list(manifests())
    assert {document["kind"] for _, document in found} == {"ClusterServingRuntime", "InferenceService"}
    assert len(EXAMPLES) >= 3
    for name, document in found:
        assert validation_errors(document) == [], name


def _rename(mapping: dict[str, Any], old: str, new: str) -> None:
    mapping[new] = mapping.pop(old)


def _model(document: dict[str, Any]) -> dict[str, Any]:
    model: dict[str, Any] = document["spec"]["predictor"]["model"]
    return model


# (what is broken, how, where the error must point)
BROKEN: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("InferenceService", lambda d: _rename(_model(d), "storageUri", "storageURI"), "storageURI"),
    ("InferenceService", lambda d: _rename(_model(d)["modelFormat"], "name", "nmae"), "modelFormat: Additional"),
    ("InferenceService", lambda d: _rename(d["spec"], "predictor", "predicter"), "predicter"),
    ("InferenceService", lambda d: _rename(d["metadata"], "name", "nmae"), "metadata: Additional"),
    ("InferenceService", lambda d: d["metadata"].update(name="add_sub"), "metadata.name"),
    ("ClusterServingRuntime", lambda d: _rename(d["spec"]["containers"][0], "readinessProbe", "readinesProbe"),
     "readinesProbe"),
    ("ClusterServingRuntime", lambda d: d["spec"]["containers"][0]["livenessProbe"]["httpGet"].update(paht="/"),
     "paht"),
    ("ClusterServingRuntime", lambda d: d["spec"]["supportedModelFormats"][0].update(priority=0), "priority"),
    ("ClusterServingRuntime", lambda d: d["spec"].update(protocolVersions="v2"), "protocolVersions"),
]


@pytest.mark.parametrize(("kind", "break_it", "pointed_at"), BROKEN, ids=[f"{b[0]}-{b[2]}" for b in BROKEN])
def test_a_misspelled_or_mistyped_field_is_an_error(kind: str, break_it: Callable[[dict[str, Any]], None],
                                                    pointed_at: str) -> None:
    document = copy.deepcopy(runtime() if kind == "ClusterServingRuntime" else EXAMPLES[0])
    break_it(document)
    errors = validation_errors(document)
    assert any(pointed_at in error for error in errors), errors


def test_a_field_given_twice_is_an_error() -> None:
    text = (MANIFESTS / "examples" / "onnx-model.yaml").read_text()
    assert "      runtime: modelhost\n" in text
    with pytest.raises(yaml.YAMLError, match="duplicate field.* runtime"):
        load_all(text.replace("      runtime: modelhost\n", "      runtime: modelhost\n      runtime: other\n"))


@pytest.mark.parametrize("example", EXAMPLES, ids=[e["metadata"]["name"] for e in EXAMPLES])
def test_each_example_is_one_the_runtime_takes(example: dict[str, Any]) -> None:
    """What KServe's controller checks when an InferenceService names a runtime (predictor.go reconcileModel):
    the runtime, the model format (and version, if given) and the protocol; and the ports it lists are ones
    modelhost listens on, gRPC (KServe tells it by a name holding h2c or grpc) on --grpc-port."""
    spec, model = runtime()["spec"], _model(example)
    assert model["runtime"] == runtime()["metadata"]["name"]
    formats = {(f["name"], f.get("version")) for f in spec["supportedModelFormats"]}
    wanted = model["modelFormat"]
    assert (wanted["name"], wanted.get("version")) in formats | {(name, None) for name, _ in formats}
    assert model["protocolVersion"] in spec["protocolVersions"]
    assert model["storageUri"].startswith(("s3://", "gs://", "https://", "pvc://", "oci://", "hf://"))
    listening = port_flags(runtime_container()["args"])
    for port in model.get("ports", []):
        grpc = "h2c" in port["name"] or "grpc" in port["name"]
        assert port["containerPort"] == listening["grpc-port" if grpc else "http-port"], port
    mode = example["metadata"].get("annotations", {}).get("serving.kserve.io/deploymentMode", "Standard")
    assert mode in ("Standard", "RawDeployment", "Knative", "Serverless")
    if mode in ("Knative", "Serverless"):  # Knative runs a container with one port
        assert len(model.get("ports", [])) <= 1


def test_the_runtime_listens_where_kserve_and_its_probes_expect() -> None:
    """HTTP on 8080, the port KServe sends traffic to when the container lists none; the probes and the
    Prometheus annotation on ports modelhost opens; the container command names the model directory."""
    container, spec = runtime_container(), runtime()["spec"]
    listening = port_flags(container["args"])
    assert listening["http-port"] == 8080
    assert listening["sagemaker-port"] == 0  # `modelhost serve` would otherwise take 8080 for SageMaker too
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["port"] == listening["http-port"]
    assert int(spec["annotations"]["prometheus.kserve.io/port"]) == listening["metrics-port"]
    assert "--model-repository=/mnt/models" in container["args"]
    assert "ports" not in container  # Knative takes one port; each InferenceService chooses which
    assert container["image"] == f"modelhost:{__version__}"  # docs/kubernetes.md's commands name this tag
