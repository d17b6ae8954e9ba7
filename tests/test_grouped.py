"""grouped_allreduce on 2 and 3 ranks."""

from conftest import run_mpi


def test_grouped_pytrees_modes_atomicity_transforms(nranks):
    run_mpi("grouped.py", nranks, "main", timeout=300)


def test_groups_ready_together_are_fused(nranks):
    # A heartbeat longer than the cycle time: an idle set's first request must still wait.
    run_mpi("grouped.py", nranks, "fusion", timeout=120,
            env={"JAXCACHE_CYCLE_TIME": "100", "JAXCACHE_HEARTBEAT_MS": "1000"})


def test_group_fusion_can_be_disabled(nranks):
    run_mpi("grouped.py", nranks, "fusion-disabled", timeout=120,
            env={"JAXCACHE_CYCLE_TIME": "100", "JAXCACHE_HEARTBEAT_MS": "1000",
                 "JAXCACHE_DISABLE_GROUP_FUSION": "1"})


def test_donated_gradients_reduced_in_place(nranks):
    run_mpi("grouped.py", nranks, "donated", timeout=120, env={"JAXCACHE_CHUNK_BYTES": "4096"})
