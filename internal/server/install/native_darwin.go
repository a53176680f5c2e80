package install

import (
	"fmt"
	"os/exec"
	"os/user"
	"strconv"
	"strings"
)

// Native is launchd, with the _k3sm user's id: its own when it exists,
// else the first free id from 450 down (below 500: hidden from the login
// window, as macOS's own service users).
func Native() (Service, error) {
	if u, err := user.Lookup(ServiceUser); err == nil {
		id, _ := strconv.Atoi(u.Uid)
		return Launchd{UID: id, UserExists: true}, nil
	}
	out, err := exec.Command("dscl", ".", "-list", "/Users", "UniqueID").Output()
	if err != nil {
		return nil, fmt.Errorf("dscl . -list /Users UniqueID: %w", err)
	}
	gout, err := exec.Command("dscl", ".", "-list", "/Groups", "PrimaryGroupID").Output()
	if err != nil {
		return nil, fmt.Errorf("dscl . -list /Groups PrimaryGroupID: %w", err)
	}
	used := map[string]bool{}
	for _, l := range strings.Split(string(out)+"\n"+string(gout), "\n") {
		if f := strings.Fields(l); len(f) == 2 {
			used[f[1]] = true
		}
	}
	for id := 450; id > 300; id-- {
		if !used[strconv.Itoa(id)] {
			return Launchd{UID: id}, nil
		}
	}
	return nil, fmt.Errorf("no free user and group id between 301 and 450 for %s: create the user yourself (dscl) and re-run k3sm install", ServiceUser)
}

// CheckDataDir: launchd's server already runs as _k3sm.
func CheckDataDir(dataDir string) error { return nil }

// NativeFor is Native: the data dir does not choose the service here.
func NativeFor(dataDir string) (Service, error) { return Native() }
