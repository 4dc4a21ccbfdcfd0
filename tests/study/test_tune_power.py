"""What a tune prints it can call, checked by simulated tunes through the tune's own code
(tests/helpers/tunesim.py: halving, tunepower.size on the search's rounds, stats.compare): the
confirmation is re-sized from the noise the search measured, so the MDE it prints is called in
>= 80% of tunes even when the CV it was planned at is a guess 5x too small; a planted null still
names a false winner in <= alpha of tunes; several tunes corrected together keep the family's
level; a confirmed gain is printed as its interval's lower end, flagged near the MDE."""

from __future__ import annotations

import math

import numpy as np
import pytest

from analysis import stats
from helpers.binomial import at_least, at_most
from helpers.tunesim import simulate
from workloads.study import halving, tunepower
from workloads.study.tunespec import DEFAULT

NULL = {"a": 0.0, "b": 0.0, "c": 0.0}
BUDGET = 32   # four candidates: rounds of 4 and 8 blocks, so the search measures its noise


def test_the_residual_sd_removes_candidates_and_blocks():
    """A worked case: candidates +0/+0.1/+0.2 and block drifts 0/0.5/1 are removed exactly; what is
    left is the interaction, sd sqrt(ss / ((3 - 1)(3 - 1)))."""
    eff, drift = np.array([0.0, 0.1, 0.2]), np.array([0.0, 0.5, 1.0])
    noise = np.array([[0.01, -0.01, 0.0], [-0.01, 0.01, 0.0], [0.0, 0.0, 0.0]])
    x = drift[:, None] + eff[None, :] + noise                  # (blocks, candidates)
    logs = {n: list(x[:, j]) for j, n in enumerate("abc")}
    sd, df = tunepower.residual_sd([logs, {"a": [1.0], "b": [2.0]}])  # a one-block round adds nothing
    assert df == 4 and sd == pytest.approx(math.sqrt(4 * 0.01 ** 2 / 4))
    assert tunepower.residual_sd([{"a": [None, 1.0], "b": [0.0, 2.0]}]) == (math.nan, 0) or \
        math.isnan(tunepower.residual_sd([{"a": [None, 1.0], "b": [0.0, 2.0]}])[0])


@pytest.mark.parametrize("true_cv,planned", [(0.15, 0.03), (0.04, 0.05)])
def test_the_printed_mde_is_called_in_80_percent_of_tunes(true_cv, planned):
    """The docs' bucket tune's case (planned at the catalog's 3%, the runs vary by 15%) and a guess
    about right: with the winner's true gain at the MDE the re-sized confirmation printed, it is
    named in >= 80% of tunes (planned on the guess alone, the first case called ~10%)."""
    rng = np.random.default_rng(5711 if true_cv > 0.1 else 5712)
    tunes = [simulate(rng, NULL, cv=true_cv, drift=0.05, confirm_blocks=4, search_budget=BUDGET, resize=True,
                      planned_cv=planned, detect=0.10, at_mde=True) for _ in range(300)]
    confirmed = [t for t in tunes if t.outcome.winner != DEFAULT]
    named = sum(t.outcome.kind == halving.WINNER for t in confirmed)
    assert at_least(named, len(confirmed), 0.80), (named, len(confirmed))
    assert all(t.confirm.measured for t in tunes)
    if true_cv > 0.1:  # the line says the blocks fall short of detect and how many would do
        capped = [t.confirm for t in tunes if t.confirm.mde > 0.10]
        assert capped and all("cannot call detect 10.0%" in c.line for c in capped)


def test_a_planted_null_still_names_no_winner_beyond_alpha():
    rng = np.random.default_rng(5713)
    tunes = [simulate(rng, NULL, cv=0.05, confirm_blocks=7, search_budget=BUDGET, resize=True) for _ in range(600)]
    named = sum(t.outcome.kind == halving.WINNER for t in tunes)
    assert at_most(named, len(tunes), 0.05), named


def test_three_tunes_read_together_keep_the_familys_level():
    """Three planted-null tunes per study, each judged at alpha/3 and then Holm over their
    p-values (what a study of three tuned arms does): a false winner anywhere in <= alpha of
    studies; uncorrected, the rate is about three times one tune's."""
    rng = np.random.default_rng(5714)
    studies, any_false = 300, 0
    for _ in range(studies):
        tunes = [simulate(rng, NULL, cv=0.05, confirm_blocks=7, search_budget=BUDGET, resize=True, family=3)
                 for _ in range(3)]
        kept = tunepower.family_keep([t.p for t in tunes], 0.05)
        any_false += any(k and t.outcome.kind == halving.WINNER for k, t in zip(kept, tunes))
    assert at_most(any_false, studies, 0.05), any_false


