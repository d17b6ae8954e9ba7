"""Horovod's process functions (hvd.init, rank, cross_rank, mpi_built, ...) for the bridges."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from .. import runtime as _runtime
from .. import session as _session
from .. import submit
from ..errors import JaxcacheError
from ..protocol import Kind
from ..process_sets import ProcessSet as _ProcessSet

HorovodInternalError = JaxcacheError  # what Horovod code catches around collectives


class NotInitializedError(ValueError, RuntimeError):
    """Raised by the query functions before init(): Horovod raises ValueError, jaxcache RuntimeError."""


def _communicator(comm):
    if comm is None:
        return MPI.COMM_WORLD
    if isinstance(comm, MPI.Comm):
        return comm
    try:
        ranks = sorted(set(comm))
    except TypeError:
        raise ValueError("jaxcache init: comm must be an mpi4py communicator or a list of ranks of "
                         f"MPI.COMM_WORLD, got {type(comm).__name__}") from None
    world = MPI.COMM_WORLD
    if not ranks:
        return world  # Horovod: an empty list means every rank
    bad = [r for r in ranks if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < world.size]
    if bad:
        raise ValueError(f"jaxcache init: comm lists {bad}, which are not ranks of MPI.COMM_WORLD "
                         f"(size {world.size})")
    if world.rank not in ranks:
        raise ValueError(f"jaxcache init: this process (MPI.COMM_WORLD rank {world.rank}) is not in "
                         f"comm={ranks}; only the listed ranks may call init(comm=ranks)")
    group = world.Get_group().Incl(ranks)
    try:
        return world.Create_group(group)
    finally:
        group.Free()


def init(comm=None, process_sets=None) -> None:
    """Horovod's hvd.init(comm=None, process_sets=None) over jaxcache's runtime (collective).

    comm: None (MPI.COMM_WORLD), an mpi4py communicator, or a list of COMM_WORLD ranks.
    process_sets: None, "dynamic" (Horovod's switch for add_process_set later; jaxcache always
    allows it) or a list of ProcessSets (or rank lists, or communicators) to register, in
    order, on every rank: each object passed gets its process_set_id. A list naming the same
    ranks twice raises ValueError on every rank, as Horovod.
    """
    sets = _process_set_list(process_sets)
    _runtime.init(_communicator(comm), process_sets=sets)
    _learn_topology()


def _process_set_list(process_sets) -> list:
    if process_sets is None:
        return []
    if isinstance(process_sets, str):
        if process_sets.lower() == "dynamic":
            return []
        raise ValueError(f"jaxcache init: process_sets must be None, 'dynamic' or a list of "
                         f"ProcessSets, got {process_sets!r}")
    if isinstance(process_sets, _ProcessSet):
        raise TypeError("jaxcache init: process_sets must be a list of ProcessSets, got one "
                        "ProcessSet (wrap it in a list)")
    try:
        return list(process_sets)
    except TypeError:
        raise TypeError(f"jaxcache init: process_sets must be a list of ProcessSets, got "
                        f"{type(process_sets).__name__}") from None


def _learn_topology() -> None:
    """One small allgather of (local_rank, local_size) through the runtime itself."""
    size = _runtime.size()
    mine = np.array([_runtime.local_rank(), _runtime.local_size()], np.int64)
    out = np.empty(2 * size, np.int64)
    submit.submit(Kind.ALLGATHER, "jaxcache.init/topology", [mine], [out],
                  submit.codes_of([mine])).wait()
    local_ranks, local_sizes = out[0::2].tolist(), out[1::2].tolist()
    me, my_local = _runtime.rank(), local_ranks[_runtime.rank()]
    # Horovod's cross communicator: the ranks that share this rank's local rank, in rank order.
    peers = [r for r in range(size) if local_ranks[r] == my_local]
    _session.current().topology = (peers.index(me), len(peers), len(set(local_sizes)) == 1)


def shutdown() -> None:
    _runtime.shutdown()


def is_initialized() -> bool:
    return _runtime.is_initialized()


def _require(fn: str) -> None:
    if not _runtime.is_initialized():
        raise NotInitializedError(f"jaxcache: {fn}() needs the runtime; call init() first (or "
                                  "after shutdown(), init() again)")


def _query(name: str, read: Callable[[], Any], doc: str) -> Callable[[], Any]:
    """Horovod's query function `name`: NotInitializedError before init(), else read()."""
    return _runtime.query_function(name, read, doc, require=_require)


def _constant(name: str, value: Any, doc: str) -> Callable[[], Any]:
    """Horovod's build-information function `name`: what jaxcache has (`value`), before
    init() too."""
    return _runtime.query_function(name, lambda: value, doc, require=lambda name: None)


rank = _query("rank", _runtime.rank, "This process's rank in the job.")
size = _query("size", _runtime.size, "The number of ranks in the job.")
local_rank = _query("local_rank", _runtime.local_rank, "This process's rank on its node.")
local_size = _query("local_size", _runtime.local_size, "The number of ranks on this node.")
mpi_threads_supported = _query("mpi_threads_supported",
                               lambda: MPI.Query_thread() >= MPI.THREAD_MULTIPLE,
                               "True: MPI runs with MPI_THREAD_MULTIPLE (jaxcache needs it).")


def _topo(fn: str) -> tuple[int, int, bool]:
    _require(fn)
    topology = _session.current().topology
    if topology is None:
        raise NotInitializedError(f"jaxcache: {fn}() is learned by the bridge's init(): call "
                                  "jaxcache.torch.init() or jaxcache.tensorflow.init() (collective; "
                                  "jaxcache.init() alone does not learn the node layout)")
    return topology


def cross_rank() -> int:
    """This rank's index among the ranks with the same local rank (its node's index)."""
    return _topo("cross_rank")[0]


def cross_size() -> int:
    """The number of ranks with this rank's local rank (nodes, in a homogeneous job)."""
    return _topo("cross_size")[1]


def is_homogeneous() -> bool:
    """True when every node runs the same number of ranks."""
    return _topo("is_homogeneous")[2]


def mpi_enabled() -> bool:
    """MPI carries jaxcache's control and data planes whenever the runtime runs."""
    return _runtime.is_initialized()


mpi_built = _constant("mpi_built", True, "True: MPI is jaxcache's engine.")
gloo_enabled = _constant("gloo_enabled", False, "False: jaxcache has no Gloo controller.")
gloo_built = _constant("gloo_built", False, "False: jaxcache has no Gloo controller.")
nccl_built = _constant("nccl_built", 0, "0: jaxcache has no NCCL data path (Horovod returns "
                       "NCCL's version code when built with it).")
ddl_built = _constant("ddl_built", False, "False: no IBM DDL.")
ccl_built = _constant("ccl_built", False, "False: no oneCCL.")
cuda_built = _constant("cuda_built", False, "False: Horovod's CUDA build flag (jaxcache stages "
                       "GPU tensors through host memory; see jaxcache.cuda_built()).")
rocm_built = _constant("rocm_built", False, "False: no ROCm.")


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Horovod's hvd.start_timeline: rank 0 starts writing a Chrome-trace timeline to
    `file_path` while the job runs (jaxcache.start_timeline)."""
    _require("start_timeline")
    _runtime.start_timeline(file_path, mark_cycles)


def stop_timeline() -> None:
    """Horovod's hvd.stop_timeline (jaxcache.stop_timeline)."""
    _require("stop_timeline")
    _runtime.stop_timeline()
