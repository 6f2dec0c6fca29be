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


def test_parse_fields_and_str_round_trip():
    v = Version.parse("1.2.3-rc.1")
    assert (v.major, v.minor, v.patch, v.pre) == (1, 2, 3, ("rc", 1))  # numeric ids become ints
    assert v.prerelease and not Version.parse("1.2.3").prerelease
    assert str(v) == "1.2.3-rc.1"
    assert str(Version.parse("10.0.7")) == "10.0.7"


def test_parse_errors_are_value_errors_with_a_hint():
    with pytest.raises(ValueError, match="build metadata"):
        Version.parse("1.0.0+build.5")
    with pytest.raises(ValueError) as info:
        Version.parse("1.0")
    assert "build metadata" not in str(info.value)
    with pytest.raises(ValueError, match="None is not a semantic version"):
        Version.parse(None)  # not a string: a ValueError too, not a TypeError


def test_order_is_strict():
    a, b = Version.parse("1.0.0"), Version.parse("1.0.0")
    assert a == b and not a < b and not a > b and a <= b and a >= b
    assert Version.parse("1.0.0-rc.1") < a and not a < Version.parse("1.0.0-rc.1")


def test_versions_and_refs_are_frozen_and_hashable():
    assert len({Version.parse("1.0.0"), Version(1, 0, 0)}) == 1
    assert len({EnvRef.parse("c@1"), EnvRef("c", "1")}) == 1
    with pytest.raises(AttributeError):
        Version.parse("1.0.0").major = 2
    with pytest.raises(AttributeError):
        EnvRef.parse("c").name = "d"


def test_ref_str():
    assert str(EnvRef.parse("counter")) == "counter@latest"
    assert str(EnvRef.parse("counter@1.2#warm")) == "counter@1.2#warm"


def test_range_resolution_is_never_flagged_yanked():
    assert select(VERSIONS, "latest") == ("1.10.1", False)
    assert select(VERSIONS, "1.2") == ("1.2.0", False)


def test_available_versions_are_listed_in_semver_order():
    # text order would put 1.10.0 before 1.9.0
    with pytest.raises(EnvNotFound, match=r"available: 1\.9\.0, 1\.10\.0 \(yanked\)\)"):
        select({"1.10.0": True, "1.9.0": False}, "2")
