// Package limits says which pod limits the node's runtime enforces, for
// `k3sm doctor` and `k3sm status`: the running runtime's own report
// (GetRuntimeInfo's resource_limits, what it found when it started), or,
// when no runtime runs, what one would find (cgroups.Detect). Never a
// reading of its own: the runtime may see another /sys than its caller
// (`ip netns exec` remounts it).
package limits

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strings"
	"syscall"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/runtime/cgroups"
	"github.com/k3sm-dev/k3sm/internal/runtime/client"
	"github.com/k3sm-dev/k3sm/internal/syserr"
)

// Report is what the kernel holds pods to, and where that was learnt.
type Report struct {
	cgroups.Support
	// OS the runtime runs on (GOOS).
	OS string
	// FromRuntime: the running runtime reported it; otherwise it is
	// cgroups.Detect in this process.
	FromRuntime bool
	// AskErr: something answers at the socket, or is there and refuses
	// this user, but gave no report; Support is then Detect's.
	AskErr error
}

// Proto is the wire form of s (GetRuntimeInfoResponse.resource_limits).
func Proto(s cgroups.Support) *runtimev1.ResourceLimits {
	return &runtimev1.ResourceLimits{CgroupMode: s.Version.String(), Enforced: s.Enforced, Cause: s.Cause, Reason: s.Reason, Fix: s.Fix}
}

// FromProto reads the wire form back.
func FromProto(p *runtimev1.ResourceLimits) cgroups.Support {
	s := cgroups.Support{Enforced: p.GetEnforced(), Cause: p.GetCause(), Reason: p.GetReason(), Fix: p.GetFix()}
	switch p.GetCgroupMode() {
	case "v1":
		s.Version = cgroups.V1
	case "v2":
		s.Version = cgroups.V2
	}
	return s
}

// FromRuntime asks the runtime serving socket. An error wrapping
// ErrNotRunning means nothing serves there.
func FromRuntime(ctx context.Context, socket string) (cgroups.Support, string, error) {
	conn, err := (&net.Dialer{}).DialContext(ctx, "unix", socket)
	if err != nil {
		if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
			return cgroups.Support{}, "", fmt.Errorf("%w (%s: %v)", ErrNotRunning, socket, syserr.Cause(err))
		}
		return cgroups.Support{}, "", fmt.Errorf("socket %s: %w", socket, syserr.Cause(err))
	}
	conn.Close()
	c, err := client.Dial(socket)
	if err != nil {
		return cgroups.Support{}, "", err
	}
	defer c.Close()
	info, err := c.Runtime.GetRuntimeInfo(ctx, &runtimev1.GetRuntimeInfoRequest{})
	if err != nil {
		return cgroups.Support{}, "", fmt.Errorf("GetRuntimeInfo at %s: %w", socket, err)
	}
	if info.GetResourceLimits() == nil {
		return cgroups.Support{}, info.GetOs(), fmt.Errorf("%s %s does not report its limits: it is older than this k3sm", info.GetRuntimeName(), info.GetRuntimeVersion())
	}
	return FromProto(info.GetResourceLimits()), info.GetOs(), nil
}

// ErrNotRunning: no runtime serves the socket.
var ErrNotRunning = errors.New("no runtime runs")

// Ask is FromRuntime, or Detect with the runtime's default options where
// it cannot say.
func Ask(ctx context.Context, socket string) Report {
	s, goos, err := FromRuntime(ctx, socket)
	if err == nil {
		return Report{Support: s, OS: goos, FromRuntime: true}
	}
	r := Report{Support: cgroups.Detect(cgroups.Options{}), OS: runtime.GOOS}
	if !errors.Is(err, ErrNotRunning) {
		r.AskErr = err
	}
	return r
}

// Impaired: on Linux, the kernel does not hold pods to their CPU or
// memory limits (elsewhere there are no cgroups to miss).
func Impaired(goos string, s cgroups.Support) bool {
	return goos == "linux" && (!s.Enforces(cgroups.CPU) || !s.Enforces(cgroups.Memory))
}

// Unenforced names the CPU and memory limits s does not enforce, for a
// message: "CPU and memory limits", "CPU limits", "" when both are.
func Unenforced(s cgroups.Support) string {
	var out []string
	if !s.Enforces(cgroups.CPU) {
		out = append(out, "CPU")
	}
	if !s.Enforces(cgroups.Memory) {
		out = append(out, "memory")
	}
	if len(out) == 0 {
		return ""
	}
	return strings.Join(out, " and ") + " limits"
}
