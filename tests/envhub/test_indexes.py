"""The package-index roles of a package's ``network`` list (envhub/indexes.py) and the build's
setup network (envhub/build.py's setup_network)."""

import pytest

from rockroll.envhub import indexes
from rockroll.envhub.build import setup_network
from rockroll.envhub.errors import BuildError
from rockroll.sandbox import SandboxSpec, SpecError
from rockroll.sandbox.protocol.wire import SpecIn


def test_pip_config_hosts_reads_index_urls_only():
    text = ("global.index-url='https://mirror.example/simple'\n"
            "global.extra-index-url='file:///opt/simple https://extra.example/simple'\n"
            ":env:.find-links='/opt/wheels'\nglobal.cert='/etc/ssl/certs/ca.crt'\n")
    assert indexes.pip_config_hosts(text) == (["mirror.example", "extra.example"], True)
    # extra-index-url alone keeps pip's default index in the list
    assert indexes.pip_config_hosts("global.extra-index-url='http://a.example/s'\n") == (["a.example"], False)


def test_pip_hosts_without_an_index_url_has_pips_default_index(monkeypatch):
    default = indexes.pip_default_hosts()
    assert len(default) == 2 and all("." in h for h in default)  # the index's page and its files
    monkeypatch.setattr(indexes, "pip_default_hosts", lambda: ["index.example", "files.example"])
    real_run = indexes.subprocess.run
    monkeypatch.setattr(indexes.subprocess, "run", lambda cmd, **k: real_run(
        [cmd[0], "-c", "print(\"global.extra-index-url='https://extra.example/s'\")"], **k))
    assert indexes.pip_hosts() == ["index.example", "files.example", "extra.example"]


def test_reading_pips_defaults_leaves_setuptools_importable():
    """pip's internals imported in this process would break DeepSpeed's later setuptools import."""
    import sys

    indexes.pip_hosts()
    assert "distutils" not in sys.modules


def test_apt_hosts_reads_both_formats(tmp_path):
    (tmp_path / "a.list").write_text("deb http://one.example/debian bookworm main\n"
                                     "# deb http://commented.example/debian bookworm main\n")
    (tmp_path / "b.sources").write_text("Types: deb\nURIs: https://two.example/debian http://one.example/x\n"
                                        "Suites: bookworm\n")
    assert indexes.apt_hosts([str(tmp_path / "*.list"), str(tmp_path / "*.sources")]) == \
        ["one.example", "two.example"]


def test_expand_replaces_roles_in_place(monkeypatch):
    monkeypatch.setattr(indexes, "pip_hosts", lambda: ["p.example", "shared.example"])
    monkeypatch.setattr(indexes, "apt_hosts", lambda: ["shared.example", "a.example"])
    assert indexes.expand(["x.example", "@pip", "@apt"]) == \
        ("x.example", "p.example", "shared.example", "a.example")


def test_setup_network_modes(monkeypatch):
    monkeypatch.setattr(indexes, "apt_hosts", lambda: ["a.example"])
    monkeypatch.delenv("ROCKROLL_BUILD_NETWORK", raising=False)
    assert setup_network(()) == {"network": False}
    fields = setup_network(("@apt", "x.example"))
    assert fields["network"] is True and fields["egress"].hosts == ("a.example", "x.example")
    monkeypatch.setenv("ROCKROLL_BUILD_NETWORK", "host")
    assert setup_network(("@apt",)) == {"network": "host"}
    assert setup_network(()) == {"network": False}  # no list: no network, whatever the mode
    monkeypatch.setenv("ROCKROLL_BUILD_NETWORK", "open")
    with pytest.raises(BuildError, match="ROCKROLL_BUILD_NETWORK"):
        setup_network(("@apt",))


def test_host_network_is_local_only_and_never_a_service_clients():
    assert SandboxSpec(network="host").network == "host"
    for bad in (dict(network="host", backend="docker"), dict(network="yes")):
        with pytest.raises(SpecError) as e:
            SandboxSpec(**bad)
        assert e.value.field == "network"
    with pytest.raises(SpecError) as e:
        SpecIn(network="host").to_spec("local")
    assert e.value.field == "network"


def test_host_network_shares_the_creating_namespace():
    """``network="host"``: the sandbox sees the host's interfaces (and its resolver file);
    ``network=False`` sees loopback only."""
    from rockroll.sandbox import open_sandbox
    def ifaces(text: str) -> list[str]:  # /proc/net/dev: the reader's namespace's interfaces
        return sorted(line.split(":")[0].strip() for line in text.splitlines()[2:])

    with open("/proc/net/dev") as f:
        host = ifaces(f.read())
    assert host != ["lo"]
    with open_sandbox(SandboxSpec(network="host")) as sb:
        assert ifaces(sb.run("cat /proc/net/dev").stdout) == host
        with open("/etc/resolv.conf") as f:
            assert sb.run("cat /etc/resolv.conf").stdout == f.read()
    with open_sandbox(SandboxSpec()) as sb:
        assert ifaces(sb.run("cat /proc/net/dev").stdout) == ["lo"]
