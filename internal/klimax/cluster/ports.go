package cluster

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/k3sm-dev/k3sm/internal/klimax/slot"
	"github.com/k3sm-dev/k3sm/internal/klimax/vm"
)

// LocalPortCheck checks API ports on this host (host driver): a port is
// free when klimax can listen on addr:port itself, which also fails when
// something listens on the wildcard address.
func LocalPortCheck(addr string) slot.PortCheck {
	return func(ctx context.Context, port int) error {
		l, err := net.Listen("tcp", net.JoinHostPort(addr, strconv.Itoa(port)))
		if err != nil {
			return err
		}
		return l.Close()
	}
}

// GuestPortCheck checks API ports in the VM with `ss`: a port is in use
// when a TCP socket listens on it. When ss cannot run, the port counts as
// free (Docker still refuses a taken port when kind publishes it).
func GuestPortCheck(r vm.Runner) slot.PortCheck {
	return func(ctx context.Context, port int) error {
		res, err := r.Run(ctx, []string{"ss", "-Hltn", fmt.Sprintf("sport = :%d", port)}, vm.RunOptions{Timeout: ShortTimeout})
		if err != nil {
			return nil
		}
		if out := strings.TrimSpace(string(res.Stdout)); out != "" {
			return fmt.Errorf("listening in the VM: %s", strings.Fields(out)[min(3, len(strings.Fields(out))-1)])
		}
		return nil
	}
}
