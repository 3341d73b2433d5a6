"""The study's training knobs do what they say, the trainer sees every reflection label, and a tiny model can
learn a judgement that depends on the passage."""

from __future__ import annotations

import copy
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from selfrag import reflection as rf
from selfrag.config import load_config
from selfrag.errors import ConfigError
from selfrag.jsonl import write_jsonl_atomic
from selfrag.reflection import Group
from selfrag.training.config import TrainConfig
from selfrag.training.dataset import IGNORE, encode_record, reflection_positions
from selfrag.training.judgement import auroc, auroc_interval, judge
from selfrag.training.loss import answer_start, loss_weight_table, masked_loss, rank_loss, relevance_rank
from selfrag.training.tokens import MEANING, prepare_tokens
from selfrag.trajectory import Label, Passage, Record, Segment


def weighted_loss(logits: torch.Tensor, labels: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """The oracle of :func:`masked_loss`: weighted mean next-token cross-entropy, sum(w * ce) / sum(w) over the
    labelled positions, from the logits of every position (``batch x length x vocab``)."""
    shift_logits = logits[:, :-1, :].float()
    shift_labels = labels[:, 1:]
    mask = shift_labels != -100
    safe = shift_labels.masked_fill(~mask, 0)
    ce = torch.nn.functional.cross_entropy(
        shift_logits.reshape(-1, shift_logits.shape[-1]), safe.reshape(-1), reduction="none"
    ).view_as(safe)
    weights = table.to(logits.device)[safe] * mask
    return (ce * weights).sum() / weights.sum().clamp_min(1e-8)


def gold(value: str) -> Label:
    return Label(value, "gold")


def test_loss_weight_scales_the_gradient_of_its_positions(prepared) -> None:  # type: ignore[no-untyped-def]
    _, tokenizer, token_ids, _ = prepared
    vocab = len(tokenizer)
    text_id = tokenizer.encode("the", add_special_tokens=False)[0]
    rel_id = token_ids.id(rf.RELEVANT)
    labels = torch.tensor([[IGNORE, text_id, rel_id, text_id, IGNORE]])
    torch.manual_seed(0)
    base = torch.randn(1, 5, vocab)

    def grads(weights: dict[str, float]) -> torch.Tensor:
        logits = base.clone().requires_grad_(True)
        table = loss_weight_table(weights, token_ids, vocab)
        loss = weighted_loss(logits, labels, table if table is not None else torch.ones(vocab))
        loss.backward()
        return logits.grad[0].norm(dim=-1)  # type: ignore[union-attr]

    plain, weighted, only = grads({}), grads({"relevance": 4.0}), grads({"text": 0.0})
    # position p predicts label p+1: logits 1 -> [Relevant], logits 0 and 2 -> text
    ratio_plain = plain[1] / plain[0]
    assert torch.isclose(weighted[1] / weighted[0], 4 * ratio_plain, rtol=1e-4)
    assert torch.isclose(weighted[2] / weighted[0], plain[2] / plain[0], rtol=1e-4)
    assert only[0] == 0 and only[2] == 0 and only[1] > 0  # text weight 0: reflection positions only
    assert plain[3] == 0 and plain[4] == 0  # masked and past-the-end positions never get a gradient
    # all weights 1 is the plain mean loss: no table, so the model's own loss is used
    assert loss_weight_table({"relevance": 1.0}, token_ids, vocab) is None


@pytest.mark.parametrize("weights", [{}, {"relevance": 5.0, "text": 0.25}])
def test_masked_loss_equals_the_full_logits_loss(prepared, weights) -> None:  # type: ignore[no-untyped-def]
    """Logits only where a label is read give the same loss and the same gradients as the full head."""
    model, tokenizer, token_ids, _ = prepared
    vocab = model.get_input_embeddings().weight.shape[0]
    torch.manual_seed(1)
    ids = torch.randint(0, len(tokenizer) - 20, (3, 12))
    ids[:, 6] = token_ids.id(rf.RELEVANT)
    labels = torch.full_like(ids, IGNORE)
    labels[0, 5:9] = ids[0, 5:9]
    labels[1, 6] = ids[1, 6]
    labels[2, 3:12] = ids[2, 3:12]  # to the end: the last position predicts nothing
    mask = torch.ones_like(ids)
    mask[1, 10:] = 0
    table = loss_weight_table(weights, token_ids, vocab)

    def run(masked: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad()
        if masked:
            loss, _ = masked_loss(model, {"input_ids": ids, "attention_mask": mask, "labels": labels}, table)
        else:
            logits = model(input_ids=ids, attention_mask=mask).logits
            loss = weighted_loss(logits, labels, table if table is not None else torch.ones(vocab))
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    (full_loss, full_grads), (kept_loss, kept_grads) = run(False), run(True)
    assert torch.isclose(full_loss, kept_loss, rtol=1e-5)
    assert len(full_grads) == len(kept_grads) > 0
    for full, kept in zip(full_grads, kept_grads, strict=True):
        assert torch.allclose(full, kept, rtol=1e-4, atol=1e-6)


def test_balance_gives_each_verdict_of_a_type_the_same_total_weight(prepared) -> None:  # type: ignore[no-untyped-def]
    _, tokenizer, token_ids, _ = prepared
    rel, irr = token_ids.id(rf.RELEVANT), token_ids.id(rf.IRRELEVANT)
    full = token_ids.id(rf.FULLY_SUPPORTED)
    counts = {rel: 100, irr: 300, full: 50, 7: 1000}
    table = loss_weight_table({"relevance": 2.0}, token_ids, len(tokenizer), ["relevance"], counts)
    # 100 x w_rel == 300 x w_irr, and the type's mean weight per label stays its loss weight (2)
    assert torch.isclose(100 * table[rel], 300 * table[irr])
    assert torch.isclose((100 * table[rel] + 300 * table[irr]) / 400, torch.tensor(2.0))
    assert table[full] == 1.0 and table[7] == 1.0  # other types and text untouched
    # without balance the two relevance tokens weigh the same
    plain = loss_weight_table({"relevance": 2.0}, token_ids, len(tokenizer))
    assert plain[rel] == plain[irr] == 2.0
    # balance alone (all weights 1) still makes a table
    assert loss_weight_table({}, token_ids, len(tokenizer), ["relevance"], counts) is not None


def test_answer_start_weighs_the_first_answer_word_after_a_verdict(prepared) -> None:  # type: ignore[no-untyped-def]
    """answer_start reweights exactly the first answer word after [Relevant]/[Irrelevant]/[No Retrieval]."""
    model, tokenizer, token_ids, _ = prepared
    vocab = model.get_input_embeddings().weight.shape[0]
    rel, sup = token_ids.id(rf.RELEVANT), token_ids.id(rf.FULLY_SUPPORTED)
    word = tokenizer.encode("the", add_special_tokens=False)[0]
    # prompt, [Relevant], word, word, [Fully supported]: positions 2 (reads [Relevant]) predicts the first word
    ids = torch.tensor([[5, 6, rel, word, word, sup]])
    labels = torch.tensor([[IGNORE, IGNORE, rel, word, word, sup]])
    weights = {"text": 0.1, "relevance": 10.0, "answer_start": 3.0}
    table = loss_weight_table(weights, token_ids, vocab)
    start = answer_start(weights, token_ids)
    assert start is not None and answer_start({"text": 0.1}, token_ids) is None
    captured = {}
    real = torch.nn.functional.cross_entropy

    def spy(logits, targets, reduction="mean"):  # type: ignore[no-untyped-def]
        out = real(logits, targets, reduction=reduction)
        captured["ce"] = out.detach()
        return out

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.nn.functional, "cross_entropy", spy)
        loss, _ = masked_loss(model, {"input_ids": ids, "labels": labels}, table, start)
    ce = captured["ce"]  # targets: [Relevant], word (first), word, [Fully supported]
    expected = (10 * ce[0] + 3 * ce[1] + 0.1 * ce[2] + 1 * ce[3]) / (10 + 3 + 0.1 + 1)
    assert torch.isclose(loss, expected, rtol=1e-5)


def test_rank_loss_ranks_each_relevant_position_above_each_irrelevant_one(prepared) -> None:  # type: ignore[no-untyped-def]
    """The pairwise IsREL term: mean softplus(m_neg - m_pos) over the (pos, neg) pairs, m = logit(Rel) - logit(Irr)."""
    _, tokenizer, token_ids, _ = prepared
    vocab = len(tokenizer)
    rank = relevance_rank(2.0, token_ids)
    assert rank is not None and relevance_rank(0.0, token_ids) is None
    rel, irr = token_ids.id(rf.RELEVANT), token_ids.id(rf.IRRELEVANT)
    word = tokenizer.encode("the", add_special_tokens=False)[0]
    targets = torch.tensor([rel, irr, word, rel, irr])
    logits = torch.zeros(5, vocab)
    margins = [1.0, 0.5, 9.0, -0.25, -2.0]  # row 2 is an answer word: never part of a pair
    for row, margin in enumerate(margins):
        logits[row, rel], logits[row, irr] = margin, 0.0
    logits.requires_grad_(True)
    loss = rank_loss(logits, targets, rank)
    pairs = [(p, n) for p in (1.0, -0.25) for n in (0.5, -2.0)]
    expected = sum(torch.nn.functional.softplus(torch.tensor(n - p)) for p, n in pairs) / len(pairs)
    assert torch.isclose(loss, expected)
    loss.backward()
    grad = logits.grad
    assert grad is not None
    # raising a [Relevant] position's margin, or lowering an [Irrelevant] one's, lowers the loss
    assert grad[0, rel] < 0 and grad[3, rel] < 0 and grad[1, rel] > 0 and grad[4, rel] > 0
    assert torch.equal(grad[2], torch.zeros(vocab))  # the answer word gets no gradient from the term
    # the worse-ranked pair (-0.25 vs 0.5) pulls harder than the well-separated one (1.0 vs -2.0)
    assert -grad[3, rel] > -grad[0, rel]
    # one verdict only in the batch: no pair, no term
    only = rank_loss(logits.detach(), torch.tensor([rel, word, rel, word, rel]), rank)
    assert float(only) == 0.0


def test_masked_loss_adds_the_weighted_rank_term(prepared, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    import selfrag.training.loss as train_loss

    model, tokenizer, token_ids, _ = prepared
    rel, irr = token_ids.id(rf.RELEVANT), token_ids.id(rf.IRRELEVANT)
    word = tokenizer.encode("the", add_special_tokens=False)[0]
    ids = torch.tensor([[5, 6, rel, word], [5, 7, irr, word]])
    labels = torch.tensor([[IGNORE, IGNORE, rel, word], [IGNORE, IGNORE, irr, IGNORE]])
    inputs = {"input_ids": ids, "labels": labels}
    rank = relevance_rank(3.0, token_ids)
    seen = {}

    def term(logits, targets, given):  # type: ignore[no-untyped-def]
        seen["targets"], seen["rank"] = targets.tolist(), given
        return torch.tensor(0.25)

    monkeypatch.setattr(train_loss, "rank_loss", term)
    with torch.no_grad():
        plain, _ = masked_loss(model, inputs, None)
        ranked, _ = masked_loss(model, inputs, None, None, rank)
    assert torch.isclose(ranked, plain + 3.0 * 0.25, atol=1e-5)
    assert seen == {"targets": [rel, word, irr], "rank": rank}  # every labelled position, in row order


def test_loss_weight_keys_are_validated(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(
            TrainConfig, None,
            ["training.loss_weights.relevanse=2", "training.row_lr_multiplier=0", "training.relevance_rank=-1"],
            model="m", records="r.jsonl", output_dir=str(tmp_path),
        )
    text = str(error.value)
    assert "relevanse" in text and "did you mean relevance" in text and "row_lr_multiplier must be > 0" in text
    assert "relevance_rank must be >= 0, got -1" in text


def test_words_init_starts_relevant_and_irrelevant_apart(tiny_tokenizer, tiny_model_builder) -> None:  # type: ignore[no-untyped-def]
    rows = {}
    for init in ("mean", "words"):
        tokenizer = copy.deepcopy(tiny_tokenizer)
        model = tiny_model_builder(len(tokenizer))
        token_ids = prepare_tokens(model, tokenizer, "add", init=init)
        weight = model.get_input_embeddings().weight
        rows[init] = (weight[token_ids.id(rf.RELEVANT)].clone(), weight[token_ids.id(rf.IRRELEVANT)].clone())
        if init == "words":
            word = tokenizer.encode(MEANING[rf.RELEVANT], add_special_tokens=False)
            assert torch.allclose(rows[init][0], weight[torch.tensor(word)].mean(dim=0))
    assert torch.equal(*rows["mean"])
    assert not torch.equal(*rows["words"])


def synthetic_records(count: int, seed: int) -> list[Record]:
    """Relevant exactly when the passage is about the asked thing (the town's flag), not its river.

    The question is the same shape either way, and the colour is drawn independently of the label, so only the
    passage's subject tells the labels apart: a model that ignores the passage stays at the class prior.
    """
    colours = ["red", "blue", "green", "black", "white", "gold"]
    towns = ["Arlo", "Bree", "Cole", "Dunn", "Eske", "Fane", "Gath", "Hale"]
    rng = random.Random(seed)
    records = []
    for number in range(count):
        town, colour = rng.choice(towns), rng.choice(colours)
        relevant = number % 2 == 0
        subject = "flag" if relevant else "river"
        passage = Passage(f"p{seed}-{number}", town, f"The {subject} of {town} is {colour}.")
        segment = Segment(
            f"It is {colour}." if relevant else "No.",
            gold(rf.RETRIEVAL),
            passage,
            gold(rf.RELEVANT if relevant else rf.IRRELEVANT),
            gold(rf.FULLY_SUPPORTED if relevant else rf.NO_SUPPORT),
        )
        utility = gold(rf.UTILITY_TOKENS[4 if relevant else 0])
        kind = "gold" if relevant else "easy"
        records.append(
            Record(f"s{seed}-{number}", f"What colour is the flag of {town}?", (segment,), utility,
                   meta={"kind": kind})
        )
    return records


@pytest.fixture(scope="module")
def learned(tiny_base_dir: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from selfrag.training.run import run

    folder = tmp_path_factory.mktemp("learn")
    train, test = folder / "train.jsonl", folder / "test.jsonl"
    write_jsonl_atomic(train, [r.to_json() for r in synthetic_records(256, seed=1)])
    write_jsonl_atomic(test, [r.to_json() for r in synthetic_records(120, seed=2)])
    # relevance_rank (the CPU recipe's pairwise IsREL term; every batch of 8 holds 4 [Relevant] and 4 [Irrelevant])
    # makes this learn from any seed. Without it the recipe sat on a knife edge: training seeds 0-2 gave IsREL
    # accuracy 0.50 / 0.98 / 1.00, and seed 0 itself learned (0.99) or collapsed to one verdict (0.50) by the CPU's
    # kernels alone (AVX2 or AVX-512, ATEN_CPU_CAPABILITY) -- green in CI on one machine, red on the next.
    # With it, seeds 0-7 all score 1.00 (positives' s_rel >= 0.96, negatives' <= 0.07); see results/judgement-test.md.
    config = load_config(
        TrainConfig, None, [],
        model=str(tiny_base_dir), records=str(train), output_dir=str(folder / "out"), eval_records=str(test),
        judgement_items=60,
        training={"learning_rate": 1e-2, "max_steps": 160, "batch_size": 8, "logging_steps": 20, "eval_fraction": 0.0,
                  "max_length": 256, "save_steps": 1000, "loss_weights": {"relevance": 4.0}, "row_lr_multiplier": 2.0,
                  "relevance_rank": 1.0},
        lora={"r": 16, "alpha": 32, "dropout": 0.0},
    )
    return config, run(config), folder


def test_a_tiny_model_learns_a_judgement_that_depends_on_the_passage(learned) -> None:  # type: ignore[no-untyped-def]
    config, result, folder = learned
    report = (folder / "out" / "judgement.json").read_text()
    import json

    data = json.loads(report)
    easy = data["relevance"]["easy"]
    assert easy["n_pos"] == 60 and easy["n_neg"] == 60
    # the class prior is 0.5; a model that ignores the passage scores AUROC 0.5
    assert easy["auroc"] > 0.85, easy
    # ranking alone is not enough: the verdict itself (argmax [Relevant] vs [Irrelevant]) must follow the passage
    assert data["accuracy"]["relevance"] > 0.75, data["confusion"]["relevance"]
    assert (folder / "out" / "training.png").stat().st_size > 1000


#: the ``rank`` argument of each ``masked_loss`` call the ``loss_batches`` spy saw
RANKS: list[Any] = []


@pytest.fixture
def loss_batches(monkeypatch: pytest.MonkeyPatch) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """Each batch's labels and the loss-weight table as they reach the loss (a spy on ``masked_loss``); the
    ranking term each batch got is in ``loss_batches_rank``."""
    import selfrag.training.sft_trainer as train_trainer

    captured: list[tuple[torch.Tensor, torch.Tensor | None]] = []
    real = train_trainer.masked_loss

    def spy(model: Any, inputs: Any, table: Any, start: Any = None, rank: Any = None) -> Any:
        captured.append((inputs["labels"].detach().clone(), None if table is None else table.clone()))
        RANKS.append(rank)
        return real(model, inputs, table, start, rank)

    RANKS.clear()

    monkeypatch.setattr(train_trainer, "masked_loss", spy)
    return captured


def test_the_trainer_sees_every_reflection_label(
    tiny_base_dir: Path, tmp_path: Path, loss_batches: list[tuple[torch.Tensor, torch.Tensor | None]]
) -> None:
    """Capture each batch at the loss and check every reflection position's label reaches it, weighted > 0."""
    from selfrag.training.run import run

    captured = loss_batches
    records = synthetic_records(16, seed=3)
    path = tmp_path / "records.jsonl"
    write_jsonl_atomic(path, [r.to_json() for r in records])
    config = load_config(
        TrainConfig, None, [],
        model=str(tiny_base_dir), records=str(path), output_dir=str(tmp_path / "out"),
        training={"learning_rate": 1e-3, "max_steps": 4, "batch_size": 4, "eval_fraction": 0.0, "max_length": 256,
                  "save_steps": 1000, "loss_weights": {"support": 2.0}, "relevance_rank": 0.5},
        lora={"r": 4, "alpha": 8, "dropout": 0.0},
    )
    result = run(config)
    assert len(captured) == 4
    assert len(RANKS) == 4 and all(rank is not None and rank.weight == 0.5 for rank in RANKS)
    seen = [row for labels, _ in captured for row in labels.tolist()]
    tokenizer, token_ids = result.model, None  # noqa: F841
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "out"))
    token_ids = rf.reflection_ids(tokenizer)
    assert (RANKS[0].relevant, RANKS[0].irrelevant) == (token_ids.id(rf.RELEVANT), token_ids.id(rf.IRRELEVANT))
    expected = [encode_record(r, tokenizer, token_ids, "auto")["labels"] for r in records]
    for want in expected:
        # the batch row that holds this example, padded with IGNORE
        match = [row for row in seen if row[: len(want)] == want and all(t == IGNORE for t in row[len(want):])]
        assert match, "an example's labels did not reach the loss unchanged"
        positions = reflection_positions({"labels": want}, token_ids)
        assert positions[Group.RELEVANCE] and positions[Group.SUPPORT] and positions[Group.RETRIEVE]
    table = captured[0][1]
    assert table is not None  # loss_weights are set: the weighted loss gets its table
    for token_id in token_ids.all_ids:
        assert table[token_id] > 0
    assert table[token_ids.id(rf.FULLY_SUPPORTED)] == 2.0 and table[token_ids.id(rf.RELEVANT)] == 1.0


def test_auroc_and_interval() -> None:
    assert auroc([0.9, 0.8], [0.1, 0.2]) == 1.0
    assert auroc([0.1], [0.9]) == 0.0
    assert auroc([0.5, 0.5], [0.5, 0.5]) == 0.5
    rng = random.Random(0)
    pos = [rng.gauss(1.0, 1.0) for _ in range(200)]
    neg = [rng.gauss(0.0, 1.0) for _ in range(200)]
    value = auroc(pos, neg)
    low, high = auroc_interval(pos, neg)
    assert low < value < high and 0.68 < value < 0.84  # Φ(1/√2) ≈ 0.76
    assert judge is not None


def question_records(questions: int) -> list[Record]:
    """Four records per question (gold, easy, hard, support negative), written kind by kind, questions interleaved,
    so the file order never keeps a question's records together."""
    kinds = ["gold", "easy-0", "hard-0", "support-negative-0"]
    distinct = [  # the text names the question, so no two questions' records render the same labels
        replace(r, segments=(replace(r.segments[0], text=f"{r.segments[0].text} ({n})"),))
        for n, r in enumerate(synthetic_records(questions, seed=5))
    ]
    by_kind = [
        replace(record, id=f"q{number}/{kind}", meta={"query_id": f"q{number}", "kind": kind})
        for kind in kinds
        for number, record in enumerate(distinct)
    ]
    return by_kind


def test_order_by_question_keeps_each_question_together_in_a_seeded_order() -> None:
    from selfrag.training.dataset import order_by_question, question_of

    records = question_records(6)
    examples = [{"id": record.id} for record in records]
    ordered = order_by_question(examples, records, seed=0)
    assert sorted(e["id"] for e in ordered) == sorted(e["id"] for e in examples)  # each example once
    questions = [e["id"].split("/")[0] for e in ordered]
    runs = [q for i, q in enumerate(questions) if i == 0 or questions[i - 1] != q]
    assert len(runs) == 6  # each question is one contiguous run
    assert ordered == order_by_question(examples, records, seed=0)
    assert [e["id"] for e in ordered] != [e["id"] for e in order_by_question(examples, records, seed=1)]
    # within a question the file order stays: gold before its negatives
    assert [e["id"].split("/")[1] for e in ordered[:4]] == ["gold", "easy-0", "hard-0", "support-negative-0"]
    # without meta.query_id the id before its last '/' names the question
    assert question_of(Record("a/b/hard-0", "q", records[0].segments, records[0].utility)) == "a/b"


def train_and_read_batches(
    tiny_base_dir: Path, tmp_path: Path, records: list[Record], steps: int, order: str,
    loss_batches: list[tuple[torch.Tensor, torch.Tensor | None]],
) -> list[list[str]]:
    """Train ``steps`` steps in ``order`` on ``records``; the question of every row of every batch at the loss.

    A question's records share their text here (only the ids differ), so a row's labels name one question."""
    from transformers import AutoTokenizer

    from selfrag.training.run import run

    path = tmp_path / "records.jsonl"
    write_jsonl_atomic(path, [r.to_json() for r in records])
    config = load_config(
        TrainConfig, None, [],
        model=str(tiny_base_dir), records=str(path), output_dir=str(tmp_path / "out"),
        training={"learning_rate": 1e-3, "max_steps": steps, "batch_size": 4, "eval_fraction": 0.0,
                  "max_length": 256, "save_steps": 1000, "order": order},
        lora={"r": 4, "alpha": 8, "dropout": 0.0},
    )
    run(config)
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "out"))
    token_ids = rf.reflection_ids(tokenizer)
    labels_of = {r.id: encode_record(r, tokenizer, token_ids, "auto")["labels"] for r in records}

    def question_of_row(row: list[int]) -> str:
        unpadded = row[: max(i for i, t in enumerate(row) if t != IGNORE) + 1]
        (question,) = {rid.split("/")[0] for rid, want in labels_of.items() if want[: len(unpadded)] == unpadded
                       and all(t == IGNORE for t in want[len(unpadded):])}
        return question

    return [[question_of_row(row) for row in labels.tolist()] for labels, _ in loss_batches]


