"""Tests of the toy-base schedule, loop and copy probe."""

import pytest
import torch

from zerotir.toy.probe import build_probe, run_probe
from zerotir.toy.tasks import heldout_set
from zerotir.toy.tokenizer import build_byte_tokenizer
from zerotir.toy.train_loop import LoopSettings, Schedule, train

TOK = build_byte_tokenizer()


def _text(row: torch.Tensor) -> str:
    return TOK.decode([t for t in row.tolist() if t])


def test_schedule_hand_worked():
    s = Schedule(lr=1e-3, warmup_steps=10, decay_steps=20, max_steps=100)
    assert s.decay_start == 80 and s.end == 100
    assert s.lr_at(0) == pytest.approx(1e-4)  # warmup: (0 + 1) / 10 of the peak
    assert s.lr_at(9) == pytest.approx(1e-3)
    assert s.lr_at(79) == pytest.approx(1e-3)  # held until the decay
    assert s.lr_at(90) == pytest.approx(1e-3 * (0.1 + 0.9 * 10 / 20))  # half way down
    s.start_decay(40, "probe")
    assert (s.decay_start, s.end, s.decay_reason) == (40, 60, "probe")
    assert s.lr_at(50) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5))
    s.start_decay(55, "probe")  # the decay has begun: no change
    assert (s.decay_start, s.decay_reason) == (40, "probe")


class _Oracle(torch.nn.Module):
    """A 'model' whose logits put all mass on the true next token of the probe documents it was built from."""

    def __init__(self, ids: torch.Tensor, wrong_rows: int = 0):
        super().__init__()
        self.ids, self.wrong_rows = ids, wrong_rows

    def forward(self, input_ids):
        nxt = torch.roll(self.ids, -1, dims=1)
        nxt[: self.wrong_rows] = 0  # these rows predict padding everywhere: nothing copied
        logits = torch.nn.functional.one_hot(nxt, len(TOK)).float()
        return type("Out", (), {"logits": logits})()


def test_probe_counts_exact_copies():
    probe = build_probe(8, seed=0, exclude=set(), tokenizer=TOK)
    assert run_probe(_Oracle(probe.input_ids), probe) == {"code": 1.0, "box": 1.0, "both": 1.0}
    assert run_probe(_Oracle(probe.input_ids, wrong_rows=3), probe)["both"] == 5 / 8
    # The spans are the question inside print(...) and the answer inside \boxed{...}.
    row = probe.input_ids[0]
    a, b = probe.code_spans[0]
    assert _text(row[:a]).endswith("print(") and _text(row[b : b + 1]) == ")"
    assert any(op in _text(row[a:b]) for op in (" * ", " + "))  # the whole question, operators included
    a, b = probe.box_spans[0]
    assert _text(row[:a]).endswith("\\boxed{") and _text(row[b : b + 1]) == "}" and _text(row[a:b]).isdigit()


def test_probe_never_uses_heldout_questions():
    held = {q.problem for q in heldout_set(256)}
    free = build_probe(64, seed=3, exclude=set(), tokenizer=TOK)
    asked = {_text(row[a:b]) for row, (a, b) in zip(free.input_ids, free.code_spans, strict=True)}
    probe = build_probe(64, seed=3, exclude=asked, tokenizer=TOK)  # excluding what it would ask forces other questions
    assert not asked & {_text(row[a:b]) for row, (a, b) in zip(probe.input_ids, probe.code_spans, strict=True)}
    assert held  # the real runs pass the held-out set as ``exclude``


def test_loop_decays_when_the_probe_passes():
    """With a probe that passes at once, the decay starts at the first probe and the run ends decay_steps later."""
    probe = build_probe(4, seed=0, exclude=set(), tokenizer=TOK)
    model = torch.nn.Linear(1, 1)  # stands in for the LM: the loop only needs .parameters() and a loss

    class LM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = model

        def forward(self, input_ids, labels=None):
            if labels is None:
                return _Oracle(probe.input_ids)(input_ids)
            loss = self.inner(torch.ones(1, 1)).pow(2).sum()
            return type("Out", (), {"loss": loss})()

    sched = Schedule(lr=1e-2, warmup_steps=1, decay_steps=3, max_steps=50)
    rows = iter(lambda: torch.ones(2, 4, dtype=torch.long), None)
    rec = train(LM(), rows, sched, LoopSettings(pad_id=0, probe_every=2, probe_threshold=0.5, show_progress=False),
                probe)
    assert (sched.decay_start, sched.decay_reason, sched.end) == (2, "probe", 5)
    assert len(rec.losses) == 5 and [s for s, _ in rec.probes] == [2] and rec.tokens == 5 * 8


