//go:build !linux && !darwin

package doctor

import "errors"

func osName() string { return "other" }

// kernelChecks: k3sm runs on Linux and macOS only.
func kernelChecks(string, string) []Check {
	return []Check{{Name: "os", Status: Fail, Detail: "k3sm runs on Linux and macOS only", Fix: "run k3sm on Linux or macOS"}}
}

func diskUsage(string) (DiskUsage, error) {
	return DiskUsage{}, errors.New("free space is not measured on this OS")
}

func ntpSynced() (bool, bool) { return false, false }
