"""The licence policy (tools/licenses.py, locks/licenses.toml): what passes and what is refused."""

from __future__ import annotations

import dataclasses

import pytest

from tools.licenses import Policy, judge

POLICY = Policy.load()


@pytest.mark.parametrize(
    ("raw", "ok"),
    [
        ("MIT", True),
        ("MIT License", True),  # a trove classifier
        ("BSD License", True),
        ("Apache-2.0 OR BSD-3-Clause", True),
        ("EPL-2.0 OR GPL-2.0-or-later", True),  # passes on EPL-2.0
        ("Apache-2.0 WITH LLVM-exception", True),
        ("DFSG approved; MIT License", True),  # the seal is no licence; the classifier is
        ("GPL-3.0-only", False),
        ("AGPL-3.0-or-later", False),
        ("MIT AND GPL-3.0-only", False),  # every part of an AND must hold
        ("MIT License; GNU General Public License v3 (GPLv3)", False),  # classifiers together: AND
        ("", False),
        ("UNKNOWN", False),
        ("Free for non-commercial use", False),  # not SPDX at all
    ],
)
def test_a_licence_passes_only_inside_the_allow_list(raw: str, ok: bool) -> None:
    verdict = judge("dev", "some-package", "1.0", raw, POLICY)
    assert verdict.ok is ok, verdict


def test_a_package_read_by_hand_passes_at_that_version_only() -> None:
    policy = dataclasses.replace(POLICY, packages={"some-package==1.0": "MIT"})
    assert judge("dev", "some-package", "1.0", "UNKNOWN", policy).ok
    upgraded = judge("dev", "some-package", "1.1", "UNKNOWN", policy)
    assert not upgraded.ok and upgraded.why == "not an SPDX licence: UNKNOWN", upgraded
