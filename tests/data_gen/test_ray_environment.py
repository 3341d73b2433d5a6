"""executor=ray on a cluster whose nodes were started without the teacher's key exported: the driver's key reaches
the labelling workers (Ray's runtime_env), so the run labels as a single-process one would (issue #44, defect 6)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from teacher_inputs import write_inputs
from teacher_server import TeacherServer
from test_teacher_run import QUERIES, generate

from selfrag.data_gen.ray_executor import forwarded_environment

ray = pytest.importorskip("ray")

KEY = "SELFRAG_RAY_TEST_KEY"


def test_only_the_named_key_is_forwarded_and_only_when_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY, raising=False)
    assert forwarded_environment(KEY) == {} and forwarded_environment(None) == {}
    monkeypatch.setenv(KEY, "sk-test")
    assert forwarded_environment(KEY) == {KEY: "sk-test"}


def test_workers_on_nodes_without_the_key_call_the_teacher_with_it(tmp_path: Path, monkeypatch, ray_turn) -> None:  # type: ignore[no-untyped-def]
    from ray.cluster_utils import Cluster

    assert not ray.is_initialized(), "another test left Ray initialized"
    monkeypatch.delenv(KEY, raising=False)  # the nodes start without it, as on machines the user never logged into
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        monkeypatch.setenv(KEY, "sk-driver-only")  # exported in the driver's shell only
        data = write_inputs(tmp_path, QUERIES[:3])
        with TeacherServer() as server:
            result = generate(server.url, data, tmp_path / "out", "executor=ray", f"ray.address={cluster.address}",
                              "ray.workers=2", "ray.batch_size=1", f"teacher.engine_options.api_key_env={KEY}")
        assert not result.problems and result.stats["questions"] == 3
        assert server.authorization == {"Bearer sk-driver-only"}
        assert "sk-driver-only" not in "".join(p.read_text(errors="replace") for p in (tmp_path / "out").rglob("*")
                                               if p.is_file())
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()
        os.environ.pop(KEY, None)
