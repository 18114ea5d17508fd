"""``SandboxErrorGuard`` with tool failures counted apart from the sandbox's: hand-worked rates and messages."""

from __future__ import annotations

import pytest
import torch

from zerotir.rl.guards import SandboxErrorGuard, SandboxFailureError
from zerotir.types import ToolCall, Trajectories

URLS = ["http://127.0.0.1:9"]


def one_row(calls: list[ToolCall], sandbox_errors: int, tool_errors: int) -> Trajectories:
    """One trajectory that made ``calls``, with the loop's counters given by hand."""
    one = torch.ones(1, 2, dtype=torch.long)
    zero = torch.zeros(1, dtype=torch.long)
    return Trajectories(
        input_ids=one, attention_mask=one, action_mask=one.bool(), logprobs=torch.zeros(1, 2),
        prompt_lens=zero + 1, response_lens=zero + 1, group_ids=zero, rewards=torch.zeros(1),
        num_calls=torch.tensor([len(calls)]), num_exec_errors=zero, num_timeouts=zero,
        num_sandbox_errors=torch.tensor([sandbox_errors]), num_tool_errors=torch.tensor([tool_errors]),
        truncated=zero.bool(), tool_calls=[calls],
    )


def ok(tool: str) -> ToolCall:
    return ToolCall("{}", "ok", "1", tool)


def failed(tool: str) -> ToolCall:
    return ToolCall("{}", "tool_error", "Error: the server is unavailable", tool)


def test_a_failing_mcp_tool_stops_the_run_naming_the_tool_not_the_sandbox():
    # 4 python calls that ran, `add` failed 3 of its 4 calls: 3 failures in 8 calls = 0.375 > 0.3.
    traj = one_row([ok("python")] * 4 + [ok("add")] + [failed("add")] * 3, sandbox_errors=0, tool_errors=3)
    assert SandboxErrorGuard.error_rate(traj) == pytest.approx(3 / 8)
    with pytest.raises(SandboxFailureError) as caught:
        SandboxErrorGuard(max_rate=0.3, patience=1).update(traj, 4, URLS)
    message = str(caught.value)
    assert "RL step 4: 38% of the tool calls failed" in message
    assert "3 of the step's 8 calls failed in their tool" in message and "`add` 3 of its 4 calls" in message
    assert "sandbox failed" not in message and "python -m sandbox serve" not in message and URLS[0] not in message


def test_sandbox_errors_keep_the_sandbox_wording_and_name_no_tool():
    traj = one_row([ToolCall("1/0", "sandbox_error", "refused")] * 2 + [ok("python")] * 2, sandbox_errors=2,
                   tool_errors=0)
    with pytest.raises(SandboxFailureError) as caught:
        SandboxErrorGuard(max_rate=0.4, patience=1).update(traj, 2, URLS)
    message = str(caught.value)
    assert "The python tool's sandbox failed 2 of the step's 4 calls (sandbox URLs: http://127.0.0.1:9)" in message
    assert "python -m sandbox serve" in message and "tool_error" not in message


def test_sandbox_and_tool_failures_add_up_in_the_rate_and_are_reported_apart():
    # 1 sandbox error + 2 tool errors (search 1 of 1, add 1 of 2) in 6 calls: 0.5, not above 0.5 ...
    calls = [ToolCall("x", "sandbox_error", "refused"), ok("python"), failed("search"), failed("add"), ok("add"),
             ok("calculator")]
    traj = one_row(calls, sandbox_errors=1, tool_errors=2)
    guard = SandboxErrorGuard(max_rate=0.5, patience=2)
    assert guard.update(traj, 1, URLS) == 0.5 and guard.bad_steps == 0
    # ... and above 0.45 for two steps: stopped, with both counts and each tool's own.
    guard = SandboxErrorGuard(max_rate=0.45, patience=2)
    guard.update(traj, 1, URLS)
    with pytest.raises(SandboxFailureError) as caught:
        guard.update(traj, 2, URLS)
    message = str(caught.value)
    assert "sandbox failed 1 of the step's 6 calls" in message
    assert "2 of the step's 6 calls failed in their tool" in message
    assert "`add` 1 of its 2 calls, `search` 1 of its 1 calls" in message and "calculator" not in message
