"""The CANN release whose published rules apply where releases differ (docs/testing_with_the_mock.md,
"The CANN release").

CANN's documents change between releases: the late-2025 ones refuse things the newer ones accept. The
mock follows the newest published rules unless ``ACLNN_MOCK_CANN_VERSION`` names an older release;
aclnn-py's pre-checks ask the mock which rule set is active, so that both give the same answer. On a
real CANN backend the pre-checks apply the newest rules and leave the rest to CANN's own checks.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..env_values import cann_release

#: The variable that selects a release's rules on the mock.
VARIABLE = "ACLNN_MOCK_CANN_VERSION"


@dataclass(frozen=True)
class RuleSet:
    """The rules of one family of releases where they differ from the others."""

    name: str                                   # "newest" or the release, as doctor prints it
    source: str                                 # the documents the rules come from
    a2_fullmesh_world_sizes: frozenset[int]     # Atlas A2 ep_world_size with comm_alg "" / "fullmesh"
    a2_fullmesh_max_experts: int                # Atlas A2 moe_expert_num bound with "" / "fullmesh"
    a2_fullmesh_max_local: int | None           # Atlas A2 E / W bound with "" / "fullmesh" (None: no bound)

    def a2_world_sizes_text(self) -> str:
        """The fullmesh world sizes as the mock's message words them."""
        if self is R8_3:
            return "16, 32, 64, 128 or 256 (the CANN 8.3.RC1 rules)"
        return "2 ... 8, 16, 32, 64, 128, 192, 256 or 384"


NEWEST = RuleSet("newest", "the newest published aclnnMoeDistribute*.md (the revision listing Ascend 950PR/950DT)",
                 frozenset({2, 3, 4, 5, 6, 7, 8, 16, 32, 64, 128, 192, 256, 384}), 1024, None)
R8_3 = RuleSet("8.3.RC1", "the aclnnMoeDistribute*.md of CANN 8.3.RC1 and earlier (before the Ascend 950 entries)",
               frozenset({16, 32, 64, 128, 256}), 512, 24)
RULE_SETS = (NEWEST, R8_3)


def rules_of(value: str) -> RuleSet:
    """The rule set a value of ACLNN_MOCK_CANN_VERSION selects: "" or "newest" → the newest rules; a
    release number <major>.<minor>.<RCn | n>[.<suffix>] → the 8.3.RC1 rules before 8.5, the newest from
    8.5 on. ValueError naming the variable and the accepted values otherwise (the mock's own wording)."""
    try:
        release = cann_release(value)
    except ValueError:
        raise ValueError(f"{VARIABLE}='{value}' is refused: must be a CANN release such as 8.3.RC1 or 8.5.0 "
                         "(<major>.<minor>.<RCn or n>; releases before 8.5 get the 8.3.RC1 rules) or \"newest\" "
                         "(the default)") from None
    return NEWEST if release is None or release >= (8, 5) else R8_3


def active() -> RuleSet:
    """The rule set of the loaded backend: the mock's active one, the newest on real CANN."""
    from ..runtime import initialized

    backend = initialized()
    if backend.kind != "mock":
        return NEWEST
    from .. import _mock

    name = _mock.cann_rules()
    return next(r for r in RULE_SETS if r.name == name)


__all__ = ["VARIABLE", "RuleSet", "NEWEST", "R8_3", "RULE_SETS", "rules_of", "active"]
