"""Client address resolution behind (and without) trusted proxies."""

from __future__ import annotations

from app.core.setting_types import trusted_proxies
from app.webhooks.client_ip import UNKNOWN_CLIENT, client_ip

PROXIES = trusted_proxies("TRUSTED_PROXIES", "10.0.0.0/8, 2001:db8:ffff::/48")


def test_without_forwarded_for_the_peer_is_the_client() -> None:
    assert client_ip("203.0.113.9", None, PROXIES) == "203.0.113.9"
    assert client_ip("10.0.0.2", "", PROXIES) == "10.0.0.2"


def test_untrusted_peer_cannot_spoof_forwarded_for() -> None:
    assert client_ip("203.0.113.9", "198.51.100.1", PROXIES) == "203.0.113.9"
    assert client_ip("203.0.113.9", "198.51.100.1", []) == "203.0.113.9"


def test_trusted_proxy_chain_is_walked_from_the_right() -> None:
    forwarded = "6.6.6.6, 198.51.100.7, 10.1.2.3"  # client-written spoof on the left
    assert client_ip("10.0.0.2", forwarded, PROXIES) == "198.51.100.7"


def test_when_every_hop_is_trusted_the_left_most_wins() -> None:
    assert client_ip("10.0.0.2", "10.9.9.9, 10.1.2.3", PROXIES) == "10.9.9.9"


def test_ipv6_peer_and_hops() -> None:
    forwarded = "2001:db8:1::7, 2001:db8:ffff::2"
    assert client_ip("2001:db8:ffff::1", forwarded, PROXIES) == "2001:db8:1::7"
    assert client_ip("2001:DB8:1:0::7", "198.51.100.1", PROXIES) == "2001:db8:1::7"


def test_ipv4_mapped_peer_matches_ipv4_proxies() -> None:
    assert client_ip("::ffff:10.0.0.2", "198.51.100.7", PROXIES) == "198.51.100.7"


def test_ports_and_brackets_appended_by_proxies_are_tolerated() -> None:
    assert client_ip("10.0.0.2", "198.51.100.7:5123", PROXIES) == "198.51.100.7"
    assert client_ip("10.0.0.2", "[2001:db8:1::7]:443", PROXIES) == "2001:db8:1::7"


def test_malformed_entry_stops_the_walk_at_the_last_good_hop() -> None:
    assert client_ip("10.0.0.2", "198.51.100.7, garbage, 10.1.2.3", PROXIES) == "10.1.2.3"
    assert client_ip("10.0.0.2", "198.51.100.7, unknown", PROXIES) == "10.0.0.2"
    assert client_ip("10.0.0.2", "198.51.100.7, [2001:db8::1", PROXIES) == "10.0.0.2"


def test_missing_or_non_ip_peer_is_not_trusted() -> None:
    assert client_ip(None, "198.51.100.7", PROXIES) == UNKNOWN_CLIENT
    assert client_ip("testclient", "198.51.100.7", PROXIES) == "testclient"


def test_forwarded_for_lines_are_joined_in_order() -> None:
    from app.webhooks.client_ip import forwarded_for

    assert forwarded_for([]) is None
    assert forwarded_for(["1.2.3.4"]) == "1.2.3.4"
    assert forwarded_for(["1.2.3.4", "5.6.7.8, 10.0.0.1"]) == "1.2.3.4,5.6.7.8, 10.0.0.1"


def test_rate_limit_buckets_are_addresses_and_ipv6_64_networks() -> None:
    from app.webhooks.client_ip import rate_limit_key

    assert rate_limit_key("203.0.113.9") == "203.0.113.9"
    assert rate_limit_key("2001:db8:1:2:aaaa::1") == rate_limit_key("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert rate_limit_key("2001:db8:1:3::1") != rate_limit_key("2001:db8:1:2::1")
    assert rate_limit_key(UNKNOWN_CLIENT) == UNKNOWN_CLIENT
