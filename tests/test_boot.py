"""decisions/nodes/boot.py: every pool shape's worst-case boot fits inside its launch hook, cluster-autoscaler waits
longer, and a rollout waits only for what follows the gate."""
import pytest

from decisions.nodes import boot

SHAPES = [(source, nvswitch, efa, lustre) for source in ("ami", "install") for nvswitch in (False, True)
          for efa in (False, True) for lustre in (False, True)]


@pytest.mark.parametrize("source,nvswitch,efa,lustre", SHAPES)
def test_worst_case_boot_fits_inside_the_hook(source, nvswitch, efa, lustre):
    steps = boot.worst_case(source, nvswitch=nvswitch, efa=efa, lustre=lustre)
    assert sum(steps.values()) <= boot.verify_hook_timeout(source), steps


def test_slowest_shapes_and_their_margins():
    # p5 on the accelerated AMI: 240 before the gate + 300 module load + 300 fabric manager + 60 + 120 + 60
    assert sum(boot.worst_case("ami", nvswitch=True, efa=True).values()) == 1080
    # p5 installing its stack: + packages 300, DKMS 900, NVLSM and fabric manager 180, no EFA step, no module wait
    assert sum(boot.worst_case("install", nvswitch=True, efa=True).values()) == 2160
    # a pool that mounts Lustre installs its client first: 90 s more, 1170 of the AMI path's 1200
    assert sum(boot.worst_case("ami", nvswitch=True, efa=True, lustre=True).values()) == 1170


def test_each_source_waits_for_what_it_has():
    ami = boot.worst_case("ami", nvswitch=True, efa=True)
    install = boot.worst_case("install", nvswitch=True, efa=True)
    assert "kmod-load" in ami and "driver-dkms-build" not in ami and "efa-installer" not in ami
    assert "kmod-load" not in install and {"driver-dkms-build", "fabric-manager-install"} <= set(install)
    # the standard AMI's EFA software is the NVIDIA AMI's: no EFA step on either path
    assert not [step for step in (*ami, *install) if "efa" in step]
    assert "fabric-manager-start" not in boot.worst_case("ami", nvswitch=False, efa=False)
    assert "efa-installer" not in boot.worst_case("install", nvswitch=False, efa=False)


def test_fabric_manager_gets_minutes():
    assert boot.FABRIC_MANAGER_WAIT_S >= 180


@pytest.mark.parametrize("source", ["ami", "install"])
def test_hook_timeouts_are_within_what_ec2_auto_scaling_accepts(source):
    assert 30 <= boot.verify_hook_timeout(source) <= 7200     # heartbeat timeout limits of lifecycle hooks


def test_nodes_offer_their_gpus_ten_minutes_after_continue():
    # Registration 300 s, then 300 s for the device plugin: the GPU operator's validator allows it 150 s
    # (30 x 5 s) after the operands before it, which take as long again.
    assert boot.node_ready_seconds() == boot.NODE_REGISTRATION_S + boot.GPU_ADVERTISE_S == 600
    assert boot.GPU_ADVERTISE_S >= 30 * 5
    # The gate is spent before InService, so readiness after it is shorter than either hook.
    assert all(boot.node_ready_seconds() < boot.verify_hook_timeout(s) for s in boot.VERIFY_HOOK_TIMEOUT_S)
