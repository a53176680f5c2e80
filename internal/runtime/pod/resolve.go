package pod

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/runtime/image"
	"k8s.io/kubernetes/third_party/forked/golang/expansion"
)

// NativeImage is the image name that runs a host command with no image.
const NativeImage = "native"

// hostPath is the host's default search path, appended after the root's.
const hostPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// resolved is a container command ready to start.
type resolved struct {
	Argv []string
	Env  []string
	Dir  string
}

// fillPodIP puts the pod's address where the provider left
// runtimev1.PodIPPlaceholder (status.podIP in env, and $(VAR) expansions
// of it in env and in the command).
func (r *resolved) fillPodIP(ip string) {
	for _, l := range [][]string{r.Env, r.Argv} {
		for i, s := range l {
			if strings.Contains(s, runtimev1.PodIPPlaceholder) {
				l[i] = strings.ReplaceAll(s, runtimev1.PodIPPlaceholder, ip)
			}
		}
	}
}

// resolveProcess applies the path rules (see docs/runtime.md, "How commands
// and paths resolve"): no chroot, so the container's root is a directory on
// the host and the process sees the host system.
//
//   - command/args merge with the image's Entrypoint/Cmd as Kubernetes does;
//     $(VAR) references in command/args expand from the container's env;
//     env values marked verbatim are used as they are, others expand from
//     the variables before them (older providers).
//   - An absolute command that exists under the root runs from the root
//     (/app/server -> <root>/app/server); otherwise the same host path runs.
//   - A bare command is searched in PATH, which lists the image's PATH
//     directories inside the root first, then the same directories and the
//     host's default ones on the host.
//   - workingDir (or the image's WorkingDir) maps into the root and is
//     created if missing; without either the process starts in the root.
//   - image "native": no root; the command must resolve on the host and
//     workingDir is a host path (default: the container's private dir).
//
// With inRoot the container's "/" is its image root (the sandbox pivots
// into it): paths are the container's own, HOME comes from the sandbox
// (the image's /etc/passwd), and the executable is looked up inside the
// root when the process starts.
func resolveProcess(spec *runtimev1.PodSpec, c *runtimev1.ContainerSpec, img *image.Image, root string, inRoot bool) (resolved, error) {
	native := img == nil
	inRoot = inRoot && !native
	var entrypoint, cmd, imgEnv []string
	imgDir := ""
	if !native {
		entrypoint, cmd, imgEnv, imgDir = img.Config.Entrypoint, img.Config.Cmd, img.Config.Env, img.Config.WorkingDir
	}

	// Environment: image, then k3sm's, then the container's (later wins).
	envMap := map[string]string{}
	var order []string
	set := func(k, v string) {
		if _, ok := envMap[k]; !ok {
			order = append(order, k)
		}
		envMap[k] = v
	}
	for _, kv := range imgEnv {
		k, v, _ := strings.Cut(kv, "=")
		set(k, v)
	}
	if native {
		set("PATH", hostPath)
	}
	set("HOSTNAME", podHostname(spec))
	if !inRoot {
		set("HOME", root)
		set("K3SM_ROOT", root)
	}
	// A verbatim variable is final (the provider expanded it as the kubelet
	// does); an older provider's are expanded here, from the ones before.
	containerVars := map[string]string{}
	for _, e := range c.GetEnv() {
		v := e.GetValue()
		if !e.GetVerbatim() {
			v = expand(v, containerVars)
		}
		containerVars[e.GetName()] = v
		set(e.GetName(), v)
	}
	if _, ok := envMap["PATH"]; !ok {
		set("PATH", hostPath)
	}
	if !native && !inRoot {
		envMap["PATH"] = rootPath(root, envMap["PATH"])
	}

	// Command and args, Kubernetes' merge rules. As with the kubelet, only
	// the container's own command and args are $(VAR)-expanded, from the
	// container's env, not the image's Entrypoint/Cmd. (Exec commands come
	// with every $ escaped as $$, see daemon/stdio.go.)
	expandAll := func(in []string) []string {
		out := make([]string, len(in))
		for i, a := range in {
			out[i] = expand(a, containerVars)
		}
		return out
	}
	command, args := expandAll(c.GetCommand()), expandAll(c.GetArgs())
	var argv []string
	switch {
	case len(command) > 0:
		argv = append(append(argv, command...), args...)
	case len(args) > 0:
		argv = append(append(argv, entrypoint...), args...)
	default:
		argv = append(append(argv, entrypoint...), cmd...)
	}
	if len(argv) == 0 {
		if native {
			return resolved{}, errors.New(`image "native" needs a command: set the container's command to an absolute host path`)
		}
		return resolved{}, fmt.Errorf("no command specified: image %q has no Entrypoint or Cmd and the container sets no command", c.GetImage())
	}

	// Working directory.
	dir := c.GetWorkingDir()
	if dir == "" {
		dir = imgDir
	}
	if inRoot {
		if dir == "" {
			dir = "/"
		}
		if !filepath.IsAbs(dir) {
			return resolved{}, fmt.Errorf("workingDir %q must be an absolute path", dir)
		}
		env := make([]string, 0, len(order))
		for _, k := range order {
			env = append(env, k+"="+envMap[k])
		}
		return resolved{Argv: argv, Env: env, Dir: dir}, nil
	}
	switch {
	case native && dir == "":
		dir = root
	case native:
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			return resolved{}, fmt.Errorf("workingDir %s does not exist on the host (image native uses host paths)", dir)
		}
	case dir == "":
		dir = root
	default:
		if !filepath.IsAbs(dir) {
			return resolved{}, fmt.Errorf("workingDir %q must be an absolute path", dir)
		}
		dir = filepath.Join(root, dir)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return resolved{}, fmt.Errorf("create workingDir: %w", err)
		}
	}

	// The executable.
	exe := argv[0]
	switch {
	case filepath.IsAbs(exe):
		if !native && isExecutable(filepath.Join(root, exe)) {
			exe = filepath.Join(root, exe)
		} else if !isExecutable(exe) {
			where := "on the host"
			if !native {
				where = fmt.Sprintf("in the pod root %s or on the host", root)
			}
			return resolved{}, fmt.Errorf("exec: %q: executable file not found %s", argv[0], where)
		}
	case strings.Contains(exe, "/"):
		exe = filepath.Join(dir, exe)
		if !isExecutable(exe) {
			return resolved{}, fmt.Errorf("exec: %q: executable file not found relative to %s", argv[0], dir)
		}
	default:
		found := ""
		for _, d := range filepath.SplitList(envMap["PATH"]) {
			if d == "" {
				continue
			}
			if p := filepath.Join(d, exe); isExecutable(p) {
				found = p
				break
			}
		}
		if found == "" {
			return resolved{}, fmt.Errorf("exec: %q: executable file not found in $PATH", exe)
		}
		exe = found
	}
	argv[0] = exe

	env := make([]string, 0, len(order))
	for _, k := range order {
		env = append(env, k+"="+envMap[k])
	}
	return resolved{Argv: argv, Env: env, Dir: dir}, nil
}

// rootPath puts each directory of path inside root first (when it exists
// there), then the original host directories, then the host default.
func rootPath(root, path string) string {
	var out []string
	seen := map[string]bool{}
	add := func(d string) {
		if d != "" && !seen[d] {
			seen[d] = true
			out = append(out, d)
		}
	}
	dirs := filepath.SplitList(path)
	for _, d := range dirs {
		if filepath.IsAbs(d) {
			if fi, err := os.Stat(filepath.Join(root, d)); err == nil && fi.IsDir() {
				add(filepath.Join(root, d))
			}
		}
	}
	for _, d := range dirs {
		add(d)
	}
	for _, d := range filepath.SplitList(hostPath) {
		add(d)
	}
	return strings.Join(out, string(filepath.ListSeparator))
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// expand replaces $(VAR) with vars[VAR] as the kubelet does (its own
// expansion package): $$ is a literal $, and a reference to an undefined
// variable stays as written.
func expand(s string, vars map[string]string) string {
	if !strings.Contains(s, "$") {
		return s
	}
	return expansion.Expand(s, expansion.MappingFuncFor(vars))
}
