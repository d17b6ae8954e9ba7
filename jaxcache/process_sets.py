"""Process sets: collectives on subsets of the job's ranks.

A process set is registered collectively -- every rank of the job calls
`add_process_set` (or passes it to `init(process_sets=...)`) with the same ranks -- and
then gets its own negotiation in the runtime: its own duplicate communicator, request
table (names are matched within the set), response cache, coordinator (the set's rank 0)
and counters (docs/control_plane.md, "Process sets"). Every collective takes
`process_set=`: a ProcessSet, or an mpi4py communicator whose ranks form a registered set.

Ranks that name other ranks stay global (Horovod's and torch.distributed's convention):
a broadcast's `root` is the root's rank in the job. Results ordered by rank (allgather,
alltoall, reducescatter) follow the set's rank order: `ProcessSet.rank()`.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple, Sequence, Union

from mpi4py import MPI

from . import session as _session
from ._ext import ext


class ProcessSet:
    """A set of ranks that run collectives together.

    Build it from a list of the job's ranks (its rank order is then ascending global rank)
    or from an mpi4py communicator whose processes are ranks of the job (its rank order is
    the communicator's); then register it on every rank with `jaxcache.add_process_set`
    or `jaxcache.init(process_sets=[...])`, and pass it as `process_set=` to collectives.
    """

    def __init__(self, ranks_or_comm: Union[Sequence[int], MPI.Comm]):
        self.process_set_id: int | None = None
        self.mpi_comm: MPI.Comm | None = None
        self.ranks: list[int] | None = None
        if isinstance(ranks_or_comm, MPI.Comm):
            self.mpi_comm = ranks_or_comm
            return
        if isinstance(ranks_or_comm, (str, bytes)) or not hasattr(ranks_or_comm, "__iter__"):
            raise TypeError("jaxcache.ProcessSet: pass a list of ranks or an mpi4py communicator, "
                            f"got {type(ranks_or_comm).__name__}")
        ranks = list(ranks_or_comm)
        for r in ranks:
            if isinstance(r, bool) or not isinstance(r, int) or r < 0:
                raise ValueError(f"jaxcache.ProcessSet: ranks must be non-negative ints, got {ranks!r}")
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"jaxcache.ProcessSet: ranks contain duplicates: {ranks!r}")
        if not ranks:
            raise ValueError("jaxcache.ProcessSet: a process set needs at least one rank")
        self.ranks = sorted(ranks)

    def size(self) -> int | None:
        """The number of ranks in the set (None before it is registered, for a communicator)."""
        return None if self.ranks is None else len(self.ranks)

    def rank(self) -> int | None:
        """This process's rank within the set (None before registration).

        Raises ValueError on a rank that is not a member.
        """
        if self.process_set_id is None or self.ranks is None:
            return None
        me = ext.rank()
        if me not in self.ranks:
            raise ValueError(f"jaxcache: rank {me} is not a member of {self}")
        return self.ranks.index(me)

    def included(self) -> bool | None:
        """Whether this process is a member (None before the ranks are known)."""
        if self.ranks is None:
            return None
        return ext.rank() in self.ranks

    def __repr__(self) -> str:
        if self.process_set_id == 0:
            return "jaxcache.global_process_set"
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


# The whole job (id 0); its ranks are known once init() has run.
global_process_set = ProcessSet.__new__(ProcessSet)
global_process_set.process_set_id = 0
global_process_set.ranks = None
global_process_set.mpi_comm = None



class Resolved(NamedTuple):
    """What a collective needs of its process set."""
    id: int
    size: int
    rank: int  # this process's rank within the set
    ranks: tuple  # the members' global ranks, in set-rank order


def started(state: _session.Session, size: int) -> None:
    """Called by init(): a new runtime knows only the global set."""
    global_process_set.ranks = list(range(size))
    state.process_sets[0] = global_process_set


def ended(state: _session.Session) -> None:
    """Called by shutdown(): the sets of the session are registered no more."""
    for ps in state.process_sets.values():
        if ps is not global_process_set:
            ps.process_set_id = None
    state.process_sets.clear()


def _registered() -> dict[int, ProcessSet]:
    """The running session's process sets by id (empty when none runs)."""
    state = _session.peek()
    return state.process_sets if state is not None else {}


def _global_ranks(comm: MPI.Comm) -> tuple:
    """The job ranks of `comm`'s processes in `comm`'s rank order (ValueError if one is not in the job)."""
    group, job_group = comm.Get_group(), _session.current().job_comm.Get_group()
    try:
        ranks = MPI.Group.Translate_ranks(group, list(range(group.Get_size())), job_group)
    finally:
        group.Free()
        job_group.Free()
    if any(r == MPI.UNDEFINED for r in ranks):
        raise ValueError("jaxcache: the communicator has processes outside the job jaxcache.init() "
                         "was called with")
    return tuple(int(r) for r in ranks)


def _describe(ps: ProcessSet, size: int) -> tuple:
    """This rank's description of the set it registers, exchanged to check agreement."""
    if ps.mpi_comm is None:
        bad = [r for r in ps.ranks if r >= size]
        if bad:
            raise ValueError(f"jaxcache.add_process_set: ranks {bad} are outside the job (size {size})")
        return ("ranks", tuple(ps.ranks))
    if ps.mpi_comm == MPI.COMM_NULL:
        return ("none", ())
    return ("comm", _global_ranks(ps.mpi_comm))


def _agreed_sets(descriptions: list) -> list[tuple]:
    """The sets every rank agreed to register (raises ValueError, on every rank alike, if not)."""
    kinds = {d[0] for d in descriptions}
    if "ranks" in kinds:
        if len(set(descriptions)) != 1:
            by_rank = "; ".join(f"rank {r}: {list(d[1]) if d[0] != 'none' else 'COMM_NULL'}"
                                for r, d in enumerate(descriptions))
            raise ValueError("jaxcache.add_process_set: the ranks disagree on the process set "
                             f"({by_rank}); every rank must pass the same ranks")
        return [descriptions[0][1]]
    # Communicators: each rank passes its own (a Split gives one per color) or COMM_NULL.
    sets = sorted({d[1] for d in descriptions if d[0] == "comm"}, key=min)
    if not sets:
        raise ValueError("jaxcache.add_process_set: every rank passed MPI.COMM_NULL")
    owner = {}
    for s in sets:
        for r in s:
            if r in owner:
                raise ValueError(f"jaxcache.add_process_set: rank {r} is in two of the communicators "
                                 f"passed ({list(owner[r])} and {list(s)}); register them one at a time")
            owner[r] = s
    for r, d in enumerate(descriptions):
        if r in owner and d[1] != owner[r]:
            raise ValueError(f"jaxcache.add_process_set: rank {r} is a member of the communicator of "
                             f"ranks {list(owner[r])} but passed "
                             f"{'COMM_NULL' if d[0] == 'none' else list(d[1])}")
    return sets


def add_process_set(process_set: Union[ProcessSet, Sequence[int], MPI.Comm]) -> ProcessSet:
    """Registers a process set; every rank of the job must call it, with the same ranks.

    Accepts a ProcessSet, a list of ranks, or an mpi4py communicator. With communicators,
    each rank may pass the one it belongs to (e.g. from `COMM_WORLD.Split(color)`, one set
    per color, all registered by this one call) or MPI.COMM_NULL. Returns the registered
    ProcessSet (the one passed, now with its `process_set_id`). Raises ValueError on every
    rank when the ranks disagree or the set is registered already.
    """
    state = _session.current("jaxcache.add_process_set()")
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps.process_set_id is not None:
        raise ValueError(f"jaxcache.add_process_set: {ps} is registered already")
    size, me = ext.size(), ext.rank()
    mine = _describe(ps, size)
    descriptions = state.job_comm.allgather(mine)
    sets = _agreed_sets(descriptions)
    known = {tuple(sorted(p.ranks)): i for i, p in state.process_sets.items()}
    for s in sets:
        if tuple(sorted(s)) in known:
            i = known[tuple(sorted(s))]
            what = "the global process set" if i == 0 else f"process set {i}"
            raise ValueError(f"jaxcache.add_process_set: ranks {sorted(s)} are {what} already")
    ids = {s: state.next_set_id + k for k, s in enumerate(sets)}
    state.next_set_id += len(sets)
    for s in sets:
        if me not in s:
            continue
        if mine[0] == "comm":
            ext.add_process_set(ids[s], MPI._addressof(ps.mpi_comm))  # duplicated by the runtime
        else:
            job_group = state.job_comm.Get_group()
            group = job_group.Incl(list(s))
            comm = state.job_comm.Create_group(group)  # collective over the members only
            try:
                ext.add_process_set(ids[s], MPI._addressof(comm))
            finally:
                comm.Free()
                group.Free()
                job_group.Free()
    # This rank's object is the set it belongs to (or the only one registered); the other
    # sets are known here too, so that every rank keeps the same registry.
    own = next((s for s in sets if me in s), sets[0] if len(sets) == 1 else None)
    for s in sets:
        entry = ps if s == own else ProcessSet.__new__(ProcessSet)
        entry.ranks, entry.process_set_id = list(s), ids[s]
        if s != own:
            entry.mpi_comm = None
        state.process_sets[ids[s]] = entry
    return ps


def remove_process_set(process_set: Union[ProcessSet, MPI.Comm]) -> bool:
    """Unregisters a process set; every rank of the job must call it with the same set (or,
    for sets registered from a Split communicator, each rank with its own).

    Returns False for the global set or a set that is not registered. Collectives still
    pending in the set fail on its members with ShutdownError. Waits up to
    JAXCACHE_SHUTDOWN_TIMEOUT seconds for the other members.
    """
    state = _session.current("jaxcache.remove_process_set()")
    if isinstance(process_set, MPI.Comm):
        process_set = _by_comm(process_set, "remove_process_set")
    elif not isinstance(process_set, ProcessSet):
        raise TypeError("jaxcache.remove_process_set: pass a jaxcache.ProcessSet or an mpi4py "
                        f"communicator, got {type(process_set).__name__}")
    set_id = process_set.process_set_id
    if set_id is not None and state.process_sets.get(set_id) is not process_set:
        set_id = None
    ids = state.job_comm.allgather(set_id)
    named = {i for i in ids if i not in (None, 0)}
    everyone_same = len(set(ids)) == 1
    for r, i in enumerate(ids):
        if i in (None, 0):
            continue
        members = state.process_sets[i].ranks
        if not all(ids[m] == i for m in members) or not (everyone_same or r in members):
            raise ValueError("jaxcache.remove_process_set: the ranks disagree on the set to remove "
                             f"(process set ids by rank: {ids}); every rank names the same set, "
                             "or each rank its own set of a Split")
    for i in sorted(named):
        if ext.rank() in state.process_sets[i].ranks:
            problem = ext.remove_process_set(i, state.settings.shutdown_timeout_s)
            if problem:
                warnings.warn(problem, RuntimeWarning, stacklevel=2)
        state.process_sets.pop(i).process_set_id = None
    process_set.process_set_id = None if set_id in named else process_set.process_set_id
    return set_id in named


def registered() -> list[ProcessSet]:
    """The registered process sets, the global one first."""
    sets = _registered()
    return [sets[i] for i in sorted(sets)]


def _by_comm(comm: MPI.Comm, fn: str) -> ProcessSet:
    if comm == MPI.COMM_NULL:
        raise ValueError(f"jaxcache.{fn}: process_set is MPI.COMM_NULL: this rank is not in that "
                         "communicator")
    ranks = _global_ranks(comm)
    for ps in _registered().values():
        if tuple(ps.ranks) == ranks:
            return ps
    raise ValueError(f"jaxcache.{fn}: the communicator of global ranks {list(ranks)} is not a "
                     "registered process set; register it first on every rank with "
                     "jaxcache.add_process_set(comm)")


def _same_as_registered(ps: ProcessSet, fn: str) -> ProcessSet:
    if ps.mpi_comm is not None and ps.ranks is None:
        return _by_comm(ps.mpi_comm, fn)
    for registered_set in _registered().values():
        if ps.ranks is not None and sorted(registered_set.ranks) == sorted(ps.ranks):
            return registered_set
    raise ValueError(f"jaxcache.{fn}: {ps} is not registered (add it on every rank with "
                     "jaxcache.add_process_set first; a removed set stays removed)")


def pick(process_set, comm, fn: str):
    """`process_set=` or, in mpi4jax's spelling, `comm=` (an mpi4py communicator): one of them."""
    if comm is None:
        return process_set
    if process_set is not None:
        raise TypeError(f"jaxcache.{fn}: pass process_set= or comm=, not both")
    if not isinstance(comm, MPI.Comm):
        raise TypeError(f"jaxcache.{fn}: comm must be an mpi4py communicator, got {type(comm).__name__}")
    return comm


def resolve(process_set, fn: str, member: bool = True, comm=None) -> Resolved:
    """The registered set a collective names (`process_set=`, or an mpi4py communicator as
    `comm=`); with `member`, this rank must belong to it."""
    process_set = pick(process_set, comm, fn)
    if process_set is None or process_set is global_process_set:
        return Resolved(0, ext.size(), ext.rank(), tuple(global_process_set.ranks or ()))
    if isinstance(process_set, MPI.Comm):
        process_set = _by_comm(process_set, fn)
    elif not isinstance(process_set, ProcessSet):
        raise TypeError(f"jaxcache.{fn}: process_set must be a jaxcache.ProcessSet or an mpi4py "
                        f"communicator, got {type(process_set).__name__}")
    if _registered().get(process_set.process_set_id) is not process_set:
        # An unregistered object naming a registered set's ranks (or communicator) means it.
        process_set = _same_as_registered(process_set, fn)
    set_id = process_set.process_set_id
    ranks = tuple(process_set.ranks)
    me = ext.rank()
    if me not in ranks:
        if member:
            raise ValueError(f"jaxcache.{fn}: rank {me} is not a member of process set {set_id} "
                             f"(global ranks {list(ranks)}); only its members may call collectives "
                             "on it")
        return Resolved(set_id, len(ranks), -1, ranks)
    return Resolved(set_id, len(ranks), ranks.index(me), ranks)


def set_root(root, resolved: Resolved, fn: str) -> int:
    """A broadcast root given as a global rank, as a rank within the set."""
    from .ops import validation

    root = validation.check_root(root, ext.size(), fn)
    if resolved.id == 0:
        return root
    if root not in resolved.ranks:
        raise ValueError(f"jaxcache.{fn}: root={root} is not a member of process set {resolved.id} "
                         f"(global ranks {list(resolved.ranks)}); root is a global rank")
    return resolved.ranks.index(root)
