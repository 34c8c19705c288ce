//go:build tools

// The command scripts/build_controlplane.sh builds from this module.
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
