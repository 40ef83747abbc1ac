"""The build a worker registers: its own, or the test hook's (workers/identity.py)."""

from __future__ import annotations

import pytest

from torchfarm.fx.fingerprint import fingerprint_for
from torchfarm.wire import builds, targets
from workers import identity

CPU = targets.make("cpu", "avx2")


def test_without_an_override_the_worker_reports_its_own_build():
    assert identity.worker_fingerprint(CPU) == fingerprint_for(CPU)


def test_an_override_changes_the_reported_build_and_its_digest():
    fp = identity.worker_fingerprint(CPU, '{"torch_git": "other"}')
    assert fp.torch_git == "other" and fp.isa == fingerprint_for(CPU).isa
    assert identity.build_digest(fp) != identity.build_digest(fingerprint_for(CPU))
    assert identity.build_digest(fp) == builds.digest(fp.to_dict())


@pytest.mark.parametrize("text, match", [
    ("not json", "not JSON"),
    ('["torch_git"]', "JSON object"),
    ('{"isa": "avx512"}', r"unknown fields \['isa'\]"),  # the target is not the build's
])
def test_a_bad_override_is_refused_by_name(text, match):
    with pytest.raises(identity.ReportedBuildError, match=match):
        identity.parse_override(text)
