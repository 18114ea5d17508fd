"""``benchmarks.rollout_dump`` drives the real ``RolloutDumper`` with outputs of the shape ``training_step`` returns."""

from benchmarks import rollout_dump


def test_a_small_step_is_dumped(capsys):
    rollout_dump.measure("tiny", rows=16, chars=120, repeats=1, token_samples=4)  # with per-token records
    line = capsys.readouterr().out
    assert line.startswith("tiny") and "hook" in line and "MiB" in line


def test_make_rollout_is_a_step_result():
    outputs = rollout_dump.make_rollout(16, 120, seed=0, step=3)
    result = outputs["step"]
    assert result.rl_step == 3 and len(result.rollout.response_texts) == 16
    assert len(result.batch.prompts) == len(result.batch.problem_ids) == 1  # 16 rows = one group of 16
    assert result.batch.sources == ["bench"] and bool(result.kept.all())
