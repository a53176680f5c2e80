package status

// ServiceUnitPaths are the files `k3sm install` writes for the service.
func ServiceUnitPaths() []string { return []string{"/etc/systemd/system/k3sm.service"} }

// StartCommand starts the installed service.
func StartCommand() string { return "sudo systemctl start k3sm" }