def test_the_schedule_does_not_depend_on_wall_time(monkeypatch):
    """A machine so loaded that every step takes an hour builds the same base: the decay starts when the probe
    passes, the run ends decay_steps later (no time budget moves or cuts it)."""
    import zerotir.toy.train_loop as loop

    clock = iter(range(0, 10**9, 3600))
    monkeypatch.setattr(loop.time, "monotonic", lambda: float(next(clock)))
    probe = build_probe(4, seed=0, exclude=set(), tokenizer=TOK)
    passes_at = 6

    class LM(torch.nn.Module):
        """Copies the probe exactly from the sixth step on; its loss is a dummy."""

        def __init__(self):
            super().__init__()
            self.inner, self.steps = torch.nn.Linear(1, 1), 0

        def forward(self, input_ids, labels=None):
            if labels is None:
                return _Oracle(probe.input_ids, wrong_rows=0 if self.steps >= passes_at else 4)(input_ids)
            self.steps += 1
            return type("Out", (), {"loss": self.inner(torch.ones(1, 1)).pow(2).sum()})()

    sched = Schedule(lr=1e-2, warmup_steps=1, decay_steps=4, max_steps=50)
    rows = iter(lambda: torch.ones(2, 4, dtype=torch.long), None)
    rec = train(LM(), rows, sched, LoopSettings(pad_id=0, probe_every=2, probe_threshold=0.5, show_progress=False),
                probe)
    assert (sched.decay_start, sched.decay_reason, sched.end) == (passes_at, "probe", passes_at + 4)
    assert len(rec.losses) == passes_at + 4 and [s for s, _ in rec.probes] == [2, 4, 6]


def test_a_time_limit_stops_the_build_with_a_message_instead_of_reshaping_it(monkeypatch):
    import zerotir.toy.train_loop as loop

    clock = iter(range(0, 10**9, 25))  # 25 s per reading: the one-minute limit passes after three steps
    monkeypatch.setattr(loop.time, "monotonic", lambda: float(next(clock)))
    sched = Schedule(lr=1e-2, warmup_steps=1, decay_steps=3, max_steps=50)
    model = torch.nn.Linear(1, 1)

    class LM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = model

        def forward(self, input_ids, labels=None):
            return type("Out", (), {"loss": self.inner(torch.ones(1, 1)).pow(2).sum()})()

    rows = iter(lambda: torch.ones(2, 4, dtype=torch.long), None)
    with pytest.raises(loop.TimeLimitReached, match=r"toy_base.minutes=1 .* at step 2 of 50, before the decay.*"
                                                   r"none is written"):
        train(LM(), rows, sched, LoopSettings(pad_id=0, probe_every=100, probe_threshold=0.5, show_progress=False,
                                             minutes=1.0), None)
    assert (sched.decay_start, sched.decay_reason) == (47, "max_steps")  # the schedule was never moved


def test_progress_through_a_pipe_prints_probe_results_and_step_lines(capsys):
    """Without a terminal the loop prints lines (not one rich frame at the end): each copy probe's result, the
    decay's start, and the step count with the loss (every 100 steps, at least every 10 s, and the last)."""
    probe = build_probe(4, seed=0, exclude=set(), tokenizer=TOK)

    class LM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = torch.nn.Linear(1, 1)

        def forward(self, input_ids, labels=None):
            if labels is None:
                return _Oracle(probe.input_ids)(input_ids)
            return type("Out", (), {"loss": self.inner(torch.ones(1, 1)).pow(2).sum()})()

    sched = Schedule(lr=1e-2, warmup_steps=1, decay_steps=3, max_steps=50)
    rows = iter(lambda: torch.ones(2, 4, dtype=torch.long), None)
    train(LM(), rows, sched, LoopSettings(pad_id=0, probe_every=2, probe_threshold=0.5, show_progress=True), probe)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("toy-base: step 2 copy probe ") and "both 1.00" in lines[0]
    assert lines[1] == "toy-base: copy probe passed at step 2; decaying until step 5"
    assert lines[-1].startswith("toy-base 5/5 | loss ")
