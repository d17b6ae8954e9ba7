"""Ctrl-C during an eager recv that nothing arrives for raises KeyboardInterrupt at once; the
interrupted recv stays in flight and takes the message when it comes (as an interrupted
collective does), and the ranks go on exchanging."""

import os
import signal
import threading
import time

import numpy as np

import jaxcache as jc
from _util import COMM, done

jc.init()
rank = jc.rank()
if rank == 1:
    threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    start = time.monotonic()
    try:
        jc.recv(np.zeros(3), 0, tag=1)
        raise AssertionError("the recv returned instead of being interrupted")
    except KeyboardInterrupt:
        waited = time.monotonic() - start
    assert waited < 3.0, f"KeyboardInterrupt came after {waited:.1f} s"
    print(f"rank 1: interrupted after {waited:.1f} s", flush=True)
elif rank == 0:
    time.sleep(4)
    jc.send(np.ones(3), 1, tag=1)  # taken by the interrupted recv
COMM.Barrier()
if rank < 2:
    other = 1 - rank
    got = np.asarray(jc.sendrecv(np.full(2, rank), np.zeros(2, np.int64), other, other, sendtag=2, recvtag=2))
    assert np.array_equal(got, np.full(2, other)), got
done("point_to_point_interrupt")
jc.shutdown()
