"""broadcast: every rank receives root's value (a pytree is one request)."""

from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from .. import runtime
from . import eager, naming, validation
from .allreduce import allreduce_p

broadcast_p = Primitive("jaxcache_broadcast")
broadcast_p.multiple_results = True


def _abstract_eval(*avals, name, root):
    return [jax.core.ShapedArray(a.shape, a.dtype) for a in avals]


def _lowering(ctx, *args, name, root):
    rule = jax.ffi.ffi_lowering(
        "jaxcache_broadcast", operand_output_aliases={i: i for i in range(len(args))}
    )
    return rule(ctx, *args, name=name, root=np.int64(root))


def _impl(*args, name, root):
    return eager.run(eager.KIND_BROADCAST, name, args, [a.shape for a in args], root=root)


def _jvp(primals, tangents, *, name, root):
    out = broadcast_p.bind(*primals, name=name, root=root)
    tangents = [ad.instantiate_zeros(t) for t in tangents]
    return out, broadcast_p.bind(*tangents, name=naming.derived(name, "jvp"), root=root)


def _transpose(cts, *args, name, root):
    # Every rank's cotangent flows back to root's input: a sum at root, zero elsewhere.
    cts = [ad.instantiate_zeros(c) for c in cts]
    summed = allreduce_p.bind(*cts, name=naming.derived(name, "T"), op="sum")
    if runtime.rank() == root:
        return summed
    return [jnp.zeros_like(s) for s in summed]


def _batch(args, dims, *, name, root):
    return broadcast_p.bind(*args, name=name, root=root), list(dims)


broadcast_p.def_impl(_impl)
broadcast_p.def_abstract_eval(_abstract_eval)
mlir.register_lowering(broadcast_p, _lowering, platform="cpu")
ad.primitive_jvps[broadcast_p] = _jvp
ad.primitive_transposes[broadcast_p] = _transpose
batching.primitive_batchers[broadcast_p] = _batch


def broadcast(tree, root: int = 0, *, name: str | None = None):
    """Returns root's `tree` on every rank (arrays or a pytree of arrays; None leaves pass)."""
    runtime.require_initialized("jaxcache.broadcast")
    validation.check_name(name, "broadcast")
    root = validation.check_root(root, runtime.size(), "broadcast")
    leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
    if not leaves:
        return tree
    values = [validation.as_array(v, "broadcast", f"leaf {jax.tree_util.keystr(p) or 'x'}")
              for p, v in leaves]
    name = naming.collective_name("broadcast", name, values[0])
    if any(isinstance(v, jax.core.Tracer) for v in values):
        out = broadcast_p.bind(*values, name=name, root=root)
    else:
        out = eager.run(eager.KIND_BROADCAST, name, values, [v.shape for v in values], root=root)
    return jax.tree_util.tree_unflatten(treedef, out)
