"""Rules by name: the built-in ones and any a user registers.

A rule is a function. A *phase* rule is called once per ``(phase, epoch)`` group that the
rules select, as ``fn(ctx, group, option)``; a *run* rule once per timeline, as
``fn(ctx, option)``. Either records what it judged with ``ctx.check(...)`` and returns the
findings it makes. ``option`` is the value of the :class:`~harness._verdict.options.Rules` field the
rule is bound to (built-in rules), or the rule's entry in ``Rules.custom`` (registered rules, which
run only when given one: ``@pytest.mark.memleak(my_rule="1MB")``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, overload

from harness._core.errors import BadArgument, BadInput
from harness._verdict.model import Finding
from harness._verdict.options import option_names

Scope = Literal["run", "phase"]
RuleFunction = Callable[..., Iterable[Finding]]
F = TypeVar("F", bound=RuleFunction)


@dataclass(frozen=True)
class Rule:
    """A registered rule: its name, function, scope, and the ``Rules`` field it reads
    (``None``: always run with option ``None``; ``"custom"``: run when ``Rules.custom`` names
    it)."""

    name: str
    function: RuleFunction
    scope: Scope
    option: str | None

    def enabled_with(self, rules: Any) -> tuple[bool, Any]:
        """Whether the rule runs under ``rules``, and the option it gets."""
        if self.option is None:
            return True, None
        if self.option == "custom":
            return self.name in rules.custom, rules.custom.get(self.name)
        value = getattr(rules, self.option)
        return value is not None, value


_REGISTRY: dict[str, Rule] = {}


@overload
def register_rule(name: str, function: F, *, scope: Scope = ..., option: str | None = ...) -> F: ...
@overload
def register_rule(
    name: str, function: None = ..., *, scope: Scope = ..., option: str | None = ...
) -> Callable[[F], F]: ...
def register_rule(
    name: str,
    function: F | None = None,
    *,
    scope: Scope = "run",
    option: str | None = "custom",
) -> F | Callable[[F], F]:
    """Register ``function`` as the rule ``name`` (usable as a decorator, which returns the
    function as it was, type and all).

    User rules keep the default ``option="custom"``: they run when a marker keyword, a
    ``Rules(custom={name: value})`` or a timeline's stored rules give them a value. Raises
    :class:`~harness._core.errors.BadInput` for a name already taken by a built-in rule or a
    ``Rules`` option, and ``TypeError`` for a function that is not callable or a scope that is
    not run/phase.
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise BadArgument(f"register_rule: name must be an identifier, got {name!r}")
    if scope not in ("run", "phase"):
        raise BadArgument(f"register_rule: scope must be 'run' or 'phase', got {scope!r}")

    def add(fn: F) -> F:
        if not callable(fn):
            raise BadArgument(f"register_rule: {fn!r} is not callable")
        taken = _REGISTRY.get(name)
        if option == "custom" and (
            name in option_names() or (taken is not None and taken.option != "custom")
        ):
            raise BadInput(f"{name!r} is a built-in rule or option", field="register_rule")
        _REGISTRY[name] = Rule(name, fn, scope, option)
        return fn

    return add if function is None else add(function)


def unregister_rule(name: str) -> None:
    """Remove a registered user rule (built-in rules stay)."""
    rule = _REGISTRY.get(name)
    if rule is not None and rule.option == "custom":
        del _REGISTRY[name]


def registered() -> list[Rule]:
    """Every rule, built-in first, in registration order."""
    return list(_REGISTRY.values())


def is_custom(name: str) -> bool:
    rule = _REGISTRY.get(name)
    return rule is not None and rule.option == "custom"
