package seccomp

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/k3sm-dev/k3sm/internal/runtime/sandbox"
	mobyseccomp "github.com/moby/profiles/seccomp"
	"github.com/opencontainers/runtime-spec/specs-go"
)

// ipprotoMPTCP is IPPROTO_MPTCP. Landlock's TCP rules do not cover MPTCP
// sockets (and Go listens with MPTCP when it can), so the default denies
// them; moby's profile allows them.
const ipprotoMPTCP = 262

var defaults struct {
	sync.Mutex
	byCaps map[string][]sandbox.SockFilter
}

// RuntimeDefaultFor is RuntimeDefault for a container whose bounding set
// is caps ("CAP_NET_ADMIN" or "NET_ADMIN"): the moby profile resolved for
// those capabilities and this kernel, plus k3sm's additions: ptrace,
// process_vm_readv and process_vm_writev denied unless caps has
// CAP_SYS_PTRACE (moby allows them from kernel 4.8 on), and socket(...,
// IPPROTO_MPTCP) denied with EPERM. Compiled once per capability set.
func RuntimeDefaultFor(caps []string) ([]sandbox.SockFilter, error) {
	norm := normCaps(caps)
	key := strings.Join(norm, ",")

	defaults.Lock()
	defer defaults.Unlock()
	if f, ok := defaults.byCaps[key]; ok {
		return slices.Clone(f), nil
	}
	prof, err := runtimeDefaultProfile(norm)
	if err != nil {
		return nil, err
	}
	f, err := compile(prof)
	if err != nil {
		return nil, fmt.Errorf("seccomp runtime default: %w", err)
	}
	if defaults.byCaps == nil {
		defaults.byCaps = map[string][]sandbox.SockFilter{}
	}
	defaults.byCaps[key] = f
	return slices.Clone(f), nil
}

// runtimeDefaultProfile is the moby profile for caps (normalised) with
// k3sm's additions.
func runtimeDefaultProfile(caps []string) (*specs.LinuxSeccomp, error) {
	prof, err := mobyseccomp.GetDefaultProfile(specFor(caps))
	if err != nil {
		return nil, fmt.Errorf("seccomp runtime default: %w", err)
	}
	if !slices.Contains(caps, "CAP_SYS_PTRACE") {
		denyNames(prof, "ptrace", "process_vm_readv", "process_vm_writev")
	}
	prof.Syscalls = append(prof.Syscalls, specs.LinuxSyscall{
		Names:  []string{"socket"},
		Action: specs.ActErrno,
		// The kernel reads the protocol as an int: compare the low 32
		// bits only, or 262 with high bits set would slip through.
		Args: []specs.LinuxSeccompArg{{Index: 2, Value: 0xffffffff, ValueTwo: ipprotoMPTCP, Op: specs.OpMaskedEqual}},
	})
	return prof, nil
}

func specFor(caps []string) *specs.Spec {
	return &specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{
		Bounding: caps, Effective: caps, Permitted: caps,
	}}}
}

// denyNames takes names out of the profile's allow rules, so they fall to
// the default action (EPERM).
func denyNames(p *specs.LinuxSeccomp, names ...string) {
	for i := range p.Syscalls {
		if p.Syscalls[i].Action != specs.ActAllow {
			continue
		}
		p.Syscalls[i].Names = slices.DeleteFunc(slices.Clone(p.Syscalls[i].Names), func(n string) bool {
			return slices.Contains(names, n)
		})
	}
	p.Syscalls = slices.DeleteFunc(p.Syscalls, func(s specs.LinuxSyscall) bool { return len(s.Names) == 0 })
}

// compileLocalhost compiles a JSON profile as written (no k3sm
// additions): the OCI LinuxSeccomp format or Docker's (archMap,
// includes/excludes, resolved for caps and this kernel).
func compileLocalhost(body []byte, caps []string) ([]sandbox.SockFilter, error) {
	var probe struct {
		DefaultAction string `json:"defaultAction"`
	}
	if err := json.Unmarshal(body, &probe); err != nil {
		return nil, fmt.Errorf("not valid JSON: %v", err)
	}
	if probe.DefaultAction == "" {
		return nil, errors.New("no defaultAction: set it (for example SCMP_ACT_ERRNO) and list the allowed calls in syscalls")
	}
	prof, err := mobyseccomp.LoadProfile(string(body), specFor(caps))
	if err != nil {
		return nil, err
	}
	return compile(prof)
}
