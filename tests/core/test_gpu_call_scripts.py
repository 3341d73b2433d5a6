"""The lent-GPU call's helpers, without a GPU: the carried wheels' requirement check (scripts/wheel_requirements.py)
and gpu_check's guarded stages (a failing stage is recorded, logged and reported, and later stages still run)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from repo_modules import repo_module


def wheel(folder: Path, name: str, version: str, *requires: str) -> None:
    """A wheel holding only its METADATA, as the check reads it."""
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {requirement}" for requirement in requires]
    dist = f"{name.replace('-', '_')}-{version}"
    with zipfile.ZipFile(folder / f"{dist}-py3-none-any.whl", "w") as archive:
        archive.writestr(f"{dist}.dist-info/METADATA", "\n".join(lines) + "\n")


@pytest.fixture()
def check():  # type: ignore[no-untyped-def]
    with repo_module("scripts", "wheel_requirements") as module:
        yield module


def test_the_two_requirements_that_cost_lent_gpu_calls_are_caught(check, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    wheel(tmp_path, "openai", "3.57.0", "httpx2<3,>=2.12.0", "anyio>=3.5")
    wheel(tmp_path, "xgrammar", "0.2.9", "apache-tvm-ffi>=0.1.11", "torch>=1.10.0")
    wheel(tmp_path, "apache-tvm-ffi", "0.1.10")
    problems = check.unmet([tmp_path], {"anyio": None, "torch": check.Version("2.11.0")})
    assert problems == [
        "openai 3.57.0 needs httpx2<3,>=2.12.0: neither carried nor on the machine",
        "xgrammar 0.2.9 needs apache-tvm-ffi>=0.1.11: apache-tvm-ffi 0.1.10 carried",
    ]


def test_markers_extras_versions_on_the_machine_and_ignored_names(check, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    wheel(tmp_path, "vllm", "0.26.0", "torch==2.11.0", 'pywin32; sys_platform == "win32"', 'pytest; extra == "test"',
          "flashinfer-python==0.6.14", "mistral-common>=1.11")
    (tmp_path / "other").mkdir()
    wheel(tmp_path / "other", "mistral-common", "1.13.1")  # a second folder (.whl/ beside the vLLM bundle)
    assert check.unmet([tmp_path, tmp_path / "other"], {"torch": check.Version("2.11.0")},
                       ignore=frozenset({"flashinfer-python"})) == []
    assert check.unmet([tmp_path, tmp_path / "other"], {"torch": check.Version("2.13.0")},
                       ignore=frozenset({"flashinfer-python"})) == [
        "vllm 0.26.0 needs torch==2.11.0: torch 2.13.0 on the machine"]
    assert check.main([str(tmp_path), str(tmp_path / "other"), "--have", "torch==2.11.0"]) == 1
    assert check.main([str(tmp_path), str(tmp_path / "other"), "--have", "torch==2.11.0",
                       "--ignore", "flashinfer-python"]) == 0


@pytest.fixture()
def random_init():  # type: ignore[no-untyped-def]
    with repo_module("benchmarks", "gpu_random_init") as module:
        yield module


def test_a_failing_stage_is_recorded_logged_and_reported(random_init, capsys) -> None:  # type: ignore[no-untyped-def]
    def broken() -> dict[str, object]:
        raise ModuleNotFoundError("No module named 'flashinfer'")

    assert random_init.guarded("vllm", broken) == {"error": "ModuleNotFoundError: No module named 'flashinfer'"}
    assert random_init.guarded("rl", lambda: {"steps": 3}) == {"steps": 3}
    logged = capsys.readouterr()
    text = logged.out + logged.err
    assert "vllm: FAILED ModuleNotFoundError" in text and 'rl: result {"steps": 3}' in text
    report = {"device": "cpu", "shape": "8b", "scale": {}, "steps": 4, "seconds": 1.0,
              "data": {"records": 2, "shortest": 3, "longest": 5},
              "train": [{"strategy": "reserved", "variant": "packed", "error": "CalledProcessError: exit 1"}],
              "vllm": {"error": "ModuleNotFoundError: No module named 'flashinfer'"}}
    table = random_init.markdown(report)
    assert "| reserved | packed | FAILED: CalledProcessError: exit 1 |" in table
    assert "vllm: FAILED ModuleNotFoundError" in table
    assert random_init.failures(report) == ["train reserved (packed): CalledProcessError: exit 1",
                                            "vllm: ModuleNotFoundError: No module named 'flashinfer'"]
    assert "vllm" in report  # markdown reads the report, it does not change it
