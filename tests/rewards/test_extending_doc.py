"""The worked example reward of docs/extending.md, as written there: its file and its config entry, scoring a batch
on the one scoring path."""

from __future__ import annotations

import yaml

from tests.callbacks.helpers import make_batch
from tests.tools.test_extending_doc import block
from zerotir.rewards import build_reward
from zerotir.rollout.scoring import score_trajectories

ROWS = [{"id": "p0", "problem": "capital of France?", "answer": "Paris", "prompt_text": "", "prompt_ids": [1],
         "source": "s"}]


def test_the_example_reward_is_one_file_and_one_config_entry(tmp_path, monkeypatch):
    (tmp_path / "my_rewards").mkdir()
    (tmp_path / "my_rewards" / "exact.py").write_text(block("reward") + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = yaml.safe_load(block("reward-config"))["model"]["reward"]
    reward = build_reward(entry["class_path"], entry["init_args"])
    traj = make_batch([0.0] * 4, [0] * 4, truncated=[False, False, False, True],
                      texts=["It is\nparis", "It is\nLyon", "Paris, I think", "It is\nParis"])
    score_trajectories(reward, traj, ROWS)
    assert traj.rewards.tolist() == [1.0, 0.0, 0.0, 0.0]  # last line only, any case; a cut response scores 0
    assert traj.correct.tolist() == [True, False, False, False]
