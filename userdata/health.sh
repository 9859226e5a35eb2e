#!/usr/bin/env bash
# gpu-cloud run-time health check, run by gpu-cloud-health.service every 30 seconds on every GPU node. The gate's
# verifier in --mode runtime: the same fault table, the checks a running workload does not disturb. It writes
# gpu_cloud_node_health_* into node-exporter's textfile collector (alerts, the repair controller) and the report to
# /var/lib/gpu-cloud/health.json. A fault is not the unit's failure: exit 0 whenever the verifier gave a verdict.
# Config (/etc/gpu-cloud/health.env, written by the gate): GPU_CLOUD_EXPECT, GPU_CLOUD_INSTANCE_ID,
# GPU_CLOUD_VERIFY_BUDGET_S, GPU_CLOUD_VERIFY_KILL_GRACE_S.
set -euo pipefail
R=${GPU_CLOUD_ROOT:-}
VD=$R/opt/gpu-cloud/verify
: "${GPU_CLOUD_EXPECT:?}" "${GPU_CLOUD_INSTANCE_ID:?}" "${GPU_CLOUD_VERIFY_BUDGET_S:?}" "${GPU_CLOUD_VERIFY_KILL_GRACE_S:?}"
PROM=$R/var/lib/node_exporter/textfile_collector/gpu_cloud_health.prom
mkdir -p "${PROM%/*}" "$R/var/lib/gpu-cloud"
rc=0
PYTHONPATH=$VD timeout -k 10 $((GPU_CLOUD_VERIFY_BUDGET_S + GPU_CLOUD_VERIFY_KILL_GRACE_S)) \
  python3 "$VD/gpu_verify.py" --mode runtime --expect "$R$GPU_CLOUD_EXPECT" --report "$R/var/lib/gpu-cloud/health.json" \
  --textfile "$PROM" --budget-s "$GPU_CLOUD_VERIFY_BUDGET_S" >/dev/null || rc=$?
case $rc in
  0 | 1) exit 0 ;;
  # Killed: the textfile keeps its last timestamp, which GpuNodeHealthCheckStale watches.
  124 | 137) echo "gpu-cloud-health: verifier killed after $((GPU_CLOUD_VERIFY_BUDGET_S + GPU_CLOUD_VERIFY_KILL_GRACE_S))s" >&2 ;;
  *) echo "gpu-cloud-health: verifier could not run (exit $rc); see $R/var/lib/gpu-cloud/health.json" >&2 ;;
esac
exit "$rc"
