"""What a ``mixed``-world base must be at RL step 0, as a check on its measured base statistics.

The design: on easy questions the base answers in plain text with an accuracy inside a band (neither
never right, which would leave code as the only road to reward, nor always right, which would leave nothing to
learn); it writes code now and then, not always; and the code it writes is sometimes wrong and sometimes right.
Where the corpus asks multi-step questions (``multi_share`` > 0), the base must also leave room to learn on them (its
accuracy there at most ``multi_accuracy_max``) and already make two calls or more on some of them (a share of its
answers inside ``multi_call_rate``), so that RL finds the second call without inventing it.
The benchmark records the verdict for each base it builds; a CI test builds a small base and checks it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Design:
    """Bands on the base statistics of ``zerotir.toy.base_stats.measure_questions`` (``easy`` / ``hard`` groups).

    Args:
        easy_text_accuracy: inclusive band for ``accuracy_no_code`` on easy questions.
        code_rate_max: the base must open a code block in more than 0 and at most this share of answers (both
            groups together).
        multi_accuracy_max: the most the base may score on multi-step questions (room to learn).
        multi_call_rate: inclusive band for the share of multi-step answers with two calls or more.
    """

    easy_text_accuracy: tuple[float, float] = (0.4, 0.7)
    code_rate_max: float = 0.5
    multi_accuracy_max: float = 0.5
    multi_call_rate: tuple[float, float] = (0.02, 0.8)

    def to_dict(self) -> dict:
        return asdict(self)


def check_design(stats: dict[str, dict], design: Design = Design()) -> list[str]:
    """The ways ``stats`` (``{"easy": rates, "hard": rates, "multi": rates}``; ``hard`` may be absent for a base
    whose corpus had no hard kind, ``multi`` for one without multi-step questions) misses the design; empty when it
    meets it."""
    if "easy" not in stats:
        raise ValueError("base statistics lack the easy group; measure with the mixed world's measure")
    problems = []
    easy = stats["easy"]
    low, high = design.easy_text_accuracy
    text_acc = easy["accuracy_no_code"]
    if text_acc is None or not low <= text_acc <= high:
        problems.append(f"easy text accuracy {text_acc} outside [{low}, {high}]")
    answers = sum(s["n_answers"] for s in stats.values())
    with_code = sum(s["answers_with_code"] for s in stats.values())
    if not 0 < with_code <= design.code_rate_max * answers:
        problems.append(f"code in {with_code} of {answers} answers: want more than 0, at most {design.code_rate_max:.0%}")
    right = sum(round((s["code_run_accuracy"] or 0.0) * s["answers_with_code"]) for s in stats.values())
    if with_code and right == 0:
        problems.append("code is never right")
    if with_code and right == with_code:
        problems.append("code is never wrong")
    if "multi" in stats:
        multi = stats["multi"]
        if multi["accuracy"] > design.multi_accuracy_max:
            problems.append(f"multi-step accuracy {multi['accuracy']} above {design.multi_accuracy_max}: no room")
        low, high = design.multi_call_rate
        if not low <= multi["multi_call_rate"] <= high:
            problems.append(f"two calls or more in {multi['multi_call_rate']} of multi-step answers, outside "
                            f"[{low}, {high}]")
    return problems
