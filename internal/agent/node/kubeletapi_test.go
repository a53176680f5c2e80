package node

import (
	"errors"
	"strings"
	"testing"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	utilexec "k8s.io/utils/exec"
)

// The remotecommand server reports a utilexec.ExitError's code to kubectl,
// which exits with it; anything else is a failure message.
func TestExitError(t *testing.T) {
	for _, tc := range []struct {
		name   string
		exit   *runtimev1.ExitStatus
		attach bool
		code   int // 0: nil error; -1: a plain error
		msg    string
	}{
		{"success", &runtimev1.ExitStatus{}, false, 0, ""},
		{"non-zero", &runtimev1.ExitStatus{ExitCode: 3}, false, 3, "exit code: 3"},
		{"signal", &runtimev1.ExitStatus{ExitCode: 137, Signal: 9}, false, 137, "137"},
		{"not found", &runtimev1.ExitStatus{ExitCode: 127, Error: `exec: "nope": executable file not found`}, false, 127, `"nope": executable file not found`},
		{"runtime error", &runtimev1.ExitStatus{Error: "boom"}, false, -1, "boom"},
		{"attach ends cleanly", &runtimev1.ExitStatus{ExitCode: 4}, true, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := exitError(tc.exit, tc.attach)
			var ee utilexec.ExitError
			switch {
			case tc.code == 0:
				if err != nil {
					t.Fatalf("got %v, want nil", err)
				}
			case tc.code == -1:
				if err == nil || errors.As(err, &ee) || !strings.Contains(err.Error(), tc.msg) {
					t.Fatalf("got %#v, want a plain error with %q", err, tc.msg)
				}
			default:
				if !errors.As(err, &ee) || ee.ExitStatus() != tc.code || !strings.Contains(err.Error(), tc.msg) {
					t.Fatalf("got %#v, want exit code %d with %q", err, tc.code, tc.msg)
				}
			}
		})
	}
}
