# shellcheck shell=bash
# gpu-cloud node gate, driver stack install for gpuDriver.source: install, on the standard EKS AL2023 AMI.
# Sourced by gate.sh (bootstrap.sh's helpers in scope). It installs only what is missing, so a node that boots
# again reinstalls nothing. Sources: NVIDIA Driver Installation Guide (Amazon Linux 2023: module stream
# nvidia-driver:<branch>-open, package nvidia-open; NVIDIA ships no precompiled modules for AL2023, so DKMS
# builds them), and awslabs/amazon-eks-ami@v20260724 templates/al2023/provisioners/install-nvidia-driver.sh
# (kernel packages, lines 108-112; NVLSM, libibumad, infiniband-diags and the ib_umad module, lines 230-239;
# fabric manager and persistenced pinned to the driver version, lines 255-266).
# Types the AMI runs on the proprietary module with GPU System Processor firmware off (g4dn, g5) are refused by
# decisions/config/validate.py before anything is created: this script only installs the open module.
# EFA: nothing to install. The standard AMI carries the same EFA kernel module and rdma-core as the NVIDIA AMI,
# from the AMI's own `efa_installer.sh --minimal` (install-efa.sh line 53; the CHANGELOG's efa row spans every
# AL2023 column); the gate counts the devices in sysfs on both paths.
# containerd is not touched here: the NodeConfig in user-data makes nvidia-container-runtime its default
# runtime, and nodeadm-run starts containerd only after this gate has passed.
# shellcheck disable=SC2154 # R, BR, VER and the helpers come from bootstrap.sh and gate.sh

install_driver_stack() {
  local r k=kernel fm=nvidia-fabricmanager dv
  r=$(uname -r)
  [[ $r == 6.1.* ]] || k=kernel$(cut -d. -f1,2 <<<"$r") # AL2023: kernel, kernel6.12, ...
  [[ -e $R/etc/yum.repos.d/cuda-amzn2023.repo ]] || retry dnf -y config-manager --add-repo \
    "https://developer.download.nvidia.com/compute/cuda/repos/amzn2023/$(uname -m)/cuda-amzn2023.repo" ||
    fail "driver: cannot add the NVIDIA repo"
  # A later boot: the module an earlier boot built is installed; udev may not have loaded it yet.
  if ! drv_ok && modinfo nvidia >/dev/null 2>&1; then
    modprobe nvidia || fail "driver: modprobe nvidia failed"
  fi
  if drv_ok; then
    log "driver $(drv) is on branch $BR; not reinstalling"
  else
    log "driver '$(seen)' is not $BR ${VER:-}; installing nvidia-open"
    retry dnf -y install "$k-devel-${r%.*}" "$k-modules-extra-${r%.*}" dkms || fail "driver: kernel packages"
    retry dnf -y module reset nvidia-driver || fail "driver: dnf module reset"
    retry dnf -y module enable "nvidia-driver:$BR-open" || fail "driver: no stream $BR-open"
    retry dnf -y install "nvidia-open${VER:+-$VER}" || fail "driver: install nvidia-open"
    modprobe nvidia || fail "driver: modprobe nvidia failed"
    drv_ok || fail "driver: want $BR ${VER:-}, have '$(seen)' after install"
  fi
  dv=$(drv)
  retry dnf -y install nvidia-container-toolkit "nvidia-persistenced-$dv" ||
    fail "driver: install nvidia-container-toolkit, nvidia-persistenced"
  command -v nvidia-container-runtime >/dev/null || fail "driver: no nvidia-container-runtime after install"
  systemctl enable --now nvidia-persistenced || fail "driver: cannot start nvidia-persistenced"
  if [[ $GPU_CLOUD_NVSWITCH == true ]]; then
    # Fourth-generation NVSwitch systems (p6-b200) need the NVLink subnet manager and the ib_umad module it talks
    # through before fabric manager starts; the AMI installs them on every type, and so does this on NVSwitch types.
    retry dnf -y install libibumad infiniband-diags nvlsm || fail "driver: install libibumad, infiniband-diags, nvlsm"
    { mkdir -p "$R/etc/modules-load.d" && echo ib_umad >"$R/etc/modules-load.d/ib-umad.conf"; } ||
      fail "driver: cannot write modules-load.d/ib-umad.conf"
    modprobe ib_umad || fail "driver: modprobe ib_umad failed"
    ((BR >= 580)) || fm=nvidia-fabric-manager # package renamed in 580
    retry dnf -y install "$fm-$dv" || fail "driver: install $fm-$dv"
    if ! systemctl enable nvidia-fabricmanager || ! systemctl --no-block start nvidia-fabricmanager; then
      fail "driver: cannot start nvidia-fabricmanager"
    fi
  fi
}
