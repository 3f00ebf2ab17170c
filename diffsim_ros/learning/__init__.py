"""Learning through the simulator.

The analytic-gradient trainer, policies and checkpoints (no ROS imports here).
"""
from .apg import TrainConfig, evaluate, train
from .policy import MLPPolicy, RunningNorm, ValueNet
from .ppo import PPOConfig, train_ppo
from .run import TrainResult, write_history
from .sac import SACConfig, train_sac

__all__ = ["PPOConfig", "train_ppo", "SACConfig", "train_sac", "TrainConfig", "TrainResult", "evaluate", "train",
           "write_history", "MLPPolicy", "RunningNorm", "ValueNet"]
