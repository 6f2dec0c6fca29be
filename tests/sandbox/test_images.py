"""Debian base images: apt source parsing (pure), and a real debootstrap + docker import."""

import os
import shutil
import subprocess
import uuid

import pytest

from rockroll.sandbox.deployment.images import (ImageBuildError, apt_mirror, build_debian_rootfs, docker_image_tag,
                                     ensure_docker_image, parse_apt_sources, rootfs_cache_dir)

DEB822 = """\
Types: deb
# http://old-mirror.example/archive/debian/20250520T000000Z
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
"""

ONE_LINE = """\
# a comment
deb http://security.example/debian-security bookworm-security main
deb [arch=amd64 signed-by=/k.gpg] http://ftp.example/debian/ bookworm main contrib
deb-src http://src.example/debian bookworm main
"""


def test_deb822_picks_the_plain_suite():
    assert parse_apt_sources([DEB822], "bookworm") == "http://mirror.example/debian"


def test_one_line_skips_security_and_options():
    assert parse_apt_sources([ONE_LINE], "bookworm") == "http://ftp.example/debian"


def test_security_and_updates_only_never_win():
    updates_first = "deb http://a.example/debian bookworm-updates main\ndeb http://b.example/debian bookworm main\n"
    assert parse_apt_sources([updates_first], "bookworm") == "http://b.example/debian"


def test_falls_back_to_first_debian_when_suite_differs():
    text = "deb http://a.example/debian trixie main\ndeb http://b.example/debian sid main\n"
    assert parse_apt_sources([text], "bookworm") == "http://a.example/debian"


def test_non_debian_and_disabled_repos_are_ignored():
    third_party = (
        "Types: deb\nURIs: https://nodejs.example/node_20.x\nSuites: nodistro\nComponents: main\n\n"
        "Types: deb\nURIs: http://off.example/debian\nSuites: bookworm\nEnabled: no\n")
    assert parse_apt_sources([third_party, "deb https://vendor.example/apt cloud main\n"],
                             "bookworm") is None


def test_mixed_files_and_multiline_uris():
    stanza = "Types: deb deb-src\nURIs:\n http://x.example/debian-security\n http://y.example/debian\nSuites: bookworm\n"
    assert parse_apt_sources(["", stanza], "bookworm") == "http://y.example/debian"


def test_apt_mirror_reads_files(tmp_path):
    (tmp_path / "sources.list").write_text("# nothing here\n")
    (tmp_path / "debian.sources").write_text(DEB822)
    patterns = [str(tmp_path / "sources.list"), str(tmp_path / "*.sources")]
    assert apt_mirror("bookworm", patterns) == "http://mirror.example/debian"


def test_apt_mirror_error_names_the_files(tmp_path):
    (tmp_path / "x.list").write_text("deb https://packages.example/apt stable main\n")
    with pytest.raises(ImageBuildError, match="x.list"):
        apt_mirror("bookworm", [str(tmp_path / "*.list")])


def test_tag_is_per_package_set():
    assert docker_image_tag("bookworm", ["b", "a"]) == docker_image_tag("bookworm", ["a", "b", "a"])
    assert docker_image_tag("bookworm", ["a"]) != docker_image_tag("bookworm", ["b"])
    assert docker_image_tag("bookworm").startswith("rockroll/debian:bookworm-")
    assert len(docker_image_tag("bookworm").rsplit("-", 1)[1]) == 8


def test_rootfs_cache_lives_under_state_home():
    from rockroll.sandbox.home import state_home

    path = rootfs_cache_dir(docker_image_tag("bookworm"))
    assert path.parent == state_home() / "images" and "/" not in path.name


# ----------------------------------------------------------------- real builds
def _docker_ready() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=20).returncode == 0
    except subprocess.TimeoutExpired:
        return False


@pytest.fixture(scope="module")
def docker_engine():
    """Skip without an engine, except under CI=true, where a missing engine is a failure."""
    if _docker_ready() and shutil.which("debootstrap"):
        return
    why = "no reachable docker engine or no debootstrap (run `make services`)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true: {why}")
    pytest.skip(why)


@pytest.mark.skipif(os.geteuid() != 0, reason="debootstrap needs root")
def test_failed_build_leaves_nothing(tmp_path):
    # A closed port on loopback: debootstrap fails at once, and no traffic leaves the host.
    dest = tmp_path / "rootfs"
    with pytest.raises(ImageBuildError, match="debootstrap failed"):
        build_debian_rootfs(dest, "bookworm", mirror="http://127.0.0.1:9/debian")
    assert not dest.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rootfs.log"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ensure_docker_image_builds_imports_and_caches(docker_engine):
    cache = rootfs_cache_dir(docker_image_tag("bookworm"))
    cached_before = cache.exists()
    try:
        tag = ensure_docker_image("bookworm")  # debootstrap on first use (minutes), then cached
    finally:
        if not cached_before:  # built into the session's throwaway ROCKROLL_HOME: 130 MB of litter
            shutil.rmtree(cache, ignore_errors=True)
    assert tag == docker_image_tag("bookworm")
    labels = subprocess.run(["docker", "image", "inspect", "--format", "{{json .Config.Labels}}", tag],
                            capture_output=True, text=True, check=True).stdout
    assert '"rockroll.image":"1"' in labels
    name = f"rockroll-test-{uuid.uuid4().hex[:8]}"
    try:
        out = subprocess.run(["docker", "run", "--rm", "--network", "none", "--name", name, tag,
                              "bash", "-c", "cat /etc/debian_version; ls /var/cache/apt/archives"],
                             capture_output=True, text=True, timeout=120)
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)
    assert out.returncode == 0, out.stderr
    version, *rest = out.stdout.split()
    assert version.startswith("12.")
    assert not [f for f in rest if f.endswith(".deb")]  # the build drops downloaded packages
    assert ensure_docker_image("bookworm") == tag  # cached: inspect succeeds, nothing rebuilt


def _cli_engine():
    from rockroll.sandbox.deployment.images import _CliEngine

    return _CliEngine()


def _sdk_engine():
    import docker
    from rockroll.sandbox.deployment.images import _SdkEngine

    return _SdkEngine(docker.from_env())


@pytest.mark.parametrize("make_engine", [_cli_engine, _sdk_engine], ids=["cli", "sdk"])
def test_import_rootfs_labels_and_tags(docker_engine, tmp_path, make_engine):
    # A one-file rootfs: exercises the tar-stream import of each engine in a second.
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "marker").write_text("rockroll\n")
    engine = make_engine()
    tag = f"rockroll/test:{uuid.uuid4().hex[:8]}"
    assert not engine.has_image(tag)
    try:
        engine.import_rootfs(tmp_path, tag)
        assert engine.has_image(tag)
        labels = subprocess.run(["docker", "image", "inspect", "--format", "{{json .Config.Labels}}", tag],
                                capture_output=True, text=True, check=True).stdout
        assert '"rockroll.image":"1"' in labels
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)
