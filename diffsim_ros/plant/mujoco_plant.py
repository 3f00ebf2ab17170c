"""``MujocoPlant``: the embedded default robot, an independent engine standing in for hardware.

    params = config.load_yaml("config/hover.yaml")
    plant = MujocoPlant(params, source="config/hover.yaml",
                        perturbation=Perturbation(mass_scale=1.2))
    plant.reset(q0)                                    # simulator convention (see below)
    s = plant.step([9.81, 0.0, 0.0, 0.0])              # one control step of the config's dt
    s.position, s.orientation, s.angular_velocity      # measured state (BaseState)

The plant reads the same training/robot YAML as the simulator (``urdf``,
``floating_base`` and the ``simulator`` section; other sections are ignored), loads the
same URDF into MuJoCo, and runs MuJoCo at the simulator's substep ``dt / substeps``
(with ground contact at most :data:`CONTACT_STEP`: that substep split in as many MuJoCo
steps as it takes, see below) with its gravity and integrator (semi_implicit -> MuJoCo's
Euler, rk4 -> RK4). The
rigid-body dynamics, URDF joint damping, joint limits and ground contact are MuJoCo's
own. The URDF's Coulomb joint friction is the simulator's smoothed law ``-f tanh(v / eps)``
applied as ``qfrc_applied``, its secant slope ``f tanh(v / eps) / v`` in MuJoCo's implicit
damping as for the drives below, so that the unperturbed plant and the simulator agree to
round-off (Perturbation ``constraint_friction`` puts MuJoCo's ``frictionloss`` constraint
back, a friction model gap; doc/friction.md). What is computed here is what a robot's
drives and flight controller compute, with the simulator's own laws (physics/laws.py,
evaluated with NumPy: no torch on the real-time path):

* joints (``position``, ``velocity``, ``effort``): the simulator's actuator law, PD
  ``kp (q* - q) - kd v`` or ``kd (v* - v)`` or the effort, plus gravity compensation
  (MuJoCo's bias force at zero velocity, on the *nominal* model: the drive does not
  know the perturbed masses) when ``gravity_compensation`` is on, saturated smoothly at
  the URDF effort limit ``L tanh(u / L)`` (with ``velocity_limits``: inside the drive's
  torque-speed window, which honours the URDF velocity limit), through the optional
  first-order torque lag.
  Applied as ``qfrc_applied``. Without a lag, with the Euler integrator, the PD gains
  are integrated linearly implicitly as the simulator does: ``s kd + h s kp`` (s: the
  saturation's slope) is added to MuJoCo's implicitly integrated ``dof_damping`` and
  the applied force is corrected so that the explicit force is unchanged; MuJoCo then
  solves ``(M + h D + h^2 K) a = f - h K v`` exactly like the simulator.
* rotors (``ctbr``, ``rotor_thrust``, plant/flight.py): the rate loop and mixer of
  physics/quadrotor.py (on the nominal inertia), the smooth thrust clamp, the
  first-order rotor-speed lag; each rotor's thrust (along body +z at its hub) and
  reaction torque, and the body drag (at the nominal centre of mass, linear plus
  quadratic, body frame) enter MuJoCo through ``mj_applyFT`` into ``qfrc_applied``.

Conventions (as the simulator's, so the two can be compared directly):
``q = [x y z qx qy qz qw, joints...]`` for a floating base (MuJoCo stores w first),
``v = [v_lin (body frame), w (body frame), joints...]``; joints in the physics
model's order (``plant.joint_names``); every boundary maps joints by name.

The step with ground contact. A robot is a continuous-time system, so the stand-in's verdict
must not depend on its integration step. MuJoCo's soft contact under a light foot (solo12's
lower leg and foot weigh 0.04 kg) is not resolved at a 2 ms step: the shipped solo12 walker's
feet slid 0.07-0.11 m/s in stance at 2 ms, 0.04-0.07 at 1 ms, 0.02-0.05 at 0.5 ms and
0.017-0.037 at 0.25 ms (bench/foot_slide.py --step-refinement 1,2,4,8; the simulator's implicit penalty contact gives
0.01-0.02 at 2 ms), the Euler step's error, not the floor's physics. With ``simulator.ground``
on, each simulator substep is therefore split into ``step_refinement`` MuJoCo steps, by default
as many as keep MuJoCo's step at or below ``CONTACT_STEP`` (0.5 ms); the command, the delay line
and the drives' laws then run at that finer step. Without ground contact, or with
``step_refinement=1``, MuJoCo steps at the simulator's substep and the unperturbed plant
agrees with the simulator to round-off.

Perturbations (:class:`Perturbation`) stand in for the reality gap; defaults are none.
"""
from __future__ import annotations

import dataclasses
import re
from collections import deque
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from .. import config as _config
from ..physics import ConfigError, Rotors, laws
from ..physics.rotation import quat_exp, quat_mul, quat_to_matrix
from ..physics.stages.cone import IMPRATIO
from .flight import FlightController
from .perturbation import Perturbation

JOINT_INTERFACES = ("position", "velocity", "effort")
ROTOR_INTERFACES = ("ctbr", "rotor_thrust")
INTERFACES = JOINT_INTERFACES + ROTOR_INTERFACES
# Ratio of frictional to normal constraint impedance on the ground (MuJoCo opt.impratio): the
# simulator's soft contact takes the same.
FRICTION_IMPRATIO = IMPRATIO
CONTACT_STEP = 5e-4         # s, the largest MuJoCo step of a plant with ground contact (module doc)