def test_order_question_puts_one_question_in_each_batch_the_trainer_sees(
    tiny_base_dir: Path, tmp_path: Path, loss_batches: list[tuple[torch.Tensor, torch.Tensor | None]]
) -> None:
    """training.order=question: every batch of 4 at the loss holds exactly one question's 4 records."""
    seen = train_and_read_batches(tiny_base_dir, tmp_path, question_records(4), 4, "question", loss_batches)
    assert len(seen) == 4
    batches = [set(rows) for rows in seen]
    assert all(len(questions) == 1 for questions in batches), batches
    assert len(set.union(*batches)) == 4


def test_question_batches_hold_whole_questions_next_fit() -> None:
    from selfrag.training.dataset import order_by_question, question_batches, question_of

    sizes = {"a": 4, "b": 3, "c": 1, "d": 3, "e": 3, "f": 6, "g": 1, "h": 1}
    records = [Record(f"{q}/{n}", "q", (), None) for q, size in sizes.items() for n in range(size)]
    examples = [{"id": record.id} for record in records]
    ordered, batches = question_batches(examples, records, seed=3, batch_size=4)
    assert ordered == order_by_question(examples, records, seed=3)  # the same order, only cut differently
    assert sorted(i for batch in batches for i in batch) == list(range(len(examples)))  # each example once
    assert [i for batch in batches for i in batch] == list(range(len(examples)))  # read in order
    assert all(1 <= len(batch) <= 4 for batch in batches)
    owners = [{ordered[i]["id"].split("/")[0] for i in batch} for batch in batches]
    for question, size in sizes.items():
        holding = [n for n, batch in enumerate(owners) if question in batch]
        if size <= 4:  # a question fits: it is in exactly one batch
            assert len(holding) == 1, (question, owners)
        else:  # f (6 records) fills one batch of 4, then 2 in the next
            assert len(holding) == 2 and holding[1] == holding[0] + 1
    # next fit: a batch is closed only when the next question (or its next chunk) does not fit
    for batch, following in zip(batches, batches[1:], strict=False):
        first = ordered[following[0]]["id"].split("/")[0]
        chunk = min(4, sum(1 for i in following if ordered[i]["id"].split("/")[0] == first))
        assert len(batch) + chunk > 4
    assert question_of(records[0]) == "a"


