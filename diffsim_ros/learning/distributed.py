"""Data-parallel gradient training over ``torch.distributed`` (launched by ``torchrun``).

    torchrun --standalone --nproc_per_node=2 -m diffsim_ros.cli train --config config/hover.yaml --out runs/hover

Every rank (process) builds the same task and policy, draws the same full batch of
``training.num_envs`` episodes from the same generator (same seed) and simulates its
own contiguous slice of it (rank r: environments r*n/W .. (r+1)*n/W - 1, for world
size W). The training loss is a mean over environments, so the average of the ranks'
gradients is the gradient of the whole batch: the update equals the single-process
update over all environments (up to the order of floating-point sums). The running
observation normaliser is fed the whole batch (the slices gathered in rank order),
evaluation runs on rank 0 and its result is broadcast, and a divergence on any rank
makes every rank drop and retry the iteration. Rank 0 alone writes the run's folder.

Backends: gloo on the CPU, NCCL on GPUs (rank -> ``cuda:LOCAL_RANK``). Outside torchrun
(or with a world size of 1) :data:`SINGLE` stands for the plain single-process run and
every helper here is a no-op that costs nothing.
"""
from __future__ import annotations

import os
import pickle
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Iterable, List, Optional

import torch

from ..physics import ConfigError, SimulationError

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")     # set by torchrun for every worker
DEFAULT_TIMEOUT_S = 600.0       # s, longest wait of one collective (a stuck rank fails the run then)


class DistributedError(ConfigError):
    """A distributed run that cannot start.

    No torchrun environment, a batch the ranks cannot share evenly, a device that does not fit the
    ranks.
    """


