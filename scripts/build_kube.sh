#!/usr/bin/env bash
# Build the real Kubernetes control plane the Kubernetes tests and benchmark run against, from the Go
# module proxy: kube-apiserver, kube-controller-manager, kube-scheduler and kubectl from k8s.io/kubernetes,
# and etcd from go.etcd.io/etcd/server/v3. Pinned versions; the binaries land in a cache keyed by version,
# so only the first build on a machine pays (prints the path of the bin folder on its last line).
#
#   scripts/build_kube.sh            # build what is missing, print the bin folder
#   KUBE_VERSION=v1.36.3 scripts/build_kube.sh
#
# k8s.io/kubernetes is not meant to be imported: its go.mod points its ~30 staging modules (k8s.io/api,
# k8s.io/client-go, ...) at ./staging. A consumer module replaces each of them with the published module of
# the same release (v0.X.Y for v1.X.Y), read off the release's own go.mod so no list is kept by hand.
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-v1.37.2}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
CACHE="${GPUSCHED_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpusched/kube}"
BIN="$CACHE/kubernetes-$KUBE_VERSION-etcd-$ETCD_VERSION/bin"
KUBE_TOOLS=(kube-apiserver kube-controller-manager kube-scheduler kubectl)

missing=()
for tool in "${KUBE_TOOLS[@]}" etcd; do
  [ -x "$BIN/$tool" ] || missing+=("$tool")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "$BIN"
  exit 0
fi

# Go where the machine keeps it, though the caller's PATH may be a minimal one (CI runs with /usr/bin and /bin).
if ! command -v go >/dev/null; then
  for dir in /usr/local/go/bin /usr/lib/go/bin "$HOME/go/bin" "$HOME"/sdk/go*/bin; do
    if [ -x "$dir/go" ]; then PATH="$dir:$PATH"; break; fi
  done
fi
command -v go >/dev/null || { echo "build_kube: go is not installed (the Go toolchain, 1.26 or newer)" >&2; exit 1; }
mkdir -p "$BIN"
export GOFLAGS="${GOFLAGS:--buildvcs=false} -trimpath"
export CGO_ENABLED=0
started=$(date +%s)
step() { echo "build_kube: [$(( $(date +%s) - started ))s] $*" >&2; }

work="$CACHE/src-$KUBE_VERSION"
mkdir -p "$work/kube" "$work/etcd"

# 1. Kubernetes: a consumer module that requires k8s.io/kubernetes and maps every staging module.
staging_version="v0.${KUBE_VERSION#v1.}"
step "downloading k8s.io/kubernetes@$KUBE_VERSION's go.mod"
kube_mod=$(cd "$work/kube" && GOFLAGS= go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" \
  | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
go_line=$(grep -m1 '^go ' "$kube_mod")
{
  echo "module gpusched.local/kubebuild"
  echo
  echo "$go_line"
  echo
  echo "require k8s.io/kubernetes $KUBE_VERSION"
  echo
  echo "replace ("
  grep -E '^\s*k8s.io/[a-z0-9-]+ => \./staging/' "$kube_mod" \
    | awk -v v="$staging_version" '{print "\t" $1 " => " $1 " " v}'
  echo ")"
} >"$work/kube/go.mod"
cat >"$work/kube/tools.go" <<'EOF'
//go:build tools

// The binaries this module builds; the import keeps go mod tidy from dropping them.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubectl/pkg/cmd"
)
EOF
(
  cd "$work/kube"
  step "resolving Kubernetes' modules (go mod tidy)"
  go mod tidy -e >/dev/null 2>"$work/kube/tidy.log" || { cat "$work/kube/tidy.log" >&2; exit 1; }
  for tool in "${KUBE_TOOLS[@]}"; do
    [ -x "$BIN/$tool" ] && continue
    pkg="k8s.io/kubernetes/cmd/$tool"
    step "building $tool ($pkg)"
    go build -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION \
      -X k8s.io/client-go/pkg/version.gitVersion=$KUBE_VERSION" -o "$BIN/$tool.partial" "$pkg"
    mv "$BIN/$tool.partial" "$BIN/$tool"
  done
)

# 2. etcd: a one-line main around etcd's own entry point (its repository root module carries replace lines,
#    so `go install go.etcd.io/etcd/v3@...` is refused).
if [ ! -x "$BIN/etcd" ]; then
  cat >"$work/etcd/main.go" <<'EOF'
// etcd, built from go.etcd.io/etcd/server/v3's own entry point.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOF
  (
    cd "$work/etcd"
    [ -f go.mod ] || go mod init gpusched.local/etcdbuild >/dev/null 2>&1
    step "resolving go.etcd.io/etcd/server/v3@$ETCD_VERSION"
    go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >/dev/null 2>&1
    go mod tidy >/dev/null
    step "building etcd"
    go build -ldflags "-s -w" -o "$BIN/etcd.partial" .
    mv "$BIN/etcd.partial" "$BIN/etcd"
  )
fi
step "done"
echo "$BIN"
