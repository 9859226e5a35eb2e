#!/usr/bin/env bash
# gpu-cloud node gate, run by cloud-final before nodeadm-run.service (After=cloud-final.service,
# awslabs/amazon-eks-ami al2023 rootfs) can start the kubelet. Pass: tag, CONTINUE. Any failure,
# even an unexpected error: mask the kubelet units, tag reason, ABANDON. Config: GPU_CLOUD_* env.
set -Eeuo pipefail
R=${GPU_CLOUD_ROOT:-} STEP=init REASON='' IID='' DONE=0 TEE=''
IMDS=${GPU_CLOUD_IMDS_ENDPOINT:-http://169.254.169.254}
RPT=$R/var/lib/gpu-cloud/verify.json
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
: "${GPU_CLOUD_ARTIFACT_URI:?}" "${GPU_CLOUD_ARTIFACT_SHA256:?}" "${GPU_CLOUD_DRIVER_BRANCH:?}"
: "${GPU_CLOUD_NVSWITCH:?}" "${GPU_CLOUD_EFA_COUNT:?}" "${GPU_CLOUD_DRIVER_VERSION=}"
: "${GPU_CLOUD_VERIFY_BUDGET_S:=60}"
BR=$GPU_CLOUD_DRIVER_BRANCH VER=$GPU_CLOUD_DRIVER_VERSION EFA=$GPU_CLOUD_EFA_COUNT
BUDGET=$GPU_CLOUD_VERIFY_BUDGET_S
[[ $BR =~ ^[0-9]+$ && (-z $VER || $VER == "$BR".*) ]] || fail "config: driver '$BR' '$VER'"
[[ $GPU_CLOUD_NVSWITCH =~ ^(true|false)$ ]] || fail "config: bad NVSWITCH"
[[ $EFA =~ ^[0-9]+$ && $BUDGET =~ ^[1-9][0-9]*$ ]] || fail "config: bad EFA count/budget"
[[ $GPU_CLOUD_ARTIFACT_URI =~ ^s3://[^/]+/.+ ]] || fail "config: bad artifact URI"
[[ $GPU_CLOUD_ARTIFACT_SHA256 =~ ^[0-9a-fA-F]{64}$ ]] || fail "config: bad artifact sha256"
log "instance $IID pool $GPU_CLOUD_POOL asg $GPU_CLOUD_ASG_NAME driver $BR ${VER:-any}"

STEP=driver
drv() { nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | sort -u; }
drv_ok() {
  local v
  v=$(drv) || return 1
  [[ -n $v && $v != *$'\n'* && ${v%%.*} == "$BR" && (-z $VER || $v == "$VER") ]]
}
install_driver() {
  # NVIDIA amzn2023 repo, pinned module stream <branch>-open, nvidia-open (NVIDIA Driver Install
  # Guide, Amazon Linux 2023; amazon-eks-ami al2023 install-nvidia-driver.sh). Idempotent.
  local r k=kernel fm=nvidia-fabricmanager
  r=$(uname -r)
  [[ $r == 6.1.* ]] || k=kernel$(cut -d. -f1,2 <<<"$r") # AL2023: kernel, kernel6.12, ...
  [[ -e $R/etc/yum.repos.d/cuda-amzn2023.repo ]] || retry dnf -y config-manager --add-repo \
    "https://developer.download.nvidia.com/compute/cuda/repos/amzn2023/$(uname -m)/cuda-amzn2023.repo" ||
    fail "driver: cannot add the NVIDIA repo"
  retry dnf -y install "$k-devel-${r%.*}" "$k-modules-extra-${r%.*}" || fail "driver: kernel packages"
  retry dnf -y module reset nvidia-driver || fail "driver: dnf module reset"
  retry dnf -y module enable "nvidia-driver:$BR-open" || fail "driver: no stream $BR-open"
  retry dnf -y install "nvidia-open${VER:+-$VER}" || fail "driver: install nvidia-open"
  if [[ $GPU_CLOUD_NVSWITCH == true ]]; then
    ((BR >= 580)) || fm=nvidia-fabric-manager # package renamed in 580
    retry dnf -y install "$fm${VER:+-$VER}" || fail "driver: install $fm"
  fi
}
if drv_ok; then
  log "driver $(drv) is on branch $BR"
else
  log "driver '$(drv | xargs)' is not $BR ${VER:-}; installing"
  install_driver
  drv_ok || fail "driver: want $BR ${VER:-}, have '$(drv | xargs)' after install"
  [[ $GPU_CLOUD_NVSWITCH == false ]] || systemctl enable --now nvidia-fabricmanager ||
    fail "driver: cannot enable nvidia-fabricmanager"
fi
DV=$(drv)

if [[ $GPU_CLOUD_NVSWITCH == true ]]; then
  STEP=fabricmanager
  retry systemctl is-active --quiet nvidia-fabricmanager || fail "fabricmanager: service not active"
  # prints "Fabric Manager version is : <x.y.z>"
  fmv=$(nv-fabricmanager --version 2>&1 | grep -Eo '[0-9]+\.[0-9]+(\.[0-9]+)?' | tail -n1) || fmv=''
  [[ $fmv == "$DV" ]] || fail "fabricmanager: version '${fmv:-unknown}' != driver $DV"
fi

STEP=persistence
systemctl is-active --quiet nvidia-persistenced || nvidia-smi -pm 1 >/dev/null ||
  fail "persistence: nvidia-smi -pm 1 failed"
pm=$(nvidia-smi --query-gpu=persistence_mode --format=csv,noheader | sort -u) || pm=''
[[ $pm == Enabled ]] || fail "persistence: mode is '${pm//$'\n'/,}'"

if [[ ${GPU_CLOUD_MIG:-false} == true ]]; then
  STEP=mig # MIG mode only; the GPU operator's MIG manager cuts the instances once the node has joined
  nvidia-smi -mig 1 >/dev/null || fail "mig: nvidia-smi -mig 1 failed"
  mm=$(nvidia-smi --query-gpu=mig.mode.current --format=csv,noheader | sort -u) || mm=''
  [[ $mm == Enabled ]] || fail "mig: mode is '${mm//$'\n'/,}' (a GPU reset may be pending)"
fi

if ((EFA > 0)); then
  STEP=efa
  PATH=$PATH:/opt/amazon/efa/bin # the EFA installer puts fi_info here
  n=$({ fi_info -p efa -t FI_EP_RDM 2>/dev/null || true; } | awk '$1=="domain:"{print $2}' | sort -u | wc -l)
  ((n == EFA)) || fail "efa: libfabric sees $n EFA devices, expected $EFA"
fi

STEP=artifact
VD=$R/opt/gpu-cloud/verify A=$R/var/lib/gpu-cloud/verifier.tar.gz
mkdir -p "${A%/*}"
retry aws --region "$GPU_CLOUD_REGION" s3 cp --only-show-errors "$GPU_CLOUD_ARTIFACT_URI" "$A" ||
  fail "artifact: download failed"
sum=$(sha256sum "$A" | cut -d' ' -f1)
[[ $sum == "${GPU_CLOUD_ARTIFACT_SHA256,,}" ]] || fail "artifact: sha256 mismatch (got $sum)"
rm -rf "$VD"
mkdir -p "$VD"
tar -xzf "$A" -C "$VD" --no-same-owner || fail "artifact: cannot extract"

STEP=verify
PROM=$R/var/lib/node_exporter/textfile_collector/gpu_cloud_verify.prom
mkdir -p "${PROM%/*}"
rm -f "$RPT"
EXPECT=$VD/expect/$ITYPE.json
[[ -s $EXPECT ]] || fail "verify: no expectation for instance type $ITYPE in the artifact"
rc=0
GPU_CLOUD_INSTANCE_ID=$IID PYTHONPATH=$VD timeout -k 10 "$((BUDGET + 60))" python3 "$VD/gpu_verify.py" \
  --expect "$EXPECT" --report "$RPT" --textfile "$PROM" --budget-s "$BUDGET" || rc=$?
case $rc in
  0) [[ $(py verdict "$RPT") == pass ]] || fail "verify: exit 0 but verdict not pass" ;;
  124 | 137) fail "verify: verifier exceeded $((BUDGET + 60))s" ;;
  *)
    why=$(py reason "$RPT" 2>/dev/null) || why=''
    ((rc == 1)) || why="verify: could not run (exit $rc)${why:+: $why}"
    fail "${why:-verify: verifier reported failure}"
    ;;
esac

STEP=gate
log "report: $(cat "$RPT")"
tag gpu-cloud:verify pass || log "tagging pass failed (continuing)"
lifecycle CONTINUE || fail "gate: CompleteLifecycleAction CONTINUE failed"
DONE=1
log "verified: CONTINUE; nodeadm may start the kubelet"
