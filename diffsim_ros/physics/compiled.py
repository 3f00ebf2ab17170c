"""The step compiled by torch.compile (Inductor, C++ kernels on the CPU), for one system.

    step = CompiledStep(sys)              # compiles lazily, on the first call per batch shape
    state = step(state, action)           # as Simulator.step; differentiable in state and action
    sim = Simulator(model, config, compile=True)  # the same behind the usual wrapper

At one environment the eager step is bound by per-operation overhead; the compiled step
is one graph (no host synchronisation: the contact stage evaluates every point group
under compilation instead of selecting the near ones), which Inductor fuses into few
kernels. (Contact sums reach the bodies through a one-hot product, not index_add: fused
with the joint-space scatters, Inductor on the CPU miscompiled the latter; see
stages/contact._to_bodies.) The system's tensors are constants of the graph: a changed
parameter means a new ``CompiledStep`` (calibration and domain randomisation use the
eager step). Compiling costs about two minutes for a nine-joint arm on a two-core machine
the first time and ~10 s once the persistent cache holds it: ``TORCHINDUCTOR_CACHE_DIR``
defaults here to ``~/.cache/diffsim_ros/torchinductor`` (Inductor's own default lies
under /tmp, which a reboot clears).
"""
from __future__ import annotations

import itertools
import os
import types
from typing import Optional

import torch

from .algorithms import model_constants
from .pipeline import batch_action, guard, step as pure_step
from .state import State
from .system import System

_SERIAL = itertools.count()
VECTOR_BATCH = 8     # from this many environments on, the CPU kernels are vectorised
CACHE_DIR = os.path.join(os.path.expanduser("~"), ".cache", "diffsim_ros", "torchinductor")


def _input_guards(fn):
    """The guard filter for Dynamo that keeps the guards on ``fn``'s arguments (shape, dtype,
    device, strides, requires_grad) and on the global state (grad mode and the like). The ones on
    the captured System (a few hundred: every tensor's metadata, every constant) and on the
    modules' globals are dropped: each CompiledStep compiles its own copy of the step function
    for one frozen System, so they hold as long as nobody patches diffsim_ros's modules or
    mutates the System's tensors in place (neither is supported: ``sys.replace`` and a new
    CompiledStep are), and checking them cost a fifth of a step at one environment."""
    inputs = frozenset(fn.__code__.co_varnames[:fn.__code__.co_argcount])

    def keep(entries):
        return [e.name == "" or e.name.split(".")[0].split("[")[0] in inputs for e in entries]
    return keep


def _own_copy(fn):
    """``fn`` with a code object of its own: Dynamo keeps compiled graphs per code object,
    so two CompiledSteps (two systems) never share, or pick from, each other's graphs."""
    code = fn.__code__.replace(co_name="%s_%d" % (fn.__code__.co_name, next(_SERIAL)))
    return types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)


def _persistent_cache() -> None:
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        os.makedirs(CACHE_DIR, exist_ok=True)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = CACHE_DIR


class CompiledStep:
    """``Simulator.step`` for a fixed :class:`System`, compiled; with ``nan_check`` the graph
    also returns whether everything is finite (one host synchronisation), and only a
    non-finite step runs the eager guard that names the environment and quantity."""

    def __init__(self, sys: System, nan_check: Optional[bool] = None, cpp_wrapper: bool = True):
        _persistent_cache()
        self.system = sys
        for model in (sys.model, sys.nominal):
            model_constants(model)
        self.nan_check = sys.config.nan_check if nan_check is None else nan_check

        def flat(q, v, actuator, delay, t, action):
            new, data = pure_step(sys, State(q=q, v=v, actuator=actuator, delay=delay, t=t), action)
            # The NaN guard's test inside the graph (fused into its last kernels): the sum of
            # everything is finite exactly when every entry is.
            parts = [x for x in (new.q, new.v, new.actuator, data.qdd, action) if x is not None]
            finite = torch.isfinite(torch.stack([x.sum() for x in parts]).sum())
            return new.q, new.v, new.actuator, new.delay, new.t, data.qdd, finite

        self._flat = _own_copy(flat)
        # cpp_wrapper: the graph's kernels are called from generated C++ rather than Python,
        # which at one environment halves what is left of the per-call overhead.
        self._cpu = sys.model.device.type == "cpu"
        self._options = {"guard_filter_fn": _input_guards(self._flat)}
        if cpp_wrapper and self._cpu:
            self._options["cpp_wrapper"] = True
        self._fns = {}

    def _compiled(self, batch: int):
        """The compiled function for this batch size's class. The batch is the innermost
        dimension, the one Inductor's CPU kernels vectorise: below VECTOR_BATCH environments
        the vector kernels (and their scalar tails) would cost compile time only, so they
        are not generated (half the compile time of the quadrotor's step)."""
        small = self._cpu and batch < VECTOR_BATCH
        fn = self._fns.get(small)
        if fn is None:
            options = dict(self._options, **({"cpp.simdlen": 1} if small else {}))
            fn = self._fns[small] = torch.compile(self._flat, fullgraph=True, dynamic=False, options=options)
        return fn

    def __call__(self, state: State, action) -> State:
        action = batch_action(self.system, state, action)
        fn = self._compiled(state.q[..., 0].numel())
        nq, nv, act, delay, t, qdd, finite = fn(state.q, state.v, state.actuator, state.delay, state.t, action)
        new = State(q=nq, v=nv, actuator=act, delay=delay, t=t)
        if self.nan_check and not bool(finite):        # one host synchronisation; the guard names what
            guard(state, new, action, qdd)
        return new
