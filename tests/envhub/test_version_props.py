"""Properties of what a hub hands us untrusted: version strings, refs and manifests.

Version: parsing is injective (the only text that parses to a version is its canonical
form, so two published files can never name the same version), the order is a total order
that agrees with equality, and it is semver precedence (spec item 11), checked against a
reference comparator written from the spec's wording. Manifest: ``from_json`` of any bytes
either returns a manifest or raises ``ManifestError``; a manifest survives
``to_json``/``from_json`` unchanged.
"""

from __future__ import annotations

import json
from functools import cmp_to_key

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rockroll.envhub.errors import EnvNotFound, ManifestError
from rockroll.envhub.manifest import SCHEMA, EnvManifest, LayerRef
from rockroll.envhub.version import EnvRef, Version, latest_per_major, select, sort_versions

PROPS = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow])

# ---- strategies ----------------------------------------------------------------------------
numbers = st.integers(0, 10**6) | st.integers(0, 12)  # small ones collide, large ones exercise width
ALNUM = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz-"
alnum_ident = st.builds(lambda a, c, b: a + c + b, st.text(ALNUM, max_size=4),  # at least one non-digit
                        st.sampled_from(ALNUM[10:]), st.text(ALNUM, max_size=4))
ident = numbers | alnum_ident
versions = st.builds(Version, numbers, numbers, numbers, st.lists(ident, max_size=4).map(tuple))
# Text near the grammar (digits, dots, dashes, '+', letters, non-ASCII digits and letters)
# and anything at all.
TRICKY = "0123456789..--+aZx\u0661\u00b2\u0967\uff11\u0e51 \n"
near = st.text(st.sampled_from(TRICKY), max_size=16)


@st.composite
def edited_versions(draw):
    """A valid version with one character inserted, replaced or deleted."""
    text = str(draw(versions))
    i = draw(st.integers(0, len(text)))
    c = draw(st.sampled_from(TRICKY) | st.characters())
    how = draw(st.sampled_from(["insert", "replace", "delete"]))
    return text[:i] + (c if how != "delete" else "") + text[i + (how != "insert"):]


any_text = near | edited_versions() | st.text(max_size=16)


def semver_cmp(a: str, b: str) -> int:
    """Semver 2.0.0 precedence, item 11, read off the spec (not off ``Version._key``)."""
    def split(v: str):
        core, _, pre = v.partition("-")
        return [int(x) for x in core.split(".")], pre.split(".") if pre else []

    (ca, pa), (cb, pb) = split(a), split(b)
    if ca != cb:  # 11.2: major, minor, patch compared numerically
        return -1 if ca < cb else 1
    if not pa or not pb:  # 11.3: a pre-release has lower precedence than the normal version
        return (len(pb) > 0) - (len(pa) > 0)
    for x, y in zip(pa, pb):  # 11.4: identifier by identifier
        if x == y:
            continue
        if x.isdigit() and y.isdigit():
            return -1 if int(x) < int(y) else 1
        if x.isdigit() != y.isdigit():  # numeric identifiers rank below alphanumeric ones
            return -1 if x.isdigit() else 1
        return -1 if x < y else 1  # ASCII order
    return (len(pa) > len(pb)) - (len(pa) < len(pb))  # a longer list of equal prefix ranks higher


# ---- Version -------------------------------------------------------------------------------
@PROPS
@given(versions)
def test_str_parse_round_trip(v):
    assert Version.parse(str(v)) == v
    assert str(Version.parse(str(v))) == str(v)


@PROPS
@given(any_text)
def test_parse_accepts_only_canonical_text(text):
    """Anything parses to a version whose str is that very text, or raises ValueError: so
    two different files in a hub folder never resolve to one version."""
    try:
        v = Version.parse(text)
    except ValueError:
        return
    assert str(v) == text


@PROPS
@given(st.text(st.characters(), max_size=24).map(lambda s: "1.0.0" + s))
def test_build_metadata_and_junk_after_a_version_are_refused(suffix_text):
    tail = suffix_text[len("1.0.0"):]
    if tail and not tail.startswith("-"):
        with pytest.raises(ValueError):
            Version.parse(suffix_text)


@PROPS
@given(versions, versions, versions)
def test_total_order_consistent_with_equality(a, b, c):
    assert [a < b, a == b, b < a].count(True) == 1  # trichotomy
    assert (a == b) == (str(a) == str(b))
    assert (a <= b) == (a < b or a == b) and (a >= b) == (b <= a)
    if a <= b and b <= c:
        assert a <= c  # transitivity
    if a == b:
        assert hash(a) == hash(b)


