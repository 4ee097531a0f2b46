"""Suite-wide test settings.

Hypothesis' per-example deadline (200 ms by default) measures wall time, which a loaded 2-core CI
machine can exceed for reasons that are not the code's; property tests here assert values and
invariants, and the suite's own timing checks are explicit. So: no deadline, and no health check
that fails a test because generating its examples was slow."""

from hypothesis import HealthCheck, settings

settings.register_profile("dualpath", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("dualpath")
