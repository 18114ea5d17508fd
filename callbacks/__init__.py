"""Lightning callbacks of zerotir: they observe and schedule, never compute a loss."""

from callbacks.interrupt import SaveOnInterrupt
from callbacks.pass_rate_filter import PassRateFilter
from callbacks.progress import RLStepProgressBar
from callbacks.resumed_curves import PurgeResumedSteps
from callbacks.rollout_dumper import RolloutDumper
from callbacks.scaling_metrics import ScalingMetrics, rollout_metrics

__all__ = ["PassRateFilter", "PurgeResumedSteps", "RLStepProgressBar", "RolloutDumper", "SaveOnInterrupt",
           "ScalingMetrics", "rollout_metrics"]
