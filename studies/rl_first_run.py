"""The first CPU run of ``selfrag rl``: the mean reward per term of a model's sampled rollouts on held-out questions,
before and after GRPO (issue #42; one seed, an honest first look, not the study the issue asks for).

    python studies/rl_first_run.py --models runs/sft runs/sft-rl --questions 40 --samples 2 --out runs/rl-first.json

Each model answers the same ``--questions`` questions of the demo's test split (answerable and unanswerable in the
file's proportion, the first N), ``--samples`` rollouts each at temperature 1 with the same seeds, through
``selfrag.rl.rollout`` (the runtime's long form with one beam, the retriever in the loop) and the reward of
``configs/rl/smollm2-135m-cpu.yaml``. Prints a markdown table: mean reward in all and per term, well-formed share,
retrievals per rollout, and the questions whose shipped answer held a gold answer, per model, with the CPU.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

from selfrag.config import load_config
from selfrag.corpus import load_queries
from selfrag.inference.retrievers.spec import open_retriever
from selfrag.loading import load_model
from selfrag.rl.config import RLConfig
from selfrag.rl.reward import TERMS, Reward, build_judge
from selfrag.rl.rollout import Rollouts, policy_engine

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "configs" / "rl" / "smollm2-135m-cpu.yaml"


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").is_file() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def measure(model_dir: str, config: RLConfig, questions: list, samples: int) -> dict:  # type: ignore[type-arg]
    loaded = load_model(model_dir)
    retriever = open_retriever(config.retriever)
    assert retriever is not None
    reward = Reward(config.reward, build_judge(config.reward))
    asked = [q for q in questions for _ in range(samples)]
    started = time.monotonic()
    engine = policy_engine(loaded.model, loaded.tokenizer, loaded.meta.token_ids, loaded.meta.prompt_template, seed=0)
    rollouts = Rollouts(engine, retriever, config.rollout).run([q.question for q in asked])
    seconds = time.monotonic() - started
    answers, answerable = [list(q.answers) for q in asked], [q.answerable for q in asked]
    terms = reward.terms(rollouts, answers, answerable)
    total = reward.total(rollouts, answers, answerable)
    return {
        "model": model_dir,
        "rollouts": len(rollouts),
        "reward": statistics.mean(total),
        **{term: statistics.mean(values) for term, values in terms.items()},
        "well_formed": statistics.mean(float(r.trajectory.well_formed) for r in rollouts),
        "retrievals": statistics.mean(r.retrievals for r in rollouts),
        "correct_answerable": sum(v > 0 for v, a in zip(terms["correct"], answerable, strict=True) if a),
        "answerable": sum(answerable),
        "abstained_right": sum(v > 0 for v in terms["abstain"]),
        "unanswerable": len(asked) - sum(answerable),
        "seconds": seconds,
    }


def table(rows: list[dict]) -> str:  # type: ignore[type-arg]
    head = ["model", "reward", *TERMS, "well-formed", "retrievals", "gold held", "abstained right", "s"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for row in rows:
        cells = [Path(row["model"]).name, f"{row['reward']:+.3f}", *(f"{row[t]:+.3f}" for t in TERMS),
                 f"{row['well_formed']:.0%}", f"{row['retrievals']:.2f}",
                 f"{row['correct_answerable']}/{row['answerable']}",
                 f"{row['abstained_right']}/{row['unanswerable']}", f"{row['seconds']:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", required=True)
    parser.add_argument("--questions", type=int, default=40)
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    config = load_config(RLConfig, RECIPE, [f"retriever.corpus={REPO / 'data_gen/demo/corpus.jsonl'}"],
                         model="unused", output_dir="unused")
    test = [q for q in load_queries(REPO / "data_gen/demo/queries.jsonl") if q.meta.get("split") == "test"]
    questions = [q for q in test if q.answers or not q.answerable][: args.questions]
    rows = [measure(model, config, questions, args.samples) for model in args.models]
    print(f"{len(questions)} test questions x {args.samples} rollouts, temperature {config.rollout.temperature}; "
          f"{cpu_name()}")
    print(table(rows))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
