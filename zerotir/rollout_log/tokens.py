"""Per-token records: a sampled share of a step's trajectories, token by token, with what trained each token.

A record's ``tokens`` field (absent from the trajectories not sampled) holds parallel lists over the trajectory's real
tokens, prompt first:

    ids              the token id
    pieces           its text (the token decoded alone)
    span             "prompt", "text" (model text), "call" (a tool call the model wrote), "output" (a tool's output,
                     injected) or "answer" (the final ``\\boxed{...}``)
    loss_weight      1 where the token entered the loss (sampled by the policy, in a row the update kept), else 0
    engine_logprob   the rollout engine's log-prob of the sampled token (None off the action mask)
    trainer_logprob  the actor's log-prob at the update (the old log-probs; None off the mask and for a row the
                     update did not keep)
    advantage        the token's advantage in the update (None off the mask and for a row the update did not keep)
    entropy          the entropy of the actor's tempered distribution at the token in the update (None as above)
    weight_version   the weight version that sampled the token (None off the mask or where the rollout has none)

Floats are rounded to 4 decimals. The training thread only slices the sampled rows to CPU (``capture``); decoding
and span labelling happen on the writer thread (``token_fields``).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from zerotir.rl.step import StepResult

SPANS = ("prompt", "text", "call", "output", "answer")
# A tool call the model wrote, in the fences (```python ... ```) or hermes (<tool_call> ... </tool_call>) format.
_CALL = re.compile(r"```python\n.*?(?:```|$)|<tool_call>.*?(?:</tool_call>|$)", re.S)
_BOXED = "\\boxed{"


def pick_rows(size: int, count: int | None, step: int) -> list[int]:
    """``count`` rows of ``size`` (all of them for None or ``count >= size``), the same for the same step: a
    sample seeded by the step, in row order."""
    if count is None or count >= size:
        return list(range(size))
    return sorted(random.Random(step).sample(range(size), count))


def _rows(tensor: Tensor | None, rows: Tensor) -> Tensor | None:
    return None if tensor is None else tensor.index_select(0, rows.to(tensor.device)).detach().float().cpu()


def capture(result: StepResult, rows: Sequence[int]) -> dict[str, Any]:
    """The per-token tensors of ``rows`` of ``result.rollout`` on CPU, with the update's values where it trained
    them (``result.trained``): what the writer thread needs, and nothing that keeps the step's tensors alive."""
    traj = result.rollout
    index = torch.tensor(list(rows), dtype=torch.long)
    out: dict[str, Any] = {
        "rows": list(rows), "ids": traj.input_ids.index_select(0, index.to(traj.input_ids.device)).cpu(),
        "attention": _rows(traj.attention_mask, index), "action": _rows(traj.action_mask, index),
        "engine": _rows(traj.logprobs, index), "versions": _rows(traj.versions, index),
        "prompt_lens": traj.prompt_lens.cpu()[index], "trained": {}, "kept": result.kept.cpu()[index].tolist(),
    }
    trained = result.trained
    if trained is not None:
        position = {int(r): i for i, r in enumerate(trained.rows.tolist())}
        for j, row in enumerate(rows):
            if row in position:
                i = torch.tensor([position[row]])
                out["trained"][j] = (_rows(trained.old_logp, i), _rows(trained.advantages, i),
                                     _rows(trained.entropy, i))
    return out


def _round(values: Tensor | None, on: list[bool]) -> list[float | None] | None:
    if values is None:
        return None
    return [round(v, 4) if keep else None for v, keep in zip(values.tolist(), on)]


def spans(pieces: Sequence[str], prompt_len: int, action: Sequence[bool]) -> list[str]:
    """The span kind of each token (module doc): prompt tokens, then injected tokens as ``output``, and sampled
    tokens as ``call`` inside a tool call, ``answer`` inside the last ``\\boxed{...}``, else ``text``."""
    response = "".join(pieces[prompt_len:])
    starts, at = [], 0
    for piece in pieces[prompt_len:]:
        starts.append(at)
        at += len(piece)
    calls = [(m.start(), m.end()) for m in _CALL.finditer(response)]
    answer = _boxed_range(response)
    kinds = ["prompt"] * min(prompt_len, len(pieces))
    for k, piece in enumerate(pieces[prompt_len:]):
        start, end = starts[k], starts[k] + max(len(piece), 1)
        if not action[prompt_len + k]:
            kinds.append("output")
        elif any(a < end and start < b for a, b in calls):
            kinds.append("call")
        elif answer is not None and answer[0] < end and start < answer[1]:
            kinds.append("answer")
        else:
            kinds.append("text")
    return kinds


def _boxed_range(text: str) -> tuple[int, int] | None:
    """The character range of the last ``\\boxed{...}`` of ``text`` (to its closing brace, or the end)."""
    start = text.rfind(_BOXED)
    if start < 0:
        return None
    depth, at = 0, start + len(_BOXED) - 1
    while at < len(text):
        depth += {"{": 1, "}": -1}.get(text[at], 0)
        at += 1
        if depth == 0:
            break
    return start, at


def token_fields(captured: dict[str, Any], j: int, tokenizer: Any) -> dict[str, Any]:
    """The ``tokens`` field (module doc) of the ``j``-th captured row; ``tokenizer`` decodes the pieces."""
    length = int(captured["attention"][j].sum().item())
    ids = captured["ids"][j, :length].tolist()
    pieces = tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=False, clean_up_tokenization_spaces=False)
    action = [bool(a) for a in captured["action"][j, :length].tolist()]
    kept = bool(captured["kept"][j])
    trained = captured["trained"].get(j)
    trainer_logp = advantage = entropy = None
    if trained is not None:
        trainer_logp, advantage, entropy = (_round(values[0, :length], action) for values in trained)
    versions = captured["versions"]
    return {
        "ids": ids, "pieces": pieces, "span": spans(pieces, int(captured["prompt_lens"][j]), action),
        "loss_weight": [int(a and kept and trained is not None) for a in action],
        "engine_logprob": _round(captured["engine"][j, :length], action),
        "trainer_logprob": trainer_logp, "advantage": advantage, "entropy": entropy,
        "weight_version": None if versions is None else [int(v) if a else None for v, a in
                                                         zip(versions[j, :length].tolist(), action)],
    }


def advantage_sums(result: StepResult) -> list[float | None]:
    """Each rollout row's advantage summed over its tokens (they are 0 off the action mask; None: the update did not
    keep the row): one row sum and a copy of B numbers on the training thread. Divided by the row's action tokens
    (its record's ``sampled_tokens``) on the writer thread, it is the row's mean advantage."""
    out: list[float | None] = [None] * len(result.rollout)
    trained = result.trained
    if trained is None:
        return out
    for row, value in zip(trained.rows.tolist(), trained.advantages.sum(1, dtype=torch.float32).cpu().tolist()):
        out[row] = value
    return out