def test_a_confirmed_gain_is_its_lower_end_and_flagged_near_the_mde():
    d = np.log([1.06, 1.02, 1.09, 1.04, 1.07, 1.03])
    c = stats.correct([stats.compare(np.exp(d), np.ones(6), "w", DEFAULT, "samples_per_sec",
                                     design=stats.Design(blocks=d, name="sim"))], "holm", 0.05)[0]
    text = tunepower.gain(c)
    assert c.significant and text.startswith(f"samples_per_sec at least {100 * (c.lo - 1):+.1f}%")
    assert f"near this test's MDE of {stats.pct(c.mde)}" in text
    # a lower-is-better metric: the claim is the end nearest no change, the interval's upper end
    lat = stats.correct([stats.compare(np.exp(-d), np.ones(6), "w", DEFAULT, "median_ttft_ms",
                                       design=stats.Design(blocks=-d, name="sim"))], "holm", 0.05)[0]
    assert tunepower.gain(lat).startswith(f"median_ttft_ms at least {100 * (lat.hi - 1):+.1f}%")


def test_declared_blocks_are_kept_and_said_to_fall_short():
    c = tunepower.size([(0.15, 20)], 4, True, 0.03, 0.10, 1, 0.05)
    assert c.blocks == 4 and c.measured and c.mde > 0.10
    need = stats.blocks_for(0.10, 1, c.cv)
    assert f"that needs {need} blocks (confirm: {{blocks: {need}}})" in c.line
    assert c.cv == pytest.approx(tunepower.upper(0.15, 20)) and c.cv > 0.15
    planned = tunepower.size([(math.nan, 0)], 7, False, 0.05, 0.10, 2, 0.05, family=2)
    assert planned.blocks == 7 and not planned.measured and planned.alpha == 0.025
    assert "no round of two complete blocks" in planned.line and "one of 2 tunes" in planned.line


def test_a_study_of_tuned_arms_corrects_across_its_tunes(tmp_path):
    """Two tuned arms beside an untuned baseline: each tune's p (written by the tune) read
    together by Holm: p 0.01 stands (x 2 = 0.02), p 0.06 does not: that arm runs at its default,
    and the plan says each tune's level and MDE."""
    from workloads.study import tuned
    from workloads.study.plan import Plan
    from workloads.study.spec import load_spec

    settings = {"overrides": {"collectives.warmup_iters": 2}}
    for name, p in (("a", 0.01), ("b", 0.06)):
        (tmp_path / name).mkdir()
        tuned.write(tmp_path / name, {"name": name, "id": name, "source": "x.yaml", "outcome": "winner",
                                      "candidate": "c", "p": p, "alpha": 0.05, "level": 0.025, "family": 2,
                                      "mde": 0.081}, f"{name}-tuned", "loopback", ["collectives.iters=5"], settings)
    study = tmp_path / "s.yaml"
    study.write_text(f"name: two\narms:\n  - {{fabric: loopback, label: base, baseline: true}}\n"
                     f"  - {{tuned: {tmp_path / 'a'}}}\n  - {{tuned: {tmp_path / 'b'}}}\nworkloads:\n"
                     "  - {name: ar, entry: collectives}\nblocks: 3\ndetect: 50%\ncv: 5%\n")
    spec = load_spec(study, output_root=str(tmp_path / "o"))
    a, b = spec.arms[1], spec.arms[2]
    assert "collectives.warmup_iters=2" in a.overrides and "does not stand" not in a.tune_note
    assert not any("warmup_iters" in o for o in b.overrides) and "candidate:'default'" in b.overrides[-1]
    assert "p 0.06 does not stand in the family: the arm runs at its default" in b.tune_note
    lines = Plan(spec, 1, 0, {"ar": (0.05, "")}, {}, [1]).lines()
    for arm in (a, b):
        assert (f"  arm {arm.label}: tune {arm.label[0]}: winner (c), judged at alpha 0.025, one of 2 tunes corrected "
                "together (Holm over their p-values); its confirmation could call >= 8.1% with 80% power") in \
            "\n".join(lines)
