"""The Sample Mixer's formulas against hand-computed values."""

import pytest

from rlonce.rollout.mixer import MixerSettings, SampleMixer, SourceStats


def _mixer(**kw):
    return SampleMixer({"A": SourceStats(target=4, acceptance=0.5, duration=1.0, seen=1),
                        "B": SourceStats(target=2, acceptance=0.25, duration=3.0, seen=1)},
                       MixerSettings(budget=1.25, p_min=1.0, p_max=3.0, **kw))


def test_demand_oversampling_and_quotas_by_hand():
    m = _mixer()
    assert m.demand() == {"A": 8.0, "B": 8.0}  # m_i = B_i / r_i
    # t̄ = (8·1 + 8·3)/16 = 2 → t_i/t̄ = (0.5, 1.5); A sits at p_min, so (8·1 + 8·1.5c)/16 = 1.25 → c = 1
    p, c = m.oversampling()
    assert c == pytest.approx(1.0, abs=1e-9)
    assert p["A"] == pytest.approx(1.0) and p["B"] == pytest.approx(1.5)
    assert m.quotas() == {"A": 8, "B": 12}
    # budget reached exactly: Σ m_i p_i / Σ m_i = 1.25
    assert (8 * p["A"] + 8 * p["B"]) / 16 == pytest.approx(1.25)


def test_weights_blend_demand_and_deficit():
    m = _mixer()
    w = m.weights({"A": 4, "B": 0})  # A met its target; B is 2 short
    assert w["A"] == pytest.approx(0.5 * 0.5 + 0.5 * 0.0) and w["B"] == pytest.approx(0.5 * 0.5 + 0.5 * 1.0)
    w = m.weights({"A": 9, "B": 5})  # no deficit anywhere: demand shares only
    assert w == pytest.approx({"A": 0.5, "B": 0.5})


def test_concurrency_follows_littles_law():
    # load ∝ m_i · p_i · t_i = (8·1·1, 8·1.5·3) = (8, 36) of 44 → 10 slots: (1.8, 8.2) → (2, 8)
    assert _mixer().concurrency(10) == {"A": 2, "B": 8}


def test_caps_bind_when_the_budget_is_out_of_reach():
    p, _ = _mixer().__class__(_mixer().sources, MixerSettings(budget=9.0, p_max=3.0)).oversampling()
    assert p == {"A": 3.0, "B": 3.0}


def test_estimates_start_from_the_first_observation_then_average_and_warm_start():
    m = SampleMixer({"A": SourceStats(target=1)}, MixerSettings(ema=0.2))
    m.observe("A", accepted=True, duration=10.0)
    assert (m.sources["A"].acceptance, m.sources["A"].duration) == (1.0, 10.0)  # the prior is replaced
    m.observe("A", accepted=False, duration=0.0)
    assert m.sources["A"].acceptance == pytest.approx(0.8) and m.sources["A"].duration == pytest.approx(8.0)
    fresh = SampleMixer({"A": SourceStats(target=1)}, MixerSettings(ema=0.2))
    fresh.load_state_dict(m.state_dict())
    fresh.observe("A", accepted=True, duration=0.1)  # a short rollout after restart moves it by 20%, not 100%
    assert fresh.sources["A"].duration == pytest.approx(8.0 + 0.2 * (0.1 - 8.0))


def test_a_source_that_accepted_nothing_is_tried_not_infinitely_demanded():
    m = SampleMixer({"A": SourceStats(target=2, acceptance=0.0, seen=3)}, MixerSettings(min_acceptance=0.05))
    assert m.demand() == {"A": pytest.approx(40.0)}
