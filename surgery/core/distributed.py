"""Data-parallel finding under torchrun: one process per device, each with a disjoint shard.

``torchrun --nproc-per-node N -m surgery find-neurons …`` starts N copies of the command with
RANK / WORLD_SIZE / LOCAL_RANK set (``--nnodes`` and a rendezvous make it several machines; the
code path is the same). Every helper here is a no-op in a plain single process, so library code
calls them unconditionally:

- :class:`Shard` is the one shape of every data-parallel loop: this rank's share of the batches,
  then the tail that gathers per-item rows back into their original order (or adds sums up) on
  every rank and advances rank 0's progress by what the other ranks did;
- underneath, :func:`shard` deals a list out to the ranks in chunks (a chunk is one batch, so
  every batch holds exactly the items it holds in a single process, and the numbers are the same),
  :func:`all_reduce` sums (or maxes) arrays, :func:`gather_rows` puts per-item results
  back into the original order on every rank;
- :func:`broadcast_json` hands rank 0's decision (a drawn trial, say) to every rank;
- :func:`check_agree` refuses, on every rank, when the ranks were given different inputs;
- :func:`is_main` says whether this process writes files and prints results (rank 0 only).

Collectives use gloo for CPU tensors and NCCL for CUDA tensors (torch.distributed's own engines).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .counted import counted, in_number
from .errors import SurgeryError

if TYPE_CHECKING:  # imported where they are used: `surgery --help` and argument errors stay fast
    import numpy as np
    import torch

T = TypeVar("T")


class RanksDisagree(SurgeryError):
    """torchrun's processes were given different models or inputs (every rank raises it)."""


class NotDataParallel(SurgeryError):
    """A command that does not split its work was started under torchrun (every rank raises it)."""


class StoppedByRank0(SurgeryError):
    """Rank 0 stopped on an error of its own (it says it); the other ranks stop with it."""


# Errors every rank raises alike, or that rank 0 says first: rank 0 alone says them.
SAID_BY_RANK_0 = (RanksDisagree, NotDataParallel, StoppedByRank0)


# torchrun starts every process at once: a rank still waiting for the others after this long is told why.
WAIT_SAID_AFTER_S = 10.0


@dataclass(frozen=True)
class World:
    """This process's place among torchrun's: rank, number of processes, rank on this node."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0


def world() -> World:
    """The torchrun world from the environment (a single process when it is not set)."""
    env = os.environ
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return World()
    return World(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", "0")))


def under_torchrun() -> bool:
    """Whether this process is one of several started by torchrun."""
    return world().size > 1


def is_main() -> bool:
    """Whether this process writes files and prints results (rank 0, or the only process)."""
    return world().rank == 0


def rank_device(requested: str) -> str:
    """The device this rank computes on: ``cuda``/``auto`` become ``cuda:LOCAL_RANK`` on a GPU node
    under torchrun (one GPU per process); anything else is returned as asked.

    The loader calls it with the user's ``--device`` before placing the model.
    """
    if not under_torchrun() or requested not in ("cuda", "auto"):
        return requested
    import torch

    if not torch.cuda.is_available():
        return requested  # the loader resolves auto (MPS or CPU) and refuses a missing GPU
    local = world().local_rank
    if local >= torch.cuda.device_count():
        raise SurgeryError(
            f"torchrun started local rank {local} but this node has {counted(torch.cuda.device_count(), 'GPU')}; "
            "give --nproc-per-node at most the number of GPUs"
        )
    return f"cuda:{local}"


def _comm_device() -> torch.device:
    """Where collective tensors live: this rank's GPU when NCCL is in the group, else the CPU."""
    import torch
    import torch.distributed as dist

    if "nccl" in str(dist.get_backend()).lower():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@contextmanager
