"""The frozen ``System``: every tensor a simulation step reads, in one place.

    sys = build_system(model, SimConfig(...))
    state, data = step(sys, state, action)                  # physics.pipeline.step
    sys2 = sys.replace(model=sys.model.replace(mass=m))     # calibration, domain randomisation

A ``System`` holds the physical model (``model``), the controller's model
(``nominal``: what gravity compensation and the CTBR rate loop believe, the URDF's
until a calibration changes ``model`` alone), the actuator gains and limits, the
contact points, the rotors and the contact coefficients, as tensors: replace any of
them with tensors that require grad and the step is differentiable in them.
``config`` holds the structure (which stages run, the integrator, dt); a change of
structure is a new ``build_system``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple, Union

import torch

from .algorithms import inverse_weights
from .model import Model
from .quadrotor import Rotors
from ..schema import ConfigError
from .sim_config import SimConfig


@dataclass(frozen=True)
class ContactSet:
    """Contact points fixed to the bodies.

    Flat, in collision order: ``body`` (P,) long, ``local`` (P, 3) position in the body
    frame (a sphere's centre), ``radius`` (P,) (0 for box corners and cylinder rims),
    ``pairs`` (K, 2) long: sphere points tested against each other (self-collision).

    Grouped, for the step: the points of each body in groups of at most ``group_size``
    (G groups): ``group_body`` (G,) long, ``group_local`` (G, S, 3), ``group_radius``
    (G, S), ``group_valid`` (G, S) (1 for a point, 0 for padding), and a bounding sphere
    per group in the body frame, ``group_center`` (G, 3) and ``group_reach`` (G,), so a
    group that cannot touch the ground in any environment is skipped exactly.
    ``flat_index`` (P,) long: each flat point's slot in the (G * S) grouped layout.
    ``group_weight`` (G, S), 1/kg: the soft contact's inverse weight of each point's body
    (:func:`~diffsim_ros.physics.algorithms.inverse_weights` at the centre of mass of the link
    that names the body, MuJoCo's body_invweight0 of the stand-in's body that carries the
    collision geometry; zero without the soft contact).
    """

    body: torch.Tensor
    local: torch.Tensor
    radius: torch.Tensor
    pairs: torch.Tensor
    group_body: torch.Tensor
    group_local: torch.Tensor
    group_radius: torch.Tensor
    group_valid: torch.Tensor
    group_center: torch.Tensor
    group_reach: torch.Tensor
    flat_index: torch.Tensor
    group_weight: torch.Tensor

    @property
    def n(self) -> int:
        return int(self.body.numel())

    def subset(self, groups) -> "ContactSet":
        """Return the contact set of the point groups ``groups`` and their points; no self-collision pairs.

        ``groups`` are indices into the grouped layout, in order. This is what the compiled step
        evaluates when the other groups cannot reach the ground (physics.compiled).
        """
        if self.pairs.numel():
            raise ValueError("a subset of a contact set with self-collision pairs is not defined")
        dev = self.body.device
        G, S = self.group_valid.shape
        index = torch.tensor(list(groups), dtype=torch.long, device=dev)
        slot = {int(g) * S + k: i * S + k for i, g in enumerate(index.tolist()) for k in range(S)}
        points = [p for p, f in enumerate(self.flat_index.tolist()) if f in slot]
        keep = torch.tensor(points, dtype=torch.long, device=dev)
        flat = torch.tensor([slot[f] for f in self.flat_index[keep].tolist()], dtype=torch.long, device=dev)
        return ContactSet(  # type: ignore[call-arg]  # mypy cannot count the six tensors the generator unpacks
            self.body[keep], self.local[keep], self.radius[keep], self.pairs,
            *(x.index_select(0, index) for x in (self.group_body, self.group_local, self.group_radius,
                                                 self.group_valid, self.group_center, self.group_reach)), flat,
            self.group_weight.index_select(0, index))


def _groups(body: torch.Tensor, local: torch.Tensor, radius: torch.Tensor, weight: torch.Tensor):
    """Group the flat points by body, at most S per group.

    S = 8 (a box's corners), or fewer when no body has that many.
    """
    dt, dev = local.dtype, local.device
    bodies = body.tolist()
    per_body: Dict[int, List[int]] = {}     # body -> its points (flat indices)
    for i, b in enumerate(bodies):
        per_body.setdefault(b, []).append(i)
    size = max([1] + [min(8, len(v)) for v in per_body.values()])
    groups = []
    for b in sorted(per_body):
        pts = per_body[b]
        groups += [(b, pts[k:k + size]) for k in range(0, len(pts), size)]
    G = len(groups)
    g_local = torch.zeros(G, size, 3, dtype=dt, device=dev)
    g_radius = torch.zeros(G, size, dtype=dt, device=dev)
    g_weight = torch.zeros(G, size, dtype=dt, device=dev)
    g_valid = torch.zeros(G, size, dtype=dt, device=dev)
    center = torch.zeros(G, 3, dtype=dt, device=dev)
    reach = torch.zeros(G, dtype=dt, device=dev)
    flat = [0] * len(bodies)
    for g, (b, pts) in enumerate(groups):
        idx = torch.tensor(pts, dtype=torch.long, device=dev)
        g_local[g, :len(pts)] = local[idx]
        g_radius[g, :len(pts)] = radius[idx]
        g_weight[g, :len(pts)] = weight[idx]
        g_valid[g, :len(pts)] = 1.0
        c = local[idx].mean(0)
        center[g] = c
        reach[g] = (torch.linalg.vector_norm(local[idx] - c, dim=-1) + radius[idx]).max()
        for k, i in enumerate(pts):
            flat[i] = g * size + k
    return (torch.tensor([b for b, _ in groups], dtype=torch.long, device=dev), g_local, g_radius, g_valid,
            center, reach, torch.tensor(flat, dtype=torch.long, device=dev), g_weight)


@dataclass(frozen=True)
class System:
    """Everything a step reads.

    Fields other than ``config`` and the index/name fields are parameters: ``replace`` them (with
    tensors that may require grad).
    """

    model: Model
    nominal: Model
    config: SimConfig
    actuated_joints: Tuple[str, ...]
    act_index: torch.Tensor          # (na,) long: actuated joints in the joint part of q/v
    kp: torch.Tensor                 # (na,) N m/rad
    kd: torch.Tensor                 # (na,) N m s/rad
    effort_limit: torch.Tensor       # (na,)
    velocity_limit: torch.Tensor     # (na,) rad/s or m/s (inf where the URDF gives none)
    actuator_lag: torch.Tensor       # () s: first-order torque lag (a state only if config.actuator_lag > 0)
    ground_normal: torch.Tensor      # (3,) unit
    ground_height: torch.Tensor      # () m
    contact_stiffness: torch.Tensor  # () N/m^2
    contact_damping: torch.Tensor    # () N s/m^2
    contact_time_constant: torch.Tensor  # () s: soft contact's tc
    contact_damping_ratio: torch.Tensor  # () soft contact's zeta
    friction: torch.Tensor           # () Coulomb coefficient
    friction_smoothing: torch.Tensor  # () m/s: slip speed of the regularised Coulomb friction
    contact: ContactSet
    rotors: Optional[Rotors]

    def replace(self, **changes) -> "System":
        """Return a copy with some parameters replaced.

        ``model=`` alone keeps the controller's ``nominal`` model (as a calibrated robot keeps its
        controller).
        """
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------ sizes
    @property
    def nbase(self) -> int:
        return 6 if self.model.floating_base else 0

    @property
    def n_act(self) -> int:
        """Size of the actuator state: rotors, or actuated joints."""
        return self.rotors.n if self.rotors is not None else len(self.actuated_joints)

    @property
    def action_dim(self) -> int:
        if self.config.actuator == "ctbr":
            return 4
        return self.n_act

    @property
    def has_actuator_state(self) -> bool:
        return self.rotors is not None or self.config.actuator_lag > 0

    def to(self, dtype: Optional[torch.dtype] = None, device=None) -> "System":
        """Return the same system rebuilt for another dtype/device (parameters kept by value)."""
        return build_system(self.model.to(dtype=dtype, device=device), self.config,
                            nominal=self.nominal.to(dtype=dtype, device=device))


def _velocity_limits(lim: torch.Tensor) -> torch.Tensor:
    """URDF velocity limits, with a missing or zero one (URDF's "none given") as inf."""
    return torch.where(lim > 0, lim, torch.full_like(lim, float("inf")))


def _contact_set(model: Model, cfg: SimConfig) -> ContactSet:
    dt, dev = model.dtype, model.device
    bodies: List[int] = []
    pts, radii, weights = [], [], []
    link_weight = _link_weights(model) if cfg.contact_model == "soft" and cfg.ground else None
    for col in model.collisions:
        if col.body < 0:
            continue
        if col.kind == "sphere":
            local = torch.zeros(1, 3, dtype=dt, device=dev)
            r = col.size[0:1]
        elif col.kind == "box":
            signs = torch.tensor([[sx, sy, sz] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)],
                                 dtype=dt, device=dev)
            local = signs * (col.size / 2)
            r = torch.zeros(8, dtype=dt, device=dev)
        elif col.kind == "cylinder":
            k = cfg.cylinder_rim_points
            ang = torch.arange(k, dtype=dt, device=dev) * (2 * torch.pi / k)
            rad, half = col.size[0], col.size[1] / 2
            ring = torch.stack((rad * torch.cos(ang), rad * torch.sin(ang)), -1)
            local = torch.cat((torch.cat((ring, -half.expand(k, 1)), -1), torch.cat((ring, half.expand(k, 1)), -1)))
            r = torch.zeros(2 * k, dtype=dt, device=dev)
        else:
            continue
        pts.append(local @ col.R.T + col.p)
        radii.append(r)
        weights.append(torch.zeros_like(r) if link_weight is None
                       else link_weight[model.link_names.index(model.body_names[col.body])].expand(r.shape[0]))
        bodies += [col.body] * local.shape[0]
    local = torch.cat(pts) if pts else torch.zeros(0, 3, dtype=dt, device=dev)
    radius = torch.cat(radii) if radii else torch.zeros(0, dtype=dt, device=dev)
    weight = torch.cat(weights) if weights else torch.zeros(0, dtype=dt, device=dev)
    # Sphere pairs for self-collision: different bodies, not parent and child.
    pairs = []
    if cfg.self_collision:
        sph = [i for i in range(len(bodies)) if float(radius[i]) > 0]
        for a in range(len(sph)):
            for b in range(a + 1, len(sph)):
                i, j = sph[a], sph[b]
                bi, bj = bodies[i], bodies[j]
                if bi != bj and model.parent[bi] != bj and model.parent[bj] != bi:
                    pairs.append((i, j))
    body = torch.tensor(bodies, dtype=torch.long, device=dev)
    gb, gl, gr, gv, gc, greach, flat, gw = _groups(body, local, radius, weight)
    return ContactSet(body=body, local=local, radius=radius,
                      pairs=torch.tensor(pairs, dtype=torch.long, device=dev).reshape(-1, 2),
                      group_body=gb, group_local=gl, group_radius=gr, group_valid=gv, group_center=gc,
                      group_reach=greach, flat_index=flat, group_weight=gw)


def _link_weights(model: Model) -> torch.Tensor:
    """Return each link's translational inverse weight (1/kg) at its own centre of mass (n_links,), in one solve.

    Links fixed to the world get zero.
    """
    body = torch.tensor(model.link_body, device=model.device)
    moving = (body >= 0).nonzero()[:, 0]
    points = model.link_com if model.link_com is not None else model.link_p
    out = torch.zeros(len(model.link_names), dtype=model.dtype, device=model.device)
    if moving.numel():
        out[moving] = inverse_weights(model, body[moving], points[moving])[:, 0]
    return out


def build_system(model: Model, config: Union[SimConfig, Dict[str, Any], None] = None,
                 nominal: Optional[Model] = None) -> System:
    """Resolve a :class:`SimConfig` against a model.

    It resolves actuated joints by name, gains per joint, contact points from the collision
    geometry and rotors. Raises ConfigError naming the key at fault.
    """
    cfg = config or SimConfig()
    if isinstance(cfg, dict):
        cfg = SimConfig.from_mapping(cfg)  # type: ignore[attr-defined]  # from_mapping: set by schema.section
    dt, dev = model.dtype, model.device
    model = model.replace(gravity=torch.tensor(cfg.gravity, dtype=dt, device=dev))
    nominal = model if nominal is None else nominal.replace(gravity=model.gravity)
    n = torch.tensor(cfg.ground_normal, dtype=dt, device=dev)         # not zero: SimConfig.check
    names = list(cfg.actuated_joints) or list(model.joint_names)
    for nm in names:
        if nm not in model.joint_names:
            raise ConfigError(f"{{key}}: '{nm}' is not a joint of '{model.name}' "
                              f"(joints: {', '.join(model.joint_names)})", "simulator.actuated_joints")
    act_index = torch.tensor([model.joint_names.index(nm) for nm in names], dtype=torch.long, device=dev)
    na = len(names)

    def gains(val, key):
        t = torch.as_tensor(val, dtype=dt, device=dev)
        if t.ndim == 0:
            return t.expand(na).clone()
        if t.shape != (na,):
            raise ConfigError(f"has {t.numel()} entries for {na} actuated joints", f"simulator.{key}")
        return t

    rotors = Rotors(cfg.rotors, nominal) if cfg.rotors is not None else None

    def scalar(x):
        return torch.tensor(float(x), dtype=dt, device=dev)

    return System(
        model=model, nominal=nominal, config=cfg, actuated_joints=tuple(names), act_index=act_index,
        kp=gains(cfg.kp, "kp"), kd=gains(cfg.kd, "kd"), effort_limit=model.effort_limit[act_index],
        velocity_limit=_velocity_limits(model.velocity_limit[act_index]),
        actuator_lag=scalar(cfg.actuator_lag), ground_normal=n / torch.linalg.vector_norm(n),
        ground_height=scalar(cfg.ground_height), contact_stiffness=scalar(cfg.contact_stiffness),
        contact_damping=scalar(cfg.contact_damping), contact_time_constant=scalar(cfg.contact_time_constant),
        contact_damping_ratio=scalar(cfg.contact_damping_ratio),
        friction=scalar(cfg.friction),
        friction_smoothing=scalar(cfg.friction_smoothing),
        contact=_contact_set(model, cfg), rotors=rotors)
