"""``hpo worker``'s options: what reaches ``ray start`` (``hpo.workers``)."""

from __future__ import annotations

import pytest

from hpo.workers import WorkerOptionError, ray_start_command


@pytest.mark.parametrize(("given", "address"), [
    ("10.0.0.5", "10.0.0.5:6379"),
    ("head:6380", "head:6380"),
    ("gpu-node-1.cluster.local", "gpu-node-1.cluster.local:6379"),
    ("ray_head:6379", "ray_head:6379"),  # a compose service name: Docker's DNS has them
    ("[::1]", "[::1]:6379"),
    ("[fe80::1%eth0]:7000", "[fe80::1%eth0]:7000"),
    ("h:00080", "h:80"),
])
def test_a_host_name_or_ip_address_with_a_port_is_the_gcs_address(given, address):
    assert ray_start_command(given)[2] == f"--address={address}"


@pytest.mark.parametrize("given", [
    "-x:1", "-x", "--block", "a.-b:1",  # would read as an option to what it is handed to
    "a b:1", "h\n:1", "h:1\n", "", ":1", "a..b", "h.:1", "x/y:1", "h:1:2",
    "999.1.1.1", "10.0.0.256", "010.0.0.1",  # numbers only: an IPv4 address or nothing
    "::1", "::1:6379", "[h]:1", "[::1", "[::1]x", "[::1]:",  # IPv6: in brackets
    "h:", "h:0", "h:65536", "h:x", "h:\u0661",  # an Arabic-Indic 1: int() reads it
])
def test_an_address_that_is_not_a_host_name_or_ip_address_and_port_is_refused(given):
    with pytest.raises(WorkerOptionError) as info:
        ray_start_command(given)
    assert info.value.flag == "--address"
    assert str(info.value).startswith("expected HOST or HOST:PORT, got ")


def test_the_host_refused_is_named():
    with pytest.raises(WorkerOptionError, match="'-x' is not a host name nor an IP address"):
        ray_start_command("-x:1")


@pytest.mark.parametrize(("given", "sent"), [
    ('{"a100": 8}', '{"a100": 8}'),
    ('{"a100": 8.0, "node-type/x:1": 1e3}', '{"a100": 8.0, "node-type/x:1": 1000.0}'),
    ('{"big": 100000000000000}', '{"big": 100000000000000}'),
    ("{}", "{}"),
])
def test_whole_amounts_of_custom_resources_reach_ray_start(given, sent):
    assert ray_start_command("h", resources=given)[-1] == f"--resources={sent}"


@pytest.mark.parametrize(("given", "why"), [
    ('{"a": 1e400}', "got Infinity"),  # overflows to inf: ray start got Infinity
    ('{"a": Infinity}', "got Infinity"),
    ('{"a": -Infinity}', "got -Infinity"),
    ('{"a": NaN}', "got NaN"),
    ('{"a": 0.5}', "got 0.5"),  # ray start: node resources are whole numbers
    ('{"a": 0}', "got 0"),
    ('{"a": -1}', "got -1"),
    ('{"a": 100000000000001}', "got 100000000000001"),  # ray's MAX_RESOURCE_QUANTITY
    ('{"a": 1' + "0" * 400 + "}", "a: expected a whole number from 1 to 100,000,000,000,000"),
    ('{"a": true}', "got true"),
    ('{"a": "1"}', 'got "1"'),
    ('{"a": {"b": 1}}', 'got {"b": 1}'),
    ('{"a": 1, "a": 2}', "the key 'a' is given twice"),
    ('{"": 1}', "'' is not a resource name"),
    ('{"a b": 1}', "'a b' is not a resource name"),
    ('{"\\u0000": 1}', r"'\\x00' is not a resource name"),
    ('{"Memory": 1}', "Memory is not a custom resource"),
    ("[1]", "expected a JSON object"),
    ("1", "expected a JSON object"),
    ('{"a": 1' + "0" * 5000 + "}", "not JSON: Exceeds the limit"),
    ("{a: 1}", "not JSON: Expecting property name"),
])
def test_custom_resources_ray_start_would_refuse_or_misread_are_refused(given, why):
    with pytest.raises(WorkerOptionError) as info:
        ray_start_command("h", resources=given)
    assert info.value.flag == "--resources"
    assert why in str(info.value)


@pytest.mark.parametrize(("option", "flag"), [
    (["--resources", '{"a": 1e400}'], "--resources"),
    (["--address", "-x:1"], "--address"),
])
def test_hpo_worker_exits_2_naming_the_option_and_prints_no_command(option, flag):
    from typer.testing import CliRunner

    import hpo.cli

    args = ["worker", "--address", "h:6379", *option, "--dry-run"]
    result = CliRunner().invoke(hpo.cli.app, args, env={"COLUMNS": "1000"})
    assert result.exit_code == 2
    assert f"error: {flag}: " in result.output and " start --address=" not in result.output


def test_hpo_worker_prints_the_option_s_text_as_given_not_as_markup():
    """The CLIs print errors through rich: text of the user's (``[red]``) was read as
    markup and dropped from the message (hpo, hpo serve's client commands, hpo task)."""
    from typer.testing import CliRunner

    import hpo.cli

    args = ["worker", "--address", "[red]x:1", "--dry-run"]
    result = CliRunner().invoke(hpo.cli.app, args, env={"COLUMNS": "1000"})
    assert result.exit_code == 2
    said = " ".join(result.output.split())  # the console may wrap it
    assert "got '[red]x:1': '[red]x:1' is not a host name" in said
