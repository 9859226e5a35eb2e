# shellcheck shell=bash
# gpu-cloud node gate, the checks. Shipped in the pool's verifier bundle and sourced by bootstrap.sh (user-data)
# once the bundle's SHA-256 matched; bootstrap.sh's log/fail/retry/py, STEP, R, VD, RPT, TEXTFILES, IID, ITYPE
# and POLL are in scope, and any failure here ends in its fail-closed exit handler. Returning passes the gate.
# shellcheck disable=SC2154,SC2034 # R, VD, RPT, TEXTFILES, IID, ITYPE, POLL come from bootstrap.sh, whose exit handler reads STEP

STEP=config
: "${GPU_CLOUD_DRIVER_SOURCE:?}" "${GPU_CLOUD_AMI_NAME:?}" "${GPU_CLOUD_DRIVER_BRANCH:?}" "${GPU_CLOUD_DRIVER_VERSION=}"
: "${GPU_CLOUD_NVSWITCH:?}" "${GPU_CLOUD_EFA_COUNT:?}" "${GPU_CLOUD_KMOD_WAIT_S:?}" "${GPU_CLOUD_FM_WAIT_S:?}"
: "${GPU_CLOUD_VERIFY_BUDGET_S:=60}" "${GPU_CLOUD_MIG:=false}" "${GPU_CLOUD_LUSTRE:=false}"
SRC=$GPU_CLOUD_DRIVER_SOURCE AMI=$GPU_CLOUD_AMI_NAME BR=$GPU_CLOUD_DRIVER_BRANCH VER=$GPU_CLOUD_DRIVER_VERSION
EFA=$GPU_CLOUD_EFA_COUNT BUDGET=$GPU_CLOUD_VERIFY_BUDGET_S KILL_AFTER=$((BUDGET + GPU_CLOUD_VERIFY_KILL_GRACE_S))
[[ $SRC == ami || $SRC == install ]] || fail "config: bad driver source '$SRC'"
[[ $BR =~ ^[0-9]+$ && (-z $VER || $VER == "$BR".*) ]] || fail "config: driver '$BR' '$VER'"
[[ $SRC == install || -n $VER ]] || fail "config: source ami needs the AMI's driver version"
[[ $GPU_CLOUD_NVSWITCH =~ ^(true|false)$ && $GPU_CLOUD_LUSTRE =~ ^(true|false)$ ]] || fail "config: bad NVSWITCH/LUSTRE"
[[ $EFA =~ ^[0-9]+$ && $BUDGET =~ ^[1-9][0-9]*$ ]] || fail "config: bad EFA count/budget"
[[ $GPU_CLOUD_KMOD_WAIT_S =~ ^[1-9][0-9]*$ && $GPU_CLOUD_FM_WAIT_S =~ ^[1-9][0-9]*$ ]] || fail "config: bad waits"
log "image $AMI ($SRC), driver $BR ${VER:-any}"

drv() { nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | sort -u; }
seen() { drv | tr -s '\n' ' ' | sed 's/ *$//'; } # what nvidia-smi said, on one line, for reasons
drv_ok() {
  local v
  v=$(drv) || return 1
  [[ -n $v && $v != *$'\n'* && ${v%%.*} == "$BR" && (-z $VER || $v == "$VER") ]]
}
# Wait for a unit to be active: the boot started it, or `systemctl start --no-block` did. A failed unit ends the wait.
wait_active() {
  local u=$1 end=$((SECONDS + $2)) s
  while :; do
    s=$(systemctl is-active "$u" 2>/dev/null) && return 0
    [[ $s != failed ]] || return 1
    ((SECONDS < end)) || return 1
    sleep "$POLL"
  done
}

STEP=driver
if [[ $SRC == ami ]]; then
  # The accelerated AMI keeps its driver's modules in a DKMS archive; nvidia-kmod-load.service picks and loads
  # one at boot, ordered only after network-online, so it may still be running now. `systemctl start` joins
  # that job and returns when the one-shot has finished. Never install a driver here: dnf would leave the
  # loaded module and the libraries on different versions.
  timeout "$GPU_CLOUD_KMOD_WAIT_S" systemctl start nvidia-kmod-load.service ||
    fail "driver: nvidia-kmod-load.service did not finish within ${GPU_CLOUD_KMOD_WAIT_S}s ($(systemctl is-active nvidia-kmod-load.service 2>/dev/null || true))"
  drv_ok || fail "driver: AMI $AMI carries $VER, nvidia-smi reports '$(seen)'"
else
  # shellcheck source=install.sh
  source "$VD/install.sh"
  install_driver_stack
fi
DV=$(drv)
log "driver $DV"

