"""Perturbations of the MuJoCo plant: the stand-in for the gap between simulation and reality.

Every field defaults to "no perturbation", so ``Perturbation()`` gives a plant whose
physics matches the training configuration.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Dict, Optional, Tuple

from ..physics.schema import from_mapping, normalise, option, section


@section("perturbation")
@dataclass(frozen=True)
class Perturbation:
    """How the plant differs from the configuration it was built from (SI units). Every field
    defaults to no perturbation.

    The fields that are physical parameters of the simulator map onto the registry of
    :mod:`diffsim_ros.physics.parameters` (``from_perturbation``), which gives the values a
    calibration of a recording of this plant should find."""
    mass_scale: float = option(1.0, """factor on every link mass and inertia tensor (the centres of mass stay).
        Gravity compensation and the CTBR rate loop keep the nominal model, as a robot's controller would""",
                               above=0)
    joint_damping_scale: float = option(1.0, "factor on the URDF <dynamics damping>", low=0)
    added_joint_damping: float = option(0.0, "viscous damping added to every joint (after the scale)",
                                        "N m s/rad (N s/m for prismatic joints)", low=0)
    drag_scale: float = option(1.0, "factor on the multirotor body drag (linear and quadratic)", low=0)
    thrust_scale: float = option(1.0, """factor on the thrust and yaw torque a multirotor's rotors really produce
        at a given speed (weaker motors or props, a low battery), on top of simulator.rotors.thrust_scale; the
        flight controller's mixer keeps the nominal coefficients""", above=0)
    actuator_lag: Optional[float] = option(None, """first-order time constant of the actuators, replacing the
        configuration's: for joints the torque lag (simulator.actuator_lag), for rotors the rotor-speed lag
        (rotors.motor_time_constant). null, or as a ROS parameter any negative number: the configuration's
        value""", "s", low=0, ros_null=-1.0)
    sensor_noise: Tuple[float, float] = option((0.0, 0.0), """standard deviation of the Gaussian noise on measured
        positions (m, rad; the base orientation gets a rotation of that many rad) and on measured velocities (m/s,
        rad/s): a number (both) or [position, velocity]. The true state is not affected""", low=0, broadcast=True)
    latency: float = option(0.0, """delay between a command and its effect; rounded to whole physics substeps
        (dt / substeps) and added to simulator.command_delay""", "s", low=0)
    seed: int = option(0, "seed of the sensor-noise generator")
    joint_friction_scale: float = option(1.0, "factor on the URDF <dynamics friction>", low=0)
    ground_friction_scale: float = option(1.0, """factor on the Coulomb coefficient between the robot and the ground
        (simulator.friction): a slippery or grippy floor""", low=0)
    contact_time_constant: Optional[float] = option(None, """time constant of MuJoCo's soft ground contact (the
        geoms' solref[0]; MuJoCo's default 0.02 s lets a foot sink millimetres and creep): smaller is a harder
        floor, down to twice the physics substep. null, or as a ROS parameter any negative number: MuJoCo's
        default. Outside the simulator's model: its penalty contact has a stiffness instead
        (simulator.contact_stiffness, which sysid fits)""", "s", low=0, ros_null=-1.0)
    constraint_friction: bool = option(False, """the joints' Coulomb friction as MuJoCo's frictionloss constraint
        (dry friction as a soft constraint, solved with the contacts) instead of the simulator's smoothed law,
        which the stand-in otherwise applies as the simulator does (doc/friction.md): a friction model gap""")
    wind_force: Tuple[float, float, float] = option((0.0, 0.0, 0.0), """constant force on a multirotor's base,
        world frame, at its centre of mass; outside the simulator's model (sysid must reject it)""", "N")
    payload_mass: float = option(0.0, """a point mass fixed to the last body (the base of a multirotor, the last
        link of an arm); outside the calibration's scales""", "kg", low=0)
    payload_offset: Tuple[float, float, float] = option((0.0, 0.0, 0.0), "where the payload sits in that body's "
                                                        "frame", "m")

    def __post_init__(self):
        normalise(self)

    @classmethod
    def from_dict(cls, d: Optional[Dict[str, Any]], where: str = "perturbation") -> "Perturbation":
        """Build from a mapping (a YAML section or node parameters; None: no perturbation);
        errors name the key path under ``where``. ``actuator_lag`` or ``contact_time_constant`` < 0
        means None (ROS parameters cannot be null)."""
        if d is None:
            return cls()
        if isinstance(d, dict):
            for key in ("actuator_lag", "contact_time_constant"):
                val = d.get(key)
                if isinstance(val, (int, float)) and not isinstance(val, bool) and val < 0:
                    d = {**d, key: None}
        return from_mapping(cls, d, where)

    def to_dict(self) -> Dict[str, Any]:
        return {f.name: (list(getattr(self, f.name)) if isinstance(getattr(self, f.name), tuple)
                         else getattr(self, f.name)) for f in fields(self)}

    @property
    def is_identity(self) -> bool:
        return self == Perturbation(seed=self.seed)
