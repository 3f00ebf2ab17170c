"""Sim-vs-real analysis from rosbag2 bags (no rclpy here; see doc/interfaces.md for the bag layout).

    from diffsim_ros import analysis
    data = analysis.read_bag("run1")                          # states, commands, timing report
    metrics = analysis.analyze("run1", out_dir="out/")        # k-step velocity error, plots, report.md
    result = analysis.calibrate(data, analysis.sim_setup(data), ["mass_scale", "joint_damping"])
    analysis.write_calibrated(result, setup, "out/")          # calibrated.yaml for `diffsim-ros train`

Modules: ``bag`` (reading and writing bags), ``predict`` (rebuilding the simulator and
replaying commands from recorded states), ``report`` (metrics, plots, markdown),
``params`` and ``sysid`` (calibration), ``record`` (recording a plant rollout into a bag,
for tests and benchmarks). Every bad input is an :class:`AnalysisError` naming the file,
topic or field.
"""
from .bag import BagData, BagWriter, TopicStats, read_bag, timing_stats
from .errors import AnalysisError
from .params import SPECS as PARAMETERS
from .params import build_simulator
from .predict import Replay, SimSetup, sim_setup
from .report import analyze
from .sysid import SysIdResult, calibrate, write_calibrated

__all__ = ["AnalysisError", "BagData", "BagWriter", "TopicStats", "read_bag", "timing_stats", "PARAMETERS",
           "build_simulator", "Replay", "SimSetup", "sim_setup", "analyze", "SysIdResult", "calibrate",
           "write_calibrated"]
