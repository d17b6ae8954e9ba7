"""Point-to-point (send, recv, sendrecv) on 2 and 3 ranks, and a send nobody receives reported
by the stall inspector with both ranks and its name."""

from conftest import run_mpi


def test_point_to_point(nranks):
    out = run_mpi("point_to_point.py", nranks, timeout=300).stdout
    assert f"point_to_point: OK on {nranks} ranks" in out


def test_unreceived_send_is_reported():
    out = run_mpi("point_to_point_stall.py", 2, timeout=120, env={"JAXCACHE_STALL_CHECK_TIME": "1"}).stdout
    assert "point_to_point_stall: OK on 2 ranks" in out
    assert "send 'late' from rank 0 to rank 1 (tag 3) has waited" in out, out[-3000:]
    assert "recv 'early' on rank 1 from rank 0 (tag 8) has waited" in out, out[-3000:]


def test_interrupted_recv():
    out = run_mpi("point_to_point_interrupt.py", 2, timeout=120).stdout
    assert "point_to_point_interrupt: OK on 2 ranks" in out
