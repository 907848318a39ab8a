"""The SoC family table: every name a device reports (``aclrtGetSocName``) belongs to one product
family, and every SoC lookup of the package (the operators' profiles, the golden, the demo's
``--soc`` and its check of the device's name) goes through :func:`family_of`.

A real device reports a member of a family, not the family's own name: ``Ascend910_9391`` or
``Ascend910_9392`` on Atlas A3, ``Ascend910B1`` … ``Ascend910B4`` on Atlas A2, ``Ascend950PR_…`` or
``Ascend950DT_…`` on the 950 line. A name belongs to the family whose name it begins with (compared
without regard to case); the family's own name is a member too. The mock's C table
(``ACLNN_MOCK_SOC``) follows the same rule, which tests/test_socs.py checks.

Plain Python with no other import, so the golden uses it as well.
"""

from __future__ import annotations

from typing import NamedTuple


class Family(NamedTuple):
    """One product family: its name (what the profiles, the golden and the mock's profile go by),
    the product line, and example member names for messages."""

    name: str
    line: str
    examples: tuple[str, ...]


#: The families, first match wins (no name is a prefix of another, so the order is only for messages).
FAMILIES: tuple[Family, ...] = (
    Family("Ascend910_93", "Atlas A3", ("Ascend910_9391", "Ascend910_9392")),
    Family("Ascend910B", "Atlas A2", ("Ascend910B1", "Ascend910B2", "Ascend910B3", "Ascend910B4")),
    Family("Ascend950", "Ascend 950", ("Ascend950PR_…", "Ascend950DT_…")),
)

A3, A2, ASCEND950 = (f.name for f in FAMILIES)


def family_of(soc_name: str) -> str | None:
    """The family name of a SoC name (``"Ascend910B3"`` → ``"Ascend910B"``), or None when the name
    belongs to no family."""
    low = soc_name.lower()
    for f in FAMILIES:
        if low.startswith(f.name.lower()):
            return f.name
    return None


def accepted() -> str:
    """What a SoC name may be, for messages."""
    return "; ".join(f"{f.name} ({f.line}, e.g. {', '.join(f.examples[:2])})" for f in FAMILIES)


def require_family(soc_name: str, what: str = "soc") -> str:
    """family_of, or a ValueError naming `what` and the families."""
    fam = family_of(soc_name) if isinstance(soc_name, str) else None
    if fam is None:
        raise ValueError(f"{what}: {soc_name!r} belongs to no known SoC family; a name beginning with one of "
                         f"{accepted()}")
    return fam


__all__ = ["A2", "A3", "ASCEND950", "FAMILIES", "Family", "accepted", "family_of", "require_family"]