same_core_pairs = st.tuples(versions, versions).map(
    lambda ab: (ab[0], Version(ab[0].major, ab[0].minor, ab[0].patch, ab[1].pre)))


@PROPS
@given(st.tuples(versions, versions) | same_core_pairs)
def test_order_is_semver_precedence(ab):
    a, b = ab
    want = semver_cmp(str(a), str(b))
    assert (a < b, a == b, a > b) == (want < 0, want == 0, want > 0)


@PROPS
@given(versions, st.lists(ident, min_size=1, max_size=3).map(tuple))
def test_prereleases_sort_below_their_release_and_above_the_previous_core(v, pre):
    release = Version(v.major, v.minor, v.patch)
    candidate = Version(v.major, v.minor, v.patch, pre)
    assert candidate < release and candidate.prerelease and not release.prerelease
    assert Version(v.major, v.minor, v.patch - 1) < candidate if v.patch else True
    assert candidate < Version(v.major, v.minor, v.patch + 1, (0,))


@PROPS
@given(st.lists(versions.map(str) | any_text, max_size=12), st.randoms(use_true_random=False))
def test_sort_versions_orders_and_drops_only_the_unparseable(texts, rnd):
    out = sort_versions(texts)
    shuffled = list(texts)
    rnd.shuffle(shuffled)
    assert out == sort_versions(shuffled)  # equal versions are equal texts: order is unique
    assert all(Version.parse(a) <= Version.parse(b) for a, b in zip(out, out[1:]))
    parseable = []
    for t in texts:
        try:
            Version.parse(t)
            parseable.append(t)
        except ValueError:
            pass
    assert sorted(out) == sorted(parseable)
    assert out == sorted(parseable, key=cmp_to_key(semver_cmp))


# ---- resolution ----------------------------------------------------------------------------
hub_versions = st.dictionaries(versions.map(str), st.booleans(), max_size=8)
specs = (st.sampled_from(["latest"]) | st.integers(0, 12).map(str)
         | st.tuples(st.integers(0, 12), st.integers(0, 12)).map(lambda t: f"{t[0]}.{t[1]}")
         | versions.map(str))


@PROPS
@given(hub_versions, specs)
def test_select_matches_a_brute_force_model(published, spec):
    exact = spec.count(".") >= 2
    if exact:  # exact pin: that version (yanked or pre-release alike), or nothing
        want = Version.parse(spec)
        hits = [t for t in published if Version.parse(t) == want]
    else:
        prefix = () if spec == "latest" else tuple(int(x) for x in spec.split("."))
        ok = [t for t, yanked in published.items() if not yanked and not Version.parse(t).prerelease
              and (Version.parse(t).major, Version.parse(t).minor)[:len(prefix)] == prefix]
        hits = sorted(ok, key=Version.parse)[-1:]
    if not hits:
        with pytest.raises(EnvNotFound):
            select(published, spec)
        return
    assert select(published, spec) == (hits[-1], published[hits[-1]] if exact else False)


@PROPS
@given(hub_versions)
def test_latest_per_major_is_the_latest_release_of_each_major(published):
    out = latest_per_major(published)
    for major, text in out.items():
        assert select(published, str(major)) == (text, False)
    releases = {Version.parse(t).major for t, y in published.items() if not y and not Version.parse(t).prerelease}
    assert set(out) == releases


@PROPS
@given(any_text | st.builds(lambda n, s, h: f"{n}@{s}#{h}", any_text, any_text, any_text))
def test_env_ref_parse_raises_only_env_not_found_and_round_trips(text):
    try:
        ref = EnvRef.parse(text)
    except EnvNotFound:
        return
    again = EnvRef.parse(str(ref))
    assert again == ref
    if ref.spec != "latest":
        # the spec is a version or a prefix of one, in canonical (ASCII) digits
        if ref.exact:
            assert str(Version.parse(ref.spec)) == ref.spec
        else:
            assert ".".join(str(int(p)) for p in ref.spec.split(".")) == ref.spec