if [[ $GPU_CLOUD_NVSWITCH == true ]]; then
  STEP=fabricmanager # NVSwitch training takes minutes after the module loads
  wait_active nvidia-fabricmanager "$GPU_CLOUD_FM_WAIT_S" ||
    fail "fabricmanager: nvidia-fabricmanager not active after ${GPU_CLOUD_FM_WAIT_S}s ($(systemctl is-active nvidia-fabricmanager 2>/dev/null || true))"
  # prints "Fabric Manager version is : <x.y.z>"
  fmv=$(nv-fabricmanager --version 2>&1 | grep -Eo '[0-9]+\.[0-9]+(\.[0-9]+)?' | tail -n1) || fmv=''
  [[ $fmv == "$DV" ]] || fail "fabricmanager: version '${fmv:-unknown}' != driver $DV"
fi

STEP=persistence
systemctl is-active --quiet nvidia-persistenced || nvidia-smi -pm 1 >/dev/null ||
  fail "persistence: nvidia-smi -pm 1 failed"
pm=$(nvidia-smi --query-gpu=persistence_mode --format=csv,noheader | sort -u) || pm=''
[[ $pm == Enabled ]] || fail "persistence: mode is '${pm//$'\n'/,}'"

if [[ $GPU_CLOUD_MIG == true ]]; then
  STEP=mig # MIG mode only; the GPU operator's MIG manager cuts the instances once the node has joined
  nvidia-smi -mig 1 >/dev/null || fail "mig: nvidia-smi -mig 1 failed"
  mm=$(nvidia-smi --query-gpu=mig.mode.current --format=csv,noheader | sort -u) || mm=''
  [[ $mm == Enabled ]] || fail "mig: mode is '${mm//$'\n'/,}' (a GPU reset may be pending)"
fi

if ((EFA > 0)); then
  STEP=efa
  # The accelerated AMI installs EFA with `efa_installer.sh --minimal` (kernel module, rdma-core, no libfabric):
  # count the RDMA devices whose PCI driver is efa. fi_info, where a full install put it, is a cross-check.
  n=0 f=''
  for d in "$R"/sys/class/infiniband/*; do
    if [[ -e $d/device/driver && $(basename "$(readlink -f "$d/device/driver")") == efa ]]; then n=$((n + 1)); fi
  done
  ((n == EFA)) || fail "efa: sysfs has $n EFA devices, expected $EFA"
  PATH=$PATH:$R/opt/amazon/efa/bin # the full EFA installer puts fi_info here
  if command -v fi_info >/dev/null; then
    f=$({ fi_info -p efa -t FI_EP_RDM 2>/dev/null || true; } | awk '$1=="domain:"{print $2}' | sort -u | wc -l)
    ((f == n)) || fail "efa: libfabric sees $f EFA devices, sysfs $n"
  fi
  log "$n EFA devices in sysfs${f:+, $f in libfabric}"
fi

if [[ $GPU_CLOUD_LUSTRE == true ]]; then
  STEP=lustre
  # Pools whose pods mount FSx for Lustre: the FSx CSI driver mounts with the host's lustre kernel module, and the
  # AL2023 AMIs carry none (nothing under amazon-eks-ami templates/al2023 installs it). AL2023's lustre-client
  # package ships the module for the release's kernel; one built for another kernel would not load.
  if ! modinfo lustre >/dev/null 2>&1; then
    retry dnf -y install lustre-client || fail "lustre: dnf install lustre-client failed"
  fi
  modprobe lustre 2>/dev/null || fail "lustre: the lustre module does not load on kernel $(uname -r)"
  [[ -d $R/sys/module/lustre ]] || fail "lustre: modprobe succeeded but the lustre module is not loaded"
  log "lustre module loaded"
fi

STEP=verify
PROM=$TEXTFILES/gpu_cloud_verify.prom
mkdir -p "$TEXTFILES"
rm -f "$RPT"
EXPECT=$VD/expect/$ITYPE.json
[[ -s $EXPECT ]] || fail "verify: no expectation for instance type $ITYPE in the artifact"
rc=0
GPU_CLOUD_INSTANCE_ID=$IID PYTHONPATH=$VD timeout -k 10 "$KILL_AFTER" python3 "$VD/gpu_verify.py" \
  --expect "$EXPECT" --report "$RPT" --textfile "$PROM" --budget-s "$BUDGET" || rc=$?
case $rc in
  0) [[ $(py verdict "$RPT") == pass ]] || fail "verify: exit 0 but verdict not pass" ;;
  124 | 137) fail "verify: verifier exceeded ${KILL_AFTER}s" ;;
  *)
    why=$(py reason "$RPT" 2>/dev/null) || why=''
    ((rc == 1)) || why="verify: could not run (exit $rc)${why:+: $why}"
    fail "${why:-verify: verifier reported failure}"
    ;;
esac
