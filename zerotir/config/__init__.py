"""The typed configuration groups of a run: ``model.base`` (with ``model.base.lora``), ``model.rl``, ``model.optim``,
``model.tool`` (with ``model.tool.sandbox``), ``model.sampling``, ``model.eval``, ``model.hosts``,
``model.filters`` (with ``model.filters.refill``) and ``model.rollout`` (the engine: ``HFRollout`` or ``VLLMRollout``).

Each group is a frozen dataclass whose field docstrings are the ``--help`` text of the command line (the CLI turns
attribute docstrings on), and whose ``__post_init__`` is the one place its fields are checked: a bad value raises a
``ValueError`` that names the field as it is written in a config (``model.rl.clip_low``) and the fix. Defaults live
here and nowhere else; ``python -m zerotir fit --print_config`` prints every group with them.

The groups live in modules of one idea each (``base``: the base model; ``rl``: the algorithm and the optimizer;
``rollout``: tool, sampling, evaluation, sandbox; ``backends``: the engines of ``model.rollout``; ``hosts``: the engine
hosts of asynchronous rollouts; ``refill``; ``filters``; ``checks``: what they share) and are used by these names,
``zerotir.config.<Group>``, which the configs' ``class_path`` values name too.

Nothing here imports torch, Lightning or the engines: the groups are plain data.
"""

from zerotir.config.base import BaseModelConfig, Dtype
from zerotir.config.backends import DEFAULT_TOKENS_PER_CALL, HFRollout, RolloutBackend, ScheduleKind, VLLMRollout
from zerotir.config.checks import as_plain, check_sampling
from zerotir.config.filters import FilterConfig, Overlong
from zerotir.config.hosts import HostsConfig
from zerotir.config.lora import LoraConfig
from zerotir.config.refill import RefillConfig
from zerotir.config.rl import (
    GROUP_ALGORITHMS, MASKING_CORRECTIONS, Algorithm, GAEInjected, KLEstimator, LossAggMode, OffPolicyCorrection,
    OptimConfig, Optimizer, RLConfig,
)
from zerotir.config.rollout import EVAL_SAMPLING, EvalConfig, SamplingConfig, SandboxConfig, ToolConfig

__all__ = [
    "DEFAULT_TOKENS_PER_CALL", "EVAL_SAMPLING", "GROUP_ALGORITHMS", "MASKING_CORRECTIONS", "Algorithm",
    "BaseModelConfig", "Dtype", "EvalConfig", "FilterConfig", "HostsConfig",
    "GAEInjected", "HFRollout", "KLEstimator", "LoraConfig", "LossAggMode", "OffPolicyCorrection", "OptimConfig", "Optimizer",
    "Overlong", "RLConfig", "RefillConfig", "RolloutBackend", "SamplingConfig", "SandboxConfig",
    "ScheduleKind", "ToolConfig", "VLLMRollout", "as_plain", "check_sampling",
]
