// Command runc-capfilter is an OCI runtime for Docker engines that run in a
// sandbox whose capability bounding set lacks some capabilities (CI
// machines, some VMs): there `docker run --privileged` — which kind needs for
// its nodes — fails with "unable to apply caps: operation not permitted",
// because runc asks for every capability. runc-capfilter removes from the
// container's (create/run) or process's (exec) capability sets every
// capability this process's own bounding set does not hold, then execs the
// real runc with the same arguments. Everything else passes through unchanged.
//
// hack/start-docker.sh installs it as the engine's default runtime only when
// the bounding set is incomplete.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// capNames are the kernel's capability numbers (linux/capability.h).
var capNames = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE", "CAP_NET_BIND_SERVICE",
	"CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE",
	"CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE", "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT",
	"CAP_SYS_NICE", "CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE",
	"CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG",
	"CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE",
}

func main() {
	real := os.Getenv("RUNC_CAPFILTER_RUNC")
	if real == "" {
		real = "/usr/sbin/runc"
	}
	if missing := missingCaps(); len(missing) > 0 {
		if f := specFile(os.Args[1:]); f != "" {
			if err := filter(f, missing); err != nil {
				fmt.Fprintln(os.Stderr, "runc-capfilter:", err)
			}
		}
	}
	err := syscall.Exec(real, append([]string{real}, os.Args[1:]...), os.Environ())
	fmt.Fprintln(os.Stderr, "runc-capfilter: exec", real+":", err)
	os.Exit(127)
}

// missingCaps are the known capabilities not in this process's bounding set.
func missingCaps() map[string]bool {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return nil
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "CapBnd:"); ok {
			bnd, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				return nil
			}
			m := map[string]bool{}
			for i, n := range capNames {
				if bnd&(1<<uint(i)) == 0 {
					m[n] = true
				}
			}
			return m
		}
	}
	return nil
}

// specFile is the JSON that holds the capabilities for this invocation:
// <bundle>/config.json for create/run, the --process file for exec.
func specFile(args []string) string {
	cmd, bundle, process := "", "", ""
	for i := 0; i < len(args); i++ {
		a := args[i]
		val := func() string {
			if k, v, ok := strings.Cut(a, "="); ok && strings.HasPrefix(k, "-") {
				return v
			}
			if i+1 < len(args) {
				i++
				return args[i]
			}
			return ""
		}
		switch {
		case a == "--bundle" || a == "-b" || strings.HasPrefix(a, "--bundle="):
			bundle = val()
		case a == "--process" || a == "-p" || strings.HasPrefix(a, "--process="):
			process = val()
		case a == "--root" || a == "--log" || a == "--log-format" || a == "--criu" || a == "--pid-file" ||
			a == "--console-socket" || a == "--preserve-fds" || a == "--cwd" || a == "--user" || a == "-u":
			i++ // flags with a value we do not need
		case !strings.HasPrefix(a, "-") && cmd == "":
			cmd = a
		}
	}
	switch cmd {
	case "create", "run":
		if bundle == "" {
			bundle, _ = os.Getwd()
		}
		return filepath.Join(bundle, "config.json")
	case "exec":
		return process
	}
	return ""
}

func filter(path string, missing map[string]bool) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		return err
	}
	caps := doc
	if p, ok := doc["process"].(map[string]any); ok {
		caps = p
	}
	c, ok := caps["capabilities"].(map[string]any)
	if !ok {
		return nil
	}
	changed := false
	for set, v := range c {
		list, ok := v.([]any)
		if !ok {
			continue
		}
		kept := list[:0]
		for _, x := range list {
			if s, ok := x.(string); ok && missing[s] {
				changed = true
				continue
			}
			kept = append(kept, x)
		}
		c[set] = kept
	}
	if !changed {
		return nil
	}
	out, err := json.Marshal(doc)
	if err != nil {
		return err
	}
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	return os.WriteFile(path, out, st.Mode().Perm())
}
