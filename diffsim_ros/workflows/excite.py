"""``diffsim-ros excite``: an identification motion on the MuJoCo stand-in, recorded for sysid.

    diffsim-ros excite --config config/reach_arm.yaml --duration 12 --amplitude 0.5 --seed 3 --out runs/excite_arm
    diffsim-ros sysid runs/excite_arm/bag --params mass_scale,joint_damping_scale,actuator_lag,latency --out runs/sysid

Starts, as separate processes on one isolated ROS_DOMAIN_ID (as ``diffsim-ros loop`` does):
``trajectory_recorder``, ``mujoco_plant`` (lockstep) and ``policy_controller`` with
``mode: excite`` (control/excitation.py: the motion; the supervisor, the limits and the
command outputs are the policy's own), runs the motion to its end, stops the nodes (the
recorder closes the bag) and checks that the bag holds every command the controller sent.
``--out`` gets ``bag/``, ``logs/`` and ``excite.json`` (settings, counts, the sysid command).

On a robot: start only the controller in excite mode and the recorder, against the robot's
own drivers (doc in the README, "Excitation").
"""
from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Union

from .loop import (LoopError, _Clock, _NodeRun, _Processes, bag_counts, follow_run, recorded_types, run_deployment,
                   state_topic_and_type)


def excitation_settings(params: Dict[str, Any], overrides: Dict[str, Any], source: str = ""):
    """Return the ExcitationConfig of a config file's ``excitation:`` section.

    ``overrides`` (CLI options) go on top; an ExcitationError names the bad key.
    """
    from ..control.excitation import ExcitationConfig, ExcitationError

    sec = params.get("excitation", {}) or {}
    if not isinstance(sec, dict):
        raise ExcitationError(f"{source}: 'excitation' must be a mapping of settings, got {sec!r}")
    values = dict(sec)
    values.update({k: v for k, v in overrides.items() if v is not None})
    return ExcitationConfig.from_mapping(values)


