# shellcheck shell=bash
# gpu-cloud node gate, driver stack install for gpuDriver.source: install, on the standard EKS AL2023 AMI.
# Sourced by gate.sh (bootstrap.sh's helpers in scope). It installs only what is missing, so a node that boots
# again reinstalls nothing. Sources: NVIDIA Driver Installation Guide (Amazon Linux 2023: module stream
# nvidia-driver:<branch>-open, package nvidia-open; NVIDIA ships no precompiled modules for AL2023, so DKMS
# builds them), awslabs/amazon-eks-ami templates/al2023/provisioners/install-nvidia-driver.sh (kernel
# packages, fabric manager and persistenced pinned to the driver version), and the AWS EFA user guide.
# containerd is not touched here: the NodeConfig in user-data makes nvidia-container-runtime its default
# runtime, and nodeadm-run starts containerd only after this gate has passed.
# shellcheck disable=SC2154 # R, BR, VER, EFA and the helpers come from bootstrap.sh and gate.sh

EFA_URL=${GPU_CLOUD_EFA_INSTALLER_URL:-https://efa-installer.amazonaws.com}

install_driver_stack() {
  : "${GPU_CLOUD_EFA_INSTALLER_VERSION:?}" "${GPU_CLOUD_EFA_INSTALLER_SHA256:?}"
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
    ((BR >= 580)) || fm=nvidia-fabric-manager # package renamed in 580
    retry dnf -y install "$fm-$dv" || fail "driver: install $fm-$dv"
    if ! systemctl enable nvidia-fabricmanager || ! systemctl --no-block start nvidia-fabricmanager; then
      fail "driver: cannot start nvidia-fabricmanager"
    fi
  fi
  ((EFA == 0)) || install_efa
}

# The full EFA installer adds libfabric (and fi_info) next to the kernel module the AMI already has.
install_efa() {
  local v=$GPU_CLOUD_EFA_INSTALLER_VERSION d
  if [[ -x $R/opt/amazon/efa/bin/fi_info ]]; then
    log "EFA software already installed"
    return 0
  fi
  d=$(mktemp -d)
  retry curl -sSf --connect-timeout 5 --max-time 300 -o "$d/efa.tar.gz" "$EFA_URL/aws-efa-installer-$v.tar.gz" ||
    fail "driver: cannot download EFA installer $v"
  [[ $(sha256sum "$d/efa.tar.gz" | cut -d' ' -f1) == "$GPU_CLOUD_EFA_INSTALLER_SHA256" ]] ||
    fail "driver: EFA installer $v sha256 mismatch"
  tar -xzf "$d/efa.tar.gz" -C "$d" || fail "driver: cannot extract EFA installer $v"
  (cd "$d/aws-efa-installer" && ./efa_installer.sh -y) || fail "driver: efa_installer.sh $v failed"
  rm -rf "$d"
}
