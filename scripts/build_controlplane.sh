#!/usr/bin/env bash
# Builds, once, the real Kubernetes control plane of the test tier tests/cluster: etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler and kubectl from k8s.io/kubernetes at the
# version pinned in tests/cluster/controlplane/kubernetes/go.mod (etcd at the version that module
# pins), and kwok (fake nodes) from tests/cluster/controlplane/kwok/go.mod. Needs Go >= the go
# lines of those go.mod files. Output: .cache/controlplane/<hash of the inputs>/, reused while the
# inputs are unchanged (a second run returns at once). First run: about 10 minutes on 2 cores
# (module downloads and compiling); a binary that does not build fails the run, naming it.
# Prints the output directory as its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
src=tests/cluster/controlplane
if ! command -v go >/dev/null 2>&1; then
  echo "build_controlplane.sh: the real-cluster tier needs a Go toolchain (go $(awk '/^go /{print $2}' $src/kubernetes/go.mod) or later) on PATH" >&2
  exit 1
fi
key=$(cat "$0" $src/kubernetes/go.mod $src/kubernetes/go.sum $src/kubernetes/tools.go \
          $src/kwok/go.mod $src/kwok/go.sum $src/kwok/tools.go | sha256sum | cut -c1-16)
out="$PWD/.cache/controlplane/$key"
if [ -f "$out/.built" ]; then echo "$out"; exit 0; fi
version=$(awk '$1 == "k8s.io/kubernetes" {print $2}' $src/kubernetes/go.mod)
echo "==> building the Kubernetes control plane $version from Go modules into $out (first run: about 10 minutes)" >&2
rm -rf "$out"; mkdir -p "$out/bin"
minor=${version#v1.}; minor=${minor%%.*}
# What `kubectl version` and /version report (Helm checks charts' kubeVersion against it); the
# Kubernetes release's own build sets the same variables.
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags="$ldflags -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done
build() {   # $1: module directory, $2: binary name, $3: package
  echo "    $2 ($3)" >&2
  if ! (cd "$1" && go build -trimpath -ldflags "$ldflags" -o "$out/bin/$2" "$3") > "$out/$2.log" 2>&1; then
    echo "build_controlplane.sh: $2 did not build from $3 (module $1):" >&2
    tail -20 "$out/$2.log" >&2
    exit 1
  fi
}
build $src/kubernetes etcd go.etcd.io/etcd/server/v3
build $src/kubernetes kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver
build $src/kubernetes kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager
build $src/kubernetes kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler
build $src/kubernetes kubectl k8s.io/kubernetes/cmd/kubectl
build $src/kwok kwok sigs.k8s.io/kwok/cmd/kwok
# kwok's own stages, those kwokctl gives a cluster by default: nodes become Ready and keep their
# heartbeat (with leases, for the node-lifecycle controller), pods Running and Ready with an IP,
# deleted pods go. Taken from the module that built kwok.
kwok_dir=$(cd $src/kwok && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)
for stage in node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease pod/fast/pod-ready pod/fast/pod-complete pod/fast/pod-delete; do
  cat "$kwok_dir/kustomize/stage/$stage.yaml"; echo "---"
done > "$out/kwok-stages.yaml"
echo "$version" > "$out/.built"
find .cache/controlplane -mindepth 1 -maxdepth 1 -not -name "$key" -exec rm -rf {} +   # older builds
echo "$out"
