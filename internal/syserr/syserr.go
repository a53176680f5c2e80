// Package syserr finds what a failed system call said beneath the wrappers
// the net and os packages put around it, for messages that name the
// address or path themselves. It imports only the standard library, so
// both sides of the tree may use it.
package syserr

import (
	"errors"
	"net"
	"os"
)

// Cause returns err without its *net.OpError, *os.PathError and
// *os.SyscallError wrappers: "connection refused" for "dial unix
// /run/x.sock: connect: connection refused", "address already in use" for
// "listen tcp :6443: bind: address already in use". An error without them
// is returned as it is.
func Cause(err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		err = op.Err
	}
	var pe *os.PathError
	if errors.As(err, &pe) && pe.Err != nil {
		err = pe.Err
	}
	var se *os.SyscallError
	if errors.As(err, &se) && se.Err != nil {
		err = se.Err
	}
	return err
}
