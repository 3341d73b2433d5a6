"""`selfrag serve` settings: the engines and options of `selfrag ask` (its inference section), a corpus or a prebuilt
index, checked at load."""

from __future__ import annotations

import pytest

from selfrag.config import load_config
from selfrag.errors import ConfigError
from selfrag.inference.server.config import ServeConfig


def problems(*overrides: str) -> str:
    with pytest.raises(ConfigError) as error:
        load_config(ServeConfig, None, ["model=m", *overrides])
    return str(error.value)


def test_exactly_one_retriever() -> None:
    assert "retriever: no passages; set retriever.index=DIR" in problems()
    assert "set one of index, url, corpus" in problems("retriever.corpus=c.jsonl", "retriever.index=runs/index")
    assert load_config(ServeConfig, None, ["model=m", "retriever.index=runs/index"]).retriever.index == "runs/index"


def test_engine_and_engine_options_are_checked_like_ask() -> None:
    message = problems("retriever.corpus=c.jsonl", "inference.engine=tgi")
    assert "inference.engine must be one of" in message and "tgi" in message
    assert "inference.engine_options.batch_size must be an integer, got 'abc'" in problems(
        "retriever.corpus=c.jsonl", "inference.engine_options.batch_size=abc")
    [line] = problems("retriever.corpus=c.jsonl", "inference.engine_options.batch_size=0").splitlines()
    assert line == "inference.engine_options.batch_size must be at least 1, got 0"  # said once
    assert "did you mean" in problems("retriever.corpus=c.jsonl", "inference.engine_options.batch_sise=4")
    assert "max_queue must be at least 1, got 0" in problems("retriever.corpus=c.jsonl", "max_queue=0")
    config = load_config(ServeConfig, None, ["model=m", "retriever.corpus=c.jsonl", "inference.engine=openai",
                                             "inference.engine_options.base_url=http://127.0.0.1:9/v1"])
    assert config.inference.engine == "openai"
    assert config.inference.engine_options.base_url == "http://127.0.0.1:9/v1"
    # serve took engine and engine_options at its top level once: refused, naming the inference section
    assert problems("retriever.corpus=c.jsonl", "engine=openai").startswith(
        "engine was removed: write inference.engine")
    assert problems("retriever.corpus=c.jsonl", "engine_options.base_url=http://h/v1").startswith(
        "engine_options.base_url was removed: write inference.engine_options.base_url (")


def test_the_shipped_compose_deployment_is_consistent() -> None:
    """deploy/compose.yaml: every replica runs `selfrag serve` with deploy/serve-replica.yaml, which loads as a
    ServeConfig with the compose command's overrides; it points inference.engine=openai at the compose `engine` service
    on the port that service serves, under the served name vLLM is given; the replica port is the one nginx is told and
    the healthcheck asks; graceful shutdown fits inside the stop grace period."""
    from pathlib import Path

    import yaml

    deploy = Path(__file__).parents[2] / "deploy"
    compose = yaml.safe_load((deploy / "compose.yaml").read_text(encoding="utf-8"))
    services = compose["services"]
    replicas = [name for name in services if name.startswith("selfrag-")]
    assert len(replicas) >= 2
    engine_command = services["engine"]["command"]
    engine_port = engine_command[engine_command.index("--port") + 1]
    served = engine_command[engine_command.index("--served-model-name") + 1]
    for name in replicas:
        replica = services[name]
        command = replica["command"]
        assert command[:4] == ["selfrag", "serve", "--config", "/app/deploy/serve-replica.yaml"]
        config = load_config(ServeConfig, deploy / "serve-replica.yaml", [
            arg.replace("/srv/index", "/tmp/index") for arg in command[4:]])
        options = config.inference.engine_options
        assert config.inference.engine == "openai" and options.base_url == f"http://engine:{engine_port}/v1"
        assert options.served_model == served
        assert f"127.0.0.1:{config.port}/health" in " ".join(replica["healthcheck"]["test"])
        assert config.host == "0.0.0.0"
        grace = int(str(replica["stop_grace_period"]).rstrip("s"))
        assert config.graceful_shutdown_s < grace
        assert "engine" in replica["depends_on"]
    nginx_line = (deploy / "compose.yaml").read_text(encoding="utf-8").split("render_nginx.py", 1)[1].split("\n")[0]
    assert all(f"--replica {name}:{config.port}" in nginx_line for name in replicas)
