"""The vmap backend runs the specs it cannot batch (loss terms that read the batch) one by one, equal to sequential."""

from __future__ import annotations

import pytest

from fedblend.common.histories import diff_histories
from tests.helpers import tiny_sim, without_timings

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("spec", ["fedproto", "fedphp"])
def test_vmap_backend_runs_batch_reading_terms_one_by_one(spec, tiny_fed):
    """Loss terms that read the batch (prototype pull, distillation) take the sequential path under ``vmap``
    (equal to ``sequential`` up to the float reassociation of vmap's batched rounds and evaluation)."""
    from fedblend.core.vmap import VmapBackend

    a = tiny_sim(tiny_fed, spec, rounds=2, seed=1)
    a.run()
    with pytest.warns(RuntimeWarning, match="looks at the batch"):
        b = tiny_sim(tiny_fed, spec, rounds=2, seed=1, backend=VmapBackend())
        b.run()
    # counted in the round metrics (FedProto's first round has no prototypes yet, so no batch-reading term)
    assert b.history[-1]["vmap_one_by_one_batch_term"] == len(b.history[-1]["selected"])
    batched = [{k: v for k, v in y.items() if not k.startswith("vmap_")} for y in without_timings(b.history)]
    # floats (the per-client losses of stats_per_client too) within the float reassociation, the rest exactly
    assert diff_histories(without_timings(a.history), batched, rel=1e-5, abs_=1e-7) == []
