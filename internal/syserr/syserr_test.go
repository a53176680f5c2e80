package syserr

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"
)

func TestCause(t *testing.T) {
	other := errors.New("other")
	for _, c := range []struct {
		err, want error
	}{
		{&net.OpError{Op: "dial", Net: "unix", Err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}}, syscall.ECONNREFUSED},
		{fmt.Errorf("probe: %w", &net.OpError{Op: "listen", Net: "tcp", Err: &os.SyscallError{Syscall: "bind", Err: syscall.EADDRINUSE}}), syscall.EADDRINUSE},
		{&os.PathError{Op: "mkdir", Path: "/x", Err: syscall.EACCES}, syscall.EACCES},
		{&os.SyscallError{Syscall: "bind", Err: syscall.EADDRINUSE}, syscall.EADDRINUSE},
		{other, other},
	} {
		if got := Cause(c.err); got != c.want {
			t.Errorf("Cause(%v) = %#v, want %#v", c.err, got, c.want)
		}
	}
}
