"""The CUDA path on a machine without a GPU: every primitive lowers for CUDA with its custom
call and attributes, and the device kind is part of the signature (2 and 3 ranks).

Scenarios: `lowering`, `device-mismatch`.
"""

import os
import re
import sys

import numpy as np

import jax
import jax.numpy as jnp

import jaxcache as jc
from jaxcache import devices
from jaxcache._ext import ext
from jaxcache.errors import MismatchError, raise_for_status
from jaxcache.protocol import NUMPY_DTYPES, Device, Kind
from jaxcache.ops.validation import REDUCE_OPS
from _util import COMM, assert_close, done, same_on_all_ranks

jc.init()
rank, size = jc.rank(), jc.size()

CALL = re.compile(r"stablehlo\.custom_call @(\w+)\((.*?)\) \{(.*)\} : \((.*?)\) -> (.*)$")
ENTRY = re.compile(r'(\w+) = ("(?:[^"\\]|\\.)*"|dense<[^>]*>[^,]*|[^,]+?)(?:,|$)')


def _value(text: str):
    text = text.strip()
    if text.startswith('"'):
        return text[1:-1]
    if text.startswith("dense<"):  # an array attribute: dense<> or dense<[0, 1]> (: tensor<...>)
        inner = text[len("dense<"):text.index(">")].strip("[] ")
        return [int(v) for v in inner.split(",")] if inner else []
    number = text.split(":")[0].strip()
    return float(number) if any(c in number for c in ".e") else int(number)


def custom_calls(text: str) -> list[dict]:
    """Every custom call of a lowered module: target, attributes, operand/result types."""
    calls = []
    for line in text.splitlines():
        m = CALL.search(line)
        if not m:
            continue
        target, _, attrs, operand_types, result_types = m.groups()
        config = re.search(r"mhlo\.backend_config = \{(.*?)\}", attrs)
        assert config is not None, f"custom call @{target} has no FFI attributes: {line}"
        calls.append({
            "target": target,
            "attrs": {k: _value(v) for k, v in ENTRY.findall(config.group(1))},
            "aliased": "output_operand_aliases" in attrs,
            "operands": [t.strip() for t in operand_types.split("tensor") if t.strip(" ,")],
            "results": result_types.strip(),
        })
    return calls


def lowered(f, *args, platforms=("cuda",)) -> list[dict]:
    return custom_calls(jax.jit(f).trace(*args).lower(lowering_platforms=platforms).as_text())


def only(calls, target):
    found = [c for c in calls if c["target"] == target]
    assert len(found) == 1, f"expected one @{target}, got {[c['target'] for c in calls]}"
    return found[0]


def check_common(call, name):
    a = call["attrs"]
    assert a["name"].endswith(name), (a["name"], name)
    assert a["world_size"] == size, a
    assert isinstance(a["program"], int) and a["program"] >= 1, a


