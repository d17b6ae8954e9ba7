"""send, recv, sendrecv: messages between two ranks of a process set, matched by MPI on
(peer, tag) in program order (mpi4jax's send/recv/sendrecv).

Order: a rank's point-to-point ops are one ordered JAX effect (`PointToPoint`), so XLA runs
them in program order (also across programs and eager calls), and MPI pairs the k-th send
from a to b on a tag with the k-th receive b posts for it -- never by the order in which XLA
happens to start them. Program order is the one order every rank agrees on: XLA:CPU runs a
small program's custom calls one after another in its own schedule order, so a receive it
started first would wait for a send it had not started yet (mpi4jax's deadlock test).
Collectives (negotiated by name) and computation are not in this order and overlap freely.
A send is buffered (completes at once, like MPI's eager sends) up to 16 KiB; a larger one
completes when the peer has taken its data, so the usual MPI rules against deadlock apply
(e.g. a halo exchange by sendrecv). The runtime posts each op as nonblocking MPI calls over
channels of its own (xla_ext/point_to_point.h); a send that nobody receives is reported by
the stall inspector. A send and its receive must agree on dtype and shape, or the receiving
rank raises MismatchError (the message is drained; both ranks go on).
"""

from __future__ import annotations

import concurrent.futures
from typing import Any

import numpy as np

import jax
from jax._src import dispatch, effects
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from .._ext import ensure_registered, ext
from ..errors import raise_for_status
from . import call, naming, placement, validation

try:  # jax >= 0.11
    from jax.ffi import abstract_token
except ImportError:  # jax 0.10: the singleton JAX's lowering compares tokens against
    from jax._src.core import abstract_token

ANY_SOURCE: int = ext.ANY_SOURCE  # MPI's own values (xla_ext/point_to_point.h)
ANY_TAG: int = ext.ANY_TAG


class PointToPoint(effects.Effect):
    """The order of this rank's sends and receives (program order)."""

    def __repr__(self):
        return "PointToPoint"


ORDER = PointToPoint()
# Ordered (one token), allowed in lowering, control flow and custom derivatives. Not in
# remat_allowed_effects: recomputing a send in the backward pass would send it twice.
for _kind in (effects.ordered_effects, effects.lowerable_effects, effects.control_flow_allowed_effects,
              effects.custom_derivatives_allowed_effects):
    _kind.add_type(PointToPoint)


class StatusAddress(int):
    """The address of an mpi4py `MPI.Status` to fill (mpi4jax's `status=`), hashable as a
    primitive parameter; it holds the Status object so that it outlives the programs."""

    def __new__(cls, status):
        from mpi4py import MPI
        self = super().__new__(cls, MPI._addressof(status))
        self.status = status
        return self


def _status(status) -> int:
    if status is None:
        return 0
    from mpi4py import MPI
    if not isinstance(status, MPI.Status):
        raise TypeError(f"status must be an mpi4py.MPI.Status or None, got {type(status).__name__}")
    return StatusAddress(status)


# --- primitives --------------------------------------------------------------------------

send_p = Primitive("jaxcache_send")
send_p.multiple_results = True
recv_p = Primitive("jaxcache_recv")
sendrecv_p = Primitive("jaxcache_sendrecv")


def _send_abstract_eval(x, *, name, dest, tag, world_size, process_set):
    return [], {ORDER}


def _recv_abstract_eval(template, *, name, source, tag, status, world_size, process_set):
    return jax.core.ShapedArray(template.shape, template.dtype), {ORDER}


def _sendrecv_abstract_eval(sendbuf, recvbuf, *, name, source, dest, sendtag, recvtag, status, world_size,
                            process_set):
    return jax.core.ShapedArray(recvbuf.shape, recvbuf.dtype), {ORDER}


def _lower(ctx, operands, target: str, **attrs):
    """One custom call that takes the order's token and gives it back."""
    platforms = ctx.platforms or ctx.module_context.platforms
    if any(p != "cpu" for p in platforms):
        raise NotImplementedError(
            f"jaxcache: {target.removeprefix('jaxcache_')} exists on CPU only for now (lowering for "
            f"{', '.join(platforms)}); use jaxcache's collectives on GPU")
    if placement.device_count(ctx) > 1:
        raise NotImplementedError(
            f"jaxcache: {target.removeprefix('jaxcache_')} ('{attrs['name']}') is in a program over "
            f"{placement.device_count(ctx)} devices of this process; point-to-point operations run "
            "in programs on one device (a collective pairs devices by position: docs/devices.md)")
    ensure_registered()
    avals_in = [ctx.avals_in[i] for i, _ in operands]
    sub = ctx.replace(avals_in=(*avals_in, abstract_token), avals_out=(*ctx.avals_out, abstract_token))
    rule = jax.ffi.ffi_lowering(target, has_side_effect=True)
    *outs, token = rule(sub, *(v for _, v in operands), ctx.tokens_in.get(ORDER), **attrs)
    # Every ordered effect in scope comes out; the others' tokens pass through.
    ctx.set_tokens_out(ctx.tokens_in.update_tokens(mlir.TokenSet({ORDER: token})))
    return outs