# ---- manifest ------------------------------------------------------------------------------
digests = st.text("0123456789abcdef", min_size=64, max_size=64).map(lambda h: "sha256:" + h)
layer_refs = st.builds(LayerRef, digests, st.integers(0, 2**53))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
short = st.text(max_size=12)
manifests = st.builds(
    EnvManifest,
    name=short, version=versions.map(str), description=short, license=short, base=short,
    system=st.sampled_from(["host", "rootfs"]),
    layers=st.lists(layer_refs, max_size=3).map(tuple),
    entry_point=short,
    kwargs=st.dictionaries(st.text(max_size=6), json_values, max_size=3),
    gym_id=short, tasks=st.none() | short, python=st.none() | short,
    snapshots=st.dictionaries(short, st.lists(layer_refs, max_size=2).map(tuple), max_size=2),
    source_digest=short,
    private=st.none() | layer_refs,
)


@PROPS
@given(manifests)
def test_manifest_json_round_trip(m):
    raw = m.to_json()
    back = EnvManifest.from_json(raw, "m.json")
    assert back == m
    assert back.to_json() == raw  # canonical: same manifest, same bytes


def _mutations(m: EnvManifest):
    """A valid manifest's JSON with one field replaced by arbitrary JSON, one key dropped or
    one key added: what a hostile or broken hub could serve."""
    base = json.loads(m.to_json())
    keys = sorted(base)
    return st.one_of(
        st.tuples(st.sampled_from(keys), json_values).map(lambda kv: {**base, kv[0]: kv[1]}),
        st.sampled_from(keys).map(lambda k: {x: v for x, v in base.items() if x != k}),
        st.tuples(st.text(max_size=6), json_values).map(lambda kv: {**base, kv[0]: kv[1]}),
        st.tuples(st.sampled_from(["layers", "snapshots", "private"]), json_values).map(
            lambda kv: {**base, kv[0]: [kv[1]] if kv[0] == "layers" else kv[1]}),
    )


@PROPS
@given(manifests.flatmap(_mutations))
def test_manifest_from_hostile_json_is_a_manifest_or_a_manifest_error(data):
    raw = json.dumps(data).encode()
    try:
        m = EnvManifest.from_json(raw, "hub/m.json")
    except ManifestError as e:
        assert e.file == "hub/m.json" and e.key
        return
    # accepted: every blob it names is a well-formed digest with a size (what pull trusts)
    assert m.system in ("host", "rootfs") and data["schema"] == SCHEMA
    for layer in m.blobs():
        assert layer.digest.startswith("sha256:") and len(layer.digest) == 71
        assert type(layer.size) is int and layer.size >= 0


MINIMAL = EnvManifest("env", "1.0.0", "", "", "host", "host", (), "pkg:Env")


@PROPS
@given(st.sampled_from(["host", "rootfs", "Host", "", "docker"]) | json_values)
def test_manifest_system_is_host_or_rootfs(system):
    data = {**json.loads(MINIMAL.to_json()), "system": system}
    try:
        m = EnvManifest.from_json(json.dumps(data).encode(), "hub/m.json")
    except ManifestError as e:
        assert system not in ("host", "rootfs") and e.key == "system"
    else:
        assert system in ("host", "rootfs") and m.system == system


@PROPS
@given(st.sampled_from(["layers", "snapshots", "private"]), digests | short | json_values,
       st.sampled_from([0, 7, -1, True, False, 1.0, "1", None]) | json_values)
def test_manifest_accepts_a_layer_entry_iff_well_formed(where, digest, size):
    entry = {"digest": digest, "size": size}
    data = json.loads(MINIMAL.to_json())
    data[where] = {"warm": [entry]} if where == "snapshots" else entry if where == "private" else [entry]
    well_formed = (isinstance(digest, str) and digest.startswith("sha256:") and len(digest) == 71
                   and all(c in "0123456789abcdef" for c in digest[7:]) and type(size) is int and size >= 0)
    try:
        back = EnvManifest.from_json(json.dumps(data).encode(), "hub/m.json")
    except ManifestError as e:
        assert not well_formed and e.key.startswith(where)
        return
    assert well_formed
    got = {"layers": back.layers, "snapshots": back.snapshots.get("warm"), "private": (back.private,)}[where]
    assert got == (LayerRef(digest, size),) and type(got[0].size) is int


@PROPS
@given(st.binary(max_size=64) | st.text(max_size=64).map(str.encode)
       | st.builds(lambda n, o: (o * n).encode(), st.integers(1, 100_000),
                   st.sampled_from(["[", "{\"a\":", "[{\"b\":"])))
def test_manifest_from_arbitrary_bytes_is_a_manifest_error(raw):
    with pytest.raises(ManifestError):
        EnvManifest.from_json(raw, "hub/m.json")
