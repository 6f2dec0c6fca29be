"""rockroll.toml validation: every error names the file and the key."""

import pytest

from rockroll.envhub.errors import ManifestError
from rockroll.envhub.package import load_package

GOOD = '''name = "demo"
version = "1.2.0"
[env]
entry_point = "demo:Demo"
'''


def write(tmp_path, text, files=()):
    (tmp_path / "rockenv.toml").write_text(text)
    for f in files:
        (tmp_path / f).write_text("x")
    return tmp_path


def test_defaults(tmp_path):
    pkg = load_package(write(tmp_path, GOOD))
    assert (pkg.base, pkg.gym_id, pkg.setup, pkg.kwargs) == ("host", "rock/demo-v1", (), {})


@pytest.mark.parametrize("text, key, words", [
    (GOOD.replace('name = "demo"\n', ""), "name", "required"),
    (GOOD.replace('"1.2.0"', '"1.2"'), "version", "semantic version"),
    (GOOD.replace('"1.2.0"', "3"), "version", "must be a string"),
    ('setpu = ["x"]\n' + GOOD, "setpu", "unknown key"),
    (GOOD + 'entry = "x"\n', "env.entry", "unknown key"),
    ('base = "ubuntu:22.04"\n' + GOOD, "base", "debian:<suite>"),
    ('base = "hub:x@1#snap"\n' + GOOD, "base", "snapshot"),
    ('setup = "apt-get install x"\n' + GOOD, "setup", "list of non-empty strings"),
    ('network = "index.example"\n' + GOOD, "network", "list of non-empty strings"),
    ('network = ["pypi org"]\n' + GOOD, "network", "not a host name"),
    ('tasks = "missing.jsonl"\n' + GOOD, "tasks", "does not exist"),
    ('tasks = "../outside"\n' + GOOD, "tasks", "inside the package"),
    ('gym_id = "nope"\n' + GOOD, "gym_id", "gymnasium id"),
    (GOOD.replace('"demo:Demo"', '"demo.Demo"'), "env.entry_point", "module:Class"),
    (GOOD + "kwargs = { image = 'x' }\n", "env.kwargs.image", "set by the hub"),
    (GOOD + '[files]\n"a.txt" = "relative/dest"\n', "files.a.txt", "absolute"),
    (GOOD + '[files]\n"a.txt" = "/rockenv/x"\n', "files.a.txt", "reserved"),
    (GOOD + "[snapshots.warm]\ncommands = 'ls'\n", "snapshots.warm.commands", "list"),
    (GOOD + "[snapshots.warm]\ncmds = ['x']\n", "snapshots.warm", "only commands"),
    ("name = [", "(syntax)", None),
])
def test_errors_name_the_key_and_the_file(tmp_path, text, key, words):
    write(tmp_path, text, files=["a.txt"])
    with pytest.raises(ManifestError) as info:
        load_package(tmp_path)
    err = info.value
    assert err.key == key and err.file == str(tmp_path / "rockenv.toml")
    assert str(tmp_path / "rockenv.toml") in str(err) and key in str(err)
    if words:
        assert words in str(err)


def test_missing_file(tmp_path):
    with pytest.raises(ManifestError, match="no rockenv.toml"):
        load_package(tmp_path)


def test_network_is_an_allow_list_of_host_names(tmp_path):
    """``network`` is what setup steps may reach (the build's egress policy); none without it."""
    assert load_package(write(tmp_path, GOOD)).network == ()
    pkg = load_package(write(tmp_path, 'network = ["Index.Example", "*.packages.example"]\n' + GOOD))
    assert pkg.network == ("index.example", "*.packages.example")
