#!/usr/bin/env bash
# Builds Berth's reference agent image from Debian packages, without any container registry:
# mmdebstrap makes a minimal bookworm rootfs (bash, coreutils, git, python3, ca-certificates)
# and `docker import` loads it under a stable tag. Idempotent: an existing image is reused.
#
# Usage: scripts/build-agent-image.sh [TAG]       (default berth/agent:bookworm)
# Mirror: the host's own apt sources (/etc/apt/sources.list.d/debian.sources or
# /etc/apt/sources.list), so no mirror name is written here.
set -euo pipefail
tag=${1:-berth/agent:bookworm}

if docker image inspect "$tag" >/dev/null 2>&1; then
  echo "image $tag present: $(docker image inspect --format '{{.Id}}' "$tag")"
  exit 0
fi
command -v mmdebstrap >/dev/null || { echo "needs mmdebstrap (apt-get install mmdebstrap)" >&2; exit 1; }

if [ -f /etc/apt/sources.list.d/debian.sources ]; then
  mirror=/etc/apt/sources.list.d/debian.sources
elif [ -f /etc/apt/sources.list ]; then
  mirror=/etc/apt/sources.list
else
  echo "no apt sources on this host to take a Debian mirror from" >&2; exit 1
fi

echo "building $tag with mmdebstrap (bookworm, minbase) from $mirror ..."
started=$(date +%s)
mmdebstrap --variant=minbase --mode=root \
  --include=bash,coreutils,git,python3,ca-certificates,procps \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
  bookworm - "$mirror" \
  | docker import \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'ENV LANG=C.UTF-8' \
      --change 'CMD ["bash"]' \
      --change 'LABEL berth.image=agent' \
      - "$tag"
echo "built $tag in $(( $(date +%s) - started ))s: $(docker image inspect --format '{{.Id}} {{.Size}} bytes' "$tag")"
