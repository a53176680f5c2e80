package install

// Native is this machine's service manager.
func Native() (Service, error) { return Systemd{}, nil }
