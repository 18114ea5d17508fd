"""What a ``tools``-world base must be at RL step 0, and its measurement with the real tool loop.

The design: the base calls tools (on a share of answers of each kind needing one) but picks them without
regard to the question, so its right-tool-first rate is near chance (a third of lookups and combined questions, two
thirds of products: :data:`zerotir.toy.choice.tasks.ANSWERING` over the three tools), and it is rarely right where
only search helps (lookups and combined questions below ``accuracy_max``): room for RL to learn the choice.
"""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from zerotir.choice_metrics import first_call
from zerotir.metric_names import INVALID_TOOL
from zerotir.toy.choice.tasks import ANSWERING, KINDS, NO_CALL, TOOLS, fact_table, write_facts

FIRST_LABELS = (NO_CALL, *TOOLS, INVALID_TOOL)  # the first call did not name a configured tool


def first_tool(calls: list[Any]) -> str:
    """The first-call label of an answer (``zerotir.choice_metrics.first_call``), a name that is none of the
    world's tools counted as ``invalid``."""
    label = first_call(calls)
    return label if label in (NO_CALL, *TOOLS) else INVALID_TOOL


def chance(kind: str) -> float:
    """The right-tool-first rate of a base that calls one of the three tools uniformly at random."""
    return sum(t in ANSWERING[kind] for t in TOOLS) / len(TOOLS)


def kind_stats(firsts: list[str], corrects: list[bool], kind: str) -> dict:
    """Rates of one kind's answers: ``accuracy``, ``call_rate``, ``first_<label>`` shares, ``right_first`` (among
    answers whose first call named a tool) and its ``chance``."""
    n, count = len(firsts), Counter(firsts)
    called = [f for f in firsts if f in TOOLS]
    return {"n_answers": n, "accuracy": round(sum(corrects) / n, 4),
            "call_rate": round(sum(f != NO_CALL for f in firsts) / n, 4),
            **{f"first_{label}": round(count[label] / n, 4) for label in FIRST_LABELS},
            "right_first": round(sum(f in ANSWERING[kind] for f in called) / len(called), 4) if called else None,
            "chance": round(chance(kind), 4)}


def tool_config(facts: Path, cache_dir: Path, max_tool_calls: int = 4) -> Any:
    """The ``model.tool`` of the world: hermes calls of python, calculator and search over ``facts``."""
    from zerotir.config import ToolConfig
    from zerotir.toy.choice.corpus import MAX_OUTPUT_CHARS

    return ToolConfig(max_tool_calls=max_tool_calls, max_output_chars=MAX_OUTPUT_CHARS, format="hermes",
                      tools=[{"class_path": "python"}, {"class_path": "calculator"},
                             {"class_path": "search", "init_args": {"corpus": str(facts), "k": 1,
                                                                    "cache_dir": str(cache_dir)}}])


def measure(model_dir: str | Path, questions: list[Any], seed: int = 0, max_response_tokens: int = 320) -> dict:
    """Sample one answer per question at temperature 1 (the tool loop, a local sandbox, the world's tools) and
    report :func:`kind_stats` per kind present."""
    import torch
    from sandbox import SandboxClient, local_sandbox

    from zerotir.rewards.verify import score
    from zerotir.rollout.agent_loop import Schedule, rollout_sync
    from zerotir.rollout.engine import SamplingParams
    from zerotir.rollout.hf_engine import HFEngine
    from zerotir.toy.template import toy_prompt

    engine = HFEngine(str(model_dir), max_batch_size=len(questions))
    tok = engine.tokenizer
    prompts = [tok(toy_prompt(q.problem), add_special_tokens=False)["input_ids"] for q in questions]
    params = SamplingParams(n=1, temperature=1.0, max_new_tokens=max_response_tokens, seed=seed)
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp, torch.inference_mode(), local_sandbox(workers=1) as urls:
        tool = tool_config(write_facts(Path(tmp) / "facts.jsonl", fact_table()), Path(tmp) / "bm25")
        traj, _ = rollout_sync(engine, tok, SandboxClient(urls), prompts, params, tool,
                               [q.answer for q in questions], Schedule("lockstep"))
    firsts = [first_tool(calls) for calls in traj.tool_calls]
    corrects = [bool(score(text, truth, bool(cut))) for text, truth, cut
                in zip(traj.response_texts, traj.ground_truths, traj.truncated.tolist(), strict=True)]
    out = {}
    for kind in [k for k in KINDS if any(q.kind == k for q in questions)]:
        rows = [i for i, q in enumerate(questions) if q.kind == kind]
        out[kind] = kind_stats([firsts[i] for i in rows], [corrects[i] for i in rows], kind)
    out["seconds"] = round(time.monotonic() - start, 1)
    return out


@dataclass(frozen=True)
class Design:
    """Bands on :func:`measure`'s statistics.

    Args:
        min_call_rate: each kind that needs a tool must call one in at least this share of answers.
        chance_band: its right-tool-first rate must lie within this distance of :func:`chance`.
        accuracy_max: lookups and combined questions must score below this.
    """

    min_call_rate: float = 0.2
    chance_band: float = 0.2
    accuracy_max: float = 0.3

    def to_dict(self) -> dict:
        return asdict(self)


def check_design(stats: dict[str, dict], design: Design = Design()) -> list[str]:
    """The ways ``stats`` (:func:`measure`'s, with ``arith``, ``lookup`` and ``combined``) miss the design; empty
    when they meet it."""
    missing = [k for k in ("arith", "lookup", "combined") if k not in stats]
    if missing:
        raise ValueError(f"base statistics lack the kinds {missing}; measure with zerotir.toy.choice.design.measure")
    problems = []
    for kind in ("arith", "lookup", "combined"):
        s = stats[kind]
        if s["call_rate"] < design.min_call_rate:
            problems.append(f"{kind}: calls in {s['call_rate']} of answers, below {design.min_call_rate}")
        right = s["right_first"]
        if right is None:
            problems.append(f"{kind}: no answer's first call named a tool")
        elif abs(right - s["chance"]) > design.chance_band:
            problems.append(f"{kind}: right tool first in {right} of answers with a call, not within "
                            f"{design.chance_band} of chance {s['chance']}")
        if kind != "arith" and s["accuracy"] >= design.accuracy_max:
            problems.append(f"{kind}: accuracy {s['accuracy']} not below {design.accuracy_max}")
    return problems
