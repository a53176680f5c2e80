//go:build !linux && !darwin

package status

// ServiceUnitPaths: k3sm installs as a service on Linux and macOS only.
func ServiceUnitPaths() []string { return nil }

// StartCommand starts the installed service.
func StartCommand() string { return "k3sm server" }
