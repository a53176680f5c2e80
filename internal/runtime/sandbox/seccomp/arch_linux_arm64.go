package seccomp

import "github.com/opencontainers/runtime-spec/specs-go"

const (
	auditArch  = 0xc00000b7 // AUDIT_ARCH_AARCH64
	x32Bit     = 0          // no second ABI under the same audit arch
	nativeArch = specs.ArchAARCH64
)
