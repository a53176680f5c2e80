package seccomp

import "github.com/opencontainers/runtime-spec/specs-go"

const (
	auditArch = 0xc000003e // AUDIT_ARCH_X86_64
	// x32Bit marks an x32-ABI system call; the x32 ABI shares amd64's
	// audit arch, so the filter tells them apart by this bit.
	x32Bit     = 0x40000000
	nativeArch = specs.ArchX86_64
)
