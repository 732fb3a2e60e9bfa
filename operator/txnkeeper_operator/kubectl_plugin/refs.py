"""Resource names as kubectl spells them: ``tc NAME``, ``pas/NAME``, ``transactioncoordinator/NAME``,
``pendingackstores.txnkeeper.io NAME``; a kind alone means every resource of that kind."""

from __future__ import annotations

from dataclasses import dataclass

from txnkeeper_operator import naming


class UsageError(ValueError):
    """The command line names something that cannot be a txnkeeper resource (exit 2)."""


def _aliases(kind: naming.Kind) -> set[str]:
    singular = kind.kind.lower()
    return {
        singular,
        kind.plural,
        kind.short,
        f"{singular}.{naming.GROUP}",
        f"{kind.plural}.{naming.GROUP}",
        f"{kind.short}.{naming.GROUP}",
    }


ALIASES: dict[str, naming.Kind] = {alias: kind for kind in naming.KINDS for alias in _aliases(kind)}
KNOWN = ", ".join(f"{k.short} | {k.kind.lower()} | {k.plural}" for k in naming.KINDS)


@dataclass(frozen=True, slots=True)
class Ref:
    """One resource, or every resource of ``kind`` (``name`` None)."""

    kind: naming.Kind
    name: str | None

    def __str__(self) -> str:
        return f"{self.kind.kind.lower()}/{self.name}" if self.name else self.kind.plural


def parse_kind(word: str) -> naming.Kind:
    kind = ALIASES.get(word.lower())
    if kind is None:
        raise UsageError(f"unknown resource type {word!r}: txnkeeper has {KNOWN}")
    return kind


def parse(words: list[str], *, need_name: bool) -> list[Ref]:
    """``[]`` -> both kinds (only where no name is needed); ``[KIND]``, ``[KIND/NAME]``, ``[KIND NAME]``."""
    if not words:
        if need_name:
            raise UsageError("name a resource: KIND NAME or KIND/NAME (KIND is one of " + KNOWN + ")")
        return [Ref(kind, None) for kind in naming.KINDS]
    first, rest = words[0], words[1:]
    if "/" in first:
        if rest:
            raise UsageError(f"give either KIND/NAME or KIND NAME, not both ({' '.join(words)!r})")
        word, _, name = first.partition("/")
        if not name:
            raise UsageError(f"{first!r} has no name after the '/'")
        return [Ref(parse_kind(word), name)]
    kind = parse_kind(first)
    if len(rest) > 1:
        raise UsageError(f"one resource at a time: {' '.join(words)!r} names {len(rest)}")
    if not rest:
        if need_name:
            raise UsageError(f"name the {kind.kind}: {kind.short} NAME")
        return [Ref(kind, None)]
    return [Ref(kind, rest[0])]
