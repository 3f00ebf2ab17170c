"""The stages of one simulation substep, one module each, in pipeline order.

They are actuation (command -> joint torques or rotor speeds), passive (joint damping,
friction, limits), contact (ground and self-collision penalties), aerodynamics
(rotor wrench and body drag), acceleration (the equations of motion, linearly
implicit in the stiff terms) and integration. Each stage is a pure function of
the :class:`~diffsim_ros.physics.system.System` and the substep's inputs; the
kinematics record (:mod:`..kinematics`) is computed once and passed to those that
need it.
"""
