"""TensorBoard tag names, defined once: written by ``callbacks.scaling_metrics`` and the module, read by
``zerotir.scaling.report`` and the tests. The metrics table of docs/metrics.md documents each one.
"""

# Rollout statistics, one value per RL step, over all trajectories of the step (before pass-rate filtering).
REWARD_MEAN = "rollout/reward_mean"  # raw reward average (paper: raw reward avg)
ACCURACY = "rollout/accuracy"  # share of trajectories with a correct final answer
TOOL_CALL_RATE = "rollout/tool_call_rate"  # share of responses with >= 1 call to any tool (paper: code proportion)
TOOL_IN_CORRECT = "rollout/tool_in_correct"  # share of correct responses with >= 1 tool call (paper: code in correct)
CALLS_PER_RESPONSE = "rollout/calls_per_response"  # mean tool calls per response (paper: code count avg)
CALLS_HIST = "rollout/calls"  # histogram of calls per response
RESPONSE_LENGTH = "rollout/response_length"  # mean response tokens (sampled + injected)
REPEAT_SCORE = "rollout/repeat_score"  # mean repetition score in [0, 1] (paper: avg repeat score)
EXEC_ERROR_RATE = "rollout/exec_error_rate"  # the model's faulty calls (code that raised, an invalid call), per call
TIMEOUT_RATE = "rollout/timeout_rate"  # calls stopped at a limit, per call
SANDBOX_ERROR_RATE = "rollout/sandbox_error_rate"  # calls the python tool's sandbox failed to run, per call
TRUNCATION_RATE = "rollout/truncation_rate"  # share of responses that hit the token budget
# Count of correct trajectories of the step with exactly k calls (k = 0, 1, 2) or 3 and more.
CORRECT_BY_CALLS = ("rollout/correct_calls_0", "rollout/correct_calls_1", "rollout/correct_calls_2",
                    "rollout/correct_calls_3plus")
# Per tool of model.tool.tools, over the step's tool calls (zerotir.tools.stats): f"tools/{tool}/{metric}". calls;
# errors (the model's: status error or invalid) and timeouts per call; latency, mean wall seconds per call; failures
# (the tool or the sandbox failed) per call. Calls that reached no tool (status invalid: malformed, a name no tool
# has, arguments off its schema) count under INVALID_TOOL (zerotir.tools.stats.tool_label), whatever name they wrote.
TOOL_METRICS = ("calls", "errors", "timeouts", "failures", "latency")
INVALID_TOOL = "invalid"
# The share of the step's trajectories with a tool call or a score that failed for infrastructure reasons (a dead
# sandbox, a tool that raised, a judge that did not answer: Trajectories.infra_failed), whether or not
# model.filters.infra_failed keeps them out of the loss.
TOOLS_INFRA_FAILED = "tools/infra_failed_fraction"


def tool_tag(tool: str, metric: str) -> str:
    """The tag of ``metric`` (one of ``TOOL_METRICS``) for the tool named ``tool``."""
    return f"tools/{tool}/{metric}"


# Tool choice (zerotir.choice_metrics), per RL step. Per first-call label (a tool's name, "none" for an answer without
# a call, "invalid" for a first call that named no tool): tools/<label>/first, the share of the step's answers whose
# first call it is. Per question kind of the rows (rows with a ``kind`` field only): kinds/<kind>/accuracy,
# kinds/<kind>/calls_per_response, kinds/<kind>/answers (count), kinds/<kind>/two_tools_in_correct (share of its
# correct answers that called two different tools or more; 0 without a correct one) and kinds/<kind>/first_<label>
# (share of that kind's answers).
FIRST_CALL = "first"
NO_CALL = "none"
KIND_METRICS = ("accuracy", "calls_per_response", "answers", "two_tools_in_correct")


def kind_tag(kind: str, metric: str) -> str:
    """The tag of ``metric`` (one of ``KIND_METRICS``, or ``first_<label>``) for question kind ``kind``."""
    return f"kinds/{kind}/{metric}"


KEPT_FRACTION = "filter/kept_fraction"  # share of prompt groups kept by the pass-rate rule
# Share of the step's trajectories each removal rule matched (model.filters; zerotir.filters.decide.REMOVAL_NAMES):
# "filter/<name>_fraction".
FILTER_NAMES = ("infra_failed", "pass_rate", "overlong_wrong", "shortcut", "code_mismatch", "void_repetition", "void_turn",
                "truncated", "roc", "perplexity")
FILTER_FRACTIONS = {name: f"filter/{name}_fraction" for name in FILTER_NAMES}
# How the step's batch was filled (model.filters.refill), per step: generation rounds, prompts drawn from the stream,
# steps so far whose refill rounds ran out before the batch was full (refill runs only), consecutive steps without an
# update.
GENERATION_ROUNDS = "filter/generation_rounds"
PROMPTS_CONSUMED = "filter/prompts_consumed"
EXHAUSTED_STEPS = "filter/exhausted_steps"
EMPTY_STEPS_IN_A_ROW = "filter/empty_steps_in_a_row"