def _send_lowering(ctx, x, *, name, dest, tag, world_size, process_set):
    return _lower(ctx, [(0, x)], "jaxcache_send", name=name, process_set=np.int64(process_set), dest=np.int64(dest), tag=np.int64(tag))


def _recv_lowering(ctx, template, *, name, source, tag, status, world_size, process_set):
    # The template only gives the shape: it is not an operand of the custom call.
    return _lower(ctx, [], "jaxcache_recv", name=name, process_set=np.int64(process_set), source=np.int64(source),
                  tag=np.int64(tag), status=np.int64(status))


def _sendrecv_lowering(ctx, sendbuf, recvbuf, *, name, source, dest, sendtag, recvtag, status, world_size,
                       process_set):
    return _lower(ctx, [(0, sendbuf)], "jaxcache_sendrecv", name=name, process_set=np.int64(process_set), source=np.int64(source),
                  dest=np.int64(dest), sendtag=np.int64(sendtag), recvtag=np.int64(recvtag),
                  status=np.int64(status))


def _batch_front(x, dim):
    return x if dim == 0 else jax.numpy.moveaxis(x, dim, 0)


def _broadcast_front(x, dim, size):
    if dim is None:
        return jax.numpy.broadcast_to(x, (size, *x.shape))
    return _batch_front(x, dim)


def _send_batch(args, dims, **params):
    (x,), (d,) = args, dims
    return send_p.bind(_batch_front(x, d), **params), []


def _recv_batch(args, dims, **params):
    (t,), (d,) = args, dims
    return recv_p.bind(_batch_front(t, d), **params), 0


def _sendrecv_batch(args, dims, **params):
    (s, r), (ds, dr) = args, dims
    size = s.shape[ds] if ds is not None else r.shape[dr]  # (None: not batched)
    s = _broadcast_front(s, ds, size)
    r = _broadcast_front(r, dr, size)
    return sendrecv_p.bind(s, r, **params), 0


def _sendrecv_jvp(primals, tangents, *, name, **params):
    sendbuf, recvbuf = primals
    out = sendrecv_p.bind(sendbuf, recvbuf, name=name, **params)
    st, rt = (ad.instantiate_zeros(t) for t in tangents)
    tan = sendrecv_p.bind(st, rt, name=naming.derived(name, "jvp"), **params)
    return out, tan


def _sendrecv_transpose(ct, sendbuf, recvbuf, *, name, source, dest, sendtag, recvtag, status, world_size,
                        process_set):
    # The adjoint of "send x to dest, receive y from source" sends y's cotangent back to
    # source and receives x's from dest: the same exchange with the peers swapped (any tag
    # on the way back: program order pairs the cotangents).
    if source == ANY_SOURCE:
        raise NotImplementedError(
            f"jaxcache: cannot transpose sendrecv '{name}' with source=ANY_SOURCE: the cotangent's "
            "destination is unknown")
    ct = ad.instantiate_zeros(ct)
    template = sendbuf.aval if ad.is_undefined_primal(sendbuf) else sendbuf
    back = sendrecv_p.bind(ct, jax.numpy.zeros(template.shape, template.dtype), name=naming.derived(name, "T"),
                           source=dest, dest=source, sendtag=sendtag, recvtag=ANY_TAG, status=0,
                           world_size=world_size, process_set=process_set)
    return [back if ad.is_undefined_primal(sendbuf) else None,
            ad.Zero(recvbuf.aval) if ad.is_undefined_primal(recvbuf) else None]


# Eager ops run on one thread of their own, in call order (the order JAX gives them), while
# the caller waits for each in a timed wait: XLA:CPU runs a small program on the thread that
# dispatches it and returns only when its receive is done, so a caller blocked there would
# ignore Ctrl-C. An interrupted op stays in flight, as an interrupted collective does.
_runner = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="jaxcache-p2p")


def _run_and_wait(primitive, args, params):
    out = dispatch.apply_primitive(primitive, *args, **params)
    if primitive.multiple_results and not out:
        jax.effects_barrier()
    else:
        jax.block_until_ready(out)
    return out


def _eager(primitive):
    """An eager call: returns once the op has completed, raising the jaxcache error class of
    a failure (the runtime records it by name)."""
    def impl(*args, name, **params):
        done = _runner.submit(_run_and_wait, primitive, args, dict(params, name=name))
        try:
            while True:
                try:
                    return done.result(timeout=0.1)  # a timed wait: KeyboardInterrupt gets through
                except concurrent.futures.TimeoutError:
                    continue
        except jax.errors.JaxRuntimeError:
            kind, message = ext.take_p2p_failure(name)
            if kind:
                raise_for_status(kind, message)
            raise
    return impl


for _p, _abstract, _lowering, _batch in (
        (send_p, _send_abstract_eval, _send_lowering, _send_batch),
        (recv_p, _recv_abstract_eval, _recv_lowering, _recv_batch),
        (sendrecv_p, _sendrecv_abstract_eval, _sendrecv_lowering, _sendrecv_batch)):
    _p.def_impl(_eager(_p))
    _p.def_effectful_abstract_eval(_abstract)
    mlir.register_lowering(_p, _lowering, cacheable=False)
    batching.primitive_batchers[_p] = _batch
