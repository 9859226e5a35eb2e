"""The GPU-hour ledger (decisions/observability/gpu_hours.py): each pool's paid GPUs split into busy, allocated and
idle, unallocated, booting or gated, draining and in repair, per pool and team namespace. `promtool test rules` holds
the arithmetic on series shaped as kube-state-metrics and dcgm-exporter write them: the parts add up to what is paid,
and a GPU that two states could claim is counted once."""
import pytest

from decisions.network.zones import Reservation
from decisions.nodes.repair import REPAIR_ANNOTATION
from decisions.observability import alert_rules as ar, gpu_hours as gh, monitoring
from plan.stackfile import load_stack
from tests.conftest import STACKS
from tests.test_alert_rules import node_info, run_promtool_tests, series

STACK = "prod-us-east-1"     # train-h100: reserved p5.48xlarge (8 GPUs); infer-l40s: g6e.12xlarge (4 GPUs) x 2 slices
RESERVATION = "cr-0a1b2c3d4e5f60718"
RESERVED = 5                 # instances the reservation bills: one more than the pool's maxNodes (4)


@pytest.fixture(scope="module")
def spec():
    return load_stack(STACK)[1]


@pytest.fixture(scope="module")
def group(spec):
    return gh.ledger_group(spec.pools, spec.catalog,
                           {RESERVATION: Reservation(RESERVATION, "use1-az4", "p5.48xlarge", RESERVED)})


def pool_of(spec, name):
    [pool] = [p for p in spec.pools if p.name == name]
    return pool


# --- the series ---------------------------------------------------------------------------------------------------

H100, L40S = dict(pool="train-h100", itype="p5.48xlarge"), dict(pool="infer-l40s", itype="g6e.12xlarge")


def node(name, kind, ready=True, cordoned=False, repair_mark=None, ready_values=None):
    """A registered node of `kind` (H100 or L40S): its labels, Ready condition, cordon and repair annotation."""
    out = [node_info(node=name, **kind),
           series("kube_node_status_condition", {"node": name, "condition": "Ready", "status": "true"},
                  ready_values or f"{int(ready)}x60"),
           series("kube_node_spec_unschedulable", {"node": name}, f"{int(cordoned)}x60")]
    annotation = {"node": name}
    if repair_mark:
        annotation[monitoring.ksm_annotation(REPAIR_ANNOTATION)] = repair_mark
    return out + [series("kube_node_annotations", annotation, "1x60")]


def pod(name, namespace, on, gpus, phase="Running", resource="nvidia_com_gpu"):
    return [series("kube_pod_container_resource_requests",
                   {"namespace": namespace, "pod": name, "container": "main", "node": on, "resource": resource,
                    "unit": "integer"}, f"{gpus}x60"),
            series("kube_pod_status_phase", {"namespace": namespace, "pod": name, "phase": phase}, "1x60")]


def gpu(on, index, util, namespace=None, pod_name=None):
    """DCGM_FI_DEV_GPU_UTIL as the operator's ServiceMonitor stores it: the exporter's pod mapping renamed to
    exported_* (honorLabels false), the node copied from the target."""
    labels = {"gpu": str(index), "node": on, "namespace": "gpu-operator", "pod": "nvidia-dcgm-exporter-x"}
    if namespace:
        labels.update(exported_namespace=namespace, exported_pod=pod_name)
    return series("DCGM_FI_DEV_GPU_UTIL", labels, f"{util}x60")


def busy_gpus(on, indexes, namespace, pod_name, util=90):
    return [gpu(on, i, util, namespace, pod_name) for i in indexes]


def fleet():
    """train-h100 (paid: 5 reserved x 8 = 40 GPUs):
    h1 in service, training holds 8 GPUs, 6 busy                 -> busy 6, allocated_idle 2
    h2 in service, training holds 4 (all busy); a finished pod's
       request of 4 no longer holds anything                      -> busy 4, unallocated 4
    h3 cordoned by the repair controller, Ready, its job's GPUs
       still busy and requested                                   -> repair 8 (not busy)
    h4 registered, not Ready                                      -> booting_or_gated 8
    the reservation's fifth instance, no node                     -> booting_or_gated 8
    infer-l40s (on demand, paid: 2 registered x 4 = 8 GPUs):
    l1 in service, inference holds 3 slices (1.5 GPUs), 2 GPUs busy -> busy 1.5, unallocated 2.5
    l2 cordoned by the termination handler (no repair mark)         -> draining 4"""
    h1, h2, h3, h4, l1, l2 = (f"ip-10-64-0-{i}.ec2.internal" for i in range(1, 7))
    inputs = (node(h1, H100) + pod("train-a", "training", h1, 8) + busy_gpus(h1, range(6), "training", "train-a")
              + [gpu(h1, i, 0, "training", "train-a") for i in (6, 7)]
              + node(h2, H100) + pod("train-b", "training", h2, 4) + busy_gpus(h2, range(4), "training", "train-b")
              + pod("train-done", "training", h2, 4, phase="Succeeded") + [gpu(h2, i, 0) for i in range(4, 8)]
              + node(h3, H100, cordoned=True, repair_mark="reboot") + pod("train-c", "training", h3, 8)
              + busy_gpus(h3, range(8), "training", "train-c", util=100)
              + node(h4, H100, ready=False)
              + node(l1, L40S) + pod("triton-a", "inference", l1, 2) + pod("triton-b", "inference", l1, 1)
              + [gpu(l1, 0, 70, "inference", "triton-a"), gpu(l1, 1, 70, "inference", "triton-b"), gpu(l1, 2, 0),
                 gpu(l1, 3, 0)]
              + node(l2, L40S, cordoned=True) + busy_gpus(l2, range(4), "inference", "triton-c"))
    return inputs