def test_order_question_batch_gives_the_trainer_whole_questions(
    tiny_base_dir: Path, tmp_path: Path, loss_batches: list[tuple[torch.Tensor, torch.Tensor | None]]
) -> None:
    """training.order=question_batch: questions of 4, 3 and 1 records; every batch at the loss holds whole
    questions only, so no question is split across two steps."""
    from selfrag.training.dataset import question_batches

    full = question_records(6)
    # q0, q1: 4 records; q2, q3: 3 (no support negative); q4, q5: 1 (gold only)
    keep = {"q0": 4, "q1": 4, "q2": 3, "q3": 3, "q4": 1, "q5": 1}
    kinds = ["gold", "easy-0", "hard-0", "support-negative-0"]
    records = [r for r in full if kinds.index(r.id.split("/")[1]) < keep[r.id.split("/")[0]]]
    _, expected = question_batches([{"id": r.id} for r in records], records, seed=0, batch_size=4)
    seen = train_and_read_batches(tiny_base_dir, tmp_path, records, len(expected), "question_batch", loss_batches)
    assert [len(rows) for rows in seen] == [len(batch) for batch in expected]
    for rows in seen:  # each question in a batch has all its records there
        for question in set(rows):
            assert rows.count(question) == keep[question], seen
    assert sorted(q for rows in seen for q in set(rows)) == sorted(keep)  # every question once