def default_refinement(substep: float, ground: bool) -> int:
    """MuJoCo steps per simulator substep.

    With ground contact as many as keep the step at or below :data:`CONTACT_STEP`, else 1.
    """
    if not ground:
        return 1
    return max(1, int(np.ceil(substep / CONTACT_STEP - 1e-9)))



# ----------------------------------------------------------------------------- measured states
@dataclass
class JointState:
    """Joint measurement at time ``t`` (s): arrays in the order of ``names``.

    position: rad or m; velocity: rad/s or m/s; effort: the actuator torque/force applied
    (after gravity compensation, saturation and lag), N m or N; 0 for unactuated joints.
    """

    t: float
    names: List[str]
    position: np.ndarray
    velocity: np.ndarray
    effort: np.ndarray

    def by_name(self) -> Dict[str, Tuple[float, float, float]]:
        """{joint name: (position, velocity, effort)}."""
        return {n: (float(p), float(v), float(e))
                for n, p, v, e in zip(self.names, self.position, self.velocity, self.effort)}


@dataclass
class BaseState:
    """Floating-base measurement at time ``t`` (s).

    position: of the base link origin in the world, m. orientation: quaternion x y z w
    (world from base). linear_velocity_world / linear_velocity_body: of the base origin,
    m/s, in world / base axes. angular_velocity: body rates p q r, rad/s (base axes).
    specific_force: what an accelerometer at the base origin reads, (a - g) in base axes,
    m/s^2, from the velocity change over the last substep. rotor_speeds: rad/s (empty
    without rotors). joints: the joint measurement when the base carries joints, else None.
    """

    t: float
    position: np.ndarray
    orientation: np.ndarray
    linear_velocity_world: np.ndarray
    linear_velocity_body: np.ndarray
    angular_velocity: np.ndarray
    specific_force: np.ndarray
    rotor_speeds: np.ndarray
    joints: Optional[JointState] = None


