"""Assembling the ``Trajectories`` batch from the tool loop's finished rows."""

from __future__ import annotations

from typing import Any

import torch

from zerotir.rollout.engine import pad_id
from zerotir.rollout.rows import UNSTAMPED, Row
from zerotir.types import FINISH_LENGTH, Trajectories


def to_trajectories(rows: list[Row], tokenizer: Any, truths: list[str]) -> Trajectories:
    """Right-padded tensors in the layout documented on ``Trajectories``.

    Args:
        rows: the finished rows: ``prompt``, ``response`` (its ids with, per id, sampled or not, log-prob and
            version), ``group``, ``finish``, the tool counters and ``tool_calls``.
        tokenizer: decodes the responses and gives the pad id.
        truths: the reference answer of each prompt (indexed by ``row.group``).
    """
    pad = pad_id(tokenizer)
    width = max(len(r.prompt) + len(r.response) for r in rows)
    b = len(rows)
    input_ids = torch.full((b, width), pad, dtype=torch.long)
    attention = torch.zeros(b, width, dtype=torch.long)
    action = torch.zeros(b, width, dtype=torch.bool)
    logprobs = torch.zeros(b, width, dtype=torch.float32)
    versions = torch.full((b, width), UNSTAMPED, dtype=torch.long)
    for i, r in enumerate(rows):
        p, n, response = len(r.prompt), len(r.response), r.response
        input_ids[i, : p + n] = torch.tensor(r.prompt + response.ids, dtype=torch.long)
        attention[i, : p + n] = 1
        if n:
            action[i, p : p + n] = torch.tensor(response.sampled, dtype=torch.bool)
            logprobs[i, p : p + n] = torch.tensor(response.logprobs, dtype=torch.float32)
            versions[i, p : p + n] = torch.tensor(response.versions, dtype=torch.long)

    def column(values: list, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype)

    finish = [r.finish or FINISH_LENGTH for r in rows]
    return Trajectories(
        input_ids=input_ids, attention_mask=attention, action_mask=action, logprobs=logprobs,
        prompt_lens=column([len(r.prompt) for r in rows], torch.long),
        response_lens=column([len(r.response) for r in rows], torch.long),
        group_ids=column([r.group for r in rows], torch.long),
        rewards=torch.zeros(b, dtype=torch.float32),
        num_calls=column([r.calls for r in rows], torch.long),
        num_exec_errors=column([r.exec_errors for r in rows], torch.long),
        num_timeouts=column([r.timeouts for r in rows], torch.long),
        num_sandbox_errors=column([r.sandbox_errors for r in rows], torch.long),
        num_tool_errors=column([r.tool_errors for r in rows], torch.long),
        truncated=column([f == FINISH_LENGTH for f in finish], torch.bool),
        versions=versions if bool((versions[action] >= 0).any()) else None,  # None: no engine stamped a version
        finish_reasons=finish,
        response_texts=tokenizer.batch_decode([r.response.ids for r in rows], skip_special_tokens=True),
        ground_truths=[truths[r.group] for r in rows],
        tool_calls=[list(r.tool_calls) for r in rows],
    )
