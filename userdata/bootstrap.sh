#!/usr/bin/env bash
# gpu-cloud node gate, user-data part. It runs at every boot, before nodeadm-run.service can start the kubelet:
# - first boot: cloud-final runs it once per instance, and nodeadm-run waits for cloud-final (After=cloud-final
#   .service, awslabs/amazon-eks-ami v20260714 templates/al2023 rootfs). cloud-init writes its per-instance
#   semaphore before it runs the script (cloudinit/helpers.py FileSemaphores._acquire), and this AMI reboots on an
#   oops (kernel.panic_on_oops=1, kernel.panic=10: rootfs etc/sysctl.d/99-amazon.conf lines 2-3): a boot that dies
#   here never runs it again. So before anything else it installs and enables itself as gpu-cloud-gate.service
#   (which nodeadm-run.service requires and follows) and the kubelet drop-in that keeps the kubelet down in any boot
#   without this boot's /run/gpu-cloud/verified, both carried in this script (userdata/render.py);
# - every later boot: the same script, run by that unit, proves the node again.
# The boot mode comes from markers on disk: launch (answer the lifecycle hook) until CONTINUE has been sent, then
# reboot (in service: report the instance's health to its group). A gate that an earlier boot started and never
# finished (the instance went down in it) is a rejection; so is a rejection at an earlier boot.
# It fetches the pool's bundle from S3 (or reuses the one from the first boot), checks its SHA-256 against the
# one baked in here, and sources the bundle's gate.sh, which holds the checks (and the driver install for
# gpuDriver.source: install). Every verdict is published to S3 (gate-reports/<pool>/), where it outlives the
# instance. Pass: /run/gpu-cloud/verified, tag, CONTINUE (launch). Any failure, even an unexpected error or a bundle
# it cannot fetch: no verified file (the kubelet stays down), tag the reason, then ABANDON (launch) or report the
# instance Unhealthy to its group (reboot), which replaces it. Config: GPU_CLOUD_* env.
set -Eeuo pipefail
R=${GPU_CLOUD_ROOT:-} STEP=init REASON='' IID='' ITYPE='' DONE=0 TEE='' MODE=launch PUBLISH=1
IMDS=${GPU_CLOUD_IMDS_ENDPOINT:-http://169.254.169.254}
POLL=${GPU_CLOUD_POLL_S:-5}
RPT=$R/var/lib/gpu-cloud/verify.json VD=$R/opt/gpu-cloud/verify
TEXTFILES=$R/var/lib/node_exporter/textfile_collector
SELF=$R/opt/gpu-cloud/bin/gpu-cloud-gate HEALTH_ENV=$R/etc/gpu-cloud/health.env
# Persistent (/var/lib) and per-boot (/run, a tmpfs) state. IN_SERVICE: CONTINUE was sent, so later boots are in
# service. RUNNING: a gate is under way (an earlier boot's, found at start, never reached a verdict). REJECTED: a
# gate rejected this instance, for good. VERIFIED: this boot's gate passed; the kubelet's drop-in requires it.
ST=$R/var/lib/gpu-cloud RUN=$R/run/gpu-cloud
IN_SERVICE=$ST/in-service RUNNING=$ST/gate-running REJECTED=$ST/rejected VERIFIED=$RUN/verified
STARTED=$(date -u +%Y%m%dT%H%M%SZ)
export AWS_PAGER=''

log() { printf '%s gpu-cloud[%s]: %s\n' "$(date -u +%FT%TZ)" "$STEP" "$*" >&2; }
fail() { REASON=${REASON:-$*}; log "FAIL: $*"; exit 1; }
# JSON: tags K V.. | stub STEP REASON IID | verdict F | reason F | published F K=V.. (the report and the boot)
py() {
  python3 -c 'import json,sys
m,a=sys.argv[1],sys.argv[2:]
if m=="tags":print(json.dumps([{"Key":k,"Value":" ".join(v.split())[:256]} for k,v in zip(a[::2],a[1::2])]))
elif m=="stub":print(json.dumps({"verdict":"fail","instanceId":a[2],"checks":[{"name":a[0],"status":"fail","gpu":None,"value":None,"threshold":None,"detail":a[1],"fault":"check-error"}]}))
elif m=="published":r=json.load(open(a[0]));r["boot"]=dict(x.split("=",1) for x in a[1:]);print(json.dumps(r))
else:
 r=json.load(open(a[0]))
 if m=="verdict":print(r.get("verdict",""))
 else:print("; ".join(str(c.get("name"))+("" if c.get("gpu") is None else " gpu%s"%c["gpu"]) for c in r.get("checks") or [] if str(c.get("status")).lower() in ("fail","failed","error")))' "$@"
}
# 5 attempts, backoff 1,2,4,8 x GPU_CLOUD_RETRY_BASE_S
retry() {
  local i d=${GPU_CLOUD_RETRY_BASE_S:-1}
  for i in 1 2 3 4 5; do
    "$@" && return 0
    ((i < 5)) || break
    log "$1 ${2:-} failed ($i/5), retrying in ${d}s"
    sleep "$d"
    d=$(awk -v d="$d" 'BEGIN{print d*2}')
  done
  return 1
}
imds() { # IMDSv2 token on every call
  local t
  t=$(curl -sSf --connect-timeout 2 --max-time 5 -X PUT \
    -H 'X-aws-ec2-metadata-token-ttl-seconds: 300' "$IMDS/latest/api/token") || return 1
  curl -sSf --connect-timeout 2 --max-time 5 -H "X-aws-ec2-metadata-token: $t" "$IMDS/latest/meta-data/$1"
}
awsr() { retry aws --region "$GPU_CLOUD_REGION" "$@"; }
tag() { awsr ec2 create-tags --resources "$IID" --tags "$(py tags "$@")"; }
lifecycle() {
  awsr autoscaling complete-lifecycle-action --lifecycle-action-result "$1" --instance-id "$IID" \
    --lifecycle-hook-name "$GPU_CLOUD_LIFECYCLE_HOOK" --auto-scaling-group-name "$GPU_CLOUD_ASG_NAME"
}
# The verdict where it outlives the instance: the artifact bucket's gate-reports/<pool>/, keyed by time so a
# listing is in boot order (the repair controller counts a pool's rejections there, jobs/node_repair.py).
publish() {
  local f=$R/var/lib/gpu-cloud/published.json b=${GPU_CLOUD_ARTIFACT_URI#s3://}
  py published "$RPT" mode="$MODE" pool="$GPU_CLOUD_POOL" asg="$GPU_CLOUD_ASG_NAME" instanceType="$ITYPE" \
    ami="${GPU_CLOUD_AMI_NAME:-}" reason="$REASON" startedAt="$STARTED" >"$f" &&
    awsr s3 cp --only-show-errors --content-type application/json "$f" \
      "s3://${b%%/*}/gate-reports/$GPU_CLOUD_POOL/$STARTED-$IID-$MODE.json"
}
# First thing at every boot: the gate unit and the kubelet's drop-in (GATE_UNIT, KUBELET_DROPIN: the text of
# userdata/units/, which render.py puts into the user-data) and this script as the unit's command, enabled and on
# disk before any check can hang or panic the instance. The same files again on a later boot. `systemctl enable`
# reloads systemd, so this boot's kubelet start already has the drop-in (systemctl(1), --no-reload).
install_gate() {
  local u=$R/etc/systemd/system
  mkdir -p "$u/kubelet.service.d" "${SELF%/*}" "$ST" "$RUN"
  [[ $0 -ef $SELF ]] || install -m 0755 "$0" "$SELF"
  printf '%s' "$KUBELET_DROPIN" >"$u/kubelet.service.d/10-gpu-cloud-gate.conf"
  printf '%s' "$GATE_UNIT" >"$u/gpu-cloud-gate.service"
  systemctl ${R:+"--root=$R"} enable gpu-cloud-gate.service
  # A panic within the next seconds must not lose them (the page cache dies with the kernel).
  sync "$SELF" "${SELF%/*}" "$u/kubelet.service.d/10-gpu-cloud-gate.conf" "$u/kubelet.service.d" \
    "$u/gpu-cloud-gate.service" "$u/nodeadm-run.service.requires" "$u"
}
mark() { printf '%s\n' "$2" >"$1" && sync "$1" "${1%/*}"; } # FILE TEXT, on disk before the next step
# Pass: install the run-time checker from the bundle (its timer every minute). Idempotent: the same files again,
# the same links.
install_units() {
  local u=$R/etc/systemd/system
  mkdir -p "$u" "${HEALTH_ENV%/*}"
  install -m 0644 "$VD"/units/gpu-cloud-health.* "$u/"
  printf 'GPU_CLOUD_EXPECT=%s\nGPU_CLOUD_INSTANCE_ID=%s\nGPU_CLOUD_VERIFY_BUDGET_S=%s\nGPU_CLOUD_VERIFY_KILL_GRACE_S=%s\n' \
    "${EXPECT#"$R"}" "$IID" "$BUDGET" "$GPU_CLOUD_VERIFY_KILL_GRACE_S" >"$HEALTH_ENV"
  systemctl ${R:+"--root=$R"} enable gpu-cloud-health.timer
  [[ -n $R || $MODE == reboot ]] || systemctl --no-block start gpu-cloud-health.timer # a reboot starts it itself
}
finish() {
  if [[ -n $TEE ]]; then exec 1>&3 2>&4; wait "$TEE" 2>/dev/null || true; fi
  exit "$1"
}
on_exit() {
  local rc=$? fs=$STEP u=(nodeadm-run.service kubelet.service)
  trap - EXIT ERR
  set +e
  ((DONE)) && finish 0
  ((rc)) || rc=1
  REASON=${REASON:-"$STEP: failed (exit $rc)"} STEP=gate
  log "FAILED: $REASON; no verified file, the kubelet stays down"
  rm -f "$VERIFIED"
  # For good: a later boot of this instance refuses at once (its group is replacing it), and the rejection
  # outlives a reboot during the reporting below.
  [[ -s $REJECTED ]] || { mkdir -p "$ST" && mark "$REJECTED" "$REASON"; }
  rm -f "$RUNNING"
  [[ -n $R ]] || systemctl --no-block stop "${u[@]}" # cancel this boot's queued start job
  [[ $fs == verify && -s $RPT ]] || { mkdir -p "${RPT%/*}"; py stub "$fs" "$REASON" "$IID" >"$RPT"; }
  log "report: $(cat "$RPT")"
  if [[ -n $IID && -n ${GPU_CLOUD_REGION:-} && -n ${GPU_CLOUD_ASG_NAME:-} && -n ${GPU_CLOUD_LIFECYCLE_HOOK:-} ]]; then
    tag gpu-cloud:verify fail gpu-cloud:verify-reason "$REASON" || log "tagging failed"
    # An earlier boot's rejection was published then: once per rejection (the brake counts them).
    ((PUBLISH)) && [[ -n ${GPU_CLOUD_POOL:-} && -n ${GPU_CLOUD_ARTIFACT_URI:-} ]] && { publish || log "publishing the report failed"; }
    # Launch: ABANDON. If no lifecycle action is open (a CONTINUE that went through though its answer or the marker
    # was lost, or the hook timed out) the instance is in service or leaving: then report it Unhealthy, as a later
    # boot does; the group replaces it through its termination hook.
    if [[ $MODE == reboot ]] || ! lifecycle ABANDON; then
      [[ $MODE == reboot ]] || log "ABANDON failed; reporting the instance Unhealthy instead (in Pending:Wait the hook timeout ABANDONs)"
      awsr autoscaling set-instance-health --instance-id "$IID" --health-status Unhealthy \
        --no-should-respect-grace-period || log "set-instance-health failed; the node stays out of the cluster"
    fi
  else
    log "no instance id/config: the hook timeout ABANDONs"
  fi
  finish "$rc"
}
trap on_exit EXIT
trap 'REASON=${REASON:-"$STEP: unexpected error at line $LINENO"}' ERR
trap 'REASON=${REASON:-"$STEP: terminated by signal"}; exit 143' TERM INT HUP

mkdir -p "$R/var/log/gpu-cloud"
exec 3>&1 4>&2
if [[ -w $R/dev/console ]]; then
  exec > >(tee -a "$R/var/log/gpu-cloud/bootstrap.log" >"$R/dev/console") 2>&1
else
  exec > >(tee -a "$R/var/log/gpu-cloud/bootstrap.log" >&2) 2>&1
fi
TEE=$!

# One gate at a time in a boot (the unit and cloud-final's script could both be asked), and once: a boot that has
# passed has nothing to prove again.
mkdir -p "$RUN"
exec 9>"$RUN/gate.lock"
flock 9
if [[ -e $VERIFIED ]]; then
  log "this boot's gate has passed already"
  DONE=1
  exit 0
fi
STEP=units
install_gate
[[ ! -e $IN_SERVICE ]] || MODE=reboot
EARLIER=$(cat "$RUNNING" 2>/dev/null) || EARLIER=''
EARLIER_REJECTION=$(cat "$REJECTED" 2>/dev/null) || EARLIER_REJECTION=''
mark "$RUNNING" "$STARTED $MODE"

STEP=imds
IID=$(retry imds instance-id) || fail "imds: instance-id unavailable"
[[ $IID =~ ^i-[0-9a-f]+$ ]] || fail "imds: bad instance-id '$IID'"
ITYPE=$(retry imds instance-type) || fail "imds: instance-type unavailable"

STEP=config
# This boot's verdict only: last boot's report and textfiles would speak for a node not yet proven.
rm -f "$RPT" "$TEXTFILES/gpu_cloud_verify.prom" "$TEXTFILES/gpu_cloud_health.prom" "$R/var/lib/gpu-cloud/health.json"
: "${GPU_CLOUD_REGION:?}" "${GPU_CLOUD_ASG_NAME:?}" "${GPU_CLOUD_LIFECYCLE_HOOK:?}" "${GPU_CLOUD_POOL:?}"
: "${GPU_CLOUD_ARTIFACT_URI:?}" "${GPU_CLOUD_ARTIFACT_SHA256:?}"
[[ $GPU_CLOUD_ARTIFACT_URI =~ ^s3://[^/]+/.+ ]] || fail "config: bad artifact URI"
[[ $GPU_CLOUD_ARTIFACT_SHA256 =~ ^[0-9a-fA-F]{64}$ ]] || fail "config: bad artifact sha256"
log "instance $IID ($ITYPE) pool $GPU_CLOUD_POOL asg $GPU_CLOUD_ASG_NAME, $MODE boot"
if [[ -n $EARLIER_REJECTION ]]; then
  PUBLISH=0
  fail "gate: rejected at an earlier boot: $EARLIER_REJECTION"
fi
# The boot that started it went down before a verdict: on this AMI most likely a kernel oops (a driver on a bad GPU),
# which panics and reboots 10 s later. A fresh run could pass and start the kubelet on that hardware.
[[ -z $EARLIER ]] || fail "gate: the gate started at ${EARLIER% *} (${EARLIER#* } boot) never reached a verdict: the instance went down during it"

STEP=artifact
A=$R/var/lib/gpu-cloud/verifier.tar
mkdir -p "${A%/*}"
sum=$( [[ -s $A ]] && sha256sum "$A" | cut -d' ' -f1 ) || sum=''
if [[ $sum == "${GPU_CLOUD_ARTIFACT_SHA256,,}" ]]; then
  log "bundle from an earlier boot matches its sha256"
else
  retry aws --region "$GPU_CLOUD_REGION" s3 cp --only-show-errors "$GPU_CLOUD_ARTIFACT_URI" "$A" ||
    fail "artifact: download failed"
  sum=$(sha256sum "$A" | cut -d' ' -f1)
fi
[[ $sum == "${GPU_CLOUD_ARTIFACT_SHA256,,}" ]] || fail "artifact: sha256 mismatch (got $sum)"
rm -rf "$VD"
mkdir -p "$VD"
tar -xf "$A" -C "$VD" --no-same-owner || fail "artifact: cannot extract"
[[ -s $VD/gate.sh ]] || fail "artifact: no gate.sh in the bundle"

# shellcheck source=gate.sh
source "$VD/gate.sh"

STEP=gate
log "report: $(cat "$RPT")"
install_units
tag gpu-cloud:verify pass || log "tagging pass failed (continuing)"
publish || log "publishing the report failed (continuing)"
if [[ $MODE == launch ]]; then
  lifecycle CONTINUE || fail "gate: CompleteLifecycleAction CONTINUE failed"
  mark "$IN_SERVICE" "$STARTED"
fi
rm -f "$RUNNING" && sync "$ST"
: >"$VERIFIED"
DONE=1
log "verified ($MODE boot)$([[ $MODE == reboot ]] || echo ': CONTINUE'); nodeadm may start the kubelet"
