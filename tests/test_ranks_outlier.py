"""The cross-rank rule judges what the rules judge: growth in the rules' metric against
``max_growth``, above a noise floor measured from the other ranks; peaks only where ``max_peak``
is set and read in that metric. A CPU rank's resident high-water mark is evidence, never a
finding by itself (synthetic timelines, judged as each rank's own rules judge them)."""

import numpy as np

from harness import Rules, judge
from harness._measure.sample import Sample
from harness._report.ranks import RankRun
from harness._results.merge import finish_ranks

KB, MB = 2**10, 2**20
BASE = 200 * MB


def cpu_loop(per_batch: int = 0, resident: int = 0, noise: int = 0, seed: int = 0) -> list[Sample]:
    """30 batches read as the CPU probe reads them: the live heap (``allocated``) growing by
    ``per_batch`` with ``noise`` (uniform, bytes), and the resident memory and its high-water
    mark (``rss``, ``peak``) climbing by ``resident`` a batch."""
    jitter = np.random.default_rng(seed).integers(-noise, noise + 1, 30) if noise else [0] * 30
    return [
        Sample(
            "BATCH",
            "validation",
            0,
            b,
            float(b),
            {
                "allocated": BASE + b * per_batch + int(jitter[b]),
                "rss": 2 * BASE + b * resident,
                "peak": 2 * BASE + b * resident,
            },
        )
        for b in range(30)
    ]


def merged(rules: Rules, *loops: list[Sample]):
    parts = [
        RankRun(r, {"rank": r, "world_size": len(loops)}, s, judge(s, rules))
        for r, s in enumerate(loops)
    ]
    return finish_ranks(parts, rules, name="run")


def outliers(finished) -> list[str]:
    return [f.message for f in finished.verdict.findings if f.rule == "rank_outlier"]


def test_a_resident_high_water_mark_alone_never_makes_a_rank_stand_out():
    """The shape of a logging rank that keeps a small tensor after each freed 64 KiB block: its
    live heap flat, its resident mark up 64 KiB a batch. Before, that was a peak finding
    against a 1 MiB gap although ``max_peak`` was off."""
    rules = Rules(phase="validation", max_growth="4MB", warmup=5)
    finished = merged(rules, cpu_loop(), cpu_loop(resident=64 * KB))
    assert finished.verdict.status == "PASS", "\n".join(finished.lines())
    [check] = [c for c in finished.verdict.checks if c.rule == "rank_outlier"]
    assert "no rank stands out" in check.details
    assert "rank 1 +0B / +1.8MiB rss high-water mark" in check.details


def test_with_max_peak_set_a_resident_mark_is_the_ranks_own_rule_not_an_outlier():
    rules = Rules(phase="validation", max_growth="4MB", warmup=5, max_peak="64MiB")
    finished = merged(rules, cpu_loop(), cpu_loop(resident=4 * MB))
    assert [f.rule for f in finished.verdict.findings] == ["max_peak"], finished.lines()
    assert outliers(finished) == []


def test_growth_is_judged_above_the_clean_ranks_noise_floor():
    """Rank 0 grows 5 KiB a batch over 25 batches after warm-up (+125 KiB) against a 16 KiB
    budget. Beside two quiet ranks it stands out; beside ranks whose readings scatter by
    +-100 KiB around their lines it does not, and a growth far above that floor still does."""
    rules = Rules(phase="validation", max_growth="16KiB", warmup=5)
    quiet = merged(rules, cpu_loop(5 * KB), cpu_loop(), cpu_loop())
    assert [m[:22] for m in outliers(quiet)] == ["rank 0 of 3 stands out"]
    assert "(gap allowed 16.0KiB)" in outliers(quiet)[0]

    noisy = [cpu_loop(noise=100 * KB, seed=s) for s in (1, 2)]
    assert outliers(merged(rules, cpu_loop(5 * KB), *noisy)) == []
    far = outliers(merged(rules, cpu_loop(40 * KB), *noisy))
    assert len(far) == 1 and far[0].endswith(": the other ranks' noise floor)")
