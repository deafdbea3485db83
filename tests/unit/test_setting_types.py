"""The parsers of the setting types, each value as the environment gives it."""

from __future__ import annotations

import ipaddress

import pytest

from app.core.setting_types import SettingsError, trusted_proxies


def test_trusted_proxies_are_cidrs_and_bare_addresses() -> None:
    assert trusted_proxies("TRUSTED_PROXIES", "10.0.0.0/8,192.0.2.7,, ::1") == (
        ipaddress.ip_network("10.0.0.0/8"),
        ipaddress.ip_network("192.0.2.7/32"),
        ipaddress.ip_network("::1/128"),
    )
    assert trusted_proxies("TRUSTED_PROXIES", ",") == ()


def test_a_trusted_proxy_with_host_bits_means_its_network() -> None:
    assert trusted_proxies("TRUSTED_PROXIES", "10.0.0.7/8") == (ipaddress.ip_network("10.0.0.0/8"),)


@pytest.mark.parametrize(("raw", "entry"), [("192.0.2.0/24, 10.0.0.0/33", "10.0.0.0/33"), ("proxy.internal", None)])
def test_a_bad_trusted_proxy_names_the_variable_and_the_entry(raw: str, entry: str | None) -> None:
    with pytest.raises(SettingsError, match=rf"^TRUSTED_PROXIES: '{entry or raw}' is not an IP address or CIDR"):
        trusted_proxies("TRUSTED_PROXIES", raw)
