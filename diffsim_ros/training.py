"""One training path for ``diffsim-ros train`` and the ``train_node`` ROS node.

    task, result, files = train_from_params(config.load_yaml(path), path, "runs/hover")

Builds the task from the parameter mapping of a training file (config/<task>.yaml),
trains by gradients through the simulator (``learning.apg.train``) and writes the
checkpoint (``save_checkpoint``) with the training summary and the whole parameter
set, so that a controller can rebuild the task exactly from the checkpoint alone.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, Optional, Union


def train_from_params(params: Dict[str, Any], source: str, out: Union[str, os.PathLike],
                      overrides: Optional[Dict[str, Any]] = None, callback=None, progress: bool = False,
                      task=None):
    """Train on ``params`` (read from ``source``) into ``out``; returns (task, result, files).

    ``overrides`` replace entries of the ``training`` section (None values are ignored);
    ``task``: an already built task for these parameters (else it is built here)."""
    from . import config
    from .learning.apg import TrainConfig, train
    from .learning.checkpoint import json_safe, save_checkpoint, training_summary

    if task is None:
        config.check_keys(params, config.TRAINING_FILE_KEYS, source)
        task, _ = config.build_task(params, source)
    training = config.section(params, "training", source)
    training.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        cfg = TrainConfig.from_dict(training, "training")
    except config.ConfigError as e:
        raise config.ConfigError(f"{source}: {e}") from None
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    result = train(task, cfg, out_dir=out, progress=progress, callback=callback)
    extra = {"training": dict(training_summary(result, cfg), method="analytic_gradient"),
             "config": json_safe(params), "config_file": os.path.abspath(source)}
    files = save_checkpoint(result.policy, task, out, extra=extra)
    return task, result, files