def run_excite(config: str, out: str, overrides: Optional[Dict[str, Any]] = None,
               perturbation: Optional[Dict[str, Any]] = None, domain: Optional[int] = None,
               timeout: float = 600.0, first_state_timeout: float = 60.0,
               log: Callable[[str], None] = print) -> Dict[str, Any]:
    """Run the excitation of ``config`` on the stand-in and record it into ``out/bag``.

    Returns the summary written to ``out/excite.json``. Bad settings raise ExcitationError (before
    any process starts); a node that fails raises LoopError naming it and its log.
    """
    from .. import config as cfgmod
    from ..control.excitation import ArmExcitation, ExcitationRunner, QuadrotorExcitation, identifiable_parameters

    out_dir = Path(out)
    bag = out_dir / "bag"
    if bag.exists():
        raise LoopError(f"{bag} exists already; choose another --out")
    params = cfgmod.load_yaml(config)
    params["urdf"] = str(cfgmod.resolve_urdf(params, config))
    exc = excitation_settings(params, overrides or {}, config)
    # Build it here first: a robot or setting the excitation refuses stops the run before any node starts.
    runner = ExcitationRunner(params, exc, source=config)
    floating = runner.model.floating_base
    # The stand-in's parameters as mujoco_plant declares them (a number for sensor_noise: both
    # entries); a preset takes the values of the robot's kind.
    from ..plant.perturbation import resolve_perturbation, ros_values

    kind = "arm" if not floating else ("multirotor" if (params.get("simulator") or {}).get("rotors") else "legged")
    perturbation = resolve_perturbation(perturbation or {}, kind)
    plant_perturbation = ros_values(perturbation, "--perturb")
    # ExcitationRunner sets a multirotor's QuadrotorExcitation or an arm's ArmExcitation (mypy takes the
    # attribute's type from the first of the two assignments).
    signal: Union[ArmExcitation, QuadrotorExcitation] = runner.signal
    initial = None
    if floating:
        initial = [float(x) for x in exc.home]
        lead = 0
    else:
        import numpy as np

        assert isinstance(signal, ArmExcitation)      # a fixed base: an arm's excitation
        lead = signal.lead_steps(np.zeros(len(runner.actuated_joints)))
    total_s = (runner.signal.steps + lead) * runner.dt
    out_dir.mkdir(parents=True, exist_ok=True)
    logs = out_dir / "logs"
    logs.mkdir(exist_ok=True)
    domain = random.randint(101, 232) if domain is None else int(domain)
    log(f"[excite] {runner.describe()}")
    log(f"[excite] on the MuJoCo stand-in (ROS_DOMAIN_ID={domain}, perturbation {json.dumps(perturbation or {})}), "
        f"{total_s:.2f} s simulated, recording to {bag}")
    procs = _Processes(logs, domain)
    state_topic, state_type = state_topic_and_type(floating)
    plant: Dict[str, Any] = {f"perturbation.{k}": v for k, v in plant_perturbation.items()}
    if initial is not None:
        plant["initial_positions"] = initial
    controller: Dict[str, Any] = {"mode": "excite", "config": params_file(params, out_dir), "lockstep": True,
                                  "use_sim_time": True, "state_timeout_s": 5.0, "wait_for_subscribers": 2,
                                  "wait_for_recorders": 1, "stats_file": str(logs / "controller_stats.json")}
    for k, v in exc.as_dict().items():
        controller[f"excitation.{k}"] = list(v) if isinstance(v, (list, tuple)) else v
    if not controller["excitation.steps"]:
        controller["excitation.steps"] = ["none"]

    def excite(run: _NodeRun) -> None:
        """Start the recorder and the plant, wait for the plant's first states, run the excitation.

        The controller's excitation runs to its end.
        """
        procs.start("recorder", "trajectory_recorder", {
            "output_dir": str(bag), "drain_s": 1.0, "types": json.dumps(recorded_types(floating))})
        procs.start("plant", "mujoco_plant", dict(plant, config=controller["config"], mode="lockstep"))
        run.clock = clock = _Clock(domain, state_topic, state_type)
        end = time.monotonic() + timeout
        first = time.monotonic() + min(first_state_timeout, timeout)
        while clock.states < 2:
            procs.check_alive("waiting for the stand-in's first states")
            if time.monotonic() > first:
                raise LoopError(f"mujoco_plant published no state on {state_topic} within {first_state_timeout:g} s; "
                                f"its log ({logs / 'plant.log'}) ends with:\n{procs.log('plant', 1500)}")
            time.sleep(0.05)
        procs.start("controller", "policy_controller", controller)
        follow_run(clock, procs, total_s, end, "the excitation ran",
                   f"the excitation did not reach {total_s:.2f} s of simulated time within {timeout:g} s", logs,
                   "excite", log)

    wall = run_deployment(procs, logs, "excite", excite, log)
    stats_file = logs / "controller_stats.json"
    stats = json.loads(stats_file.read_text()) if stats_file.exists() else {}
    counts = bag_counts(bag)
    lost = {t: n - counts.get(t, 0) for t, n in stats.get("published", {}).items() if counts.get(t, 0) != n}
    names = identifiable_parameters(floating, runner.sim.rotors is not None)
    summary = {"config": str(config), "bag": str(bag), "excitation": exc.as_dict(), "perturbation": perturbation or {},
               "simulated_s": total_s, "lead_in_steps": lead, "wall_s": wall, "domain_id": domain,
               "controller": {k: stats.get(k) for k in ("published", "policy_commands", "safe_commands",
                                                         "states_rejected", "commands_clamped", "faults")},
               "bag_counts": counts, "lost": lost, "parameters": list(names),
               "sysid": f"diffsim-ros sysid {bag} --params {','.join(names)} --out {out_dir / 'sysid'}"}
    (out_dir / "excite.json").write_text(json.dumps(summary, indent=2, default=str))
    c = summary["controller"]
    log(f"[excite] done in {wall:.1f} s: {c.get('policy_commands')} excitation commands, "
        f"{c.get('safe_commands')} safe commands, {c.get('states_rejected')} states rejected")
    log("[excite] bag: every published message recorded" if not lost else f"[excite] bag: MISSING messages {lost}")
    log(f"[excite] identify: {summary['sysid']}")
    return summary


def params_file(params: Dict[str, Any], out_dir: Path) -> str:
    """Write the config (URDF resolved to a path) as a ROS parameter file in ``out_dir`` for the nodes."""
    import yaml

    path = out_dir / "robot.yaml"
    path.write_text("# written by diffsim-ros excite\n"
                    + yaml.safe_dump({"/**": {"ros__parameters": params}}, sort_keys=False))
    return str(path.resolve())
