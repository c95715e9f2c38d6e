"""The least-squares fitter: recovers known constants, keeps undetermined ones, stays non-negative."""

import numpy as np
import pytest

from launcher.calibrate.fit import Sample, coefficients, fit, solve

NAMES = ("hidden_terms", "inner_terms", "embedding_terms", "logits_bytes")
TRUE = {"hidden_terms": 9.0, "inner_terms": 3.0, "embedding_terms": 1.5, "logits_bytes": 14.0}
PRIOR = {"hidden_terms": 7.0, "inner_terms": 2.0, "embedding_terms": 2.0, "logits_bytes": 10.0,
         "mask_bytes_per_h": 2.0, "score_bytes": 0.0}


def synthetic(rng, n=24, true=TRUE, noise=0.0, inner_is_4h=False) -> list[Sample]:
    out = []
    for i in range(n):
        tokens = rng.choice([64, 128, 256, 512])
        h, inner, blocks, vocab = rng.choice([64, 96, 128]), rng.choice([128, 256, 512]), rng.choice([2, 3, 4]), \
            rng.choice([1024, 2048, 4096])
        inner = 4 * h if inner_is_4h else inner
        coef = {"hidden_terms": 2 * blocks * tokens * h, "inner_terms": 2 * blocks * tokens * inner,
                "embedding_terms": 2 * tokens * h, "logits_bytes": tokens * vocab,
                "mask_bytes_per_h": blocks * tokens * h, "score_bytes": 0.0}
        base = float(rng.choice([0, 2 * blocks * tokens * h]))  # checkpointed block inputs, not a constant
        exact = base + sum(coef[k] * {**PRIOR, **true}[k] for k in coef)
        out.append(Sample(name=f"s{i}", measured_bytes=exact * (1 + noise * rng.standard_normal()),
                          base_bytes=base, coefficients=coef, current=dict(PRIOR), measured_peak_bytes=exact * 3,
                          peak_of=lambda c, coef=coef, base=base, exact=exact: 2 * exact + base + sum(
                              coef[k] * c[k] for k in coef)))
    return out


def test_recovers_known_constants_exactly():
    rng = np.random.default_rng(0)
    result = fit(synthetic(rng), NAMES)
    for k, v in TRUE.items():
        assert result.constants[k] == pytest.approx(v, rel=1e-3), k
    assert result.constants["mask_bytes_per_h"] == PRIOR["mask_bytes_per_h"]  # not fitted: unchanged
    assert result.summary()["max_abs_act_err_after"] < 1e-3
    assert result.summary()["median_abs_act_err_before"] > 0.05
    assert result.summary()["max_abs_peak_err_after"] < 1e-3 < result.summary()["median_abs_peak_err_before"]


def test_default_terms_are_the_constants_the_samples_depend_on():
    rng = np.random.default_rng(3)
    result = fit(synthetic(rng))
    assert "score_bytes" not in result.fitted and "hidden_terms" in result.fitted
    assert result.constants["score_bytes"] == 0.0


def test_recovers_with_noise_within_a_few_percent():
    rng = np.random.default_rng(1)
    result = fit(synthetic(rng, n=60, noise=0.02), NAMES)
    # The large terms are pinned down; embedding_terms (2·tokens·h, a few % of the bytes) is not, under 2 % noise.
    for k in ("hidden_terms", "inner_terms", "logits_bytes"):
        assert result.constants[k] == pytest.approx(TRUE[k], rel=0.1), k
    assert result.summary()["median_abs_act_err_after"] < 0.03


def test_collinear_terms_keep_their_prior_split():
    # inner is always 4h: hidden and inner cannot be told apart; only their combination is fitted.
    rng = np.random.default_rng(2)
    samples = synthetic(rng, inner_is_4h=True)
    result = fit(samples, NAMES)

    def combo(c):
        return c["hidden_terms"] + 4 * c["inner_terms"]

    assert combo(result.constants) == pytest.approx(TRUE["hidden_terms"] + 4 * TRUE["inner_terms"], rel=1e-2)
    assert result.summary()["max_abs_act_err_after"] < 1e-2


def test_constants_stay_non_negative():
    x = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    y = x @ np.array([5.0, -1.0])
    c = solve(x, y, np.array([1.0, 1.0]))
    assert (c >= 0).all()
    assert c[1] == 0.0


def test_coefficients_of_a_linear_function():
    def f(c):
        return 10 + 3 * c["a"] + 5 * c["b"]

    base, coef, nonlinear = coefficients(f, ["a", "b"], {"a": 2.0, "b": 7.0})
    assert base == 10 and coef == {"a": 3, "b": 5} and nonlinear == 0.0
    _, _, off = coefficients(lambda c: c["a"] ** 2 + 1, ["a"], {"a": 3.0})
    assert off > 0.1


def test_scales_recover_one_factor_across_architectures():
    # Two widths whose per-token constants differ 4x: one shared factor per constant, not one absolute value.
    from launcher.calibrate.fit import fit_scales, scaled

    rng = np.random.default_rng(5)
    truth = {"hidden_terms": 1.3, "logits_bytes": 0.8}
    samples = []
    for i in range(12):
        width = 4.0 if i % 2 else 1.0
        current = {"hidden_terms": 100.0 * width, "logits_bytes": 14.0}
        coef = {"hidden_terms": float(rng.integers(1000, 9000)), "logits_bytes": float(rng.integers(1000, 9000))}
        measured = 50.0 + sum(coef[k] * current[k] * truth[k] for k in coef)
        samples.append(Sample(name=f"s{i}", measured_bytes=measured, base_bytes=50.0, coefficients=coef,
                              current=current))
    scales = fit_scales(samples)
    assert scales == pytest.approx(truth, rel=1e-3)
    assert scaled({"hidden_terms": 400.0, "logits_bytes": 14.0}, scales) == pytest.approx(
        {"hidden_terms": 520.0, "logits_bytes": 11.2}, rel=1e-3)
