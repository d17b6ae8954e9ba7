"""2-D heat equation on a grid split across ranks, with halo exchange by jaxcache.sendrecv.

    mpirun -np 3 python examples/heat_halo.py [--ny 64 --nx 64 --steps 400] [--check]
    python examples/heat_halo.py --check                  # one rank: no messages at all

Explicit finite differences (forward Euler, 5-point Laplacian) for u_t = alpha * lap(u) on
an ny x nx grid of unknowns. The walls lie just outside the grid and are held at fixed
temperatures (Dirichlet): the top wall at 1, the others at 0; the plate starts at 0.

1-D slab decomposition: each rank owns a block of consecutive rows (ny need not divide by
the number of ranks) and stores it with one ghost row above and below. Each step it swaps
its edge rows with its neighbours (two sendrecvs: shift down, shift up), then updates its
own rows. The first and last ranks have a wall instead of a neighbour: their outer ghost
row holds the wall temperature and is never overwritten. The whole time loop is one
jitted lax.fori_loop per report interval; the messages are part of the compiled program.

--check reruns the solver in this process on the whole grid without any communication
(same arithmetic, float64) and asserts on every rank that the gathered field matches.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # jaxcache's point-to-point ops are CPU custom calls

import numpy as np  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

import jaxcache  # noqa: E402

jax.config.update("jax_enable_x64", True)  # float64, so --check can demand <= 1e-12 (in practice: 0)

T_TOP, T_WALLS = 1.0, 0.0
DOWN, UP = 1, 2  # message tags, one per direction of travel (clearer in traces; not required)


def block_rows(ny: int, size: int, rank: int) -> int:
    """Rows owned by `rank`: consecutive blocks in rank order, the first ny % size one longer."""
    base, extra = divmod(ny, size)
    return base + (rank < extra)


def shift(row_out, row_in, source, dest, tag):
    """Sends `row_out` to `dest` and returns the row received from `source` (else `row_in`).
    There is no MPI_PROC_NULL here: at a wall (None) we just leave that half out. The rank
    is a Python constant at trace time, so each rank compiles only the messages it makes."""
    if source is not None and dest is not None:
        return jaxcache.sendrecv(row_out, row_in, source, dest, sendtag=tag, recvtag=tag)
    if dest is not None:
        jaxcache.send(row_out, dest, tag=tag)
    if source is not None:
        return jaxcache.recv(row_in, source, tag=tag)
    return row_in


def make_solver(r: float, steps: int, up: int | None, down: int | None):
    """A jitted function advancing a block (with its ghost rows) by `steps` time steps;
    up/down: the neighbouring ranks, None at a wall (both None: the serial reference)."""

    def step(_, u):
        # Shift down, then up (MPI's classic pair). In each shift every interior rank sends
        # and receives in one sendrecv, so no rank blocks in a send that waits on a rank
        # blocked in its own send: no deadlock, whatever the number of ranks.
        top = shift(u[-2], u[0], source=up, dest=down, tag=DOWN)
        bottom = shift(u[1], u[-1], source=down, dest=up, tag=UP)
        u = u.at[0].set(top).at[-1].set(bottom)
        c = u[1:-1]
        side = jnp.pad(c, ((0, 0), (1, 1)), constant_values=T_WALLS)  # left/right walls
        lap = u[:-2] + u[2:] + side[:, :-2] + side[:, 2:] - 4.0 * c
        return u.at[1:-1].set(c + r * lap)

    return jax.jit(lambda u: lax.fori_loop(0, steps, step, u))


def initial_block(rows: int, nx: int, first: bool, last: bool) -> jnp.ndarray:
    """A block of `rows` rows, all at 0, between its ghost rows. A ghost row facing a wall
    holds the wall's temperature for the whole run; one facing a neighbour is overwritten
    by the first exchange."""
    u = jnp.zeros((rows + 2, nx), jnp.float64)
    return u.at[0].set(T_TOP if first else 0.0).at[-1].set(T_WALLS if last else 0.0)


def serial_reference(ny: int, nx: int, r: float, steps: int) -> np.ndarray:
    """The same scheme on the whole grid in this process, without any communication."""
    u = make_solver(r, steps, None, None)(initial_block(ny, nx, True, True))
    return np.asarray(u[1:-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ny", type=int, default=64, help="rows of the grid (split across ranks)")
    p.add_argument("--nx", type=int, default=64, help="columns of the grid")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--report-every", type=int, default=100, help="steps per jitted call")
    p.add_argument("--r", type=float, default=0.2, help="alpha*dt/h^2 (stable up to 0.25)")
    p.add_argument("--check", action="store_true", help="compare with a serial run")
    args = p.parse_args()

    jaxcache.init()
    rank, size = jaxcache.rank(), jaxcache.size()
    if not 0 < args.r <= 0.25:
        raise SystemExit(f"--r {args.r}: explicit Euler is unstable above 0.25")
    if args.ny < size or args.steps % args.report_every:
        raise SystemExit("need --ny >= ranks and --steps a multiple of --report-every")
    rows = block_rows(args.ny, size, rank)
    up = rank - 1 if rank > 0 else None
    down = rank + 1 if rank < size - 1 else None

    u = initial_block(rows, args.nx, up is None, down is None)
    advance = make_solver(args.r, args.report_every, up, down)
    if rank == 0:
        heights = sorted({block_rows(args.ny, size, k) for k in range(size)})
        print(f"heat_halo: {args.ny}x{args.nx} grid on {size} rank(s), "
              f"{'-'.join(map(str, heights))} rows each, {args.steps} steps")
    timed, elapsed = 0, 0.0
    for done in range(args.report_every, args.steps + 1, args.report_every):
        t0 = time.perf_counter()
        u = advance(u).block_until_ready()
        if done > args.report_every:  # the first call compiles: leave it out of the timing
            timed, elapsed = timed + args.report_every, elapsed + time.perf_counter() - t0
        heat = jaxcache.allreduce(jnp.sum(u[1:-1]), op="sum", name="heat")
        if rank == 0:
            print(f"  step {done:5d}: total heat {float(heat):.6f}")

    # Blocks differ in height by at most one row: eager allgather accepts that.
    field = np.asarray(jaxcache.allgather(u[1:-1], name="field"))
    assert field.shape == (args.ny, args.nx), field.shape
    if rank == 0:
        per_step = f"{1e6 * elapsed / timed:.1f} us/step" if timed else "n/a (one call)"
        print(f"heat_halo: done; max temperature {field.max():.6f}, {per_step}")
    if args.check:
        ref = serial_reference(args.ny, args.nx, args.r, args.steps)
        diff = float(np.max(np.abs(field - ref)))
        assert diff <= 1e-12, f"rank {rank}: field differs from the serial run by {diff}"
        print(f"heat_halo: OK on {size} ranks (max abs diff {diff:.3g}) [rank {rank}]")
    jaxcache.shutdown()


if __name__ == "__main__":
    main()
