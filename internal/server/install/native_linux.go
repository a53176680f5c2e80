package install

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Native is systemd, with the k3sm user's id: its own when it exists, else
// the first id free as both a user and a group id from 999 down (the
// system range); with its subordinate range to add when newuidmap is
// installed and the user has none.
func Native() (Service, error) { return NativeFor("") }

// NativeFor is Native for an install on dataDir: a data dir kept from an
// earlier install belongs to the id the user had then, which a new k3sm
// user gets again when it is free.
func NativeFor(dataDir string) (Service, error) {
	users, byName := readIDs("/etc/passwd")
	groups, _ := readIDs("/etc/group")
	s := Systemd{}
	if id, ok := byName[SystemUser]; ok {
		s.UID, s.UserExists = id, true
	} else if fi, err := os.Stat(dataDir); err == nil && dataDir != "" {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != 0 && !users[int(st.Uid)] && !groups[int(st.Uid)] {
			s.UID = int(st.Uid)
		}
	}
	if !s.UserExists && s.UID == 0 {
		for id := 999; id >= 100 && s.UID == 0; id-- {
			if !users[id] && !groups[id] {
				s.UID = id
			}
		}
		if s.UID == 0 {
			return nil, fmt.Errorf("no free user and group id between 100 and 999 for %s: create the user yourself (useradd --system %s) and re-run k3sm install", SystemUser, SystemUser)
		}
	}
	if _, err := exec.LookPath("newuidmap"); err == nil {
		_, ranged := readIDs("/etc/subuid")
		_, rangedG := readIDs("/etc/subgid")
		_, hasU := ranged[SystemUser]
		_, hasG := rangedG[SystemUser]
		s.AddSubIDs = !s.UserExists || !(hasU && hasG)
	}
	return s, nil
}

// readIDs reads a colon-separated file of "name:...:id:..." lines
// (/etc/passwd, /etc/group; /etc/subuid's second field is a start, used
// only for the names): the ids in use and the id of each name.
func readIDs(path string) (map[int]bool, map[string]int) {
	used, byName := map[int]bool{}, map[string]int{}
	f, err := os.Open(path)
	if err != nil {
		return used, byName
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		p := strings.Split(sc.Text(), ":")
		if len(p) < 3 {
			continue
		}
		id, err := strconv.Atoi(p[2])
		if len(p) == 3 { // /etc/subuid: name:start:count
			id, err = strconv.Atoi(p[1])
		}
		if err == nil {
			used[id] = true
			byName[p[0]] = id
		}
	}
	return used, byName
}

// CheckDataDir refuses a data dir whose cluster a server run as root
// created: the installed server runs as the unprivileged user k3sm and
// could not open it.
func CheckDataDir(dataDir string) error {
	fi, err := os.Stat(filepath.Join(dataDir, "server", "db", "state.db"))
	if err != nil {
		return nil // no cluster yet
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid == 0 {
		return fmt.Errorf("%s holds a cluster made by a server run as root; the installed server runs as the unprivileged user %s and cannot use it: pass another --data-dir, or remove this one (`k3sm uninstall --purge`, after `k3sm snapshot save` if you need its objects)", dataDir, SystemUser)
	}
	return nil
}
