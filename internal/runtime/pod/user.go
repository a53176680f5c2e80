package pod

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"

	securejoin "github.com/cyphar/filepath-securejoin"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/runtime/image"
)

// identity is who a container's process is inside its user namespace.
type identity struct {
	UID, GID uint32
	Groups   []uint32
	Home     string
}

// containerIdentity resolves the container's user as the kubelet and
// containerd do: securityContext.runAsUser/runAsGroup over the image's
// User ("uid", "uid:gid", "name", "name:group", names looked up in the
// image's /etc/passwd and /etc/group), the user's groups from /etc/group,
// supplementalGroups and fsGroup added; runAsNonRoot checked (a user the
// image names is looked up, so unlike the kubelet a named non-root user
// passes).
func containerIdentity(pod *runtimev1.PodSpec, c *runtimev1.ContainerSpec, img *image.Image) (identity, error) {
	sc := c.GetSecurityContext()
	rootfs := ""
	imgUser := ""
	if img != nil {
		rootfs, imgUser = img.RootFS, img.Config.User
	}
	passwd := readColonFile(rootfs, "/etc/passwd")
	groups := readColonFile(rootfs, "/etc/group")
	id := identity{Home: "/"}
	userPart, groupPart, _ := strings.Cut(imgUser, ":")
	name := ""
	uidSet, gidSet := false, false
	if sc != nil && sc.RunAsUser != nil {
		id.UID, uidSet = uint32(sc.GetRunAsUser()), true
	} else if userPart != "" {
		if n, err := strconv.ParseUint(userPart, 10, 32); err == nil {
			id.UID, uidSet = uint32(n), true
		} else {
			name = userPart
			for _, e := range passwd {
				if len(e) >= 4 && e[0] == userPart {
					n, _ := strconv.ParseUint(e[2], 10, 32)
					id.UID, uidSet = uint32(n), true
				}
			}
			if !uidSet {
				return id, fmt.Errorf("unable to find user %s: no matching entries in passwd file of image %s", userPart, c.GetImage())
			}
		}
	}
	// The user's passwd entry gives its primary group and home.
	for _, e := range passwd {
		if len(e) >= 6 && e[2] == strconv.FormatUint(uint64(id.UID), 10) {
			if name == "" {
				name = e[0]
			}
			if n, err := strconv.ParseUint(e[3], 10, 32); err == nil {
				id.GID = uint32(n)
			}
			if e[5] != "" {
				id.Home = e[5]
			}
			break
		}
	}
	if sc != nil && sc.RunAsGroup != nil {
		id.GID, gidSet = uint32(sc.GetRunAsGroup()), true
	} else if groupPart != "" {
		if n, err := strconv.ParseUint(groupPart, 10, 32); err == nil {
			id.GID, gidSet = uint32(n), true
		} else {
			for _, e := range groups {
				if len(e) >= 3 && e[0] == groupPart {
					n, _ := strconv.ParseUint(e[2], 10, 32)
					id.GID, gidSet = uint32(n), true
				}
			}
			if !gidSet {
				return id, fmt.Errorf("unable to find group %s: no matching entries in group file of image %s", groupPart, c.GetImage())
			}
		}
	}
	seen := map[uint32]bool{}
	add := func(g uint32) {
		if !seen[g] {
			seen[g] = true
			id.Groups = append(id.Groups, g)
		}
	}
	if name != "" {
		for _, e := range groups {
			if len(e) >= 4 && e[3] != "" {
				for _, m := range strings.Split(e[3], ",") {
					if m == name {
						if n, err := strconv.ParseUint(e[2], 10, 32); err == nil {
							add(uint32(n))
						}
					}
				}
			}
		}
	}
	for _, g := range sc.GetSupplementalGroups() {
		add(uint32(g))
	}
	if sc != nil && sc.FsGroup != nil {
		add(uint32(sc.GetFsGroup()))
	}
	if sc.GetRunAsNonRoot() {
		switch {
		case id.UID == 0:
			return id, fmt.Errorf("container has runAsNonRoot and image will run as root (pod: %q, container: %s)", pod.GetNamespace()+"/"+pod.GetName(), c.GetName())
		}
	}
	return id, nil
}

// readColonFile reads a passwd-style file of the image (nil when there is
// none), resolving symlinks inside the root.
func readColonFile(rootfs, name string) [][]string {
	if rootfs == "" {
		return nil
	}
	p, err := securejoin.SecureJoin(rootfs, name)
	if err != nil {
		return nil
	}
	f, err := os.Open(p)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out [][]string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		out = append(out, strings.Split(line, ":"))
	}
	return out
}