def session() -> Iterator[None]:
    """The process group for one command under torchrun (nothing in a single process, nor inside
    a group that is already up: a script may run several commands in one group).

    gloo serves CPU tensors; on a GPU node NCCL serves CUDA tensors in the same group, when every
    process there has a GPU of its own (more processes than GPUs compute on CPUs, over gloo alone).
    """
    if not under_torchrun():
        yield
        return
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return

    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if name not in os.environ]
    if missing:  # torchrun sets all four; RANK and WORLD_SIZE alone were left in the environment
        w = world()
        raise SurgeryError(
            f"RANK and WORLD_SIZE are set (rank {w.rank} of {w.size}) but {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not: start the command with torchrun, or unset "
            "RANK and WORLD_SIZE to run one process"
        )
    backend = "gloo"
    if torch.cuda.is_available() and world().local_rank < torch.cuda.device_count():
        torch.cuda.set_device(world().local_rank)  # "cuda" alone now means this rank's GPU
        backend = "cpu:gloo,cuda:nccl"
    _join(backend)
    try:
        yield
        # every rank leaves together: a rank that tears its connections down while another still
        # talks makes gloo abort that one (SIGABRT, "connection closed by peer")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _join(backend: str) -> None:
    """``init_process_group``, waited for from Python. It blocks in C++ until every rank has joined,
    where Ctrl-C and SIGTERM never reach Python's handlers: a process whose peers never start
    (RANK and WORLD_SIZE set by hand, or left in the environment) sat there, deaf to both, for the
    group's 30-minute timeout. It runs in a daemon thread, so that an interrupt ends the main
    thread's wait as usual (nothing is written yet), and a wait past ``WAIT_SAID_AFTER_S`` is said."""
    import threading

    import torch.distributed as dist

    from .progress import aside

    failed: list[BaseException] = []

    def join() -> None:
        try:
            dist.init_process_group(backend)
        except BaseException as exc:  # handed to the main thread, which raises it
            failed.append(exc)

    thread = threading.Thread(target=join, name="surgery-join-group", daemon=True)
    thread.start()
    thread.join(WAIT_SAID_AFTER_S)
    if thread.is_alive():
        w, env = world(), os.environ
        aside().note(
            f"rank {w.rank} of {w.size} is waiting for the other torchrun processes at "
            f"{env['MASTER_ADDR']}:{env['MASTER_PORT']} (Ctrl-C stops it); without torchrun, "
            "unset RANK and WORLD_SIZE"
        )
    while thread.is_alive():
        thread.join(0.2)
    if failed:
        raise failed[0]


def _group_ready() -> bool:
    if not under_torchrun():
        return False
    import torch.distributed as dist

    if not dist.is_initialized():
        raise SurgeryError(
            "running under torchrun without a process group: start the command through "
            "`surgery` (python -m surgery) or wrap the call in surgery.core.distributed.session()"
        )
    return True


def shard(items: Sequence[T], chunk: int = 1) -> list[T]:
    """This rank's items: chunks of ``chunk`` consecutive items dealt out round-robin."""
    w = world()
    if w.size == 1:
        return list(items)
    return [x for start in range(chunk * w.rank, len(items), chunk * w.size) for x in items[start : start + chunk]]


def all_reduce(values: np.ndarray, op: str = "sum") -> np.ndarray:
    """The elementwise sum (or max) of ``values`` over all ranks, on every rank: in float64, or in
    int64 when they are whole numbers (counts such as FLOPs pass 2⁵³, where float64 rounds them)."""
    import numpy as np

    values = np.asarray(values)
    values = values.astype(np.int64 if np.issubdtype(values.dtype, np.integer) else np.float64)
    if not _group_ready():
        return values
    import torch
    import torch.distributed as dist

    t = torch.from_numpy(np.ascontiguousarray(values)).to(_comm_device())
    dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op])
    return t.cpu().numpy()


def gather_rows(n: int, indices: Sequence[int], rows: np.ndarray) -> np.ndarray:
    """The full ``[n, …]`` array on every rank, from each rank's ``rows`` at its ``indices``.

    Every rank passes the rows it computed; each item lands at its original index, so the result
    is the single-process array whatever the split.
    """
    import numpy as np

    rows = np.asarray(rows)
    if not _group_ready():
        out = np.zeros((n,) + rows.shape[1:], dtype=rows.dtype)
        out[list(indices)] = rows
        return out
    import torch
    import torch.distributed as dist

    device = _comm_device()
    size = world().size
    counts = torch.zeros(size, dtype=torch.int64, device=device)
    counts[world().rank] = len(indices)
    dist.all_reduce(counts)
    most = int(counts.max())
    # all_gather needs equal shapes: pad each rank's rows (and indices, with -1) to the longest
    padded = torch.zeros((most,) + rows.shape[1:], dtype=torch.from_numpy(rows[:0]).dtype, device=device)
    padded[: len(indices)] = torch.from_numpy(np.ascontiguousarray(rows)).to(device)
    idx = torch.full((most,), -1, dtype=torch.int64, device=device)
    idx[: len(indices)] = torch.tensor(list(indices), dtype=torch.int64, device=device)
    all_rows = [torch.empty_like(padded) for _ in range(size)]
    all_idx = [torch.empty_like(idx) for _ in range(size)]
    dist.all_gather(all_rows, padded)
    dist.all_gather(all_idx, idx)
    out = np.zeros((n,) + rows.shape[1:], dtype=rows.dtype)
    for r, i in zip(all_rows, all_idx):
        keep = i >= 0
        out[i[keep].cpu().numpy()] = r[keep].cpu().numpy()
    return out


