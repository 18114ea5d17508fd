"""Which prompt groups and trajectories leave the loss, how an overlong response is treated, and how a step whose
groups were dropped draws more prompts: ``model.filters``.

Every rule is off by default. The rules themselves are pure functions in ``zerotir.filters``; this group holds
their switches and thresholds, checks them, and checks them against the groups they depend on
(``check_run``: the reference model of ``model.rl``, the budget of ``model.sampling``, the tool of ``model.tool``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal

from zerotir.config.checks import check_choice, check_min
from zerotir.config.refill import RefillConfig
from zerotir.config.rl import RLConfig
from zerotir.config.rollout import SamplingConfig, ToolConfig

Overlong = Literal["none", "mask", "soft_penalty"]
# The rules that read the code and output blocks of a response (they need a tool that runs code).
BLOCK_RULES = ("shortcut", "code_mismatch", "void_turn")


@dataclass(frozen=True)
class FilterConfig:
    """The pass-rate rule, trajectory filters, overlong handling, correct-with-errors downsampling and refill
    (``model.filters``); a removed trajectory leaves the loss and its group's baseline (docs/training.md, "Trajectory
    filters")."""

    infra_failed: bool = True
    """Remove a trajectory whose tool call or score failed for a reason that is not the model's (the sandbox service
    or a tool failed: status sandbox_error / tool_error; the reward could not judge it: a judge that did not answer),
    so it is neither trained on as a wrong answer nor counted in its group's baseline or pass rate; a group it leaves
    with fewer than 2 trajectories is removed too. Counted as filter/infra_failed_fraction; the sandbox guard still
    stops a run whose failures persist (model.tool.sandbox.max_error_rate). false: such trajectories train with the
    score they got."""
    pass_rate: bool = False
    """Drop the prompt groups whose pass rate (the share of correct samples, as model.reward judges them: the mean
    reward with the math reward's 0 / 1 scores, over all n samples of the prompt) lies outside
    [pass_rate_low, pass_rate_high]: an all-right or all-wrong group has no signal for a group baseline (ZeroTIR's
    filter; zerotir.filters.pass_rate). The one rule that drops whole groups, so the one refill draws more for."""
    pass_rate_low: float = 0.01
    """pass_rate: the smallest group mean reward kept (inclusive); 0.01 drops all-wrong groups for any n <= 100."""
    pass_rate_high: float = 0.99
    """pass_rate: the largest group mean reward kept (inclusive); 0.99 drops all-right groups for any n <= 100."""
    min_keep_groups: int = 1
    """pass_rate: a step where fewer prompt groups pass (over all ranks) keeps nothing: its update is skipped."""
    overlong_wrong: bool = False
    """Remove a wrong trajectory whose response reached the token budget or was truncated (the paper's code)."""
    shortcut: bool = False
    """Remove a correct trajectory whose code blocks, closed blocks and output blocks do not all agree in number: a
    block without its output, an output without its block (the paper's code)."""
    code_mismatch: bool = False
    """Remove a trajectory with a valid final answer (it stopped, with a last \\boxed{}) whose block counts disagree
    while at least one execution succeeded (the paper's code)."""
    void_repetition: bool = False
    """Remove a trajectory without a valid final answer whose repeat score is above void_repetition_threshold: a
    repetition loop (the paper's code)."""
    void_repetition_threshold: float = 0.2
    """The repeat score (zerotir.eval.text_metrics.repeat_score) above which void_repetition removes; in (0, 1)."""
    void_turn: bool = False
    """Remove a trajectory with a void turn: a turn of the model that ended with neither a closed code block nor a
    \\boxed{} answer (SimpleTIR); a last turn cut by the budget is not void."""
    perplexity: bool = False
    """Remove a trajectory whose response perplexity under the reference (base) model is above
    perplexity_threshold (the paper's code); needs the reference, model.rl.kl_coef > 0."""
    perplexity_threshold: float = 5.0
    """exp(-mean reference log-prob of the sampled tokens) above which perplexity removes; > 1."""
    overlong: Overlong = "none"
    """What a long response does: "none"; "mask" (a truncated response leaves the loss, TRL's
    mask_truncated_completions); "soft_penalty" (DAPO: the reward falls linearly over the last overlong_buffer
    tokens of the budget, to -overlong_penalty at the budget)."""
    overlong_buffer: int = 512
    """soft_penalty: the last tokens of model.sampling.max_response_tokens over which the penalty grows."""
    overlong_penalty: float = 1.0
    """soft_penalty: the penalty at the budget (> 0); the reward gets -overlong_penalty x (length - (budget -
    overlong_buffer)) / overlong_buffer, clipped to [-overlong_penalty, 0]."""
    roc: bool = False
    """Correct-with-errors downsampling (GRPO-RoC, rStar2-Agent): in each prompt group every failed trajectory and
    every clean correct one stays; correct ones with tool errors or a bad answer format are dropped, the noisiest
    first, beyond roc_correct_keep of the group's correct trajectories."""
    roc_correct_keep: float = 0.5
    """roc: the share of a group's correct trajectories kept (at least every clean one); in [0, 1]."""
    refill: RefillConfig = RefillConfig()
    """Dynamic sampling: a step whose filters drop prompt groups draws more prompts, up to max_rounds rounds; and how
    many steps in a row may train nothing before the run stops (zerotir.rl.refill)."""

    def __post_init__(self) -> None:
        check_choice("filters", "overlong", self.overlong, Overlong)
        if not 0 < self.void_repetition_threshold < 1:
            raise ValueError(f"model.filters.void_repetition_threshold={self.void_repetition_threshold}: must be in "
                             f"(0, 1) (a repeat score is in [0, 1); the paper's code uses 0.2)")
        if not self.perplexity_threshold > 1:
            raise ValueError(f"model.filters.perplexity_threshold={self.perplexity_threshold}: must be > 1 (a "
                             f"perplexity is >= 1; the paper's code uses 5)")
        if self.overlong_buffer < 1:
            raise ValueError(f"model.filters.overlong_buffer={self.overlong_buffer}: must be >= 1 token")
        if not self.overlong_penalty > 0:
            raise ValueError(f"model.filters.overlong_penalty={self.overlong_penalty}: must be > 0")
        if not 0 <= self.roc_correct_keep <= 1:
            raise ValueError(f"model.filters.roc_correct_keep={self.roc_correct_keep}: must be in [0, 1]")
        if self.pass_rate_low > self.pass_rate_high:
            raise ValueError(f"model.filters.pass_rate_low={self.pass_rate_low} is above pass_rate_high="
                             f"{self.pass_rate_high}: no group could pass; lower pass_rate_low or raise pass_rate_high")
        check_min("filters", self, ("min_keep_groups",), 1)
        self._check_unused()
        if self.refill.enabled and not self.pass_rate:
            raise ValueError(f"model.filters.refill.max_rounds={self.refill.max_rounds}: a step draws more prompts "
                             "when its filters drop prompt groups, and no rule here drops a group (model.filters."
                             "pass_rate is false), so a step would never refill; set model.filters.pass_rate: true, "
                             "or model.filters.refill.max_rounds: 1")

    def _check_unused(self) -> None:
        """A threshold set away from its default for a rule that is off cannot apply: say which switch it needs."""
        defaults = {f.name: f.default for f in fields(FilterConfig)}
        needs = (("pass_rate_low", self.pass_rate, "pass_rate: true"),
                 ("pass_rate_high", self.pass_rate, "pass_rate: true"),
                 ("min_keep_groups", self.pass_rate, "pass_rate: true"),
                 ("void_repetition_threshold", self.void_repetition, "void_repetition: true"),
                 ("perplexity_threshold", self.perplexity, "perplexity: true"),
                 ("overlong_buffer", self.overlong == "soft_penalty", "overlong: soft_penalty"),
                 ("overlong_penalty", self.overlong == "soft_penalty", "overlong: soft_penalty"),
                 ("roc_correct_keep", self.roc, "roc: true"))
        for name, on, switch in needs:
            value = getattr(self, name)
            if not on and value != defaults[name]:
                raise ValueError(f"model.filters.{name}={value} applies only with {switch}; set that, or remove "
                                 f"{name}")

    @property
    def trajectory_rules(self) -> tuple[str, ...]:
        """The names of the switched-on rules that judge one trajectory by itself (``zerotir.filters.trajectory``)."""
        switches = (("overlong_wrong", self.overlong_wrong), ("shortcut", self.shortcut),
                    ("code_mismatch", self.code_mismatch), ("void_repetition", self.void_repetition),
                    ("void_turn", self.void_turn))
        return tuple(name for name, on in switches if on)

    @property
    def row_rules(self) -> bool:
        """Any rule that judges single trajectories is on: a trajectory rule, infrastructure failures, perplexity,
        overlong handling or downsampling (else the step's decision is the pass-rate rule's, or none)."""
        return (bool(self.trajectory_rules) or self.infra_failed or self.perplexity or self.overlong != "none"
                or self.roc)

    def check_run(self, rl: RLConfig, sampling: SamplingConfig, tool: ToolConfig) -> None:
        """The cross-group checks: each rule that cannot apply with the other groups fails here, naming the fix.

        The perplexity rule reads the reference model's log-probs, and the reference is loaded only with
        ``model.rl.kl_coef > 0``. The soft penalty's buffer lies inside the response budget. The block rules count
        code and output blocks, so they need a tool that runs code and an output block with an opening marker.
        """
        if self.perplexity and rl.kl_coef == 0:
            raise ValueError("model.filters.perplexity=true with model.rl.kl_coef=0: the rule reads the reference "
                             "model's log-probs, and kl_coef 0 loads no reference; set model.rl.kl_coef > 0 (e.g. "
                             "0.001) or model.filters.perplexity: false")
        if self.overlong == "soft_penalty" and self.overlong_buffer >= sampling.max_response_tokens:
            raise ValueError(f"model.filters.overlong_buffer={self.overlong_buffer} with model.sampling."
                             f"max_response_tokens={sampling.max_response_tokens}: the buffer is the last tokens of "
                             f"the budget, so it must be smaller; lower overlong_buffer")
        block_rules = [name for name in BLOCK_RULES if name in self.trajectory_rules]
        if block_rules and not tool.enabled:
            raise ValueError(f"model.filters.{'/'.join(block_rules)}=true with model.tool.max_tool_calls=0: these "
                             f"rules count executed code blocks and their outputs, and no code runs; turn them off "
                             f"or allow tool calls")
        if block_rules:
            from zerotir.tools.formats import format_label, markers  # the tools import no config: no cycle

            if not markers(tool)[2]:
                raise ValueError(f"model.filters.{'/'.join(block_rules)}=true with model.tool.format="
                                 f"{format_label(tool.format)!r}, whose output block has no opening marker "
                                 f"(model.tool.output_template={tool.output_template!r} with fences): an output block "
                                 f"must open with a marker (e.g. ```output) for its blocks to be counted; add one or "
                                 f"turn the rules off")
