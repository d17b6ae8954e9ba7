"""Bad input raises a clear error on every rank, and the runtime stays usable afterwards."""

from __future__ import annotations

import re
import time
import warnings

import numpy as np
import torch
from _util import COMM, done

import jaxcache
import jaxcache.torch as jct
from jaxcache.torch import requests as tops

warnings.filterwarnings("ignore", message="ComplexHalf")
# DistributedOptimizer checks its arguments before it needs the runtime, as Horovod does.
_net = torch.nn.Linear(2, 2)
try:
    jct.DistributedOptimizer(torch.optim.SGD(_net.parameters(), lr=0.1),
                             named_parameters=[("w", _net.weight), ("w", _net.bias)])
except ValueError as e:
    assert "duplicate parameter name 'w'" in str(e), e
else:
    raise AssertionError("duplicate parameter names accepted before init()")
jct.init()
RANK, SIZE = jct.rank(), jct.size()


def raises(exc, pattern: str, fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except exc as e:
        assert re.search(pattern, str(e)), f"{exc.__name__} message {str(e)!r} lacks {pattern!r}"
        outcome, error = f"{type(e).__name__}", e
    except Exception as e:  # noqa: BLE001
        raise AssertionError(f"expected {exc.__name__} matching {pattern!r}, got {type(e).__name__}: {e}")
    else:
        raise AssertionError(f"expected {exc.__name__} matching {pattern!r}, nothing raised")
    # Every rank raised the same error class.
    everyone = COMM.allgather(outcome)
    assert len(set(everyone)) == 1, everyone
    return error


x = torch.ones(3)
ints = torch.ones(3, dtype=torch.int32)

# --- the collectives -------------------------------------------------------------------------------
raises(TypeError, r"tensor must be a torch.Tensor, got list", jct.allreduce, [1.0, 2.0])
raises(TypeError, r"tensor must be a torch.Tensor, got ndarray", jct.broadcast, x.numpy())
raises(TypeError, r"tensor 'grads' has layout torch.sparse_coo", jct.allreduce,
       torch.eye(3).to_sparse(), name="grads")
raises(TypeError, r"unsupported dtype torch.complex32", jct.allgather, torch.ones(2, dtype=torch.complex32))
if hasattr(torch, "float8_e4m3fn"):
    raises(TypeError, r"tensor 'f8' has unsupported dtype torch.float8_e4m3fn", jct.allreduce,
           torch.zeros(2).to(torch.float8_e4m3fn), name="f8")
raises(TypeError, r"bool; only op='min'", jct.allreduce, torch.ones(2, dtype=torch.bool), op="sum")
raises(TypeError, r"prescale=0.5 cannot scale bool", jct.allreduce, torch.ones(2, dtype=torch.bool), op="max",
       prescale=0.5)


# Integers average and scale as Horovod does them: in double precision, truncated toward zero,
# an average divided after the sum (so the average of equal integers is exact).
def int_operand(r: int) -> torch.Tensor:
    return torch.tensor([7, -7, 5, 101, -3], dtype=torch.int32) + 3 * r


every = np.stack([int_operand(r).numpy() for r in range(SIZE)]).astype(np.float64)
mine = int_operand(RANK)
for got, want in (
        (jct.allreduce(mine, name="counts"), np.trunc(every.sum(0) * (1.0 / SIZE))),
        (jct.allreduce(mine, op=jct.Sum, prescale_factor=0.5, postscale_factor=3.0),
         np.trunc(np.trunc(every * 0.5).sum(0) * 3.0)),
        (jct.grouped_allreduce([x, mine], name="g")[1], np.trunc(every.sum(0) * (1.0 / SIZE))),
        (jct.allreduce(int_operand(0), name="equal"), int_operand(0).numpy())):
    assert got.dtype == torch.int32 and np.array_equal(got.numpy(), want.astype(np.int32)), (got, want)
    assert len({g.tobytes() for g in COMM.allgather(got.numpy())}) == 1
raises(ValueError, r"op must be one of .*'mean'", jct.allreduce, x, op="mean")
raises(ValueError, r"root=%d is outside \[0, %d\)" % (SIZE, SIZE), jct.broadcast, x, root_rank=SIZE)
raises(ValueError, r"root=-1 is outside", jct.broadcast_, x, root_rank=-1)
raises(TypeError, r"root must be an int, got float", jct.broadcast, x, root_rank=0.0)
raises(TypeError, r"name must be a non-empty str", jct.allreduce, x, name="")
raises(TypeError, r"tensors must be a list or tuple", jct.grouped_allreduce, x)
raises(TypeError, r"expected a Handle", jct.synchronize, 3)
raises(ValueError, r"root=%d is outside" % SIZE, jct.broadcast_parameters, {"w": x}, root_rank=SIZE)
raises(TypeError, r"parameter 'w' must be a torch.Tensor, got float", jct.broadcast_parameters, {"w": 1.0})
raises(TypeError, r"item 1 of params is a int, not a \(name, tensor\) pair", jct.broadcast_parameters,
       [("w", x), 3])
raises(ValueError, r"parameter name 'w' appears twice", jct.broadcast_parameters, [("w", x), ("w", x)])
raises(TypeError, r"expected a torch.optim.Optimizer, got Linear", jct.broadcast_optimizer_state,
       torch.nn.Linear(2, 2))

# An explicit name stays taken until its handle is synchronized, also when the request completed
# inside the submitting call (Horovod's rule).
held = jct.allreduce_async(x, op="sum", name="held")
while not held.poll():
    time.sleep(0.001)
raises(ValueError, r"'held' is already in flight on this rank", jct.allreduce_async, x, op="sum", name="held")
assert np.array_equal(jct.synchronize(held).numpy(), np.full(3, SIZE, np.float32))
assert np.array_equal(jct.allreduce(x, op="sum", name="held").numpy(), np.full(3, SIZE, np.float32))

# An async call returns before its request is done (Horovod's poll() after *_async): it leaves
# the cycles to the background thread, and the first synchronize() drives them.
jct.barrier()
handles, polled = [], []
for i in range(20):
    handles.append(jct.allreduce_async(torch.full((4,), float(i + RANK)), op="sum", name=f"async.{i}"))
    polled.append(handles[-1].poll())
assert not all(polled), "every async allreduce was done when its call returned"
for i, h in enumerate(handles):
    assert np.array_equal(jct.synchronize(h).numpy(), np.full(4, SIZE * i + SIZE * (SIZE - 1) / 2, np.float32))

# --- DistributedOptimizer ---------------------------------------------------------------------------
model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
params = list(model.named_parameters())


def opt():
    return torch.optim.SGD(model.parameters(), lr=0.1)


raises(TypeError, r"expected a torch.optim.Optimizer, got Sequential", jct.DistributedOptimizer, model)
_dist = jct.DistributedOptimizer(opt(), named_parameters=params)
assert {name: p for p, name in _dist._parameter_names.items()} == dict(params)  # Horovod's attribute
_dist.remove_hooks()
raises(ValueError, r"duplicate parameter name '0.weight'", jct.DistributedOptimizer, opt(),
       named_parameters=[params[0], ("0.weight", params[1][1])] + params[2:])
raises(ValueError, r"same parameter appears twice.*'0.weight' and 'alias'", jct.DistributedOptimizer,
       opt(), named_parameters=params + [("alias", params[0][1])])
raises(ValueError, r"lacks 2 of the optimizer's parameters \(shapes \[\(2, 4\), \(2,\)\]",
       jct.DistributedOptimizer, opt(), named_parameters=params[:2])
raises(TypeError, r"named_parameters item 0 is not a \(str, torch.Tensor\) pair",
       jct.DistributedOptimizer, opt(), named_parameters=[p for _, p in params])
raises(ValueError, r"backward_passes_per_step must be an int >= 1", jct.DistributedOptimizer, opt(),
       named_parameters=params, backward_passes_per_step=0)
raises(ValueError, r"groups must be >= 1", jct.DistributedOptimizer, opt(), named_parameters=params, groups=0)
raises(ValueError, r"parameter '0.weight' is in groups\[0\] and groups\[1\]", jct.DistributedOptimizer,
       opt(), named_parameters=params, groups=[[params[0][1]], [params[0][1]]])
raises(ValueError, r"groups\[0\] holds a tensor of shape \(7,\) that is not a trainable parameter",
       jct.DistributedOptimizer, opt(), named_parameters=params, groups=[[torch.zeros(7)]])
raises(ValueError, r"op must be one of", jct.DistributedOptimizer, opt(), named_parameters=params, op="adasum")
# The layout differs across ranks: ValueError on EVERY rank (no hang).
if SIZE > 1:
    shape = (3, 4) if RANK == 0 else (3, 5)
    odd = torch.nn.Linear(*shape)
    raises(ValueError, r"ranks disagree on the parameters to synchronize .*ranks \[.*\] differ from rank 0",
           jct.DistributedOptimizer, torch.optim.SGD(odd.parameters(), lr=0.1),
           named_parameters=odd.named_parameters())
    extra = {"a": torch.ones(2)} if RANK == 0 else {"a": torch.ones(2), "b": torch.ones(1)}
    e = raises(ValueError, r"ranks disagree on the parameters to broadcast", jct.broadcast_parameters, extra)
    if RANK != 0:
        assert "has extra ['b:(1,):float32']" in str(e), e
    # Same name, different shape on different ranks: the runtime's MismatchError on every rank.
    e = raises(jaxcache.MismatchError, r"'shape-differs'", jct.allreduce, torch.ones(2 + RANK),
               name="shape-differs")
    if RANK == 0:
        print("MismatchError:", e, flush=True)

# Misuse of the optimizer protocol.
dist = jct.DistributedOptimizer(opt(), named_parameters=params, name_prefix="misuse")
model(torch.ones(2, 3)).sum().backward()
raises(RuntimeError, r"zero_grad\(\) was called while gradient reductions are in flight", dist.zero_grad)
raises(RuntimeError, r"computed 2 times before step\(\)/synchronize\(\), but backward_passes_per_step=1",
       lambda: model(torch.ones(2, 3)).sum().backward())
dist.synchronize()
dist.step()
dist.zero_grad()
raises(RuntimeError, r"add parameter groups to the optimizer before wrapping", dist.add_param_group,
       {"params": [torch.nn.Parameter(torch.ones(1))]})
raises(ValueError, r"already distributed", jct.DistributedOptimizer, dist)
dist.remove_hooks()

# The runtime is still usable, and nothing is left in flight.
out = jct.allreduce(torch.full((3,), float(RANK)), op="sum", name="after-errors")
assert torch.equal(out, torch.full((3,), float(sum(range(SIZE)))))
assert tops.outstanding() == 0, tops.outstanding()
done("torch_errors")
jct.shutdown()
