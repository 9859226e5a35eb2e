"""EFA interface layout: one EFA device per EFA network card, AWS's current layout."""
import pytest

from decisions.catalog.catalog import load_catalog
from decisions.nodes.efa import EFA_ONLY, ENA, efa_device_count, interface_layout

CATALOG = load_catalog()

EXPECTED_EFA = {"p5.48xlarge": 32, "p5e.48xlarge": 32, "p4d.24xlarge": 4, "p4de.24xlarge": 4, "p5en.48xlarge": 16,
                "p6-b200.48xlarge": 8, "g6e.48xlarge": 4, "g5.48xlarge": 1, "g6.48xlarge": 1, "g4dn.12xlarge": 1}


@pytest.mark.parametrize("name,count", sorted(EXPECTED_EFA.items()))
def test_one_efa_device_on_each_card(name, count):
    layout = interface_layout(CATALOG.instance_types[name], efa=True)
    efa = [i for i in layout if i.is_efa]
    assert len(efa) == count == efa_device_count(CATALOG.instance_types[name], efa=True)
    assert sorted(i.network_card_index for i in efa) == list(range(count))      # cards 0..count-1, one each
    assert all(i.interface_type == EFA_ONLY for i in efa)
    # card 0 carries the EFA at device 1 (device 0 is the primary); every other card at device 0
    assert all(i.device_index == (1 if i.network_card_index == 0 else 0) for i in efa)


@pytest.mark.parametrize("name", sorted(CATALOG.instance_types))
def test_exactly_one_primary_plain_ena_interface(name):
    for efa in (True, False) if CATALOG.instance_types[name].supports_efa else (False,):
        layout = interface_layout(CATALOG.instance_types[name], efa=efa)
        primaries = [i for i in layout if i.primary]
        assert len(primaries) == 1 and primaries[0].interface_type == ENA   # efa-only can never be primary
        slots = [(i.network_card_index, i.device_index) for i in layout]
        assert len(slots) == len(set(slots))                                  # no slot used twice


def test_pool_without_efa_has_only_the_primary():
    layout = interface_layout(CATALOG.instance_types["p5.48xlarge"], efa=False)
    assert [(i.network_card_index, i.device_index, i.interface_type) for i in layout] == [(0, 0, ENA)]
    assert efa_device_count(CATALOG.instance_types["p5.48xlarge"], efa=False) == 0


def test_max_bandwidth_layout_adds_ena_on_the_named_cards_only():
    p5 = CATALOG.instance_types["p5.48xlarge"]
    extra = [i for i in interface_layout(p5, efa=True, max_ip_bandwidth=True) if i.interface_type == ENA and not i.primary]
    assert [(i.network_card_index, i.device_index) for i in extra] == [(c, 1) for c in (4, 8, 12, 16, 20, 24, 28)]
    assert efa_device_count(p5, efa=True) == 32
