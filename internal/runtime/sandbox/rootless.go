package sandbox

import (
	"bufio"
	"fmt"
	"io"
	"os/user"
	"strconv"
	"strings"
)

// PodIDs is the number of ids a pod's user namespace maps (0…65535), as
// the kubelet gives a pod with hostUsers: false.
const PodIDs = 1 << 16

// Rootless maps: a runtime that is not root runs each pod in a user
// namespace of its own uid, the pod's root being that uid, and ids
// 1…65535 taken from the user's subordinate range (/etc/subuid,
// /etc/subgid, written into the namespace by shadow's newuidmap and
// newgidmap, as rootless Podman and containerd do). Without a range only
// the pod's root exists.

// SubordinateRange returns the first subordinate id range of at least
// want ids that the file (the format of /etc/subuid: "name-or-id:start:count"
// lines) gives the user (by name or by numeric id), and whether one does.
func SubordinateRange(r io.Reader, name string, id int, want uint32) (start uint32, ok bool) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Split(line, ":")
		if len(f) != 3 || (f[0] != name && f[0] != strconv.Itoa(id)) {
			continue
		}
		s, err1 := strconv.ParseUint(f[1], 10, 32)
		n, err2 := strconv.ParseUint(f[2], 10, 32)
		if err1 != nil || err2 != nil || n < uint64(want) || s == 0 {
			continue
		}
		return uint32(s), true
	}
	return 0, false
}

// RootlessMaps returns the user namespace maps of a pod of a runtime that
// runs as host id self (a uid or a gid) with the subordinate range
// starting at sub (0: none): the pod's 0 is self, 1…65535 the range.
func RootlessMaps(self, sub uint32) []IDMap {
	m := []IDMap{{ContainerID: 0, HostID: self, Size: 1}}
	if sub != 0 {
		m = append(m, IDMap{ContainerID: 1, HostID: sub, Size: PodIDs - 1})
	}
	return m
}

// Covers reports whether the maps give container id id a host id.
func Covers(maps []IDMap, id uint32) bool {
	for _, m := range maps {
		if id >= m.ContainerID && id-m.ContainerID < m.Size {
			return true
		}
	}
	return false
}

// mapArgs renders maps as newuidmap's and newgidmap's arguments after the
// pid: "inside outside count" triples.
func mapArgs(maps []IDMap) []string {
	var out []string
	for _, m := range maps {
		out = append(out, strconv.FormatUint(uint64(m.ContainerID), 10), strconv.FormatUint(uint64(m.HostID), 10), strconv.FormatUint(uint64(m.Size), 10))
	}
	return out
}

// ownOnly reports whether maps map only the caller's own id (self), which
// an unprivileged process may write itself; any other map needs
// newuidmap/newgidmap.
func ownOnly(maps []IDMap, self uint32) bool {
	return len(maps) == 1 && maps[0].HostID == self && maps[0].Size == 1
}

// RangeHint is the fix for a runtime without subordinate ids, for user.
func RangeHint(user string) string {
	return fmt.Sprintf("give %s a subordinate range of 65536 ids (usermod --add-subuids 100000-165535 --add-subgids 100000-165535 %s) and install newuidmap/newgidmap (Debian: apt install uidmap)", user, user)
}

// userName is uid's account name, else the number (subordinate ranges
// are listed by either).
func userName(uid int) string {
	if u, err := user.LookupId(strconv.Itoa(uid)); err == nil {
		return u.Username
	}
	return strconv.Itoa(uid)
}