# Update statistics.
KL = "train/kl"
ENTROPY = "train/entropy"
POLICY_LOSS = "train/policy_loss"
VALUE_LOSS = "train/value_loss"
CLIP_FRACTION = "train/clip_fraction"
DUAL_CLIP_FRACTION = "train/dual_clip_fraction"  # share of action tokens at the dual-clip bound
GRAD_NORM = "train/grad_norm"
ENGINE_LOGPROB_DIFF = "train/engine_logprob_diff"  # mean |trainer - engine| log-prob of the sampled tokens
IS_RATIO_MEAN = "train/is_ratio_mean"  # mean exp(trainer - engine) log-prob ratio on action tokens, before any cap
IS_CAPPED_FRACTION = "train/is_capped_fraction"  # share of action tokens whose ratio exceeds model.rl.is_cap
IS_WEIGHT_MEAN = "train/is_weight_mean"  # mean off-policy weight of the policy loss (1 without correction)
IS_SEQ_CAPPED_FRACTION = "train/is_seq_capped_fraction"  # share of sequences whose product of ratios exceeds is_cap
IS_MASKED_FRACTION = "train/is_masked_fraction"  # share of action tokens the correction weighs 0 (dropped / rejected)
IS_SEQ_MASKED_FRACTION = "train/is_seq_masked_fraction"  # share of sequences with at least one such token
# Engine vs trainer on the action tokens (zerotir.rl.mismatch), whatever the correction, when top_p is 1.
MISMATCH_KL = "train/mismatch_kl"  # k3 estimate of KL(engine || trainer), token mean
MISMATCH_CHI2 = "train/mismatch_chi2"  # token-level chi-square E_engine[ratio^2] - 1
MISMATCH_ENGINE_PPL = "train/mismatch_engine_ppl"  # exp(-token mean of the engine's log-probs)
MISMATCH_TRAINER_PPL = "train/mismatch_trainer_ppl"  # exp(-token mean of the trainer's log-probs)
LEARNING_RATE = "train/lr"

# Wall time of each phase of an RL step, seconds.
TIME_GENERATION = "time/generation"
TIME_SANDBOX = "time/sandbox"
TIME_REWARD = "time/reward"
TIME_UPDATE = "time/update"
TIME_WEIGHT_SYNC = "time/weight_sync"
TIME_STEP = "time/step"
TIME_WAIT_ROLLOUT = "time/wait_for_rollout"  # the trainer waiting for the engine host's batch (asynchronous pipeline)
TIME_WAIT_TRAINER = "time/wait_for_trainer"  # the engine host waiting at the capacity rule before starting this batch

# The asynchronous pipeline (model.hosts): weight versions the batch's sampled tokens lag the trainer's weights.
STALENESS_MEAN = "pipeline/staleness_mean"
STALENESS_MAX = "pipeline/staleness_max"
# The rollout fleet (model.hosts): engine processes restarted so far, and the size of the step's weight push.
FLEET_RESTARTS = "pipeline/fleet_restarts"
PUSH_MB = "pipeline/push_mb"
# The fleet's engines since they started, the mean over engines: the share of wall time with a rollout in flight,
# and (streaming) the mean trajectories in flight over model.hosts.max_in_flight, over all the time and over the
# time at least one prompt group waited to be admitted (work there was).
FLEET_BUSY = "pipeline/fleet_busy"
FLEET_FILL = "pipeline/fleet_fill"
FLEET_FILL_WAITING = "pipeline/fleet_fill_waiting"
# Streaming, where each step takes the prompt groups that have ended: groups dropped over the staleness bound and
# generated again (so far), and the stream batches the step's groups came from.
FLEET_REGENERATED = "pipeline/fleet_regenerated"
FLEET_SPREAD = "pipeline/fleet_spread"
# Streaming: prompt groups in flight aborted at a weight push since the last step (over the staleness bound: they
# could train at no later step) and generated again, and the tokens their finished segments had sampled (wasted).
FLEET_ABORTED_GROUPS = "pipeline/fleet_aborted_groups"
FLEET_ABORTED_TOKENS = "pipeline/fleet_aborted_tokens"

# Evaluation (validation during training, and `zerotir test`), prefixed by the benchmark name: f"{name}/{tag}".
EVAL_ACCURACY = "accuracy"  # mean over k samples (avg@k)
EVAL_PASS_AT_K = "pass_at_k"
EVAL_TOOL_CALL_RATE = "tool_call_rate"  # share of responses with >= 1 call to any tool
EVAL_CALLS_PER_RESPONSE = "calls_per_response"
EVAL_RESPONSE_LENGTH = "response_length"
EVAL_SANDBOX_ERROR_RATE = "sandbox_error_rate"
EVAL_TRUNCATION_RATE = "truncation_rate"
# The tags every benchmark logs (its per-tool calls aside), in the order of its reports.
EVAL_METRICS = (EVAL_ACCURACY, EVAL_PASS_AT_K, EVAL_TOOL_CALL_RATE, EVAL_CALLS_PER_RESPONSE, EVAL_RESPONSE_LENGTH,
                EVAL_SANDBOX_ERROR_RATE, EVAL_TRUNCATION_RATE)
# One tool's calls per response: f"{EVAL_TOOL_CALLS}/{tool}" (eval_tool_tag).
EVAL_TOOL_CALLS = "tool_calls_per_response"


def eval_tool_tag(tool: str) -> str:
    """The evaluation key of the calls per response of the tool named ``tool`` (unnamed calls: ``INVALID_TOOL``)."""
    return f"{EVAL_TOOL_CALLS}/{tool}"
