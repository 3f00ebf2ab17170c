"""The step compiled by Inductor (C++ kernels on the CPU), for one system.

    step = CompiledStep(sys)              # compiles lazily, on the first call per batch shape
    state = step(state, action)           # as Simulator.step; differentiable in state and action
    sim = Simulator(model, config, compile=True)  # the same behind the usual wrapper

At one environment the eager step is bound by per-operation overhead; the compiled step
is one graph, which Inductor fuses into few kernels. On the CPU the forward and backward
graphs are traced here (AOTAutograd, no Dynamo) and called through one autograd.Function
(:class:`_Graphs`): torch.compile's per-call Python around the same graphs cost as much as
their kernels at one environment. torch.compile compiles the step elsewhere, and wherever
the direct trace fails (it uses torch's private tracing API; a warning says so).

Inside the graph the contact stage selects nothing (that would be a host synchronisation):
the graph holds the point groups seen near the ground so far and reports after each step
whether another came near (see :class:`CompiledStep`); evaluating every group cost half the
step of an arm at 4096 environments. (Contact sums reach the bodies through a one-hot product, not index_add:
fused with the joint-space scatters, Inductor on the CPU miscompiled the latter; see
stages/contact._to_bodies.) The system's tensors are constants of the graph: a changed
parameter means a new ``CompiledStep`` (calibration and domain randomisation use the
eager step). Compiling costs about two minutes for a nine-joint arm on a two-core machine
the first time and ~10 s once the persistent cache holds it: ``TORCHINDUCTOR_CACHE_DIR``
defaults here to ``~/.cache/diffsim_ros/torchinductor`` (Inductor's own default lies
under /tmp, which a reboot clears).

    step = ExportedStep(sys)              # forward only: the controller's prediction
    state = step(state, action)

:class:`ExportedStep` is the forward step compiled ahead of time (torch.export, then
AOTInductor) into a shared library per batch shape, called from C++ with no tracing,
guard or autograd wrapper in Python per call: at one environment the compiled step spends
about as long in those wrappers as in its kernels. The libraries are kept on disk under
``~/.cache/diffsim_ros/aoti``, keyed by the exported graph and the value of every constant
in it (the system's tensors), so a changed system is a new library, never a stale one.
"""
from __future__ import annotations

import hashlib
import itertools
import logging
import os
import platform
import tempfile
import types
import warnings
from typing import Any, Callable, Dict, List, Literal, Mapping, Optional, Sequence, Tuple, Union, cast

import torch

from .algorithms import model_constants
from .registry import apply_per_episode, apply_values
from .pipeline import batch_action, guard, step as pure_step
from .spatial import tracing
from .stages.contact import _near_groups
from .state import State
from .system import System

_SERIAL = itertools.count()
VECTOR_BATCH = 8     # from this many environments on, the CPU kernels are vectorised
CACHE_DIR = os.path.join(os.path.expanduser("~"), ".cache", "diffsim_ros", "torchinductor")


def _input_guards(fn):
    """Return the guard filter for Dynamo that keeps the guards on ``fn``'s arguments and global state.

    The guards kept are those on the arguments (shape, dtype, device, strides, requires_grad) and
    on the global state (grad mode and the like). The ones on the captured System (a few hundred:
    every tensor's metadata, every constant) and on the modules' globals are dropped: each
    CompiledStep compiles its own copy of the step function for one frozen System, so they hold as
    long as nobody patches diffsim_ros's modules or mutates the System's tensors in place (neither
    is supported: ``sys.replace`` and a new CompiledStep are), and checking them cost a fifth of a
    step at one environment.
    """
    inputs = frozenset(fn.__code__.co_varnames[:fn.__code__.co_argcount])

    def keep(entries):
        return [e.name == "" or e.name.split(".")[0].split("[")[0] in inputs for e in entries]
    return keep


def _own_copy(fn):
    """``fn`` with a code object of its own.

    Dynamo keeps compiled graphs per code object, so two CompiledSteps (two systems) never share,
    or pick from, each other's graphs.
    """
    code = fn.__code__.replace(co_name="%s_%d" % (fn.__code__.co_name, next(_SERIAL)))
    return types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)


