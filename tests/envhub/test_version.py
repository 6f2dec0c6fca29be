"""Version ordering and ref resolution: pure functions, hand-checked tables."""

import pytest

from rockroll.envhub.errors import EnvNotFound
from rockroll.envhub.version import EnvRef, Version, latest_per_major, select

VERSIONS = {"0.9.0": False, "1.0.0": False, "1.2.0": False, "1.10.1": False, "1.11.0": True,
            "2.0.0-rc.1": False, "2.0.0-rc.2": False, "1.2.1-beta": False}


@pytest.mark.parametrize("spec, want", [
    ("latest", "1.10.1"),          # 1.11.0 yanked, 2.0.0 only pre-releases
    ("1", "1.10.1"),               # numeric, not string, ordering: 1.10 > 1.2
    ("1.2", "1.2.0"),              # 1.2.1-beta is a pre-release
    ("0", "0.9.0"),
    ("1.11.0", "1.11.0"),          # yanked but pinned: still resolves
    ("2.0.0-rc.1", "2.0.0-rc.1"),  # pre-release pinned
    ("1.2.1-beta", "1.2.1-beta"),
])
def test_resolution_table(spec, want):
    assert select(VERSIONS, spec)[0] == want


def test_pinned_yanked_version_is_flagged():
    assert select(VERSIONS, "1.11.0") == ("1.11.0", True)


@pytest.mark.parametrize("spec", ["2", "3", "1.3", "1.0.1", "2.0.0"])
def test_unmatched_specs_say_what_exists(spec):
    with pytest.raises(EnvNotFound, match="1.11.0 \\(yanked\\)"):
        select(VERSIONS, spec, "counter")


def test_semver_precedence():
    order = ["1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta", "1.0.0-beta.2",
             "1.0.0-beta.11", "1.0.0-rc.1", "1.0.0", "1.0.1", "1.1.0", "2.0.0"]
    assert sorted(order, key=Version.parse) == order


@pytest.mark.parametrize("bad", ["1.0", "01.0.0", "1.0.0+build", "v1.0.0", "1.0.0-", ""])
def test_bad_versions(bad):
    with pytest.raises(ValueError):
        Version.parse(bad)


def test_refs():
    assert EnvRef.parse("counter") == EnvRef("counter", "latest")
    assert EnvRef.parse("counter@1#warm") == EnvRef("counter", "1", "warm")
    assert EnvRef.parse("counter@1.2.3").exact and not EnvRef.parse("counter@1.2").exact
    for bad in ("../x", "counter@x", "counter@1.2.3.4", "counter@1#"):
        with pytest.raises(EnvNotFound):
            EnvRef.parse(bad)


def test_one_id_per_major():
    assert latest_per_major(VERSIONS) == {0: "0.9.0", 1: "1.10.1"}
