"""The tool loop's records: a response keeps one value of each kind per id whatever is appended or cut, modes pick
their stops, and the schedule kinds are the config's."""

from typing import get_args

import pytest

from zerotir.config import ScheduleKind, ToolConfig
from zerotir.rollout.agent_loop import Schedule
from zerotir.rollout.rows import UNSTAMPED, Mode, Response, stops
from zerotir.tools.formats import call_format


def test_sampled_and_injected_ids_carry_their_own_values_in_order():
    response = Response()
    response.append_sampled([5, 6], [-0.5, -1.5], version=3)
    response.append_injected([7, 8, 9])
    response.append_sampled([10], [-0.25], version=None)
    assert len(response) == 6
    assert response.ids == [5, 6, 7, 8, 9, 10]
    assert list(response.sampled) == [True, True, False, False, False, True]
    assert list(response.logprobs) == [-0.5, -1.5, 0.0, 0.0, 0.0, -0.25]
    assert list(response.versions) == [3, 3, UNSTAMPED, UNSTAMPED, UNSTAMPED, UNSTAMPED]


def test_truncate_cuts_every_value_at_the_same_id():
    response = Response()
    response.append_sampled([1, 2, 3], [-1.0, -2.0, -3.0], version=0)
    response.append_injected([4])
    response.truncate(2)
    assert (response.ids, list(response.sampled), list(response.logprobs), list(response.versions)) == (
        [1, 2], [True, True], [-1.0, -2.0], [0, 0])
    response.append_injected([9])
    assert response.ids == [1, 2, 9] and list(response.sampled) == [True, True, False]


def test_a_segment_without_one_logprob_per_id_is_refused_and_nothing_is_kept():
    response = Response()
    with pytest.raises(ValueError, match="one log-prob per sampled id"):
        response.append_sampled([1, 2], [-1.0], version=0)
    assert len(response) == 0 and not response.sampled and not response.logprobs and not response.versions


def test_each_mode_stops_on_its_own_fence_then_the_callers_stops():
    tool = call_format(ToolConfig())
    assert stops(Mode.TEXT, tool, ["</answer>", tool.call_start]) == ["```python", "</answer>"]
    assert stops(Mode.CALL, tool, ["</answer>"]) == ["```", "</answer>"]
    assert stops(Mode.FINAL, tool, ["</answer>"]) == ["</answer>"]
    hermes = call_format(ToolConfig(format="hermes"))
    assert stops(Mode.TEXT, hermes, ["</answer>"]) == ["<tool_call>", "</answer>"]
    assert stops(Mode.CALL, hermes, []) == ["</tool_call>"]


def test_schedule_accepts_every_kind_of_the_config_and_names_them_when_refusing():
    kinds = get_args(ScheduleKind)
    assert [Schedule(k).kind for k in kinds] == list(kinds)
    with pytest.raises(ValueError, match="model.rollout.init_args.schedule") as refused:
        Schedule("continuous")  # type: ignore[arg-type]
    assert all(repr(k) in str(refused.value) for k in kinds)
