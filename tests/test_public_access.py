"""Which ranges may reach the EKS API endpoint (decisions/network/public_access.py): reserved ranges by containment,
public ranges by width. The config (tests/test_validate.py) and the pack (tests/test_policy.py) apply the same rule."""
import ipaddress

import pytest

from decisions.network import public_access
from decisions.network.public_access import (RESERVED_RANGES, private_access_problem, public_access_problem,
                                             reserved_range, too_wide)

# IANA IPv4 Special-Purpose Address Registry (RFC 6890), entry by entry: the range, the RFC its message names, and
# whether a host inside a private network may have such an address (privateAccessCidrs accepts it).
RESERVED = [
    ("0.0.0.0/8", "RFC 791", False),
    ("10.0.0.0/8", "RFC 1918", True),
    ("100.64.0.0/10", "RFC 6598", True),
    ("127.0.0.0/8", "RFC 1122", False),
    ("169.254.0.0/16", "RFC 3927", False),
    ("172.16.0.0/12", "RFC 1918", True),
    ("192.0.2.0/24", "RFC 5737", False),
    ("192.168.0.0/16", "RFC 1918", True),
    ("198.51.100.0/24", "RFC 5737", False),
    ("203.0.113.0/24", "RFC 5737", False),
    ("224.0.0.0/4", "RFC 5771", False),
    ("240.0.0.0/4", "RFC 1112", False),
]


def test_the_table_is_the_reserved_list():
    assert [(str(r.network), r.private_network) for r in RESERVED_RANGES] == [(n, p) for n, _, p in RESERVED]


@pytest.mark.parametrize("cidr,rfc,private_network", RESERVED)
def test_each_reserved_range_is_refused_for_the_public_endpoint_whole_and_in_part(cidr, rfc, private_network):
    network = ipaddress.IPv4Network(cidr)
    first = f"{network.network_address}/24"
    last = f"{network.broadcast_address}/32"             # one address at the range's edge is inside it too
    # the whole range where it is no wider than /8 (wider ones, multicast and future use, are refused for width)
    for inside in ((cidr,) if network.prefixlen >= 8 else ()) + (first, last):
        problem = public_access_problem(inside)
        assert problem and f"inside {cidr}" in problem and rfc in problem, inside
    # privateAccessCidrs: a private network's own ranges are ordinary, the rest are nobody's
    assert (private_access_problem(last) is None) is private_network


@pytest.mark.parametrize("cidr", ["0.0.0.0/0", "0.0.0.0/1", "128.0.0.0/1", "192.0.0.0/2", "198.0.0.0/7"])
def test_ranges_wider_than_one_organisation_are_refused_as_too_wide_not_as_reserved(cidr):
    # 0.0.0.0/0 overlaps every reserved range but lies inside none: it is refused for its width, never called a
    # documentation range (the old check used overlaps)
    problem = public_access_problem(cidr)
    assert problem.startswith(f"{cidr} opens the public endpoint to ") and "wider than /8" in problem
    assert "RFC" not in problem


def test_the_message_says_how_much_of_the_internet():
    assert "the whole Internet (4,294,967,296 addresses)" in public_access_problem("0.0.0.0/0")
    assert "1/2 of the Internet (2,147,483,648 addresses)" in public_access_problem("0.0.0.0/1")
    assert "1/128 of the Internet (33,554,432 addresses)" in public_access_problem("198.0.0.0/7")


def test_the_slash_8_boundary():
    assert public_access.WIDEST_PUBLIC_PREFIX == 8
    assert public_access_problem("44.0.0.0/8") is None                 # /8: one organisation's largest block
    assert too_wide("44.0.0.0/7") and not too_wide("44.0.0.0/8")
    # a /8 that holds reserved ranges is not inside one, so only its width is judged
    assert public_access_problem("198.0.0.0/8") is None


# Public ranges, among them the neighbours just outside reserved ones (a range is judged by containment).
@pytest.mark.parametrize("cidr", ["198.18.0.7/32", "52.94.0.0/22", "198.51.99.0/24", "203.0.114.0/24",
                                  "172.32.0.0/16", "100.128.0.0/16", "169.255.0.0/16", "11.0.0.0/8"])
def test_public_egress_ranges_pass(cidr):
    assert public_access_problem(cidr) is None


def test_an_ipv6_anywhere_is_too_wide():
    assert too_wide("::/0")
