//go:build linux && !amd64 && !arm64

package seccomp

import "github.com/opencontainers/runtime-spec/specs-go"

// Only amd64 and arm64 have system call tables here; compile refuses the
// rest (errUnsupportedArch) rather than load a filter with wrong numbers.
const (
	auditArch  = 0
	x32Bit     = 0
	nativeArch = specs.Arch("")
)

var sysnums map[string]uint32