EXPECTED = {"train-h100": {"busy": 6 + 4, "allocated_idle": 2, "unallocated": 4, "booting_or_gated": 8 + 8,
                           "repair": 8},
            "infer-l40s": {"busy": 1.5, "unallocated": 2.5, "draining": 4}}
PAID = {"train-h100": RESERVED * 8, "infer-l40s": 2 * 4}


def expr_test(expr, at, samples):
    return {"expr": expr, "eval_time": at,
            "exp_samples": [{"labels": labels, "value": value} for labels, value in samples]}


def ledger_test(inputs, promql):
    return {"interval": "1m", "input_series": inputs, "promql_expr_test": promql}


def parts(pools):
    return f'sum by (pool) (gpu_cloud:pool_gpus:state{{pool=~"{"|".join(pools)}"}})'


# --- the arithmetic, through promtool -----------------------------------------------------------------------------

def test_each_pools_paid_gpus_split_into_the_states_they_are_in(group, tmp_path):
    samples = [(f'{gh.POOL_STATE}{{pool="{pool}", state="{state}"}}', value)
               for pool, states in EXPECTED.items() for state, value in states.items()]
    run_promtool_tests(tmp_path, [group], [ledger_test(fleet(), [
        expr_test(f'{gh.POOL_STATE}{{pool=~"train-h100|infer-l40s"}} > 0', "30m", samples),
        expr_test(f'{gh.POOL_PAID}{{pool=~"train-h100|infer-l40s"}}', "30m", [
            ('gpu_cloud:pool_gpus:paid{pool="train-h100", capacity="reserved"}', PAID["train-h100"]),
            ('gpu_cloud:pool_gpus:paid{pool="infer-l40s", capacity="on-demand"}', PAID["infer-l40s"])]),
    ])])


def test_the_parts_add_up_to_the_paid_gpu_hours_within_one_percent(group, tmp_path):
    # h4 becomes Ready half way through the hour and its GPUs stay unallocated: about 4 GPU-hours move from booting
    # to unallocated, and the hour's parts still add up to the hour's paid GPU-hours.
    h4 = "ip-10-64-0-4.ec2.internal"
    inputs = [s for s in fleet() if f'node="{h4}"' not in s["series"]] + node(h4, H100, ready_values="0x29 1x30")
    hours = lambda record: f"sum by (pool) (avg_over_time({record}[1h]))"  # noqa: E731
    of_fleet = '{pool=~"train-h100|infer-l40s"}'
    agree = f"abs({hours(gh.POOL_STATE + of_fleet)} / {hours(gh.POOL_PAID + of_fleet)} - 1) < bool 0.01"
    run_promtool_tests(tmp_path, [group], [ledger_test(inputs, [
        expr_test(agree, "60m", [('{pool="train-h100"}', 1), ('{pool="infer-l40s"}', 1)]),
        expr_test(hours(f'{gh.POOL_STATE}{{pool="train-h100", state=~"booting_or_gated|unallocated"}}'), "60m",
                  [('{pool="train-h100"}', 16 + 4)]),
    ])])


