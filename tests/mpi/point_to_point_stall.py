"""A send that rank 1 receives only after 2.5 s, then a receive rank 0 satisfies only 2.5 s later:
with JAXCACHE_STALL_CHECK_TIME=1 each waiting rank warns, naming the op, both ranks and the
tag; both then complete."""

import time

import numpy as np

import jaxcache as jc
from _util import COMM, done

jc.init()
rank = jc.rank()
if rank == 0:
    jc.send(np.arange(4.0), 1, tag=3, name="late")  # buffered: returns, stays watched
    time.sleep(5)
    jc.send(np.arange(2.0), 1, tag=8)
elif rank == 1:
    time.sleep(2.5)
    assert np.array_equal(np.asarray(jc.recv(np.zeros(4), 0, tag=3)), np.arange(4.0))
    assert np.array_equal(np.asarray(jc.recv(np.zeros(2), 0, tag=8, name="early")), np.arange(2.0))
COMM.Barrier()
assert jc.stats()["stall_warnings"] >= (1 if rank < 2 else 0)
done("point_to_point_stall")
jc.shutdown()