def _persistent_cache() -> None:
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        os.makedirs(CACHE_DIR, exist_ok=True)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = CACHE_DIR


def pack_values(varying: Sequence[Tuple[str, int]], values: Mapping[str, object], like: torch.Tensor,
                per_episode: bool = False) -> torch.Tensor:
    """Return the vector a compiled step with ``varying`` parameters takes.

    It is ``values`` (name -> value of that parameter's size) concatenated in ``varying``'s order,
    as ``like``'s dtype and device. ``per_episode``: values (B, size), one row per environment; the
    result is (B, total).
    """
    missing = [n for n, _ in varying if n not in values]
    if missing or len(values) != len(varying):
        raise KeyError(f"values for {[n for n, _ in varying]} expected, got {sorted(values)}")
    return torch.cat([torch.as_tensor(values[n], dtype=like.dtype, device=like.device).reshape(
        (-1, k) if per_episode else (k,)) for n, k in varying], -1)


def _chooses_groups(sys: System) -> bool:
    """Whether a compiled step of ``sys`` evaluates only the contact groups near the ground.

    It does with ground contact, one semi-implicit substep (the contact is evaluated at the step's
    start, where the nearness is) and no self-collision pairs.
    """
    cfg, cs = sys.config, sys.contact
    return (cfg.ground and cfg.integrator == "semi_implicit" and cfg.substeps == 1 and cs.n > 0
            and cs.pairs.numel() == 0)


def _groups_key(sys: System, groups) -> Optional[tuple]:
    """Return ``groups`` as the key of a graph: a sorted tuple, or None when it is every group of ``sys``."""
    groups = tuple(groups)
    return None if len(groups) == sys.contact.group_valid.shape[0] else groups


def _inside(watch: System, groups: Optional[tuple], device) -> torch.Tensor:
    """(G,) bool: the groups of ``watch`` a graph over ``groups`` (None: all) evaluates."""
    inside = torch.zeros(watch.contact.group_valid.shape[0], dtype=torch.bool, device=device)
    inside[list(groups) if groups is not None else slice(None)] = True
    return inside


def _flags(new: State, data, action, watch: Optional[System], inside: Optional[torch.Tensor]):
    """Return the graph's flags after a step.

    They are whether everything is finite (the NaN guard's test, fused into the last kernels: the
    sum of everything is finite exactly when every entry is) and, with ``watch``, every group's
    nearness and whether one the graph leaves out came near.
    """
    parts = [x for x in (new.q, new.v, new.actuator, data.qdd, action) if x is not None]
    finite = torch.isfinite(torch.stack([x.sum() for x in parts]).sum())
    if watch is None:
        return finite, None, None
    near = _near_groups(watch, data.kin)
    return finite, near, (near & ~cast(torch.Tensor, inside)).any()   # inside: given with watch


def _small_batch_options(device: torch.device, batch: int) -> dict:
    """Inductor's options for a batch below VECTOR_BATCH on the CPU: no vector kernels.

    The batch is the vectorised dimension; the vector kernels and their scalar tails would cost
    compile time only.
    """
    return {"cpp.simdlen": 1} if device.type == "cpu" and batch < VECTOR_BATCH else {}


