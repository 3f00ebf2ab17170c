"""The workflows layer: what a command or a node does, as library functions.

:mod:`.training` (the training path of ``diffsim-ros train`` and ``train_node``), :mod:`.evaluation`
(``eval``: success with its interval, failure modes, videos, the stand-in's verdict), :mod:`.loop`
(the main job: train, deploy on the MuJoCo stand-in over ROS 2, record, compare), :mod:`.excite`
(an identification motion on the stand-in, recorded for sysid), :mod:`.init_config` (a training
file derived from a URDF) and :mod:`.preflight` (a robot's topics gathered for the preflight checks).

The layer imports the layers below it (physics, tasks, learning, plant, analysis, control, config,
schema and the leaf modules) and never the adapters: nothing here imports ``diffsim_ros.cli`` or
``diffsim_ros.nodes``, and nothing here parses arguments. The functions raise their own error types
(``EvalError``, ``InitError``, ``LoopError``, ...); ``cli/`` maps them to its exit statuses. Importing
this package imports none of its modules (and so no torch).
"""
