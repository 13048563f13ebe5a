#!/usr/bin/env bash
# Builds the reference image variant with the pinned agent CLIs (berth/agent-clis:bookworm):
# berth/agent:bookworm plus the native binaries npm installed into agents/node_modules
# (scripts/install-agent-clis) at /opt/berth/agents/bin — opencode, claude, codex and the rg
# codex ships. No registry pull and no Dockerfile build: a container from the base image gets
# the files copied in and is committed. Rebuilt when agents/package-lock.json changes (its
# sha256 is the image's berth.agents.lock label); otherwise the image is reused.
#
# Usage: scripts/build-agent-clis-image.sh [TAG]     (default berth/agent-clis:bookworm)
set -euo pipefail
cd "$(dirname "$0")/.."
tag=${1:-berth/agent-clis:bookworm}
base=berth/agent:bookworm
lock=$(sha256sum agents/package-lock.json | cut -d' ' -f1)

if [ "$(docker image inspect --format '{{ index .Config.Labels "berth.agents.lock" }}' "$tag" 2>/dev/null)" = "$lock" ]; then
  echo "image $tag present for agents/package-lock.json $lock"
  exit 0
fi
[ -d agents/node_modules/.bin ] || scripts/install-agent-clis
scripts/build-agent-image.sh "$base" >/dev/null

case "$(uname -m)" in
  x86_64) triple=x86_64-unknown-linux-musl codex_pkg=codex-linux-x64 ;;
  aarch64) triple=aarch64-unknown-linux-musl codex_pkg=codex-linux-arm64 ;;
  *) echo "no agent CLI binaries for $(uname -m)" >&2; exit 1 ;;
esac
nm=agents/node_modules
vendor=$nm/@openai/$codex_pkg/vendor/$triple
staging=$(mktemp -d -t berth-agent-clis-XXXXXX)
cid=
cleanup() { rm -rf "$staging"; [ -z "$cid" ] || docker rm -f "$cid" >/dev/null 2>&1 || true; }
trap cleanup EXIT
bin=$staging/berth/agents/bin
mkdir -p "$bin"
# The platform binaries the npm launchers would run (no Node in the image).
cp -L "$nm/opencode-ai/bin/opencode.exe" "$bin/opencode"
cp -L "$nm/@anthropic-ai/claude-code/bin/claude.exe" "$bin/claude"
cp -L "$vendor/bin/codex" "$bin/codex"
cp -L "$vendor/codex-path/rg" "$bin/rg"
chmod 0755 "$bin"/*

started=$(date +%s)
cid=$(docker create --label berth.build=agent-clis "$base" true)
docker cp "$staging/berth" "$cid:/opt/"
docker commit \
  --change "LABEL berth.image=agent-clis berth.agents.lock=$lock" \
  --change 'ENV PATH=/opt/berth/agents/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  "$cid" "$tag" >/dev/null
echo "built $tag in $(( $(date +%s) - started ))s: $(docker image inspect --format '{{.Id}} {{.Size}} bytes' "$tag")"