class _Graphs:
    """The step's graphs for one input signature, traced by AOTAutograd and compiled by Inductor directly.

    They are made without Dynamo: with ``train`` a forward graph (that also returns what the
    backward keeps) and a backward graph behind one autograd.Function, otherwise an inference graph.

    torch.compile makes the same two graphs; what this leaves out is its per-call machinery in
    Python (Dynamo's frame and guards, AOTAutograd's runtime wrappers, which look at each of the
    ~100 saved tensors on every call), about half of a forward and backward step at one
    environment. It can do without: the inputs are plain tensors of a fixed signature (the
    key), the System is constant, nothing is mutated and no output aliases an input (each is
    cloned in the graph, which Inductor folds into the kernel that computes it).
    """

    def __init__(self, fn, inputs, train: bool, options: dict):
        from torch._functorch.aot_autograd import aot_export_joint_simple
        from torch._functorch.partitioners import min_cut_rematerialization_partition
        from torch._inductor.compile_fx import compile_fx_inner
        from torch._inductor.decomposition import select_decomp_table
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        floating = [x.is_floating_point() for x in inputs]
        with torch.enable_grad(), warnings.catch_warnings():   # which outputs carry a gradient: one eager call
            warnings.simplefilter("ignore")
            probe = fn(*[x.detach().requires_grad_(f and train) for x, f in zip(inputs, floating)])
        self.n_out = len(probe)
        self.differentiable = [i for i, y in enumerate(probe) if y.requires_grad]
        self.constant = [i for i in range(self.n_out) if i not in self.differentiable]
        # The System's tensors stay real constants; the shape environment (static shapes: no
        # symbols) is what Inductor's on-disk graph cache asks of a tracing context.
        mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv())
        fake = [mode.from_tensor(x, static_shapes=True).requires_grad_(f and train) for x, f in zip(inputs, floating)]
        with tracing():
            graph = cast(torch.fx.GraphModule, aot_export_joint_simple(     # a GraphModule (torch's hint: Callable)
                fn, fake,  # type: ignore[arg-type]  # a list: torch's hint says tuple, its code takes either
                trace_joint=train, decompositions=select_decomp_table()))
        config = {"cpp_wrapper": bool(options.get("cpp_wrapper"))}
        config.update({k: v for k, v in options.items() if k.startswith("cpp.")})

        def compiled(gm, **kw):
            # Zeros, not empty memory: Inductor's cache key reads the example values.
            example = [torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=v.device).zero_()
                       for v in (n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder")]
            with torch._inductor.config.patch(config), torch._guards.tracing(torch._guards.TracingContext(mode)):
                return compile_fx_inner(gm, example, cpp_wrapper=config["cpp_wrapper"], **kw)
        self.backward = None
        if not train:
            self.forward = compiled(graph, is_inference=True)
            return
        fw, bw = min_cut_rematerialization_partition(graph, fake, num_fwd_outputs=self.n_out)
        places = [n for n in bw.graph.nodes if n.op == "placeholder"]     # kept tensors, then tangents
        self.tangent_strides = [n.meta["val"].stride() for n in places[len(places) - len(self.differentiable):]]
        self.forward, self.backward = compiled(fw), compiled(bw, is_backward=True)

    def __call__(self, inputs):
        if self.backward is None:
            return self.forward(list(inputs))
        return _GraphStep.apply(self, *inputs)


#: What CompiledStep._trace makes of a signature: the graphs and which of the step's outputs are tensors.
_Traced = Tuple[_Graphs, Tuple[bool, ...]]


class _GraphStep(torch.autograd.Function):
    """A :class:`_Graphs` pair as one node of the autograd graph."""

    @staticmethod
    def forward(ctx, graphs: _Graphs, *inputs):
        out = graphs.forward(list(inputs))
        ctx.graphs = graphs
        ctx.save_for_backward(*out[graphs.n_out:])
        ctx.mark_non_differentiable(*[out[i] for i in graphs.constant])
        return tuple(out[:graphs.n_out])

    @staticmethod
    def backward(ctx, *grads):
        graphs, kept = ctx.graphs, ctx.saved_tensors
        tangents = []
        for i, stride in zip(graphs.differentiable, graphs.tangent_strides):
            g = grads[i]
            if g.stride() != stride:
                g = torch.empty_strided(g.shape, stride, dtype=g.dtype, device=g.device).copy_(g)
            tangents.append(g)
        out = graphs.backward(list(kept) + tangents)
        return (None,) + tuple(g if need else None for g, need in zip(out, ctx.needs_input_grad[1:]))


class CompiledStep:
    """``Simulator.step`` for a fixed :class:`System`, compiled.

    With ``nan_check`` the graph also returns whether everything is finite (one host
    synchronisation), and only a non-finite step runs the eager guard that names the environment
    and quantity.

    With ground contact, one semi-implicit substep per step and no self-collision pairs, the
    step evaluates only the contact point groups that can reach the ground, as the eager step
    does, exactly: the graph also returns which groups' bounding spheres reach the ground at
    the step's start (where the contact is evaluated) and whether one it left out does. The
    first step at a batch shape runs every group, later ones a graph of the groups seen near
    so far, and a step that finds another group near is run again with every group (the set
    grows by it). One graph per set of groups, each compiled on first use: a robot that
    touches down with a new body compiles once more then.
    """

    def __init__(self, sys: System, nan_check: Optional[bool] = None, cpp_wrapper: bool = True,
                 watch: Optional[System] = None, groups: Optional[tuple] = None, direct: Optional[bool] = None,
                 varying: Sequence[Tuple[str, int]] = ()):
        """Set up the compiled step of ``sys``; the options are as follows.

        varying: ``(name, size)`` of the registry parameters (:mod:`.registry`) that are inputs
        of the graphs rather than constants: a call then passes their values as one vector, in this
        order (:func:`pack_values`), and the graphs apply them to ``sys`` (its structure must
        already admit them: a lag that the configuration leaves out is not made by a value).
        watch: the full system whose groups' nearness the graph reports, ``groups`` those of
        its groups ``sys`` holds (None: all); given to the graphs of the groups seen near.
        direct: trace and compile the forward and backward graphs here (:class:`_Graphs`)
        rather than through torch.compile (default: on the CPU, where it halves a forward and
        backward step at one environment; torch.compile is the fallback if that fails).
        """
        _persistent_cache()
        self.system = sys
        for model in (sys.model, sys.nominal):
            model_constants(model)
        self.nan_check = sys.config.nan_check if nan_check is None else nan_check
        inside = _inside(watch, groups, sys.model.device) if watch is not None else None

        self.varying = tuple((str(n), int(k)) for n, k in varying)
        names, sizes = [n for n, _ in self.varying], [k for _, k in self.varying]

        def flat(q, v, actuator, delay, t, latency, action, values):
            s = sys
            if names and values.dim() == 2:                   # one row per environment
                s = apply_per_episode(sys, dict(zip(names, torch.split(values, sizes, 1))))
            elif names:
                s = apply_values(sys, dict(zip(names, torch.split(values, sizes))))
            new, data = pure_step(s, State(q=q, v=v, actuator=actuator, delay=delay, t=t, latency=latency), action)
            return (new.q, new.v, new.actuator, new.delay, new.t, data.qdd) + _flags(new, data, action, watch, inside)

        self._flat = _own_copy(flat)
        # cpp_wrapper: the graph's kernels are called from generated C++ rather than Python,
        # which at one environment halves what is left of the per-call overhead.
        self._cpu = sys.model.device.type == "cpu"
        self._options = {"guard_filter_fn": _input_guards(self._flat)}
        if cpp_wrapper and self._cpu:
            self._options["cpp_wrapper"] = True
        self._fns: Dict[bool, Callable[..., Any]] = {}   # small batch? -> the torch.compile'd step
        self._direct = self._cpu if direct is None else direct
        self._graphs: Dict[tuple, Union[_Traced, Literal[False]]] = {}   # input signature -> (False: fall back)
        self._subsets = watch is None and _chooses_groups(sys)
        self._near: Dict[tuple, Optional[tuple]] = {}   # batch shape -> groups seen near (None: every group)
        self._by_groups: Dict[Optional[tuple], "CompiledStep"] = {}
        self.reruns = 0                              # steps run again with every group (a group came near)

    def _compiled(self, batch: int):
        """Return the compiled function for this batch size's class.

        The batch is the innermost dimension, the one Inductor's CPU kernels vectorise: below
        VECTOR_BATCH environments the vector kernels (and their scalar tails) would cost compile
        time only, so they are not generated (half the compile time of the quadrotor's step).
        """
        small = _small_batch_options(self.system.model.device, batch)
        fn = self._fns.get(bool(small))
        if fn is None:
            fn = self._fns[bool(small)] = torch.compile(self._flat, fullgraph=True, dynamic=False,
                                                        options=dict(self._options, **small))
        return fn

    def _run(self, state: State, action, values=None):
        inputs = (state.q, state.v, state.actuator, state.delay, state.t, state.latency, action, values)
        if self._direct:
            tensors = [x.contiguous() for x in inputs if x is not None]
            train = torch.is_grad_enabled() and any(x.requires_grad for x in tensors)
            key = (train,) + tuple((x.shape, x.dtype) if x is not None else None for x in inputs)
            graphs = self._graphs.get(key)
            if graphs is None:
                graphs = self._graphs[key] = self._trace(inputs, tensors, train)
            if graphs:
                out = iter(graphs[0](tensors))
                return tuple(next(out) if kept else None for kept in graphs[1])
        return self._compiled(state.q[..., 0].numel())(*inputs)

    def _trace(self, inputs, tensors, train: bool) -> Union[_Traced, Literal[False]]:
        """(_Graphs, which of the step's outputs are tensors) for this signature.

        False instead (with a warning) where tracing or compiling them failed: torch.compile steps
        then.
        """
        present = [x is not None for x in inputs]
        kept: List[bool] = []
        flat = self._flat

        def fn(*xs):
            it = iter(xs)
            out = flat(*[next(it) if p else None for p in present])
            kept[:] = [y is not None for y in out]
            return tuple(y.clone() for y in out if y is not None)
        options = dict(self._options, **_small_batch_options(tensors[0].device, tensors[0][..., 0].numel()))
        try:
            graphs = _Graphs(fn, tensors, train, options)
        except Exception as e:         # noqa: BLE001 - private torch APIs: torch.compile remains
            warnings.warn("diffsim_ros: tracing the step's graphs directly failed (%s: %s); torch.compile "
                          "compiles it instead" % (type(e).__name__, str(e).splitlines()[0] if str(e) else ""))
            return False
        return graphs, tuple(kept)

    def _graph_of(self, groups: Optional[tuple]) -> "CompiledStep":
        """Return the step over the contact groups ``groups`` (None: all), reporting every group's nearness."""
        hit = self._by_groups.get(groups)
        if hit is None:
            sys = self.system if groups is None else self.system.replace(contact=self.system.contact.subset(groups))
            hit = self._by_groups[groups] = CompiledStep(sys, self.nan_check, "cpp_wrapper" in self._options,
                                                         watch=self.system, groups=groups, direct=self._direct,
                                                         varying=self.varying)
        return hit

    def __call__(self, state: State, action, values: Optional[torch.Tensor] = None) -> State:
        """One step; ``values``: the vector of the ``varying`` parameters (needed when there are some)."""
        action = batch_action(self.system, state, action)
        if self.varying:
            want = sum(k for _, k in self.varying)
            shapes = ((want,), (state.q.shape[0], want)) if state.q.dim() == 2 else ((want,),)
            if values is None or tuple(values.shape) not in shapes:
                raise ValueError(f"this compiled step takes the values of {[n for n, _ in self.varying]} as a "
                                 f"vector of {want} (or one per environment, {state.q.shape[:-1]} x {want}), "
                                 f"got {None if values is None else tuple(values.shape)}")
            values = values.to(dtype=state.q.dtype, device=state.q.device).contiguous()
        else:
            values = None
        if self._subsets:
            key = tuple(state.q.shape)
            groups = self._near.get(key)
            out = self._graph_of(groups)._run(state, action, values)
            if groups is None or bool(out[8]):                        # one host synchronisation
                near = set(torch.nonzero(out[7]).flatten().tolist())
                if groups is not None:
                    self.reruns += 1                                  # run again with every group
                    out = self._graph_of(None)._run(state, action, values)
                # Every group: the full graph (already compiled), not a copy of it under another key.
                self._near[key] = _groups_key(self.system, sorted(near | set(groups or ())))
        else:
            out = self._run(state, action, values)
        nq, nv, act, delay, t, qdd, finite = out[:7]
        new = State(q=nq, v=nv, actuator=act, delay=delay, t=t, latency=state.latency)
        if self.nan_check and not bool(finite):        # one host synchronisation; the guard names what
            guard(state, new, action, qdd)
        return new


AOTI_DIR = os.path.join(os.path.expanduser("~"), ".cache", "diffsim_ros", "aoti")
#: The state's fields the exported step takes (latency, an input only, is passed through) and returns.
_STATE_FIELDS = ("q", "v", "actuator", "delay", "t", "latency")
_OUT_FIELDS = _STATE_FIELDS[:-1]


class _Forward(torch.nn.Module):
    """The step as a module for torch.export: the System's tensors are constants of the graph.

    Inputs and outputs are the state's fields that exist (None ones are left out), then the
    action; outputs end with qdd, the finite flag of the NaN guard and, where the step has
    contact groups to choose (``watch``: the full system, ``inside``: the mask of its groups
    ``sys`` holds), every group's nearness and whether one left out came near.
    """

    def __init__(self, sys: System, present: Tuple[bool, ...], watch: Optional[System] = None,
                 inside: Optional[torch.Tensor] = None):
        super().__init__()
        self.system, self.present, self.watch, self.inside = sys, present, watch, inside

    def forward(self, *tensors):
        it = iter(tensors)
        fields = {f: (next(it) if p else None) for f, p in zip(_STATE_FIELDS, self.present)}
        action = next(it)
        new, data = pure_step(self.system, State(**fields), action)
        finite, near, outside = _flags(new, data, action, self.watch, self.inside)
        outs = tuple(x for x in (getattr(new, f) for f in _OUT_FIELDS) if x is not None) + (data.qdd, finite)
        return outs + ((near, outside) if self.watch is not None else ())


def _fingerprint(program, batch: int) -> str:
    """Return what decides the compiled library.

    That is the graph's code, every constant's value, the torch version and the CPU's vector
    instruction set (the library is built for it).
    """
    from torch._inductor.cpu_vec_isa import pick_vec_isa
    h = hashlib.sha256()
    for part in (torch.__version__, platform.machine(), str(pick_vec_isa()), str(batch),
                 program.graph_module.code):
        h.update(part.encode())
        h.update(b"\0")
    for name, value in sorted(dict(program.constants, **program.state_dict).items()):
        h.update(name.encode())
        if isinstance(value, torch.Tensor):
            t = value.detach().to("cpu").contiguous()
            h.update(("%s%s" % (t.dtype, tuple(t.shape))).encode())
            h.update(t.numpy().tobytes() if t.dtype != torch.bfloat16 else t.view(torch.int16).numpy().tobytes())
        else:
            h.update(repr(value).encode())
    return h.hexdigest()[:40]


class _QuietISA(logging.Filter):
    """Log filter that passes every record but the instruction-set 'mismatch' of AOTInductor.

    Loading a library built without vector kernels (one environment) logs an instruction-set
    'mismatch' that is by design; other records pass.
    """

    def filter(self, record):
        return "AOTI_CPU_ISA" not in record.getMessage()


class ExportedStep:
    """The forward step of a fixed :class:`System`, compiled ahead of time per batch shape.

    It is compiled with torch.export + AOTInductor: the same results as the compiled step, without
    its per-call Python (the controller's prediction at one environment). No gradient: inputs
    that require grad with grad mode on are refused (use :class:`CompiledStep` or the eager
    step). The first call for a shape exports the step (seconds) and builds the library
    (about 20 s for an arm on a two-core machine) or loads it from ``cache_dir``.
    """

    def __init__(self, sys: System, nan_check: Optional[bool] = None, cache_dir: Optional[str] = None):
        _persistent_cache()
        self.system = sys
        for model in (sys.model, sys.nominal):
            model_constants(model)
        self.nan_check = sys.config.nan_check if nan_check is None else nan_check
        self.cache_dir = cache_dir or AOTI_DIR
        self._runs: Dict[tuple, object] = {}   # (shape, dtype, device, fields present, groups) -> loader
        self._groups: Dict[tuple, Optional[tuple]] = {}     # (shape, ...) -> the groups its library holds
        self._choose = _chooses_groups(sys)
        self.built = 0          # libraries built (not found in the cache) by this object
        self.reruns = 0         # steps run again with every contact group (a group left out came near)

    def _library(self, inputs, present, groups):
        key = (tuple(inputs[0].shape), inputs[0].dtype, inputs[0].device, present, groups)
        hit = self._runs.get(key)
        if hit is None:
            hit = self._runs[key] = self._load(inputs, present, groups)
        return hit

    def _load(self, inputs, present, groups):
        batch = inputs[0][..., 0].numel()
        sys, watch, inside = self.system, None, None
        if self._choose:
            watch = self.system
            inside = _inside(watch, groups, inputs[0].device)
            if groups is not None:
                sys = self.system.replace(contact=self.system.contact.subset(groups))
        with torch.no_grad():
            program = torch.export.export(_Forward(sys, present, watch, inside), tuple(inputs), strict=False)
        path = os.path.join(self.cache_dir, _fingerprint(program, batch) + ".pt2")
        runner = None
        if os.path.exists(path):
            try:
                runner = _load_package(path)
            except Exception as exc:                   # a truncated or foreign file: build it again
                warnings.warn(f"ExportedStep: {path} could not be loaded ({exc}); building it again")
        if runner is None:
            os.makedirs(self.cache_dir, exist_ok=True)
            options = _small_batch_options(inputs[0].device, batch)
            fd, tmp = tempfile.mkstemp(suffix=".pt2", dir=self.cache_dir)
            os.close(fd)
            try:
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
                    torch._inductor.aoti_compile_and_package(program, package_path=tmp, inductor_configs=options)
                os.replace(tmp, path)                  # whole or not at all, for a concurrent reader
            finally:
                if os.path.exists(tmp):
                    os.remove(tmp)
            self.built += 1
            runner = _load_package(path)
        return runner.loader

    def __call__(self, state: State, action) -> State:
        action = batch_action(self.system, state, action)
        fields = [getattr(state, f) for f in _STATE_FIELDS]
        if torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in fields + [action]):
            raise RuntimeError("ExportedStep computes no gradient: its inputs require grad; step with "
                               "CompiledStep (Simulator(..., compile=True)) or the eager Simulator instead")
        present = tuple(x is not None for x in fields)
        inputs = [x.contiguous() for x in fields if x is not None] + [action.contiguous()]
        shape = (tuple(inputs[0].shape), inputs[0].dtype, inputs[0].device, present)
        first = shape not in self._groups
        groups = self._groups.get(shape)
        outs = self._library(inputs, present, groups).run(inputs)
        if self._choose:
            if first:
                # The groups near at the first state: their library is built now, so that a running
                # controller never waits for one; a group left out coming near later switches
                # this shape to the full library for good.
                groups = self._groups[shape] = _groups_key(self.system, torch.nonzero(outs[-2]).flatten().tolist())
                if groups is not None:
                    self._library(inputs, present, groups)
            elif groups is not None and bool(outs[-1]):
                self.reruns += 1
                self._groups[shape] = None
                outs = self._library(inputs, present, None).run(inputs)
        else:
            self._groups[shape] = None
        outs = iter(outs)
        new = State(**{f: (next(outs) if p else None)  # type: ignore[arg-type]  # q and v: always present
                       for f, p in zip(_OUT_FIELDS, present)}, latency=state.latency)
        qdd, finite = next(outs), next(outs)
        if self.nan_check and not bool(finite):
            guard(state, new, action, qdd)
        return new


def _load_package(path: str):
    quiet = _QuietISA()
    log = logging.getLogger("torch.export.pt2_archive._package")
    log.addFilter(quiet)
    try:
        with warnings.catch_warnings():        # torch's own deprecation notice while it unpickles the call spec
            warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
            return torch._inductor.aoti_load_package(path)
    finally:
        log.removeFilter(quiet)
