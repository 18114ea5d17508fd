"""The records that flow from the data to the rollout and from the rollout loop to the trainer: a prompt row
(``PromptRow``) and the batch of trajectories (``Trajectories``).

Shapes use B = number of trajectories (prompts x samples) and T = the longest prompt + response in the batch.
Every per-token tensor is aligned with ``input_ids``: the value at ``[b, t]`` concerns the token ``input_ids[b, t]``
(for log-probs: log p(token t | tokens < t)). Position 0 is always a prompt token, so it never carries an action.

``action_mask`` is the env-token mask of ZeroTIR: 1 only on tokens the policy sampled. Prompt tokens, injected tool
output (the ```output blocks) and padding are 0, and every loss and every mean over tokens uses this mask.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TypedDict

import torch

# Why a trajectory stopped.
FINISH_STOP = "stop"  # the model ended (EOS or a stop string that ends the answer)
FINISH_LENGTH = "length"  # the response-token budget ran out: truncated, reward 0


class _TrainingRowKeys(TypedDict, total=False):
    batch_index: int
    position: int
    kind: str


class PromptRow(_TrainingRowKeys):
    """One prompt as the data module yields it (a batch is a plain list of them: no tensors, no collation).

    Attributes:
        id: the data row's id (``data.id_field``), unique within its source.
        problem: the problem text (``data.problem_field``).
        answer: the ground truth the reward compares the final ``\\boxed{}`` with (``data.answer_field``).
        prompt_text: the problem rendered by the prompt template.
        prompt_ids: its token ids, what the engine is given.
        source: the name of the file / benchmark the row came from.
        batch_index: on training rows: the index of the batch in the training stream (the data cursor).
        position: on training rows: the row's index in that batch (with ``batch_index``, its place in the stream).
        kind: the row's ``kind`` field, where its file gives one (what ``data.curriculum`` weights; the per-kind
            metrics: ``zerotir.choice_metrics``).
    """

    id: str
    problem: str
    answer: str
    prompt_text: str
    prompt_ids: list[int]
    source: str


@dataclass(frozen=True)
class ToolCall:
    """One tool call of a trajectory, as the tool loop saw it (for logs, metrics and inspection, never for the loss).

    Attributes:
        code: the call as the model wrote it, between the format's markers (with ``fences``: the code sent to the
            sandbox, the block's text between its fences; with ``hermes``: the JSON of the call).
        status: how it ended: "ok", "error", "timeout", "memory", "killed", "sandbox_error" (the python tool keeps
            the sandbox's statuses), "tool_error" (the tool raised) or "invalid" (a malformed call: bad JSON, an
            unknown tool, arguments off the schema).
        output: the text injected into the output block (what the model read, after the output caps).
        tool: the name of the tool called ("" when the call could not be parsed to a name).
        seconds: the call's wall time (not compared: it differs from run to run).
    """

    code: str
    status: str
    output: str
    tool: str = "python"
    seconds: float = field(default=0.0, compare=False)


@dataclass
class Trajectories:
    """A batch of tool-integrated trajectories (token-in / token-out).

    Tensors (B = trajectories, T = max prompt + response length, right padded):
        input_ids:      (B, T) long   prompt ids, then the response ids (sampled and injected), then pad ids.
        attention_mask: (B, T) long   1 on real tokens (prompt + response), 0 on padding.
        action_mask:    (B, T) bool   1 on tokens sampled by the policy; 0 on prompt, injected output, padding.
        logprobs:       (B, T) float  log-prob of each sampled token under the rollout engine; 0 where action_mask is 0.
        prompt_lens:    (B,) long     number of prompt tokens.
        response_lens:  (B,) long     number of response tokens (sampled + injected), i.e. real tokens after the prompt.
        group_ids:      (B,) long     index of the prompt this trajectory answers; the n samples of a prompt share it.
        rewards:        (B,) float    outcome reward (1 correct final boxed answer, else 0); filled by the reward step.
        num_calls:      (B,) long     tool calls made (to any tool, python or another).
        num_exec_errors:(B,) long     calls that were the model's fault: code that raised / exited non-zero, a
                                      tool's error answer, an invalid call.
        num_timeouts:   (B,) long     calls stopped at the time or memory limit.
        num_sandbox_errors: (B,) long executions the sandbox service failed to run (the python tool's
                                      infrastructure fault).
        truncated:      (B,) bool     the response hit the token budget (finish_reason == "length").
        versions:       (B, T) long   or None: the weight version (updates the engine's weights had seen) that
                                      sampled each action token; -1 off the action mask. An engine host stamps each
                                      segment with the version at its submission (exact unless a weight push landed
                                      while the segment ran: then the oldest that may have produced it). None from a
                                      rollout that does not record it (the module stamps in-line rollouts).
        num_tool_errors: (B,) long    calls whose tool raised instead of answering (status "tool_error": a dead
                                      MCP server, a tool's bug), counted apart from the sandbox's failures; a batch
                                      built without it (hand-made in tests) gets zeros.
        corrects:       (B,) bool     or None: whether the answer counts as correct, as the run's reward
                                      (``model.reward``) judged it, apart from its score; None before scoring (or
                                      in a batch built by hand): ``correct`` reads it as ``rewards > 0``.
        reward_failed:  (B,) bool     the reward could not judge the trajectory (``Score.infra_failed``: a judge
                                      that did not answer); False before scoring or in a batch built by hand.

    Per-trajectory Python lists (length B):
        finish_reasons: "stop" or "length".
        response_texts: decoded response (sampled and injected text), for reward, metrics and logs only.
        ground_truths:  the reference answer of the prompt.
        tool_calls:     the executions of each trajectory, in order (``ToolCall``); a batch built without them
                        (hand-made in tests) gets an empty list per row.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    action_mask: torch.Tensor
    logprobs: torch.Tensor
    prompt_lens: torch.Tensor
    response_lens: torch.Tensor
    group_ids: torch.Tensor
    rewards: torch.Tensor
    num_calls: torch.Tensor
    num_exec_errors: torch.Tensor
    num_timeouts: torch.Tensor
    num_sandbox_errors: torch.Tensor
    truncated: torch.Tensor
    versions: torch.Tensor | None = None
    num_tool_errors: torch.Tensor | None = None
    corrects: torch.Tensor | None = None
    reward_failed: torch.Tensor | None = None
    finish_reasons: list[str] = field(default_factory=list)
    response_texts: list[str] = field(default_factory=list)
    ground_truths: list[str] = field(default_factory=list)
    tool_calls: list[list[ToolCall]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.tool_calls:
            self.tool_calls = [[] for _ in range(self.input_ids.shape[0])]
        if self.num_tool_errors is None:
            self.num_tool_errors = torch.zeros_like(self.num_calls)
        if self.reward_failed is None:
            self.reward_failed = torch.zeros_like(self.num_calls, dtype=torch.bool)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def _map(self, tensor_fn, list_fn) -> Trajectories:
        values = {}
        for f in fields(self):
            v = getattr(self, f.name)
            values[f.name] = tensor_fn(v) if isinstance(v, torch.Tensor) else None if v is None else list_fn(v)
        return Trajectories(**values)

    def select(self, index: torch.Tensor | list[int]) -> Trajectories:
        """Rows ``index`` (a list of ints or a long / bool tensor), in that order."""
        idx = torch.as_tensor(index, dtype=torch.long) if isinstance(index, list) else torch.as_tensor(index)
        if idx.dtype == torch.bool:
            idx = idx.nonzero(as_tuple=True)[0]
        rows = idx.tolist()
        return self._map(lambda t: t[idx.to(t.device)], lambda lst: [lst[i] for i in rows])

    def to(self, device: torch.device | str) -> Trajectories:
        return self._map(lambda t: t.to(device), lambda lst: list(lst))

    @staticmethod
    def cat(parts: list[Trajectories], pad_token_id: int) -> Trajectories:
        """Concatenate batches, right-padding per-token tensors to the longest T (group ids are kept as given)."""
        if not parts:
            raise ValueError("Trajectories.cat needs at least one batch")
        width = max(p.input_ids.shape[1] for p in parts)
        values = {}
        for f in fields(Trajectories):
            items = [getattr(p, f.name) for p in parts]
            if f.name == "corrects" and any(x is not None for x in items):
                items = [p.correct for p in parts]  # a part never scored reads as before: rewards > 0
            if f.name in ("versions", "corrects") and any(x is None for x in items):
                if not all(x is None for x in items):
                    raise ValueError("Trajectories.cat: some batches record weight versions and some do not")
                values[f.name] = None
                continue
            if isinstance(items[0], torch.Tensor):
                if items[0].dim() == 2:
                    fill = {"input_ids": pad_token_id, "versions": -1}.get(f.name, 0)
                    items = [torch.nn.functional.pad(x, (0, width - x.shape[1]), value=fill) for x in items]
                values[f.name] = torch.cat(items)
            else:
                values[f.name] = [x for lst in items for x in lst]
        return Trajectories(**values)

    @property
    def used_tool(self) -> torch.Tensor:
        """(B,) bool: the trajectory made at least one tool call (to any tool)."""
        return self.num_calls > 0

    @property
    def infra_failed(self) -> torch.Tensor:
        """(B,) bool: a tool call or the score failed for a reason that is not the model's: the sandbox service or a
        tool failed (``num_sandbox_errors``, ``num_tool_errors``), or the reward could not judge (``reward_failed``).
        The model's own errors and timeouts are not among them."""
        return (self.num_sandbox_errors > 0) | (self.num_tool_errors > 0) | self.reward_failed.to(self.num_calls.device)

    @property
    def correct(self) -> torch.Tensor:
        """(B,) bool: the answer counts as correct: the reward's verdict (``corrects``), else ``rewards > 0``."""
        return self.corrects if self.corrects is not None else self.rewards > 0
