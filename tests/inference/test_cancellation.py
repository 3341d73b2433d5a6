"""Work for a client that has gone stops within a decode step (issue 28.3): the hf engine drops abandoned rows from
its batch between steps, and the server marks a request abandoned as soon as its client leaves.

The real hf engine on the tiny Llama (no download): a few hundred decode steps of a 2-layer model.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

torch = pytest.importorskip("torch")

from server_harness import MODEL, FixedRetriever, LiveServer, serve_config, wait_until  # noqa: E402

from selfrag.inference.engines import GenerationRequest  # noqa: E402
from selfrag.inference.engines.cancel import abandon_when, abandoned  # noqa: E402
from selfrag.inference.engines.hf import HFEngine  # noqa: E402
from selfrag.inference.server.app import create_app  # noqa: E402
from selfrag.inference.server.backend import Backend  # noqa: E402
from selfrag.prompting import encode_prompt  # noqa: E402
from selfrag.reflection import Group  # noqa: E402

QUESTIONS = ["What is the capital of France?", "Who wrote it?", "Name a river in the north.", "Why is the sky blue?"]


@pytest.fixture(scope="module")
def model_dir(merged_model_dir) -> Path:  # type: ignore[no-untyped-def]
    return merged_model_dir(3)


@pytest.fixture
def engine(model_dir: Path) -> Iterator[tuple[HFEngine, list[int]]]:
    """The engine and the batch size of every forward pass it makes."""
    engine = HFEngine(model_dir, batch_size=8)
    sizes: list[int] = []
    handle = engine.model.register_forward_pre_hook(
        lambda _module, _args, kwargs: sizes.append(int(kwargs["input_ids"].shape[0])), with_kwargs=True)
    yield engine, sizes
    handle.remove()


def _requests(engine: HFEngine, steps: int) -> list[GenerationRequest]:
    # min_tokens = max_tokens: no row stops early, so every row would take all the steps
    return [GenerationRequest(tuple(encode_prompt(engine.tokenizer, q)), max_tokens=steps, min_tokens=steps,
                              score_token_ids=engine.token_ids.ids(Group.RELEVANCE)) for q in QUESTIONS]


def test_without_a_check_nothing_is_abandoned() -> None:
    assert abandoned([]) == []
    with abandon_when(lambda requests: [True] * len(requests)):
        with pytest.raises(ValueError, match="returned 2 flags for 1 requests"), abandon_when(lambda _: [True, True]):
            abandoned([GenerationRequest((1,), 1)])


def test_abandoned_rows_leave_the_batch_at_the_next_step_and_the_others_are_unchanged(
    engine: tuple[HFEngine, list[int]],
) -> None:
    hf, sizes = engine
    requests = _requests(hf, 40)
    baseline = hf.generate(requests)
    assert sizes == [4] * 40
    sizes.clear()
    asked: list[int] = []

    def check(batch: Sequence[GenerationRequest]) -> list[bool]:
        asked.append(len(batch))
        return [len(asked) >= 5 and request in (requests[1], requests[2]) for request in batch]

    with abandon_when(check):
        result = hf.generate(requests)
    assert sizes == [4] * 5 + [2] * 35  # from the sixth step on, only the two rows whose clients stayed
    for index in (1, 2):
        assert result[index].token_ids == baseline[index].token_ids[:5] and result[index].finish_reason == "length"
    for index in (0, 3):
        assert result[index].token_ids == baseline[index].token_ids
        for got, expected in zip(result[index].score_logprobs, baseline[index].score_logprobs, strict=True):
            assert got == pytest.approx(expected, abs=1e-4)


def test_a_batch_whose_clients_all_left_stops_at_the_next_step(engine: tuple[HFEngine, list[int]]) -> None:
    hf, sizes = engine
    with abandon_when(lambda batch: [len(sizes) >= 3] * len(batch)):
        result = hf.generate(_requests(hf, 200))
    assert sizes == [4, 4, 4] and all(len(generation.token_ids) == 3 for generation in result)


def test_rows_that_finish_leave_the_batch(engine: tuple[HFEngine, list[int]]) -> None:
    hf, sizes = engine
    prompts = [request.prompt_ids for request in _requests(hf, 30)]
    free = [hf.generate([GenerationRequest(prompt, max_tokens=30)])[0].token_ids for prompt in prompts]
    # a stop id that one prompt reaches early and another never: the first finishes, the second goes on alone
    stop, first, second = next((token, i, j) for i in range(4) for token in free[i][:10] for j in range(4)
                               if token not in free[j] and token not in hf.eos_ids)
    sizes.clear()
    result = hf.generate([GenerationRequest(prompts[k], max_tokens=30, stop_token_ids=(stop,))
                          for k in (first, second)])
    finished = free[first].index(stop) + 1
    assert result[0].finish_reason == "stop" and len(result[0].token_ids) == finished
    assert result[1].token_ids == free[second]
    assert sizes == [2] * finished + [1] * (30 - finished)


# -- the server -------------------------------------------------------------------------------------------------


def _server(hf: HFEngine, batch: int) -> LiveServer:
    """A batch of ``batch`` requests goes to the engine as soon as they are all in; the window is wide (3 s) so that a
    loaded machine (the suite's other worker) cannot split them: 500 ms once let the fourth stream miss the batch."""
    config = serve_config(max_tokens_limit=400, batch_wait_ms=3000, max_batch=batch)
    return LiveServer(create_app(config, Backend(hf, FixedRetriever(), MODEL))).start()


def _body(question: str) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": question}], "stream": True, "mode": "never",
            "max_tokens": 300}


