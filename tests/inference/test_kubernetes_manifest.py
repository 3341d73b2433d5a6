"""deploy/kubernetes.yaml: the compose deployment on Kubernetes, checked without a cluster (no kubectl).

It must agree with the serve config schema (the replicas' command loads as a ServeConfig), with deploy/compose.yaml
(the same engine arguments and replica command), and with itself: the engine Service the replicas' base_url names,
on the port vLLM serves; the served model name; readiness on /health at the replica's port; a grace period that
covers the graceful shutdown; an Ingress to the replicas' Service with proxy buffering off for server-sent events.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from selfrag.config import load_config
from selfrag.inference.server.config import ServeConfig

DEPLOY = Path(__file__).parents[2] / "deploy"


@pytest.fixture(scope="module")
def objects() -> dict[tuple[str, str], dict[str, Any]]:
    documents = [d for d in yaml.safe_load_all((DEPLOY / "kubernetes.yaml").read_text(encoding="utf-8")) if d]
    for document in documents:
        assert {"apiVersion", "kind", "metadata"} <= document.keys(), document
    found = {(d["kind"], d["metadata"]["name"]): d for d in documents}
    assert len(found) == len(documents), "two objects of the same kind share a name"
    return found


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    spec = deployment["spec"]
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    (container,) = spec["template"]["spec"]["containers"]
    return container


def _service_for(objects: dict[tuple[str, str], dict[str, Any]], deployment: dict[str, Any], port: int) -> str:
    """The one Service selecting ``deployment``'s pods and sending its port to ``port``; its name."""
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    names = [name for (kind, name), service in objects.items() if kind == "Service"
             and service["spec"]["selector"].items() <= labels.items()
             and any(p["port"] == port and p["targetPort"] == port for p in service["spec"]["ports"])]
    assert len(names) == 1, f"expected one Service for {deployment['metadata']['name']} on {port}, found {names}"
    return names[0]


def _replica_config(container: dict[str, Any]) -> ServeConfig:
    command = container["command"]
    assert command[:3] == ["selfrag", "serve", "--config"]
    shipped = command[3].replace("/app/deploy/", f"{DEPLOY}/")  # the Dockerfile copies the repo to /app
    return load_config(ServeConfig, Path(shipped), command[4:])


def test_replicas_reach_the_engine_service_on_the_port_vllm_serves(objects: dict[tuple[str, str], Any]) -> None:
    engine = objects[("Deployment", "engine")]
    vllm = _container(engine)
    args = vllm["args"]
    engine_port = int(args[args.index("--port") + 1])
    assert {"containerPort": engine_port, "name": "http"} in vllm["ports"]
    engine_service = _service_for(objects, engine, engine_port)
    assert int(vllm["resources"]["limits"]["nvidia.com/gpu"]) >= 1
    for probe in ("readinessProbe", "startupProbe"):
        assert vllm[probe]["httpGet"] == {"path": "/health", "port": engine_port}

    replicas = objects[("Deployment", "selfrag")]
    assert replicas["spec"]["replicas"] >= 2
    config = _replica_config(_container(replicas))
    assert config.inference.engine == "openai"
    assert config.inference.engine_options.base_url == f"http://{engine_service}:{engine_port}/v1"
    assert config.inference.engine_options.served_model == args[args.index("--served-model-name") + 1]
    assert config.host == "0.0.0.0"


def test_readiness_gates_traffic_and_shutdown_fits_the_grace_period(objects: dict[tuple[str, str], Any]) -> None:
    replicas = objects[("Deployment", "selfrag")]
    container = _container(replicas)
    config = _replica_config(container)
    assert {"containerPort": config.port, "name": "http"} in container["ports"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": config.port}
    assert "httpGet" not in container.get("livenessProbe", {}), "a loading replica (503) must not be restarted"
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    drain = int(pre_stop[1]) if pre_stop[0] == "sleep" else 0
    assert drain + config.graceful_shutdown_s < replicas["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    env = {item["name"]: item for item in container["env"]}
    assert env[config.api_key_env]["valueFrom"]["secretKeyRef"]["optional"] is True  # the key never in a file
    mounts = {mount["mountPath"]: mount for mount in container["volumeMounts"]}
    assert str(config.model) in mounts and str(config.retriever.index) in mounts
    assert all(mount["readOnly"] for mount in mounts.values())


def test_the_ingress_streams_unbuffered_to_the_replicas_service(objects: dict[tuple[str, str], Any]) -> None:
    replicas = objects[("Deployment", "selfrag")]
    config = _replica_config(_container(replicas))
    service = _service_for(objects, replicas, config.port)
    (ingress,) = [value for (kind, _), value in objects.items() if kind == "Ingress"]
    annotations = ingress["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"
    for timeout in ("proxy-read-timeout", "proxy-send-timeout"):
        assert int(annotations[f"nginx.ingress.kubernetes.io/{timeout}"]) >= config.timeout_s
    retried = annotations["nginx.ingress.kubernetes.io/proxy-next-upstream"].split()
    assert "timeout" not in retried and {"http_503", "http_429", "non_idempotent"} <= set(retried)
    (rule,) = ingress["spec"]["rules"]
    (path,) = rule["http"]["paths"]
    assert path["path"] == "/" and path["backend"]["service"] == {"name": service, "port": {"number": config.port}}


def test_it_runs_what_compose_runs(objects: dict[tuple[str, str], Any]) -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text(encoding="utf-8"))["services"]
    assert _container(objects[("Deployment", "engine")])["args"] == compose["engine"]["command"]
    assert _container(objects[("Deployment", "engine")])["image"] == compose["engine"]["image"]
    replica = _container(objects[("Deployment", "selfrag")])
    assert replica["command"] == compose["selfrag-1"]["command"]
    env = {item["name"]: item.get("value") for item in replica["env"]}
    assert env["HF_HUB_OFFLINE"] == compose["selfrag-1"]["environment"]["HF_HUB_OFFLINE"]
    claims = {(kind, name) for kind, name in objects if kind == "PersistentVolumeClaim"}
    for deployment in ("engine", "selfrag"):
        for volume in objects[("Deployment", deployment)]["spec"]["template"]["spec"]["volumes"]:
            if "persistentVolumeClaim" in volume:
                assert ("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"]) in claims