def test_training_plot_draws_held_out_accuracy_without_eval_records(tmp_path: Path) -> None:
    """The quickstart trains with a held-out split but no eval_records: the judgement panel shows the held-out
    IsREL/IsSUP accuracy (it was an empty panel and a matplotlib legend warning); with nothing, it says why."""
    import warnings

    import matplotlib.pyplot as plt

    from selfrag.training.judgement import plot

    losses = [{"step": 10, "loss": 2.0}, {"step": 20, "loss": 1.0}]
    during = [{"step": s, "reflection_accuracy": {"relevance": r, "support": 1.0, "counts": {}}}
              for s, r in ((50, 0.56), (100, 0.64))]
    drawn = {}
    real_close = plt.close

    def keep(figure):  # type: ignore[no-untyped-def]
        drawn["axes"] = figure.axes
        real_close(figure)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plt.close = keep
        try:
            assert plot(tmp_path / "a.png", losses, during) == tmp_path / "a.png"
            labels = [line.get_label() for line in drawn["axes"][1].get_lines()]
            assert labels == ["held-out relevance accuracy", "held-out support accuracy"]
            assert list(drawn["axes"][1].get_lines()[0].get_ydata()) == [0.56, 0.64]
            plot(tmp_path / "b.png", losses, [])
            assert "no held-out records" in drawn["axes"][1].texts[0].get_text()
        finally:
            plt.close = real_close
    assert (tmp_path / "a.png").stat().st_size > 1000