def test_a_gpu_two_states_could_claim_is_counted_once(group, tmp_path):
    # h3 is in repair while its job's GPUs are busy and requested; l2 is cordoned by a drain and its GPUs busy; a
    # cordoned node that is also NotReady is booting or gated, not draining as well.
    h5 = "ip-10-64-0-7.ec2.internal"
    inputs = fleet() + node(h5, H100, ready=False, cordoned=True)
    run_promtool_tests(tmp_path, [group], [ledger_test(inputs, [
        expr_test(f"{parts(['train-h100', 'infer-l40s'])} - on (pool) sum by (pool) ({gh.POOL_PAID})", "30m",
                  [('{pool="train-h100"}', 0), ('{pool="infer-l40s"}', 0)]),
        expr_test(f'{gh.POOL_STATE}{{state=~"busy|repair|draining|booting_or_gated", pool=~"train-h100|infer-l40s"}}'
                  " > 0", "30m", [
                      ('gpu_cloud:pool_gpus:state{pool="train-h100", state="busy"}', 10),
                      ('gpu_cloud:pool_gpus:state{pool="train-h100", state="repair"}', 8),
                      ('gpu_cloud:pool_gpus:state{pool="train-h100", state="booting_or_gated"}', 16),
                      ('gpu_cloud:pool_gpus:state{pool="infer-l40s", state="busy"}', 1.5),
                      ('gpu_cloud:pool_gpus:state{pool="infer-l40s", state="draining"}', 4)]),
    ])])


def test_each_team_namespace_is_charged_with_the_gpus_its_pods_hold_busy_or_idle(group, tmp_path):
    # training's busy GPU on h3 is in repair, not charged; inference holds 1.5 GPUs (3 slices of 2 per GPU) and
    # DCGM shows 2 GPUs busy for it: charged at most what it holds.
    by_team = f"sum by (namespace, state) ({gh.NAMESPACE_STATE})"
    run_promtool_tests(tmp_path, [group], [ledger_test(fleet(), [expr_test(by_team, "30m", [
        ('{namespace="training", state="busy"}', 10), ('{namespace="training", state="allocated_idle"}', 2),
        ('{namespace="inference", state="busy"}', 1.5), ('{namespace="inference", state="allocated_idle"}', 0)])])])


# --- the rules' inputs ------------------------------------------------------------------------------------------

def test_paid_gpus_of_a_reserved_pool_are_the_reservations_count_not_max_nodes(group, spec):
    [paid] = [r for r in group["rules"] if r["record"] == gh.POOL_PAID and r["labels"]["pool"] == "train-h100"]
    assert pool_of(spec, "train-h100").spec.max_nodes == 4
    assert f"vector({RESERVED * 8})" in paid["expr"]
    assert gh.paid_instances(pool_of(spec, "infer-l40s"), {}) is None


@pytest.mark.parametrize("sharing, expected", [
    ({"mode": "time-slicing", "replicas": 4}, {"nvidia.com/gpu": 0.25}),
    ({"mode": "mig", "migProfiles": {"3g.40gb": 1, "2g.20gb": 2}},
     {"nvidia.com/mig-3g.40gb": 3 / 7, "nvidia.com/mig-2g.20gb": 2 / 7}),
])
def test_a_shared_gpus_units_weigh_what_they_are_of_the_gpu(spec, sharing, expected):
    from dataclasses import replace
    base = pool_of(spec, "finetune-a100-80gb-spot")
    pool = replace(base, spec=base.spec.model_copy(update={"gpu_sharing": type(base.spec.gpu_sharing)(**sharing)}))
    assert gh.gpu_share(pool, spec.catalog) == pytest.approx(expected)
    assert gh.gpu_share(base, spec.catalog) == {"nvidia.com/gpu": 1}


def test_kube_state_metrics_keeps_the_repair_controllers_annotation():
    assert REPAIR_ANNOTATION in monitoring.KUBE_STATE_NODE_ANNOTATIONS
    assert gh.REPAIR_MARKED.startswith("kube_node_annotations{annotation_gpu_cloud_io_repair!=")


@pytest.mark.parametrize("stack", STACKS)
def test_every_stack_ships_the_ledger_with_its_pools_and_reservations(stack, stack_runs):
    run = stack_runs[stack]
    [rule] = [r for r in run.of_type("kubernetes:monitoring.coreos.com/v1:PrometheusRule")]
    [ledger] = [g for g in rule.inputs["spec"]["groups"] if g["name"] == gh.GROUP]
    spec = load_stack(stack)[1]
    paid = {r["labels"]["pool"]: r["expr"] for r in ledger["rules"] if r["record"] == gh.POOL_PAID}
    assert set(paid) == {p.name for p in spec.pools}
    reservations = run.outputs.get("reservations") or {}
    for pool in spec.pools:
        rid = pool.spec.capacity_reservation_id
        if rid and isinstance(reservations.get(rid), dict):
            assert f"vector({int(reservations[rid]['instanceCount']) * pool.gpus_per_node})" in paid[pool.name]


def test_the_dashboard_reads_only_what_the_ledger_records(group):
    from decisions.observability import dashboards
    table = {name for name, source in dashboards.documented_metrics().items() if source == "gpu-hours"}
    assert table <= set(gh.records(group))
    used = {name for _, expr in dashboards.expressions(dashboards.gpu_hours()) for name in dashboards.metric_names(expr)}
    assert used == table - {gh.NAMESPACE_ALLOCATED} and gh.NAMESPACE_ALLOCATED in table
