"""``benchmarks/lora_toy.py``'s rule on hand-made run records, and the fit command of ``toy_emergence.train_run``
it runs: a checkpoint at every validation, for the final evaluation."""

from benchmarks import lora_toy


def record(arm: str, seed: int, step: int | None, max_steps: int = 60) -> dict:
    """A run as ``lora_toy.main`` stores it: reached at ``step`` (None: never)."""
    return {"arm": arm, "seed": seed, "max_steps": max_steps, "reached": step is not None, "steps_to_target": step,
            "final_rows": 256, "final_accuracy": 0.85, "final_code_rate": 0.95}


def runs(full: list[int | None], lora: list[int | None]) -> list[dict]:
    return [record("full", s, f) for s, f in enumerate(full)] + [record("lora", s, x) for s, x in enumerate(lora)]


def test_lora_reaching_in_every_seed_is_reproduced_and_more_steps_is_slower():
    result = lora_toy.finding(runs([10, 10, 15], [20, 15, 15]))
    assert result["verdict"] == "reproduced"
    assert result["speed"] == "LoRA slower"  # +10, +5, 0: more steps in 2 of 3 seeds, +5 on average
    assert "LoRA minus full steps per seed +10, +5, +0" in result["evidence"]


def test_a_run_that_never_reaches_counts_its_max_steps():
    # LoRA misses in seed 1: 60 steps (a lower bound) against full's 10, the other seeds tie
    result = lora_toy.finding(runs([10, 10, 10], [10, None, 10]))
    assert result["verdict"] == "mixed"
    assert "+0, +50, +0" in result["evidence"]
    assert result["speed"] == "no difference at the resolution"  # slower in 1 of 3 seeds only
    assert lora_toy.finding(runs([10, 10], [None, None]))["verdict"] == "not reproduced"


def test_fewer_steps_in_most_seeds_and_on_average_is_faster():
    assert lora_toy.finding(runs([20, 20, 10], [10, 15, 15]))["speed"] == "LoRA faster"  # -10, -5, +5
    assert lora_toy.finding(runs([20, 20, 10], [15, 15, 30]))["speed"] == "no difference at the resolution"  # mean +3


def test_only_seeds_with_both_arms_are_compared():
    result = lora_toy.finding(runs([10, 10, 10], [10]))
    assert result["seeds"] == [0]
    assert lora_toy.finding(runs([10], []))["verdict"] == "not measured"


def test_every_validation_has_its_checkpoint_for_the_final_evaluation():
    """A run stops at a validation and ``zerotir test`` reads its ``last.ckpt``: with checkpoints every 5 steps (the
    config's) and validations every step, a stop at step 8 evaluated step 5's weights."""
    from benchmarks.toy_emergence import fit_args, parse_args

    args = parse_args(["--val_every", "3"])
    fit = fit_args(args, "reinforce_pp_lora", 1, [])
    assert fit[fit.index("--trainer.val_check_interval") + 1] == "3"
    assert fit[fit.index("--checkpoint.every_n_train_steps") + 1] == "3"