def check_agree(what: str, *parts: object) -> None:
    """Refuse on every rank (one line) unless all ranks pass the same ``parts``.

    ``parts`` are fingerprints of the model and the inputs; they are hashed here and the digests
    compared, so nothing but 32 bytes per rank travels.
    """
    if not _group_ready():
        return
    import torch
    import torch.distributed as dist

    digest = hashlib.sha256(repr(parts).encode()).digest()
    mine = torch.tensor(list(digest), dtype=torch.uint8, device=_comm_device())
    every = [torch.empty_like(mine) for _ in range(world().size)]
    dist.all_gather(every, mine)
    differ = [r for r, d in enumerate(every) if not torch.equal(d, every[0])]
    if differ:
        raise RanksDisagree(
            f"torchrun ranks disagree about {what}: {in_number(len(differ), 'rank')} {', '.join(map(str, differ))} "
            "differ from rank 0; give every process the same model and inputs"
        )


def broadcast_json(value: Any = None) -> Any:
    """Rank 0's ``value`` on every rank (anything JSON can write; the other ranks' ``value`` is ignored).

    JSON, not pickle: what travels is data, never code to run. In a single process it returns ``value``.
    """
    if not _group_ready():
        return value
    import torch
    import torch.distributed as dist

    device = _comm_device()
    data = json.dumps(value).encode() if is_main() else b""
    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    dist.broadcast(size, src=0)
    buffer = torch.zeros(int(size[0]), dtype=torch.uint8, device=device)
    if is_main():
        buffer[:] = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
    dist.broadcast(buffer, src=0)
    from .strict_files import load_json  # imports YAML, which a single process never needs here

    return load_json(buffer.cpu().numpy().tobytes().decode())


def all_true(flag: bool) -> bool:
    """Whether ``flag`` holds on every rank (e.g. every rank found the findings in its cache)."""
    import numpy as np

    return bool(all_reduce(np.array([0.0 if flag else 1.0]), "max")[0] == 0.0)


def catch_up(advance: Callable[[int], None] | None, done: int, total: int) -> None:
    """Advance rank 0's progress by what the other ranks did, once the results are gathered."""
    if advance is not None and total > done:
        advance(total - done)


class Shard(Generic[T]):
    """This rank's share of a data-parallel loop, and the tail that makes the results whole again.

    Every loop torchrun splits has one shape: whole batches dealt out round-robin, this rank's
    computed, then the per-item rows gathered back into their original order (or the sums added
    up) on every rank, and rank 0's progress advanced by what the other ranks did::

        work = Shard(batches, items=n)      # this rank's batches
        for batch in work:
            rows[batch] = compute(batch)
            work.done(batch)                # the item indices this batch filled
        rows, = work.gather(rows)           # every rank: all n rows, in the original order
        nll, count = work.sum(nll, count)   # every rank: the sums over all ranks
        work.finish(progress)               # rank 0's bar: the items the other ranks did

    Without ``items`` the units are the items themselves, dealt ``chunk`` at a time, and this
    rank's indices are known from the start. In a single process it is the plain loop: every
    unit, and gather/sum return what they are given.
    """

    def __init__(self, units: Sequence[T], items: int | None = None, chunk: int = 1) -> None:
        self.units: list[T] = shard(units, chunk)
        self.items = len(units) if items is None else items
        self.mine: list[int] = shard(range(len(units)), chunk) if items is None else []

    def __iter__(self) -> Iterator[T]:
        return iter(self.units)

    def __len__(self) -> int:
        return len(self.units)

    def done(self, indices: Iterable[int]) -> None:
        """Record the items (indices into the whole list) this rank computed."""
        self.mine.extend(indices)

    def gather(self, *arrays: np.ndarray) -> list[np.ndarray]:
        """Each ``[items, …]`` array, filled at this rank's rows, complete on every rank."""
        if not under_torchrun():
            return list(arrays)
        import numpy as np

        return [gather_rows(self.items, self.mine, np.asarray(a)[self.mine]) for a in arrays]

    def sum(self, *values: float) -> np.ndarray:
        """The sums of ``values`` over every rank (float64; int64 when they are all whole numbers)."""
        import numpy as np

        return all_reduce(np.array(values))

    def finish(self, progress: Callable[[int], None] | None, per_item: int = 1) -> None:
        """Advance rank 0's ``progress`` (``per_item`` steps an item) by the other ranks' items."""
        catch_up(progress, per_item * len(self.mine), per_item * self.items)
