//go:build !linux

package sandbox

// LandlockABI is 0: Landlock is Linux's (darwin's boundary is Seatbelt).
func LandlockABI() int { return 0 }

// ApplyLandlock applies nothing and reports ABI 0 off Linux.
func ApplyLandlock(l *Landlock) (abi int, err error) { return 0, nil }
