#!/usr/bin/env bash
# gpu-cloud node gate, user-data part. cloud-final runs it before nodeadm-run.service (After=cloud-final.service,
# awslabs/amazon-eks-ami al2023 rootfs) can start the kubelet. It fetches the pool's bundle from S3, checks
# its SHA-256 against the one baked in here, and sources the bundle's gate.sh, which holds the checks (and the
# driver install for gpuDriver.source: install). Pass: tag, CONTINUE. Any failure, even an unexpected error
# or a bundle it cannot fetch: mask the kubelet units, tag the reason, ABANDON. Config: GPU_CLOUD_* env.
set -Eeuo pipefail
R=${GPU_CLOUD_ROOT:-} STEP=init REASON='' IID='' DONE=0 TEE=''
IMDS=${GPU_CLOUD_IMDS_ENDPOINT:-http://169.254.169.254}
POLL=${GPU_CLOUD_POLL_S:-5}
RPT=$R/var/lib/gpu-cloud/verify.json VD=$R/opt/gpu-cloud/verify
export AWS_PAGER=''

log() { printf '%s gpu-cloud[%s]: %s\n' "$(date -u +%FT%TZ)" "$STEP" "$*" >&2; }
fail() { REASON=${REASON:-$*}; log "FAIL: $*"; exit 1; }
# JSON: tags K V.. | stub STEP REASON IID | verdict F | reason F
py() {
  python3 -c 'import json,sys
m,a=sys.argv[1],sys.argv[2:]
if m=="tags":print(json.dumps([{"Key":k,"Value":" ".join(v.split())[:256]} for k,v in zip(a[::2],a[1::2])]))
elif m=="stub":print(json.dumps({"verdict":"fail","instanceId":a[2],"checks":[{"name":a[0],"status":"fail","gpu":None,"value":None,"threshold":None,"detail":a[1]}]}))
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
  log "FAILED: $REASON; masking ${u[*]}" # After= alone would not stop them
  if ! systemctl ${R:+"--root=$R"} mask "${u[@]}"; then
    mkdir -p "$R/etc/systemd/system" && for s in "${u[@]}"; do ln -sf /dev/null "$R/etc/systemd/system/$s"; done
  fi
  [[ -n $R ]] || systemctl --no-block stop "${u[@]}" # cancel this boot's queued start job
  [[ $fs == verify && -s $RPT ]] || { mkdir -p "${RPT%/*}"; py stub "$fs" "$REASON" "$IID" >"$RPT"; }
  log "report: $(cat "$RPT")"
  if [[ -n $IID && -n ${GPU_CLOUD_REGION:-} && -n ${GPU_CLOUD_ASG_NAME:-} && -n ${GPU_CLOUD_LIFECYCLE_HOOK:-} ]]; then
    tag gpu-cloud:verify fail gpu-cloud:verify-reason "$REASON" || log "tagging failed"
    lifecycle ABANDON || log "ABANDON failed; the hook timeout ABANDONs"
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

STEP=imds
IID=$(retry imds instance-id) || fail "imds: instance-id unavailable"
[[ $IID =~ ^i-[0-9a-f]+$ ]] || fail "imds: bad instance-id '$IID'"
ITYPE=$(retry imds instance-type) || fail "imds: instance-type unavailable"

STEP=config
: "${GPU_CLOUD_REGION:?}" "${GPU_CLOUD_ASG_NAME:?}" "${GPU_CLOUD_LIFECYCLE_HOOK:?}" "${GPU_CLOUD_POOL:?}"
: "${GPU_CLOUD_ARTIFACT_URI:?}" "${GPU_CLOUD_ARTIFACT_SHA256:?}"
[[ $GPU_CLOUD_ARTIFACT_URI =~ ^s3://[^/]+/.+ ]] || fail "config: bad artifact URI"
[[ $GPU_CLOUD_ARTIFACT_SHA256 =~ ^[0-9a-fA-F]{64}$ ]] || fail "config: bad artifact sha256"
log "instance $IID ($ITYPE) pool $GPU_CLOUD_POOL asg $GPU_CLOUD_ASG_NAME"

STEP=artifact
A=$R/var/lib/gpu-cloud/verifier.tar
mkdir -p "${A%/*}"
retry aws --region "$GPU_CLOUD_REGION" s3 cp --only-show-errors "$GPU_CLOUD_ARTIFACT_URI" "$A" ||
  fail "artifact: download failed"
sum=$(sha256sum "$A" | cut -d' ' -f1)
[[ $sum == "${GPU_CLOUD_ARTIFACT_SHA256,,}" ]] || fail "artifact: sha256 mismatch (got $sum)"
rm -rf "$VD"
mkdir -p "$VD"
tar -xf "$A" -C "$VD" --no-same-owner || fail "artifact: cannot extract"
[[ -s $VD/gate.sh ]] || fail "artifact: no gate.sh in the bundle"

# shellcheck source=gate.sh
source "$VD/gate.sh"

STEP=gate
log "report: $(cat "$RPT")"
tag gpu-cloud:verify pass || log "tagging pass failed (continuing)"
lifecycle CONTINUE || fail "gate: CompleteLifecycleAction CONTINUE failed"
DONE=1
log "verified: CONTINUE; nodeadm may start the kubelet"
