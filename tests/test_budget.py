import random

from budgetgen.budget import DispatchPolicy, LengthModel


def test_empty_model_is_pessimistic_at_max_tokens():
    m = LengthModel(max_tokens=1000)
    assert m.expected_final(0) == 1000
    assert m.expected_final(999) == 1000


def test_conditional_expectation_from_observed_lengths():
    m = LengthModel(max_tokens=1000, lengths=[100] * 50 + [500] * 50)
    assert m.expected_final(0) == 300  # mean of all
    assert m.expected_final(100) == 500  # only the long ones are still running past 100
    assert m.expected_final(600) > 600  # beyond everything seen: blends toward the cap, never below k+1


def test_expected_final_never_decreases_while_streaming():
    rng = random.Random(0)
    m = LengthModel(max_tokens=4096, lengths=[int(rng.lognormvariate(6, 0.8)) for _ in range(2000)])
    values = [m.expected_final(k) for k in range(0, 4096, 7)]
    assert all(b >= a - 1e-9 for a, b in zip(values, values[1:]))


def test_model_grows_past_max_tokens_when_a_server_ignores_it():
    m = LengthModel(max_tokens=10, lengths=[5, 50, 500])
    assert m.n == 3 and m.sum == 555


def test_policy_stops_dispatching_at_expected_budget():
    m = LengthModel(max_tokens=1000, lengths=[100] * 100)
    p = DispatchPolicy(budget=1000, model=m)
    assert p.may_dispatch(0, [0] * 9)  # 900 expected < 1000
    assert not p.may_dispatch(0, [0] * 10)  # 1000 expected reaches the budget
    assert not p.may_dispatch(1000, [])  # met
    assert p.may_dispatch(950, [])  # below budget and nothing in flight


def simulate(budget, concurrency, mean, sigma, max_tokens, seed):
    """Event simulation of the dispatch rule: returns (kept tokens, tokens thrown away)."""
    rng = random.Random(seed)
    mu = __import__("math").log(mean) - sigma**2 / 2
    m = LengthModel(max_tokens)
    p = DispatchPolicy(budget, m)
    kept, t, inflight = 0, 0.0, []  # (end time, length, start time)
    rate = 1.0
    while True:
        streamed = [min(length, int((t - start) * rate)) for _, length, start in inflight]
        while len(inflight) < concurrency and p.may_dispatch(kept, streamed):
            length = min(max_tokens, max(1, int(rng.lognormvariate(mu, sigma))))
            inflight.append((t + length / rate, length, t))
            streamed.append(0)
        if not inflight:
            return kept, 0
        inflight.sort()
        t, length, _ = inflight.pop(0)
        kept += length
        m.observe(length)


def test_simulated_overshoot_is_small_and_nothing_is_discarded():
    # The production shape scaled down: budget / (concurrency * mean) as in 10M / (150 * 3500).
    for seed in range(3):
        kept, discarded = simulate(budget=1_000_000, concurrency=15, mean=3500, sigma=0.8,
                                   max_tokens=10240, seed=seed)
        assert kept >= 1_000_000
        assert (kept - 1_000_000) / 1_000_000 < 0.02
        assert discarded == 0
