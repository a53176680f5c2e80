package node

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// isTransientRuntimeError: the runtime daemon did not take the call (it is
// restarting, or the call timed out); the same call is worth repeating.
func isTransientRuntimeError(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted, codes.Canceled:
		return true
	}
	return false
}