@dataclass
class Context:
    """Where this process stands in a data-parallel run.

    rank: this process, 0 .. world_size - 1 [0]; world_size: processes in the run [1];
    local_rank: this process on its machine (its GPU under NCCL) [0]; backend: "gloo" or
    "nccl", None while no process group is set up [None]; device: where the collectives'
    tensors live (the GPU under NCCL) [cpu].
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: Optional[str] = None
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def active(self) -> bool:
        """Whether several processes share the work (collectives are needed)."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that writes the run's folder, evaluates and prints."""
        return self.rank == 0

    # ------------------------------------------------------------------ sharding
    def shard(self, n: int, what: str = "training.num_envs") -> slice:
        """Return this rank's contiguous share of ``n`` environments.

        A DistributedError naming ``what`` when ``n`` is not a multiple of the world size.
        """
        check_divisible(n, self.world_size, what)
        k = n // self.world_size
        return slice(self.rank * k, (self.rank + 1) * k)

    # ------------------------------------------------------------------ collectives
    def gather_batch(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate the ranks' slices in rank order along the first dimension.

        The slices have leading dim = this rank's environments; the result is the whole batch, on every
        rank. ``x`` unchanged when not distributed.
        """
        if not self.active:
            return x
        import torch.distributed as dist

        flat = x.detach().contiguous().to(self.device)
        parts = [torch.empty_like(flat) for _ in range(self.world_size)]
        dist.all_gather(parts, flat)
        return torch.cat(parts, 0).to(x.device)

    def average_gradients(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Replace every parameter's gradient by its mean over the ranks.

        One all-reduce of all of them flattened; a missing gradient counts as zero.
        """
        if not self.active:
            return
        import torch.distributed as dist

        params = [p for p in params if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params]).to(self.device)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat /= self.world_size
        i = 0
        for p in params:
            n = p.numel()
            p.grad.copy_(flat[i:i + n].view_as(p.grad))
            i += n

    def mean(self, values: List[float]) -> List[float]:
        """Return the mean over the ranks of each number in ``values`` (in float64)."""
        if not self.active:
            return list(values)
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return (t / self.world_size).tolist()

    def broadcast_module(self, module: torch.nn.Module) -> None:
        """Every rank takes rank 0's parameters and buffers of ``module`` (in place)."""
        if not self.active:
            return
        import torch.distributed as dist

        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                buf = t.detach().to(self.device)
                dist.broadcast(buf, 0)
                t.copy_(buf.to(t.device))

    def from_rank0(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` run on rank 0 alone; every rank returns its result, or raises the exception it raised.

        Both are pickled across. Keeps the ranks in step where only rank 0 can or should look, e.g. at
        the run's folder.
        """
        if not self.active:
            return fn()
        import torch.distributed as dist

        box: List[Any] = [None]
        if self.is_main:
            try:
                box[0] = (True, fn())
            except Exception as exc:  # noqa: BLE001 - re-raised on every rank below
                box[0] = (False, _picklable(exc))
        dist.broadcast_object_list(box, src=0, device=self.device if self.backend == "nccl" else None)
        ok, value = box[0]
        if not ok:
            raise value
        return value

    def agreed(self, fn: Callable[..., Any], *args, **kw) -> Any:
        """``fn(*args, **kw)`` (a simulation step), with a SimulationError on any rank raised on every rank.

        So all of them drop the iteration together (one small all-reduce per call). The error names
        the first rank that diverged and its message.
        """
        if not self.active:
            return fn(*args, **kw)
        import torch.distributed as dist

        out, failure = None, None
        try:
            out = fn(*args, **kw)
        except SimulationError as exc:
            failure = exc
        flag = torch.tensor([1.0 if failure is not None else 0.0], dtype=torch.float64, device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.SUM)
        if float(flag) == 0.0:
            return out
        messages: List[Optional[str]] = [None] * self.world_size
        dist.all_gather_object(messages, None if failure is None else str(failure))
        r = next(i for i, m in enumerate(messages) if m is not None)
        raise SimulationError(f"rank {r}: {messages[r]} (environments numbered within rank {r}'s share)")

    def gather_objects(self, obj: Any) -> List[Any]:
        """Every rank's ``obj`` (picklable), in rank order, on every rank."""
        if not self.active:
            return [obj]
        import torch.distributed as dist

        out: List[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def barrier(self, quiet: bool = False) -> None:
        """Wait until every rank is here.

        ``quiet``: on the way out after an error, where a rank may have left already: nothing to wait
        for then, and no error.
        """
        if not self.active or self.backend is None:
            return
        import torch.distributed as dist

        try:
            dist.barrier()
        except Exception:  # noqa: BLE001 - the peers are gone
            if not quiet:
                raise


SINGLE = Context()      # the single-process run


def check_divisible(n: int, world_size: int, what: str = "training.num_envs") -> None:
    """Raise a DistributedError unless ``n`` environments split evenly over ``world_size`` ranks."""
    if world_size > 1 and n % world_size:
        below, above = n - n % world_size, n + world_size - n % world_size
        raise DistributedError(f"{what} = {n} is not divisible by the world size {world_size} (torchrun "
                               f"processes over all nodes): every rank must simulate the same number of "
                               f"environments; use {below or world_size} or {above}, or another "
                               f"--nproc_per_node")


def launched_by_torchrun() -> bool:
    """Whether this process runs under torchrun (its RANK, WORLD_SIZE and LOCAL_RANK are set)."""
    return all(k in os.environ for k in TORCHRUN_VARS)


def from_environment(required: bool = False) -> Context:
    """Read this process's place from torchrun's environment variables.

    :data:`SINGLE` outside torchrun (a DistributedError then if ``required``, as ``train
    --distributed`` asks).
    """
    if not launched_by_torchrun():
        if required:
            missing = [k for k in TORCHRUN_VARS if k not in os.environ]
            raise DistributedError(f"--distributed: no torchrun environment ({', '.join(missing)} unset); start "
                                   f"the run with torchrun --nproc_per_node=N -m diffsim_ros.cli train ...")
        return SINGLE
    vals = {}
    for k in TORCHRUN_VARS:
        try:
            vals[k] = int(os.environ[k])
        except ValueError:
            raise DistributedError(f"environment variable {k}={os.environ[k]!r} is not an integer") from None
    rank, world, local = vals["RANK"], vals["WORLD_SIZE"], vals["LOCAL_RANK"]
    if world < 1 or not 0 <= rank < world or local < 0:
        raise DistributedError(f"inconsistent torchrun environment: RANK={rank}, WORLD_SIZE={world}, "
                               f"LOCAL_RANK={local}")
    return Context(rank=rank, world_size=world, local_rank=local)


def rank_device(ctx: Context, device: torch.device) -> torch.device:
    """Return the device this rank trains on.

    ``cuda`` becomes ``cuda:LOCAL_RANK`` (one GPU per process); the CPU stays. An explicit
    ``cuda:N`` cannot serve several ranks of a machine (NCCL needs one GPU per rank): a
    DistributedError.
    """
    device = torch.device(device)
    if not ctx.active or device.type != "cuda":
        return device
    if device.index is not None:
        raise DistributedError(f"--device {device}: a distributed run gives every process its own GPU "
                               f"(cuda:LOCAL_RANK); pass --device cuda (choose GPUs with CUDA_VISIBLE_DEVICES)")
    count = torch.cuda.device_count()
    if ctx.local_rank >= count:
        raise DistributedError(f"LOCAL_RANK {ctx.local_rank}: this machine has {count} GPU(s); start at most "
                               f"{count} processes per node (--nproc_per_node)")
    return torch.device("cuda", ctx.local_rank)


def init(ctx: Context, device: torch.device, timeout_s: float = DEFAULT_TIMEOUT_S) -> Context:
    """Join the process group torchrun set up (env:// rendezvous: MASTER_ADDR, MASTER_PORT).

    Gloo for the CPU and NCCL for a GPU ``device`` (from :func:`rank_device`); returns ``ctx`` with
    its backend and the collectives' device. Nothing to do for a single process.
    """
    if not ctx.active:
        return ctx
    import torch.distributed as dist

    if not dist.is_available():
        raise DistributedError("this torch build has no torch.distributed; a distributed run is impossible")
    device = torch.device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl":
        if not dist.is_nccl_available():
            raise DistributedError("--device cuda with several processes needs NCCL, which this torch build lacks")
        torch.cuda.set_device(device)
    elif not dist.is_gloo_available():
        raise DistributedError("a distributed run on the CPU needs the gloo backend, which this torch build lacks")
    if not dist.is_initialized():
        kw = {"device_id": device} if backend == "nccl" else {}
        dist.init_process_group(backend=backend, rank=ctx.rank, world_size=ctx.world_size,
                                timeout=timedelta(seconds=timeout_s), **kw)
    ctx.backend = backend
    ctx.device = device if backend == "nccl" else torch.device("cpu")
    return ctx


def shutdown(ctx: Context) -> None:
    """Leave the process group (after the run, on every rank)."""
    if ctx.backend is None:
        return
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    ctx.backend = None


def slice_state(ts, sl: slice):
    """Return the environments ``sl`` of a batch of episodes.

    The batch is a :class:`~diffsim_ros.tasks.base.TaskState` whose tensors have the batch as first
    dimension.
    """
    from ..physics import State
    from ..tasks.base import TaskState

    s = ts.sim
    sim = State(*(None if x is None else x[sl] for x in (s.q, s.v, s.actuator, s.delay, s.t, s.latency)))
    return TaskState(sim, ts.target[sl], ts.step, {k: v[sl] for k, v in ts.extra.items()})


def _picklable(exc: Exception) -> Exception:
    """``exc`` if it survives pickling, else a RuntimeError with its text (to cross to the other ranks)."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - any pickling failure
        return RuntimeError(f"{type(exc).__name__}: {exc}")