ad.primitive_jvps[sendrecv_p] = _sendrecv_jvp
ad.primitive_transposes[sendrecv_p] = _sendrecv_transpose


# --- API ---------------------------------------------------------------------------------

def _rank_in(value, fn: str, what: str, size: int, wildcard: int | None = None) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"jaxcache.{fn}: {what} must be an int, got {type(value).__name__}")
    value = int(value)
    if value == wildcard:
        return value
    if not 0 <= value < size:
        extra = " or ANY_SOURCE" if wildcard is not None else ""
        raise ValueError(f"jaxcache.{fn}: {what}={value} is not a rank of the process set "
                         f"(0..{size - 1}{extra})")
    return value


def _tag(value, fn: str, what: str, wildcard: bool) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"jaxcache.{fn}: {what} must be an int, got {type(value).__name__}")
    value = int(value)
    if wildcard and value == ANY_TAG:
        return value
    if value < 0:
        extra = " (or ANY_TAG)" if wildcard else ""
        raise ValueError(f"jaxcache.{fn}: {what}={value}; tags are non-negative{extra}")
    return value


def _message(x, fn: str, what: str):
    x = validation.as_array(x, fn, what)
    if x.ndim > ext.P2P_MAX_DIMS:
        raise ValueError(f"jaxcache.{fn}: {what} has {x.ndim} dimensions; messages have at most "
                         f"{ext.P2P_MAX_DIMS}")
    return x


def _template(x, fn: str):
    """recv's `x`: an array (its data unused) or anything with .shape and .dtype."""
    if hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, (jax.Array, jax.core.Tracer, np.ndarray)):
        x = jax.numpy.zeros(x.shape, x.dtype)
    return _message(x, fn, "x")


def send(x, dest: int, *, tag: int = 0, name: str | None = None, process_set=None, comm=None) -> None:
    """Sends `x` to rank `dest` (of `process_set`, or of `comm`), where a `recv` (or `sendrecv`)
    with this rank as source and a matching tag receives it. Returns once it has been received
    (eagerly) or, under jit, completes then. Works eagerly and under jit/vmap."""
    ps = call.begin("send", name, process_set, comm)
    dest = _rank_in(dest, "send", "dest", ps.size)
    tag = _tag(tag, "send", "tag", wildcard=False)
    x = _message(x, "send", "x")
    name, _ = naming.collective_name("send", name)
    send_p.bind(x, name=name, dest=dest, tag=tag, world_size=ps.size, process_set=ps.id)


def recv(x, source: int = ANY_SOURCE, *, tag: int = ANY_TAG, name: str | None = None, process_set=None,
         comm=None, status=None):
    """Receives an array shaped like `x` (an array or a `jax.ShapeDtypeStruct`; its values are not
    used) from rank `source` (ANY_SOURCE: the first to arrive) with `tag` (ANY_TAG: any). The
    sender must send this dtype and shape, else MismatchError here. `status`: an
    mpi4py `MPI.Status` to fill with the actual source, tag and count."""
    ps = call.begin("recv", name, process_set, comm)
    source = _rank_in(source, "recv", "source", ps.size, wildcard=ANY_SOURCE)
    tag = _tag(tag, "recv", "tag", wildcard=True)
    x = _template(x, "recv")
    name, _ = naming.collective_name("recv", name)
    return recv_p.bind(x, name=name, source=source, tag=tag, status=_status(status), world_size=ps.size,
                       process_set=ps.id)


def sendrecv(sendbuf, recvbuf, source: int, dest: int, *, sendtag: int = 0, recvtag: int = ANY_TAG,
             name: str | None = None, process_set=None, comm=None, status=None):
    """Sends `sendbuf` to `dest` and receives an array shaped like `recvbuf` from `source`, at
    once (MPI_Sendrecv: the halo exchange). Differentiable: the transpose sends the cotangent
    back (source and dest swapped). Works eagerly and under jit/vmap/grad."""
    ps = call.begin("sendrecv", name, process_set, comm)
    source = _rank_in(source, "sendrecv", "source", ps.size, wildcard=ANY_SOURCE)
    dest = _rank_in(dest, "sendrecv", "dest", ps.size)
    sendtag = _tag(sendtag, "sendrecv", "sendtag", wildcard=False)
    recvtag = _tag(recvtag, "sendrecv", "recvtag", wildcard=True)
    sendbuf = _message(sendbuf, "sendrecv", "sendbuf")
    recvbuf = _template(recvbuf, "sendrecv")
    name, _ = naming.collective_name("sendrecv", name)
    return sendrecv_p.bind(sendbuf, recvbuf, name=name, source=source, dest=dest, sendtag=sendtag,
                           recvtag=recvtag, status=_status(status), world_size=ps.size, process_set=ps.id)


__all__: list[Any] = ["ANY_SOURCE", "ANY_TAG", "send", "recv", "sendrecv"]
