"""The rows a kernel sends into its peers' windows are written with streaming stores when a round
moves more than the cache holds (mock/ops/peer_copy.h), with ordinary copies otherwise. Either way the
outputs are the golden's, bit for bit: both copies run here on random configurations of each profile,
whatever this machine's cache would choose."""

from __future__ import annotations

import pytest
from helpers.moe_cases import A3, A950, cases_for, on_profile
from helpers.moe_world import run_world


@pytest.fixture(params=[True, False], ids=["streamed", "copied"])
def row_streaming(mock, request):
    mock.set_row_streaming(request.param)
    yield request.param
    mock.set_row_streaming(None)


@on_profile(A3, A950)
@pytest.mark.parametrize("w", [2, 3])
def test_rounds_are_exact_however_the_rows_are_copied(acl, profile, row_streaming, w):
    run_world(cases_for(profile, w, 0, 6, 63_000 + 10 * w + int(row_streaming), combine=True), combine=True)