# ----------------------------------------------------------------------------- the plant
class MujocoPlant:
    """The robot of a training/robot configuration, simulated by MuJoCo.

    params: the ``ros__parameters`` mapping of a config file (``config.load_yaml``): reads
        ``urdf``, ``floating_base`` and ``simulator`` (dt, substeps, integrator, gravity,
        ground, joint switches, actuator, actuated_joints, kp, kd, effort_saturation,
        gravity_compensation, actuator_lag, command_delay, implicit_damping, rotors).
    source: the file name, prefixed to error messages.
    interface: the default command interface of :meth:`step` (default: ``simulator.actuator``);
        joints: position, velocity, effort; rotors: ctbr, rotor_thrust.
    perturbation: :class:`Perturbation` or a mapping of its fields (default: none).
    initial_q, initial_v: the state :meth:`reset` returns to (simulator convention;
        default: the model's neutral configuration at rest).
    step_refinement: MuJoCo steps per simulator substep (default: :func:`default_refinement`,
        more than one only with ground contact; 1: MuJoCo at the simulator's own substep).

    Bad configuration raises :class:`physics.ConfigError` naming the key.

    Attributes: ``dt``, ``substeps`` (MuJoCo steps per control step: the simulator's substeps
    times ``step_refinement``), ``h`` (MuJoCo's step, s), ``step_refinement``, ``joint_names``, ``actuated_joints``,
    ``rotor_links``, ``interfaces``, ``interface``, ``floating_base``, ``mass`` (true, kg),
    ``nominal_mass``, ``hover_thrust`` (true mass times g, N), ``delay_substeps``,
    ``last_command`` ((interface, command) that ``step(None)`` repeats), ``model``/``data``
    (MuJoCo), ``physics_model`` (the simulator's Model of the same URDF).
    """

    def __init__(self, params: Dict[str, Any], source: str = "", interface: Optional[str] = None,
                 perturbation: Union[Perturbation, Dict[str, Any], None] = None,
                 initial_q: Optional[Sequence[float]] = None, initial_v: Optional[Sequence[float]] = None,
                 step_refinement: Optional[int] = None):
        if not isinstance(params, dict):
            raise ConfigError(f"parameters must be a mapping, got {type(params).__name__}", source=source)
        self.source = source
        self.params = params
        self.sim_config = cfg = _config.simulator_config(params, source)
        self.urdf_path = _config.resolve_urdf(params, source)
        # The physics model gives joint order, limits, rotor hub positions and the nominal
        # inertia the flight controller uses, exactly as the simulator sees them.
        self.physics_model = pm = _config.load_model(params, source, dtype=torch.float64)
        try:
            self.perturbation = Perturbation.from_mapping(perturbation)
        except ConfigError as e:
            raise e.at(source) from None
        self.floating_base = pm.floating_base
        self.joint_names: List[str] = list(pm.joint_names)
        self.dt = float(cfg.dt)
        if step_refinement is None:
            step_refinement = default_refinement(self.dt / int(cfg.substeps), bool(cfg.ground))
        elif isinstance(step_refinement, bool) or not isinstance(step_refinement, int) or step_refinement < 1:
            raise ConfigError(f"step_refinement must be a whole number of MuJoCo steps per substep (at least 1), "
                              f"got {step_refinement!r}", source=source)
        self.step_refinement = int(step_refinement)
        self.substeps = int(cfg.substeps) * self.step_refinement
        self.h = self.dt / self.substeps

        # ---- joint actuators, by name
        names = list(cfg.actuated_joints) or list(pm.joint_names)
        for nm in names:
            if nm not in pm.joint_names:
                raise ConfigError(f"{{key}}: '{nm}' is not a joint of '{pm.name}' "
                                  f"(joints: {', '.join(pm.joint_names) or 'none'})", "simulator.actuated_joints",
                                  source)
        self.actuated_joints: List[str] = names
        self._act = np.array([pm.joint_names.index(n) for n in names], dtype=int)
        na = len(names)

        def gains(val, key):
            arr = np.atleast_1d(np.asarray(val, dtype=np.float64))
            if arr.size == 1:
                return np.full(na, float(arr[0]))
            if arr.size != na:
                raise ConfigError(f"has {arr.size} entries for {na} actuated joints ({', '.join(names)})",
                                  f"simulator.{key}", source)
            return arr
        self.kp, self.kd = gains(cfg.kp, "kp"), gains(cfg.kd, "kd")
        self.effort_limit = pm.effort_limit.numpy()[self._act].astype(np.float64) if na else np.zeros(0)
        vlim = pm.velocity_limit.numpy()[self._act].astype(np.float64) if na else np.zeros(0)
        self.velocity_limit = np.where(vlim > 0, vlim, np.inf)

        # ---- rotors
        self.rotor_links: List[str] = []
        self.flight: Optional[FlightController] = None
        if cfg.rotors is not None:
            try:
                rot = Rotors(cfg.rotors, pm)
            except ConfigError as e:
                raise e.at(source) from None
            lag = self.perturbation.actuator_lag
            real = dataclasses.replace(cfg.rotors, thrust_scale=cfg.rotors.thrust_scale
                                       * self.perturbation.thrust_scale)
            self.flight = FlightController(real, rot.positions.numpy(), pm.inertia[0].numpy(),
                                           pm.com[0].numpy(), motor_time_constant=lag)
            self.rotor_links = list(cfg.rotors.rotor_links)

        self.interfaces: Tuple[str, ...] = ((ROTOR_INTERFACES if self.flight is not None else ())
                                            + (JOINT_INTERFACES if na else ()))
        interface = cfg.actuator if interface is None else interface
        if interface not in self.interfaces:
            key = "interface" if interface != cfg.actuator else "simulator.actuator"
            rotor_hint = "; rotor interfaces need a simulator.rotors section" if interface in ROTOR_INTERFACES else ""
            raise ConfigError(f"{{key}}: the plant of '{pm.name}' cannot take '{interface}' commands "
                              f"(it accepts: {', '.join(self.interfaces) or 'nothing'}{rotor_hint})",
                              key, source)
        self.interface = interface
        self.torque_lag = cfg.actuator_lag if self.perturbation.actuator_lag is None else self.perturbation.actuator_lag

        # ---- MuJoCo: the perturbed model steps; the nominal one serves gravity compensation
        import mujoco
        self._mj = mujoco
        self.model = self._compile(payload=True)
        self.data = mujoco.MjData(self.model)
        self._nominal = self._compile()
        self._nominal_data = mujoco.MjData(self._nominal)
        m = self.model
        self._qadr = np.array([m.jnt_qposadr[m.joint(n).id] for n in self.joint_names], dtype=int)
        self._dadr = np.array([m.jnt_dofadr[m.joint(n).id] for n in self.joint_names], dtype=int)
        self._base = m.body(pm.body_names[0]).id if self.floating_base else -1
        self.nominal_mass = float(sum(self._nominal.body_mass))
        self._apply_perturbation()
        self.mass = float(sum(m.body_mass))
        g = np.asarray(cfg.gravity, dtype=np.float64)
        self.gravity = g
        self.hover_thrust = max(self.mass * -g[2], 0.0)

        # ---- delay line, in substeps: the config's command_delay (control steps) + latency
        self.delay_substeps = int(cfg.command_delay) * self.substeps + int(round(self.perturbation.latency / self.h))
        self._initial_q = self._as_q(initial_q) if initial_q is not None else pm.neutral_configuration().numpy()
        self._initial_v = self._as_v(initial_v) if initial_v is not None else np.zeros(pm.nv)
        self.reset()

    # ------------------------------------------------------------------ MuJoCo model
    def _compile(self, payload: bool = False):
        """MuJoCo model of the URDF.

        Visuals and collisions stripped (collisions come from the physics model when the ground is
        on), a free joint on the root link for a floating base, the simulator's substep, gravity,
        integrator and switches. A <mimic> joint is coupled to its leader by the equality constraint
        MuJoCo's URDF reader makes of it (q = multiplier q_leader + offset), stiff (time constant
        two substeps), as a gear or a tendon couples a real gripper's fingers; it is not reported
        (the simulator's coordinates are the leaders).
        """
        mujoco = self._mj
        from ..physics.urdf import _read_source

        cfg, pm = self.sim_config, self.physics_model
        text, _ = _read_source(str(self.urdf_path), str(self.urdf_path), None)
        text = re.sub(r"<visual\b.*?</visual>", "", text, flags=re.S)
        text = re.sub(r"<collision\b.*?</collision>", "", text, flags=re.S)
        # URDF inertials only (links without one stay massless, as in the physics model);
        # fixed links stay separate bodies so that their frames keep their names.
        text = re.sub(r"</robot>\s*$", '<mujoco><compiler discardvisual="true" fusestatic="false" '
                      'inertiafromgeom="false" angle="radian"/></mujoco></robot>', text.rstrip())
        try:
            spec = mujoco.MjSpec.from_string(text)
        except Exception as e:  # MuJoCo's parser errors are plain ValueErrors carrying its message
            raise ConfigError(f"{{key}}: MuJoCo cannot read {self.urdf_path}: {e}", "urdf", self.source) from None
        if self.floating_base:
            spec.body(pm.body_names[0]).add_freejoint()
        if payload and self.perturbation.payload_mass > 0:
            # The perturbation's point mass, a massive body without joint on the last body.
            carrier = pm.body_names[0] if self.floating_base else pm.body_names[-1]
            spec.body(carrier).add_body(name="diffsim_payload", pos=list(self.perturbation.payload_offset),
                                        mass=self.perturbation.payload_mass, inertia=[1e-7] * 3)
        opt = spec.option
        opt.timestep = self.h
        opt.gravity = list(cfg.gravity)
        opt.integrator = (mujoco.mjtIntegrator.mjINT_RK4 if cfg.integrator == "rk4"
                          else mujoco.mjtIntegrator.mjINT_EULER)
        for eq in spec.equalities:             # the mimic couplings: as stiff as the substep allows
            eq.solref = [2.0 * self.h, 1.0]
        bit = mujoco.mjtDisableBit
        flags = 0 if spec.equalities else int(bit.mjDSBL_EQUALITY)
        if not cfg.ground:
            flags |= int(bit.mjDSBL_CONTACT)
        if not cfg.joint_limits:
            flags |= int(bit.mjDSBL_LIMIT)
        if not cfg.joint_friction:
            flags |= int(bit.mjDSBL_FRICTIONLOSS)
        if not cfg.implicit_damping:
            flags |= int(bit.mjDSBL_EULERDAMP)
        opt.disableflags = flags
        if cfg.ground:
            # MuJoCo's default friction (pyramidal cone, impratio 1) is soft: a foot loaded sideways
            # at half its friction limit creeps at centimetres per second, where Coulomb's law holds
            # it still. The elliptic cone with impratio 100 (the setting MuJoCo Menagerie's
            # quadrupeds use against slip) holds it to a fraction of a millimetre per second
            # (test/plant/test_mujoco_plant.py: pushes below and above the limit).
            opt.cone = mujoco.mjtCone.mjCONE_ELLIPTIC
            opt.impratio = FRICTION_IMPRATIO
            self._add_ground(spec)
        try:
            m = spec.compile()
        except Exception as e:
            raise ConfigError(f"{{key}}: MuJoCo cannot compile {self.urdf_path}: {e}", "urdf", self.source) from None
        if not cfg.joint_damping:
            m.dof_damping[:] = 0.0
        return m

    def _add_ground(self, spec):
        """Add the ground plane, and the physics model's collision primitives as MuJoCo geoms.

        The primitives (meshes already replaced by their bounding boxes there) touch the plane only.
        """
        mujoco = self._mj
        cfg, pm = self.sim_config, self.physics_model
        n = np.asarray(cfg.ground_normal, dtype=np.float64)
        n = n / np.linalg.norm(n)
        quat = np.zeros(4)
        mujoco.mju_quatZ2Vec(quat, n)
        spec.worldbody.add_geom(type=mujoco.mjtGeom.mjGEOM_PLANE, size=[0, 0, 1], pos=(n * cfg.ground_height).tolist(),
                                quat=quat.tolist(), contype=0, conaffinity=1, friction=[cfg.friction, 0.005, 0.0001])
        for c in pm.collisions:
            if c.body < 0:
                continue
            body = spec.body(pm.body_names[c.body])
            q = np.zeros(4)
            mujoco.mju_mat2Quat(q, np.ascontiguousarray(c.R.numpy(), dtype=np.float64).reshape(9))
            size = c.size.numpy().astype(np.float64)
            kind = {"sphere": mujoco.mjtGeom.mjGEOM_SPHERE, "box": mujoco.mjtGeom.mjGEOM_BOX,
                    "cylinder": mujoco.mjtGeom.mjGEOM_CYLINDER}.get(c.kind)
            if kind is None:
                continue
            if c.kind == "sphere":
                gsize = [size[0], 0.0, 0.0]
            elif c.kind == "box":
                gsize = (size / 2).tolist()
            else:
                gsize = [size[0], size[1] / 2, 0.0]
            body.add_geom(type=kind, size=gsize, pos=c.p.numpy().tolist(), quat=q.tolist(),
                          contype=1, conaffinity=0, mass=0, density=0, friction=[cfg.friction, 0.005, 0.0001])

    def _apply_perturbation(self):
        p, m = self.perturbation, self.model
        m.body_mass[:] = m.body_mass * p.mass_scale
        # MuJoCo takes the larger of two geoms' coefficients: the ground's and the robot's, scaled alike.
        m.geom_friction[:, 0] = m.geom_friction[:, 0] * p.ground_friction_scale
        if p.contact_time_constant is not None:
            if p.contact_time_constant < 2 * self.h:
                raise ConfigError(f"{{key}}: {p.contact_time_constant} s is below twice the stand-in's MuJoCo "
                                  f"step ({2 * self.h:g} s), where MuJoCo's contact is no longer stable",
                                  "perturbation.contact_time_constant", self.source)
            m.geom_solref[:, 0] = p.contact_time_constant
        m.body_inertia[:] = m.body_inertia * p.mass_scale
        d = m.dof_damping.copy()
        if len(self._dadr):
            d[self._dadr] = d[self._dadr] * p.joint_damping_scale + p.added_joint_damping
        self._dof_damping = d          # the passive damping; actuator terms are added per substep
        m.dof_damping[:] = d
        self._friction = None          # the smoothed law's coefficients per joint, when it applies
        if p.constraint_friction:
            if len(self._dadr) and p.joint_friction_scale != 1.0:
                m.dof_frictionloss[self._dadr] = m.dof_frictionloss[self._dadr] * p.joint_friction_scale
        else:
            m.dof_frictionloss[:] = 0.0  # a mimic follower's friction acts on its leader in the physics model
            f = self.physics_model.friction.numpy().astype(np.float64) * p.joint_friction_scale
            if self.sim_config.joint_friction and len(self._dadr) and f.any():
                self._friction = f

    # ------------------------------------------------------------------ conventions
    @property
    def nq(self) -> int:
        return self.physics_model.nq

    @property
    def nv(self) -> int:
        return self.physics_model.nv

    @property
    def time(self) -> float:
        """Simulated time, s (whole control steps since the last reset times dt)."""
        return self._steps * self.dt

    def _as_q(self, q) -> np.ndarray:
        q = np.asarray(q, dtype=np.float64).reshape(-1)
        if q.shape != (self.nq,):
            raise ValueError(f"q has {q.size} entries, the model needs {self.nq} "
                             f"({'x y z qx qy qz qw, then ' if self.floating_base else ''}joints {self.joint_names})")
        return q

    def _as_v(self, v) -> np.ndarray:
        v = np.asarray(v, dtype=np.float64).reshape(-1)
        if v.shape != (self.nv,):
            raise ValueError(f"v has {v.size} entries, the model needs {self.nv}")
        return v

    def _rotation(self) -> np.ndarray:
        w, x, y, z = self.data.qpos[3:7]
        return quat_to_matrix([x, y, z, w])

    @property
    def q(self) -> np.ndarray:
        """True generalised positions, simulator convention (a copy)."""
        d = self.data
        qj = d.qpos[self._qadr]
        if not self.floating_base:
            return qj.copy()
        w, x, y, z = d.qpos[3:7]
        return np.concatenate((d.qpos[0:3], [x, y, z, w], qj))

    @property
    def v(self) -> np.ndarray:
        """True generalised velocities, simulator convention (base twist in the body frame)."""
        d = self.data
        vj = d.qvel[self._dadr]
        if not self.floating_base:
            return vj.copy()
        R = self._rotation()
        return np.concatenate((R.T @ d.qvel[0:3], d.qvel[3:6], vj))

    def set_state(self, q: Union[Sequence[float], np.ndarray], v: Optional[Sequence[float]] = None) -> None:
        """Put the robot at ``q``, ``v`` (simulator convention).

        Actuator states, command line and time are kept (see :meth:`reset`).
        """
        q = self._as_q(q)
        v = np.zeros(self.nv) if v is None else self._as_v(v)
        if not (np.isfinite(q).all() and np.isfinite(v).all()):
            raise ValueError("set_state: q and v must be finite")
        d = self.data
        d.qpos[self._qadr] = q[7:] if self.floating_base else q
        d.qvel[self._dadr] = v[6:] if self.floating_base else v
        if self.floating_base:
            quat = q[3:7] / np.linalg.norm(q[3:7])
            d.qpos[0:3] = q[0:3]
            d.qpos[3:7] = [quat[3], quat[0], quat[1], quat[2]]
            d.qvel[0:3] = quat_to_matrix(quat) @ v[0:3]
            d.qvel[3:6] = v[3:6]
        self._mj.mj_forward(self.model, d)
        self._v_world_prev = d.qvel[0:3].copy() if self.floating_base else None
        self._specific_force = None
        self._measure()

    def set_initial_state(self, q: Optional[Sequence[float]] = None, v: Optional[Sequence[float]] = None) -> None:
        """Change the state :meth:`reset` returns to (simulator convention; None: neutral / rest)."""
        self._initial_q = self._as_q(q) if q is not None else self.physics_model.neutral_configuration().numpy()
        self._initial_v = self._as_v(v) if v is not None else np.zeros(self.nv)

    def reset(self, q: Optional[Sequence[float]] = None,
              v: Optional[Sequence[float]] = None) -> Union[JointState, BaseState]:
        """Back to time 0 at ``q``, ``v`` (default: the initial state).

        Rotors at hover speed for the true mass, torque lag at zero, the command line filled with
        the hold command (hover thrust; the current joint positions; zero velocity/effort), noise
        re-seeded. Returns the measured state.
        """
        self._mj.mj_resetData(self.model, self.data)
        self._steps = 0
        self._rng = np.random.default_rng(self.perturbation.seed)
        self._torque = np.zeros(len(self.actuated_joints))
        self._lag_end = None
        self._effort = np.zeros(len(self.actuated_joints))
        if self.flight is not None:
            per = self.hover_thrust / self.flight.n
            self._speed = np.full(self.flight.n, float(self.flight.speed_for_thrust(per)))
        else:
            self._speed = np.zeros(0)
        q = self._initial_q if q is None else self._as_q(q)
        v = self._initial_v if v is None else self._as_v(v)
        self._line = deque()
        self._measured = None
        self.set_state(q, v)
        hold = (self.interface, self.hold_command(self.interface))
        self._line = deque([hold] * self.delay_substeps)
        self.last_command = hold
        self._specific_force = None
        return self._measure()

    # ------------------------------------------------------------------ commands
    def command_names(self, interface: Optional[str] = None) -> List[str]:
        """Return what each entry of a command means.

        The actuated joints (position/velocity/effort), the rotor links (rotor_thrust), or
        ['thrust', 'p', 'q', 'r'] (ctbr).
        """
        interface = interface or self.interface
        if interface in JOINT_INTERFACES:
            return list(self.actuated_joints)
        if interface == "rotor_thrust":
            return list(self.rotor_links) or [f"rotor_{i}" for i in range(self.flight.n)]
        return ["thrust", "p", "q", "r"]

    def check_command(self, command, interface: Optional[str] = None) -> np.ndarray:
        """``command`` as a float64 array, or ValueError saying what is wrong.

        What is wrong: an unknown interface, a wrong length, a non-finite entry.
        """
        interface = interface or self.interface
        if interface not in self.interfaces:
            raise ValueError(f"interface '{interface}' is not one this plant accepts ({', '.join(self.interfaces)})")
        try:
            c = np.asarray(command, dtype=np.float64).reshape(-1)
        except (TypeError, ValueError):
            raise ValueError(f"'{interface}' command is not a list of numbers: {command!r}") from None
        names = self.command_names(interface)
        if c.size != len(names):
            raise ValueError(f"'{interface}' command has {c.size} entries, expected {len(names)} "
                             f"({', '.join(names)})")
        bad = [names[i] for i in np.flatnonzero(~np.isfinite(c))]
        if bad:
            raise ValueError(f"'{interface}' command has non-finite entries for {', '.join(bad)}")
        return c

    def hold_command(self, interface: Optional[str] = None) -> np.ndarray:
        """Return the command that holds the current state.

        Current joint positions (position), zero (velocity, effort), hover thrust and zero rates
        (ctbr), hover thrust / n (rotor_thrust).
        """
        interface = interface or self.interface
        if interface == "position":
            return self.data.qpos[self._qadr][self._act].copy()
        if interface in ("velocity", "effort"):
            return np.zeros(len(self.actuated_joints))
        if interface == "ctbr":
            return np.array([self.hover_thrust, 0.0, 0.0, 0.0])
        return np.full(self.flight.n, self.hover_thrust / self.flight.n)

    def safe_command(self, interface: Optional[str] = None) -> np.ndarray:
        """Return the safe command of interfaces.md: hold position, zero velocity, zero effort, zero thrust."""
        interface = interface or self.interface
        if interface == "position":
            return self.hold_command("position")
        if interface == "ctbr":
            return np.zeros(4)
        return np.zeros(len(self.command_names(interface)))

    # ------------------------------------------------------------------ stepping
    def step(self, command=None, interface: Optional[str] = None) -> Union[JointState, BaseState]:
        """Advance one control step (``dt``, in ``substeps`` MuJoCo steps) under ``command``.

        The command is in ``interface`` (default: the plant's). ``command=None`` repeats the last
        command. The command passes the delay line (``command_delay`` + latency) substep by substep.
        Returns the measured state (with sensor noise, if any).
        """
        if command is None:
            entry = self.last_command
        else:
            interface = interface or self.interface
            entry = (interface, self.check_command(command, interface))
        self.last_command = entry
        mujoco, m, d = self._mj, self.model, self.data
        for _ in range(self.substeps):
            self._line.append(entry)
            interface_k, cmd_k = self._line.popleft()
            applied = np.zeros(m.nv)
            damping = self._dof_damping.copy()
            if self._friction is not None:
                self._joint_friction(applied, damping)
            if interface_k in JOINT_INTERFACES:
                servo = self._joint_actuation(interface_k, cmd_k, applied, damping)
                if (servo is not None and self.sim_config.servo_iterations and self.flight is None
                        and m.opt.integrator == mujoco.mjtIntegrator.mjINT_EULER):
                    self._servo_refine(interface_k, servo, applied, damping)
            m.dof_damping[:] = damping
            v_prev = d.qvel[0:3].copy() if self.floating_base else None
            if self.flight is not None:
                # Rotor forces need the kinematics of the current state: mj_step1 computes
                # them (and the passive forces with the damping just set), mj_step2 integrates.
                euler = m.opt.integrator == mujoco.mjtIntegrator.mjINT_EULER
                if euler:
                    mujoco.mj_step1(m, d)
                else:
                    mujoco.mj_fwdPosition(m, d)
                thrust = None
                if interface_k == "ctbr":
                    thrust = self.flight.ctbr_thrusts(cmd_k, d.qvel[3:6].copy())
                elif interface_k == "rotor_thrust":
                    thrust = cmd_k
                if thrust is not None:
                    self._speed = self.flight.motor_step(self._speed, thrust, self.h)
                applied += self._rotor_forces()
                d.qfrc_applied[:] = applied
                if euler:
                    mujoco.mj_step2(m, d)
                else:
                    mujoco.mj_step(m, d)   # RK4 holds the applied forces over the substep
            else:
                d.qfrc_applied[:] = applied
                mujoco.mj_step(m, d)
                if self._lag_end is not None:
                    self._end_lagged_torque()
            if self.floating_base:
                self._v_world_prev = v_prev
        self._steps += 1
        if self.floating_base:
            a_world = (d.qvel[0:3] - self._v_world_prev) / self.h
            self._specific_force = self._rotation().T @ (a_world - self.gravity)
        if not (np.isfinite(d.qpos).all() and np.isfinite(d.qvel).all()):
            raise FloatingPointError(f"MuJoCo state became non-finite at t={self.time:.4f} s "
                                     f"(last command {entry[0]} {entry[1].tolist()})")
        return self._measure()

    def _joint_friction(self, applied, damping):
        """Add the simulator's smoothed Coulomb friction (physics/stages/passive.py) into ``applied``.

        With the linearly implicit Euler its secant slope joins MuJoCo's implicit damping, and
        adding slope x v back keeps the explicit force -f tanh(v / eps).
        """
        cfg, dof = self.sim_config, self._dadr
        v = self.data.qvel[dof]
        force, slope = laws.coulomb_friction(np, v, self._friction, cfg.joint_friction_smoothing)
        applied[dof] -= force
        if cfg.implicit_damping and self.model.opt.integrator == self._mj.mjtIntegrator.mjINT_EULER:
            damping[dof] += slope
            applied[dof] += slope * v

    def _gravity_torque(self) -> np.ndarray:
        """Joint torques holding the nominal model against gravity at the current q, for the actuated joints.

        They are MuJoCo's bias force at zero velocity.
        """
        mujoco, m0, d0 = self._mj, self._nominal, self._nominal_data
        d0.qpos[:] = self.data.qpos
        d0.qvel[:] = 0.0
        mujoco.mj_fwdPosition(m0, d0)
        mujoco.mj_fwdVelocity(m0, d0)
        return d0.qfrc_bias[self._dadr[self._act]].copy()

    def _window(self):
        """Return the drives' velocity limits and band as physics/laws.py takes them (None: no window)."""
        cfg = self.sim_config
        return (self.velocity_limit if cfg.velocity_limits else None), cfg.velocity_limit_band

    def _joint_actuation(self, interface, cmd, applied, damping):
        """Add the simulator's joint actuator (see the module doc; physics/laws.py, drive).

        It goes into ``applied`` and ``damping``. Returns what :meth:`_servo_refine` needs for a
        saturated position or velocity servo (base, pd, va, torque, slope, brake), else None.
        """
        d, cfg, h = self.data, self.sim_config, self.h
        dof = self._dadr[self._act]
        qa, va = d.qpos[self._qadr[self._act]], d.qvel[dof].copy()
        if interface == "position":
            u = self.kp * (cmd - qa) - self.kd * va
        elif interface == "velocity":
            u = self.kd * (cmd - va)
        else:
            u = np.array(cmd, dtype=np.float64)
        pd = u
        if cfg.gravity_compensation:
            u = u + self._gravity_torque()
        base = u - pd
        s = brake = None
        if cfg.effort_saturation:
            vmax, band = self._window()
            u, s, brake = laws.drive(np, u, pd, va, self.effort_limit, vmax, band, servo=interface != "effort",
                                     pd_slope=cfg.gravity_compensation)
        s = np.ones_like(u) if s is None else s
        brake = np.zeros_like(u) if brake is None else brake
        if self.torque_lag > 0:
            self._torque = laws.first_order_lag(np, self._torque, u, h, self.torque_lag)
            applied[dof] += self._torque
            self._effort = self._torque.copy()
            if cfg.implicit_damping and self.model.opt.integrator == self._mj.mjtIntegrator.mjINT_EULER:
                # The simulator's lagged drive: the drive's slopes times the lag factor, implicit
                # (physics/stages/actuation.py); the torque is taken to the substep's end after it.
                a = laws.lag_factor(np, h, self.torque_lag)
                self._lag_end = self._implicit_gains(interface, a * s, a * brake, va, applied, damping) + (va,)
            return None
        self._effort = u
        applied[dof] += u
        if not cfg.implicit_damping:
            return None
        self._implicit_gains(interface, s, brake, va, applied, damping)
        if cfg.effort_saturation and interface != "effort":
            return base, pd, va, u, s, brake
        return None

    def _end_lagged_torque(self):
        """Return the lagged torque at the end of the substep just taken.

        As physics/stages/actuation.py, lagged_torque: less the implicit terms MuJoCo's solve
        applied over it.
        """
        kd, kp, va = self._lag_end
        self._lag_end = None
        v1 = self.data.qvel[self._dadr[self._act]]
        self._torque = self._torque - kd * (v1 - va) - (0.0 if kp is None else kp * self.h * v1)
        self._effort = self._torque.copy()

    def _implicit_gains(self, interface, s, brake, va, applied, damping, sign: float = 1.0):
        """Add (``sign`` 1) or take back (-1) the drive's linearly implicit terms.

        D_act = s kd (+ h s kp under Euler) joins MuJoCo's implicit damping; adding s kd v back
        keeps the explicit force u - h s kp v as the simulator's. The velocity-limit brake's
        stiffness joins it the same way (all interfaces). Returns the drive's slopes (kd + brake, s
        kp or None) it integrated.
        """
        dof = self._dadr[self._act]
        euler = self.model.opt.integrator == self._mj.mjtIntegrator.mjINT_EULER
        kd = s * self.kd if interface != "effort" else np.zeros_like(va)
        kp = s * self.kp if interface == "position" else None
        extra = kd + brake + (self.h * kp if (kp is not None and euler) else 0.0)
        damping[dof] += sign * extra
        applied[dof] += sign * (kd + brake) * va
        return kd + brake, kp

    def _servo_refine(self, interface, servo, applied, damping):
        """Apply the simulator's servo_iterations (physics/laws.py, servo_secants).

        The saturated servo's implicit gains are moved half way to the secants from the substep's
        start to the end MuJoCo predicts with the current ones (a trial step, undone),
        ``servo_iterations`` times.
        """
        mujoco, m, d, cfg, h = self._mj, self.model, self.data, self.sim_config, self.h
        base, pd, va, torque, s, brake = servo
        dof = self._dadr[self._act]
        spec = mujoco.mjtState.mjSTATE_INTEGRATION
        saved = np.empty(mujoco.mj_stateSize(m, spec))
        mujoco.mj_getState(m, d, saved, spec)
        vmax, band = self._window()
        kp = self.kp if interface == "position" else None
        for _ in range(cfg.servo_iterations):
            m.dof_damping[:] = damping
            d.qfrc_applied[:] = applied
            mujoco.mj_step(m, d)
            v1 = d.qvel[dof].copy()
            mujoco.mj_setState(m, d, saved, spec)
            s1, b1 = laws.servo_secants(np, base, pd, va, torque, s, brake if vmax is not None else None, v1,
                                        self.kd, kp, h, self.effort_limit, vmax, band)
            b1 = brake if b1 is None else b1
            self._implicit_gains(interface, s, brake, va, applied, damping, -1.0)
            s, brake = laws.relaxed(s, s1), laws.relaxed(brake, b1)
            self._implicit_gains(interface, s, brake, va, applied, damping)

    def _rotor_forces(self) -> np.ndarray:
        """Generalised force of the rotor thrusts and torques and of the body drag.

        From the kinematics MuJoCo computed for the current state.
        """
        mujoco, m, d, fc = self._mj, self.model, self.data, self.flight
        out = np.zeros(m.nv)
        b = self._base
        R = d.xmat[b].reshape(3, 3).copy()
        origin = d.xpos[b].copy()
        z = R[:, 2]
        thrust = fc.rotor_thrusts(self._speed)
        torque = fc.allocation[3] * thrust                          # the reaction torques (rotor_torques)
        for i in range(fc.n):
            mujoco.mj_applyFT(m, d, z * thrust[i], z * torque[i], origin + R @ fc.positions[i], b, out)
        # Drag at the nominal centre of mass, from its velocity in body axes.
        w_body = d.qvel[3:6]
        v_com_body = R.T @ d.qvel[0:3] + laws.cross(np, w_body, fc.com)
        F = R @ fc.drag_force(v_com_body, self.perturbation.drag_scale)
        F = F + np.asarray(self.perturbation.wind_force)          # a perturbation outside the model
        mujoco.mj_applyFT(m, d, F, np.zeros(3), origin + R @ fc.com, b, out)
        return out

    # ------------------------------------------------------------------ measurement
    def true_joint_state(self) -> JointState:
        d = self.data
        eff = np.zeros(len(self.joint_names))
        eff[self._act] = self._effort
        return JointState(self.time, list(self.joint_names), d.qpos[self._qadr].copy(), d.qvel[self._dadr].copy(), eff)

    def true_base_state(self) -> BaseState:
        if not self.floating_base:
            raise AttributeError("a fixed-base plant has no base state")
        d = self.data
        w, x, y, z = d.qpos[3:7]
        R = self._rotation()
        sf = self._specific_force if self._specific_force is not None else R.T @ (-self.gravity)
        return BaseState(self.time, d.qpos[0:3].copy(), np.array([x, y, z, w]), d.qvel[0:3].copy(),
                         R.T @ d.qvel[0:3], d.qvel[3:6].copy(), np.asarray(sf, dtype=np.float64).copy(),
                         self._speed.copy(), self.true_joint_state() if self.joint_names else None)

    def _measure(self):
        """Draw this step's measurement once (so repeated reads agree within a step)."""
        ps, vs = self.perturbation.sensor_noise
        rng = self._rng
        js = self.true_joint_state()
        if ps > 0:
            js.position = js.position + rng.normal(0.0, ps, js.position.shape)
        if vs > 0:
            js.velocity = js.velocity + rng.normal(0.0, vs, js.velocity.shape)
        if not self.floating_base:
            self._measured = js
            return js
        bs = self.true_base_state()
        bs.joints = js if self.joint_names else None
        if ps > 0:
            bs.position = bs.position + rng.normal(0.0, ps, 3)
            bs.orientation = quat_mul(bs.orientation, quat_exp(rng.normal(0.0, ps, 3)))
        if vs > 0:
            nb = rng.normal(0.0, vs, 3)
            bs.linear_velocity_world = bs.linear_velocity_world + nb
            bs.linear_velocity_body = quat_to_matrix(bs.orientation).T @ bs.linear_velocity_world
            bs.angular_velocity = bs.angular_velocity + rng.normal(0.0, vs, 3)
        self._measured = bs
        return bs

    def measured(self) -> Union[JointState, BaseState]:
        """Return the measurement of the current step (what step/reset returned)."""
        return self._measured

    def joint_state(self) -> JointState:
        """Measured joint positions/velocities/efforts, in ``joint_names`` order."""
        s = self._measured
        return s if isinstance(s, JointState) else s.joints

    def base_state(self) -> BaseState:
        """Measured floating-base state (quadrotors)."""
        if not self.floating_base:
            raise AttributeError("a fixed-base plant has no base state")
        return self._measured

    @property
    def effort(self) -> Dict[str, float]:
        """The actuator effort applied in the last substep, by actuated joint name."""
        return dict(zip(self.actuated_joints, map(float, self._effort)))


def from_file(path, node: Optional[str] = None, **kw) -> MujocoPlant:
    """``MujocoPlant`` of a parameter file (``config.load_yaml(path, node)``)."""
    import os
    return MujocoPlant(_config.load_yaml(path, node), source=os.fspath(path), **kw)