def test_summarise_reports_each_negative_kind_the_records_hold() -> None:
    """Random same-article negatives (data_gen ``article_negatives``, kind ``article``) get their own AUROC beside
    easy and hard ones; a kind the records do not hold gets none."""
    from selfrag.reflection import ReflectionIds
    from selfrag.training.judgement import summarise

    ids = ReflectionIds({token: 100 + i for i, token in enumerate(rf.TOKENS)})
    gold = [0.9, 0.8, 0.7, 0.6]
    rows = [{"kind": "gold", "s_rel": s, "s_sup": None, "pairs": {}} for s in gold]
    rows += [{"kind": "article", "s_rel": s, "s_sup": None, "pairs": {}} for s in (0.65, 0.1, 0.2, 0.3)]
    rows += [{"kind": "hard", "s_rel": s, "s_sup": None, "pairs": {}} for s in (0.95, 0.85, 0.1, 0.2)]
    relevance = summarise(rows, ids)["relevance"]
    assert set(relevance) == {"article", "hard"}
    assert relevance["article"]["auroc"] == pytest.approx(auroc(gold, [0.65, 0.1, 0.2, 0.3])) == pytest.approx(15 / 16)
    assert relevance["hard"]["auroc"] == pytest.approx(9 / 16)
    assert relevance["article"]["n_neg"] == 4
