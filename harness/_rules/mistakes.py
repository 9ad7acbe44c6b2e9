"""Configuration mistakes: rules that matched no checkpoint, each said with its likely fix (the
seen phase closest to a misspelt one, or how to give a recorder its checkpoints).

They make a verdict ERROR of their own kind (checks of rule ``configuration``): nothing ran
wrong, the rules and the run do not meet.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

import harness._core.labels as labels
from harness._measure.sample import Sample
from harness._rules.registry import Rule
from harness._verdict.options import Rules, size_fields

NO_CHECKPOINTS = (
    "no checkpoints at all: pass `memtrace` to the trainer as a callback or call "
    "`memtrace.checkpoint`"
)


def recorded_nothing(samples: Sequence[Sample]) -> bool:
    """Whether the run holds no checkpoint but its own start and end readings."""
    return all(labels.is_run_start(s.label) or labels.is_run_end(s.label) for s in samples)


def unmatched_phase(phase: str, seen: Sequence[str], samples: Sequence[Sample]) -> str:
    """A phase named in the rules that no checkpoint has, with the phases seen and the likely
    fix: the closest seen name, or how to record checkpoints at all."""
    said = f"the rule `phase={phase!r}` matched no checkpoint; phases seen: "
    said += ", ".join(seen) or "none"
    if recorded_nothing(samples):
        return f"{said}; {NO_CHECKPOINTS}"
    guess = difflib.get_close_matches(phase, seen, n=1)
    return f"{said}; did you mean {guess[0]!r}?" if guess else said


def nothing_recorded(rules: Rules, unjudged: Sequence[Rule]) -> str:
    """Rules that judged nothing because the run recorded no checkpoint: each as written."""
    named = ", ".join(f"`{rule.name}={_as_written(rules, rule)!r}`" for rule in unjudged)
    noun = "rule" if len(unjudged) == 1 else "rules"
    return f"the {noun} {named} matched no checkpoint; {NO_CHECKPOINTS}"


def _as_written(rules: Rules, rule: Rule) -> Any:
    """A rule's option as the user gave it: a size as written (``'1MB'``), else its value."""
    if rule.option in size_fields():
        return rules.shown(rule.option)
    return rule.enabled_with(rules)[1]