def lowering():
    expect_built = os.environ.get("JAXCACHE_EXPECT_CUDA_BUILT")  # set by tests/test_build.py
    if expect_built is not None:
        assert devices.cuda_built() == (expect_built == "1"), (jc.__file__, devices.cuda_built())
    x = jnp.arange(12, dtype=jnp.float32).reshape(4, 3)

    # allreduce: every op, with scales ("average" is an op of its own: the runtime divides).
    for op in ("sum", "average", "min", "max", "prod"):
        calls = lowered(lambda v: jc.allreduce(v, op=op, name=f"ar-{op}", prescale=2.0,
                                               postscale=0.5), x)
        c = only(calls, "jaxcache_allreduce")
        check_common(c, f"ar-{op}")
        assert c["attrs"]["op"] == REDUCE_OPS[op], (op, c)
        assert c["attrs"]["prescale"] == 2.0, (op, c)
        assert c["attrs"]["postscale"] == 0.5, (op, c)
        assert c["results"] == "tensor<4x3xf32>", c
        assert not c["aliased"], c

    # grouped_allreduce: one request with one operand per leaf.
    tree = {"a": x, "b": jnp.ones((5,), jnp.bfloat16), "c": jnp.ones((), jnp.int32)}
    calls = lowered(lambda t: jc.grouped_allreduce(t, op="sum", name="grp", num_groups=1), tree)
    c = only(calls, "jaxcache_allreduce")
    check_common(c, "grp/0of1")
    assert len(c["operands"]) == 3, c
    assert all(t in c["results"] for t in ("tensor<4x3xf32>", "tensor<5xbf16>", "tensor<i32>")), c

    # broadcast from the last rank: the result aliases a computed operand, not an argument
    # (XLA would copy that first).
    calls = lowered(lambda v: jc.broadcast(v * 2, root=size - 1, name="bc"), x)
    c = only(calls, "jaxcache_broadcast")
    check_common(c, "bc")
    assert c["attrs"]["root"] == size - 1 and c["aliased"], c
    assert not only(lowered(lambda v: jc.broadcast(v, root=size - 1, name="bc.arg"), x), "jaxcache_broadcast")["aliased"]

    # allgather of a pytree: axis 0 grows by `size`, a scalar becomes a vector.
    calls = lowered(lambda t: jc.allgather(t, name="ag"), {"m": x, "s": jnp.float32(1)})
    c = only(calls, "jaxcache_allgather")
    check_common(c, "ag")
    assert f"tensor<{4 * size}x3xf32>" in c["results"] and f"tensor<{size}xf32>" in c["results"], c

    # Transposes read the rank at run time: the jaxcache_rank helper lowers for CUDA too.
    calls = lowered(jax.grad(lambda v: jc.broadcast(v, root=0, name="g").sum()), x)
    only(calls, "jaxcache_rank")
    transposed = only(calls, "jaxcache_allreduce")["attrs"]["name"]
    assert transposed.startswith("g/") and transposed.endswith("/T"), transposed
    # allgather transposes to a reducescatter (and the reverse), alltoall to itself.
    calls = lowered(jax.grad(lambda v: jc.allgather(v, name="h").sum()), x)
    only(calls, "jaxcache_reducescatter")
    calls = lowered(lambda v: jc.reducescatter(v, "sum", name="rs"), x[:2 * (4 // 2)].reshape(-1)[:size * 2])
    check_common(only(calls, "jaxcache_reducescatter"), "rs")
    calls = lowered(lambda v: jc.alltoall(v, name="a2a"), jnp.arange(size * 3, dtype=jnp.float32))
    check_common(only(calls, "jaxcache_alltoall"), "a2a")

    # The CUDA program asks for the same collectives as the CPU one (same names, attributes).
    def step(v):
        s = jc.allreduce(v, op="sum", name="s1")
        return jc.allgather(jc.broadcast(s * 2, root=0, name="s2"), name="s3")

    def strip(calls):
        return [(c["target"], {k: v for k, v in c["attrs"].items() if k != "program"}, c["results"])
                for c in calls]

    cuda, cpu = lowered(step, x), lowered(step, x, platforms=("cpu",))
    assert strip(cuda) == strip(cpu), (cuda, cpu)
    # One program for both platforms: one custom call per collective, no duplicate instances.
    both = lowered(step, x, platforms=("cpu", "cuda"))
    assert strip(both) == strip(cpu), both

    # Platforms without jaxcache targets are refused when lowering, naming the primitive.
    try:
        lowered(step, x, platforms=("tpu",))
    except NotImplementedError as e:
        assert "jaxcache_allreduce cannot be lowered for tpu" in str(e), e
    else:
        raise AssertionError("lowering for tpu was accepted")

    # The CUDA targets reached jaxlib: on a jaxlib without a CUDA backend it queues them.
    if devices.cuda_built():
        from jax._src.lib import xla_client
        queued = getattr(xla_client, "_custom_callback", None)
        if queued is not None and not any(d.platform == "gpu" for d in jax.devices()):
            names = {entry[0] for entry in queued.get("CUDA", [])}
            assert {"jaxcache_allreduce", "jaxcache_broadcast", "jaxcache_allgather",
                    "jaxcache_rank"} <= names, names
            # With a state type of CUDA's own (the plugin numbers types independently).
            types = {entry[0] for entry in getattr(xla_client, "_custom_type_id", {}).get("CUDA", [])}
            assert types == {"jaxcache_call_site_cuda"}, types

    # The CPU lowering still runs: the CUDA registration changed nothing there.
    got = jax.jit(step)(x + rank)
    want = np.concatenate([2 * sum(np.arange(12, dtype=np.float32).reshape(4, 3) + r
                                   for r in range(size))] * size)
    assert_close(got, want, "step on CPU")
    same_on_all_ranks(got)
    done("lowering")


def submit(name, x, device):
    out = np.empty_like(x)
    handle = ext.submit(Kind.ALLREDUCE, name, [x], [out], REDUCE_OPS["sum"], 1.0, 1.0, 0,
                        [NUMPY_DTYPES[x.dtype]], device=device)
    status, message = handle.wait()
    raise_for_status(status, message)
    return out


def expect_device_mismatch(name, x, device):
    try:
        submit(name, x, device)
    except MismatchError as e:
        text = str(e)
        want = "rank 0: cpu; " + ("rank 1: cuda" if size == 2 else "ranks 1, 2: cuda")
        assert f"'{name}'" in text and "device differs across ranks" in text and want in text, text
        return
    raise AssertionError(f"rank {rank}: {name}: no MismatchError for a CPU/CUDA mix")


def device_mismatch():
    x = np.full(6, rank + 1, np.float32)
    want = np.full(6, sum(range(1, size + 1)), np.float32)
    mine = Device.CPU if rank == 0 else Device.CUDA

    # New name: rank 0 negotiates with a CPU request, the others with CUDA ones.
    expect_device_mismatch("mixed", x, mine)
    # The runtime keeps working, and the same name then agrees.
    assert_close(submit("mixed", x, Device.CUDA), want, "after the mismatch")

    # A cached name (CUDA everywhere, twice: negotiated, then a cache hit) that one rank
    # then submits from the CPU: the cache entry is invalid and the renegotiation fails.
    for _ in range(2):
        assert_close(submit("cached", x, Device.CUDA), want, "cached CUDA")
    expect_device_mismatch("cached", x, mine)
    # All ranks on the CPU now: a consistent change simply re-caches.
    for _ in range(2):
        assert_close(submit("cached", x, Device.CPU), want, "cached CPU")

    # Unknown device codes are refused before anything is submitted.
    try:
        submit("bad-device", x, 7)
    except ValueError as e:
        assert "unknown device kind 7" in str(e), e
    else:
        raise AssertionError("device 7 was accepted")
    done("device-mismatch")


{"lowering": lowering, "device-mismatch": device_mismatch}[sys.argv[1]]()
jc.shutdown()
