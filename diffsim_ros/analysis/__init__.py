"""Sim-vs-real analysis from rosbag2 bags (no rclpy here; see doc/interfaces.md for the bag layout).

    from diffsim_ros import analysis
    data = analysis.read_bag("run1")                          # states, commands, timing report
    metrics = analysis.analyze("run1", out_dir="out/")        # k-step velocity error, plots, report.md
    result = analysis.calibrate(data, analysis.sim_setup(data), ["mass_scale", "joint_damping"])
    analysis.write_calibrated(result, setup, "out/")          # calibrated.yaml for `diffsim-ros train`

Modules: ``bag`` (reading and writing bags), ``predict`` (rebuilding the simulator and
replaying commands from recorded states), ``report`` (metrics, plots, markdown),
``params`` and ``sysid`` (calibration); the recordings the tests and benchmarks analyse are
made by :mod:`diffsim_ros.testing.recordings`. Every bad input is an :class:`AnalysisError` naming the file,
topic or field.
"""
from .bag import BagData, BagWriter, TopicStats, read_bag, timing_stats
from .errors import AnalysisError

# The simulator-side names import torch and the physics core: loaded on first use, so that
# reading, writing and repairing bags (``diffsim-ros bag repair``) stays light.
_LAZY = {"PARAMETERS": (".params", "SPECS"), "build_simulator": (".params", "build_simulator"),
         "Replay": (".predict", "Replay"), "SimSetup": (".predict", "SimSetup"),
         "sim_setup": (".predict", "sim_setup"), "analyze": (".report", "analyze"),
         "SysIdResult": (".sysid", "SysIdResult"), "calibrate": (".sysid", "calibrate"),
         "write_calibrated": (".sysid", "write_calibrated")}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        value = getattr(importlib.import_module(mod, __name__), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["AnalysisError", "BagData", "BagWriter", "TopicStats", "read_bag", "timing_stats", "PARAMETERS",
           "build_simulator", "Replay", "SimSetup", "sim_setup", "analyze", "SysIdResult", "calibrate",
           "write_calibrated"]