def _open_streams(live: LiveServer, questions: Sequence[str]) -> tuple[httpx.Client, list[Any]]:
    """One connection per stream (one client: building clients is slow, and the batch window is short)."""
    client = httpx.Client(timeout=30)
    return client, [client.send(client.build_request("POST", f"{live.url}/v1/chat/completions", json=_body(question)),
                                stream=True) for question in questions]


def test_the_server_stops_decoding_for_clients_that_left(engine: tuple[HFEngine, list[int]]) -> None:
    hf, sizes = engine
    live = _server(hf, batch=4)
    try:
        full = httpx.post(f"{live.url}/v1/chat/completions", json={**_body(QUESTIONS[0]), "stream": False}, timeout=60)
        steps_alone = len(sizes)
        assert full.status_code == 200 and steps_alone >= 100  # the question decodes long: a test worth running
        hf.model.register_forward_pre_hook(lambda *_: time.sleep(0.01))  # ~3 s for the whole answer
        sizes.clear()
        client, streams = _open_streams(live, [QUESTIONS[0]] * 4)
        wait_until(lambda: len(sizes) >= 10)  # the four are being decoded, in one batch
        assert sizes[0] == 4
        for response in streams:
            response.close()
        client.close()
        left_at = len(sizes)
        wait_until(lambda: live.state.worker.in_flight == 0)
        assert len(sizes) - left_at <= 10, f"{len(sizes) - left_at} decode steps after every client left"
        wait_until(lambda: 'selfrag_rejected_total{reason="disconnected"} 4.0' in
                   httpx.get(f"{live.url}/metrics").text)
    finally:
        live.stop()


def test_a_client_that_stays_gets_the_answer_it_gets_alone(engine: tuple[HFEngine, list[int]]) -> None:
    hf, sizes = engine
    live = _server(hf, batch=3)
    try:
        alone = httpx.post(f"{live.url}/v1/chat/completions", json={**_body(QUESTIONS[0]), "stream": False},
                           timeout=60).json()["choices"][0]["message"]["content"]
        hf.model.register_forward_pre_hook(lambda *_: time.sleep(0.01))
        sizes.clear()
        client, leaving = _open_streams(live, QUESTIONS[1:3])
        staying: list[Any] = []
        thread = threading.Thread(target=lambda: staying.append(httpx.post(
            f"{live.url}/v1/chat/completions", json={**_body(QUESTIONS[0]), "stream": False}, timeout=60)))
        thread.start()
        wait_until(lambda: len(sizes) >= 10)
        assert sizes[0] == 3  # one batch of three (the batch window gathered them)
        for response in leaving:
            response.close()
        client.close()
        thread.join(60)
        assert staying[0].json()["choices"][0]["message"]["content"] == alone
        assert sizes[-1] == 1  # the two that left were dropped from the batch
    finally:
        live.stop()
