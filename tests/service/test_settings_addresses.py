"""The addresses among the settings: RAY_ADDRESS, HPO_DATABASE_URL, HPO_PUBLIC_URL and the
service's own URL, each refused at the start, in one line naming the variable, when no
process could use it (an operations tester's findings)."""

from __future__ import annotations

import pytest

from hpo.workers import gcs_endpoint
from service.errors import SettingsError
from service.settings import Settings

RAY_RULE = "RAY_ADDRESS must be auto, HOST:PORT or ray://HOST:PORT (e.g. 10.0.0.1:6379)"
DB_EXAMPLE = "e.g. sqlite:///hpo.db or postgresql+psycopg://USER:PASSWORD@HOST:5432/DB"
URL_EXAMPLE = "e.g. https://hpo.example.com or http://10.0.0.5:8000"


def _refusal(env: dict[str, str]) -> str:
    with pytest.raises(SettingsError) as caught:
        Settings.from_env(env)
    return str(caught.value)


@pytest.mark.parametrize("address", ["auto", "10.0.0.1:6379", "head:6379", "[::1]:6379",
                                     "ray://head:10001", "h-1.example.com:65535"])
def test_a_ray_address_is_taken_when_readyz_and_the_drivers_can_use_it(address):
    assert Settings.from_env({"RAY_ADDRESS": address}).ray_address == address
    if address != "auto":  # what /readyz probes and init_ray checks first
        assert gcs_endpoint(address) is not None


@pytest.mark.parametrize("address", ["not a ray address", "head", "head:", ":6379",
                                     "head:0", "head:65536", "head:port", "::1:6379",
                                     "http://head:6379", "ray://head", "local",
                                     "head:6379/x", "a b:6379"])
def test_a_ray_address_that_no_driver_could_join_is_refused_naming_it(address):
    assert _refusal({"RAY_ADDRESS": address}) == f"{RAY_RULE}, got {address!r}"


@pytest.mark.parametrize("url, shown", [
    ("nonsense", "nonsense"), (" ", " "),
    ("postgresql+psycopg//u:s3cret@h/db", "***@h/db"),
    # a port that is not a number (a breaker: int()'s own message, naming no variable)
    ("postgresql+psycopg://u:s3cret@host:abc/db", "postgresql+psycopg://***@host:abc/db"),
    ("postgresql+psycopg://u:s3cret@[::1/db", "postgresql+psycopg://***@[::1/db"),
])
def test_a_database_url_that_does_not_parse_is_one_line_naming_it(url, shown):
    assert _refusal({"HPO_DATABASE_URL": url}) == (
        f"HPO_DATABASE_URL is not a database URL ({DB_EXAMPLE}), got {shown!r}")


def test_a_database_of_another_kind_is_refused_without_its_password():
    assert _refusal({"HPO_DATABASE_URL": "mysql://u:s3cret@h/db"}) == (
        f"HPO_DATABASE_URL must name SQLite or PostgreSQL ({DB_EXAMPLE}), "
        f"got 'mysql://***@h/db'")


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///", "sqlite:///:memory:",
                                 "sqlite:///file:x?mode=memory&uri=true"])
def test_an_in_memory_sqlite_database_is_refused(url):
    """Every process of the service (API, dispatcher, drivers) would see its own, empty."""
    assert _refusal({"HPO_DATABASE_URL": url}) == (
        "HPO_DATABASE_URL names an in-memory SQLite database, which every process of the "
        f"service would see empty: name a file, e.g. sqlite:///hpo.db; got {url!r}")


def test_a_password_with_an_at_not_written_as_percent_40_is_refused_without_showing_it():
    url = "postgresql+psycopg://postgres:p@ss/w#rd@127.0.0.1:5432/brk_ops"
    message = _refusal({"HPO_DATABASE_URL": url})
    assert message == ("HPO_DATABASE_URL holds more than one '@': write an '@' of the user "
                       "or password as %40 (and a '%' as %25)")
    encoded = "postgresql+psycopg://postgres:p%40ss%2Fw%23rd@127.0.0.1:5432/brk_ops"
    assert Settings.from_env({"HPO_DATABASE_URL": encoded}).database_url == encoded


