"""What the report counts as independent agreements with the paper (suite.independent_agreements),
on hand-made headlines: the same simulations count once, derived values never, arithmetic checks
apart, and a second comparison of counted simulations can only turn their agreement into a miss."""

import pytest

from dualpath.experiments.common import Headline
from dualpath.experiments.simrun import SimSpec, online_spec
from dualpath.experiments.suite import _counts, independent_agreements


def sim(metric, runs, ours=1.0, **kw):
    """A simulated headline on `runs`, met unless `ours` is off by more than 10%."""
    return Headline("x", metric, ours, 1.0, 0.10, runs=frozenset(runs), **kw)


def test_two_headlines_on_the_same_simulations_are_one_agreement():
    a, b = sim("a", {"r1", "r2"}), sim("b", {"r2", "r1"})
    (only,) = independent_agreements([a, b])
    assert only.headlines == (a, b) and only.runs == {"r1", "r2"} and only.met


def test_a_headline_on_runs_already_counted_joins_every_agreement_holding_them():
    """Fig. 12's last step rests on Fig. 7's 1,024- and 2,048-agent runs: no agreement of its own."""
    at_1024, at_2048 = sim("1024", {"b1", "d1"}), sim("2048", {"b2", "d2"})
    step = sim("step", {"b1", "d1", "b2", "d2"})
    agreements = independent_agreements([at_1024, at_2048, step])
    assert [a.headlines for a in agreements] == [(at_1024, step), (at_2048, step)]


def test_a_new_run_opens_an_agreement_with_all_its_runs():
    first, second = sim("first", {"r1"}), sim("second", {"r1", "r2"})
    agreements = independent_agreements([first, second])
    assert [a.headlines for a in agreements] == [(first,), (second,)]
    assert agreements[1].runs == {"r1", "r2"}


def test_a_miss_on_counted_simulations_makes_their_agreement_missed():
    met, missed = sim("capacity ratio", {"r1", "r2"}), sim("TTFT at one point", {"r2"}, ours=2.0)
    (only,) = independent_agreements([met, missed])
    assert met.met and not missed.met and not only.met


def test_derived_arithmetic_by_construction_and_unidentified_headlines_are_no_agreement():
    a = sim("a", {"r1"})
    derived = sim("mean of a and b", {"r1", "r9"}, evidence="derived")
    arithmetic = Headline("t", "cost model", 1.0, 1.0, 0.1, evidence="arithmetic")
    built = sim("by construction", {"r8"}, by_construction="1/2 against 1/3 is 1.5")
    unidentified = sim("no runs recorded", set())
    agreements = independent_agreements([a, derived, arithmetic, built, unidentified])
    assert [x.headlines for x in agreements] == [(a,)]


def test_counts_split_headlines_by_evidence():
    hs = [sim("a", {"r1"}), sim("a again", {"r1"}), sim("b", {"r2"}, ours=2.0), sim("mean", {"r1", "r2"}, evidence="derived"),
          Headline("t", "cost 16K", 1.0, 1.0, 0.1, evidence="arithmetic"),
          Headline("t", "cost 64K", 1.2, 1.0, 0.1, evidence="arithmetic"), sim("no runs", set()),
          sim("built", {"r3"}, by_construction="arithmetic of the setup")]
    c = _counts([h.to_dict() for h in hs])
    assert (c["headlines"], c["met"], c["by_construction"]) == (7, 5, 1)
    assert (c["simulated"], c["simulated_met"], c["unidentified"]) == (4, 3, 1)
    assert (c["arithmetic"], c["arithmetic_met"], c["derived"], c["derived_met"]) == (2, 1, 1, 1)
    assert [(len(a.headlines), a.met) for a in independent_agreements(hs)] == [(2, True), (1, False)]


def test_evidence_is_checked_and_runs_survive_json():
    with pytest.raises(ValueError, match="evidence"):
        Headline("x", "m", 1.0, 1.0, 0.1, evidence="guessed")
    with pytest.raises(ValueError, match="no simulation"):
        Headline("x", "m", 1.0, 1.0, 0.1, evidence="arithmetic", runs=frozenset({"r1"}))
    h = sim("m", {"r2", "r1"}, evidence="derived")
    assert h.to_dict()["runs"] == ["r1", "r2"] and Headline.from_dict(h.to_dict()) == h
    old = {k: v for k, v in h.to_dict().items() if k not in ("runs", "evidence")}  # JSON from before they existed
    assert Headline.from_dict(old).runs == frozenset() and Headline.from_dict(old).evidence == "simulated"


def test_run_ids_tell_apart_every_field_of_a_spec():
    """Exact where the progress label rounds: APS 0.21251 and 0.21254 are two runs."""
    base = SimSpec("ds-27b", "1P1D", 65536, 512, "dualpath")
    assert base.run_id() == SimSpec("ds-27b", "1P1D", 65536, 512, "dualpath").run_id()
    variants = [SimSpec("ds-27b", "1P1D", 65536, 512, "basic"), SimSpec("ds-27b", "1P1D", 65536, 512, "dualpath", gpu="h200"),
                SimSpec("ds-27b", "1P1D", 65536, 512, "dualpath", append_scale=1.5),
                SimSpec("ds-27b", "1P1D", 65536, 512, "dualpath", knobs=("compute.prefill_forward_overhead_s=0",))]
    assert len({base.run_id(), *(v.run_id() for v in variants)}) == 5
    a, b = (online_spec("ds-27b", "1P1D", 65536, "dualpath", aps, 1800.0, 900.0) for aps in (0.21251, 0.21254))
    assert a.label() == b.label() and a.run_id() != b.run_id()
