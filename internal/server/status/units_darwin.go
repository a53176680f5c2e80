package status

// ServiceUnitPaths are the LaunchDaemons `k3sm install` writes.
func ServiceUnitPaths() []string {
	return []string{"/Library/LaunchDaemons/dev.k3sm.server.plist", "/Library/LaunchDaemons/dev.k3sm.netd.plist"}
}

// StartCommand starts the installed service.
func StartCommand() string {
	return "sudo launchctl bootstrap system /Library/LaunchDaemons/dev.k3sm.server.plist"
}