def test_a_database_url_in_code_is_checked_too():
    with pytest.raises(SettingsError, match="^HPO_DATABASE_URL is not a database URL"):
        Settings().replace(database_url="nonsense")


@pytest.mark.parametrize("url, expected", [
    ("https://hpo.example.com", "https://hpo.example.com"),
    ("https://hpo.example.com/", "https://hpo.example.com"),
    ("http://10.0.0.5:8011", "http://10.0.0.5:8011"),
    ("http://[::1]:8011", "http://[::1]:8011"),
])
def test_a_public_url_is_the_service_s_url(url, expected):
    assert Settings.from_env({"HPO_PUBLIC_URL": url}).url == expected


@pytest.mark.parametrize("url, problem", [
    ("localhost:8011", f"must be an http:// or https:// address with a host ({URL_EXAMPLE})"),
    ("ftp://h:8011", f"must be an http:// or https:// address with a host ({URL_EXAMPLE})"),
    ("http://", f"must be an http:// or https:// address with a host ({URL_EXAMPLE})"),
    ("http://h:port", "is not an address (Port could not be cast to integer value as 'port'; "
                      f"{URL_EXAMPLE})"),
    ("http://h:8011\r", f"holds a space or a control character ({URL_EXAMPLE})"),
    ("https://h/hpo", "must be an origin, scheme://host[:port] with no path, query or "
                      f"fragment (the service answers at its root; {URL_EXAMPLE})"),
    ("https://h/?a=1", "must be an origin, scheme://host[:port] with no path, query or "
                       f"fragment (the service answers at its root; {URL_EXAMPLE})"),
    ("https://h#top", "must be an origin, scheme://host[:port] with no path, query or "
                      f"fragment (the service answers at its root; {URL_EXAMPLE})"),
])
def test_a_public_url_that_no_browser_sends_as_origin_is_refused(url, problem):
    assert _refusal({"HPO_PUBLIC_URL": url}) == f"HPO_PUBLIC_URL {problem}, got {url!r}"


def test_a_public_url_with_a_password_is_refused_without_showing_it():
    assert _refusal({"HPO_PUBLIC_URL": "http://bob:s3cret@h"}) == (
        f"HPO_PUBLIC_URL must not hold a user or password ({URL_EXAMPLE})")


@pytest.mark.parametrize("host, url", [
    ("127.0.0.1", "http://127.0.0.1:8011"), ("hpo.example.com", "http://hpo.example.com:8011"),
    ("::1", "http://[::1]:8011"), ("fe80::1", "http://[fe80::1]:8011"),
    # every interface: this machine's address, which the dashboard takes as localhost too
    ("0.0.0.0", "http://127.0.0.1:8011"), ("::", "http://[::1]:8011"),
])
def test_the_url_of_a_host_is_one_a_browser_opens(host, url):
    settings = Settings.from_env({"HPO_HOST": host, "HPO_PORT": "8011"})
    assert settings.url == url
    assert (settings.url_warning is None) == (host not in ("0.0.0.0", "::"))


def test_listening_on_every_interface_without_a_public_url_says_to_set_it():
    settings = Settings.from_env({"HPO_HOST": "::", "HPO_PORT": "8011"})
    assert settings.url_warning == (
        "HPO_HOST=:: listens on every interface, but without HPO_PUBLIC_URL the dashboard "
        "takes logins only from http://[::1]:8011 (this machine): set HPO_PUBLIC_URL to the "
        "address people open, e.g. http://HOSTNAME:8011")
    public = Settings.from_env({"HPO_HOST": "::", "HPO_PUBLIC_URL": "http://hpo.lan:8011"})
    assert public.url_warning is None and public.url == "http://hpo.lan:8011"
