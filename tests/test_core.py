"""Core collectives on 2 and 3 ranks (issue: core runtime and ops)."""

import pytest

from conftest import run_mpi


def test_ops_dtypes_eager_and_jit(nranks):
    run_mpi("core_ops.py", nranks, timeout=240)


def test_out_of_order_jit_and_threads(nranks):
    run_mpi("concurrency.py", nranks, timeout=180)


def test_transforms_grad_vmap_scan(nranks):
    run_mpi("transforms.py", nranks, timeout=180)


def test_process_api(nranks):
    run_mpi("process_api.py", nranks, timeout=120)


@pytest.mark.parametrize("repeat", range(20))
def test_out_of_order_repeated(repeat):
    """The out-of-order programs, 20 times in a row (alternating 2 and 3 ranks)."""
    run_mpi("concurrency.py", 2 + repeat % 2, "8", timeout=120)
