"""Learning through the simulator: the analytic-gradient trainer, policies,
checkpoints (no ROS imports here)."""
from .apg import TrainConfig, TrainResult, evaluate, train, write_history
from .policy import MLPPolicy, RunningNorm, ValueNet
from .ppo import PPOConfig, train_ppo
from .sac import SACConfig, train_sac

__all__ = ["PPOConfig", "train_ppo", "SACConfig", "train_sac", "TrainConfig", "TrainResult", "evaluate", "train",
           "write_history", "MLPPolicy", "RunningNorm", "ValueNet"]
