package sandbox

// SandboxExec runs a command under an SBPL profile given as text (-p).
// It is deprecated as a man page but is what the system itself still
// ships; it applies the profile to itself, then execs the command, so
// the workload and everything it starts stay inside the profile.
const SandboxExec = "/usr/bin/sandbox-exec"

// WrapArgv returns the command line that runs argv under s's Seatbelt
// profile: `sandbox-exec -p <profile> -- argv…` (the "--" keeps a command
// starting with "-" from being read as an option). Without a profile argv
// is unchanged. The shim uses it for the container's process; the daemon
// for exec, exec probes and exec hooks, with the same Spec.
func WrapArgv(s *Spec, argv []string) []string {
	if s == nil || s.Seatbelt == "" || len(argv) == 0 {
		return argv
	}
	return append([]string{SandboxExec, "-p", s.Seatbelt, "--"}, argv...)
}
