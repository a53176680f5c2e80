//go:build !darwin

package sandbox

// WrapArgv returns the command line that runs argv under s where the
// boundary is a wrapper process (darwin's Seatbelt). Elsewhere the shim
// applies s itself and argv is unchanged.
func WrapArgv(s *Spec, argv []string) []string { return argv }
