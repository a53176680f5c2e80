package vm

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
	"time"
)

var resultLine = regexp.MustCompile(`(?m)^\s*--- (PASS|FAIL|SKIP): (\S+)`)

// guestGoTest runs a compiled test binary in the guest (cmd is the whole
// command line) and requires each test in want to have passed: a skip is a
// failure here, since the guest is the host those tests skip elsewhere for
// lack of.
func guestGoTest(t *testing.T, timeout time.Duration, cmd string, want ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	// go test's verdicts on stdout; what the code under test logs on
	// stderr, apart so it cannot split a verdict line.
	var out, errOut bytes.Buffer
	err := guest.Run(ctx, cmd, &out, &errOut)
	results := map[string]string{}
	for _, m := range resultLine.FindAllStringSubmatch(out.String(), -1) {
		results[m[2]] = m[1]
	}
	failed := err != nil
	for _, name := range want {
		if results[name] != "PASS" {
			failed = true
			t.Errorf("%s: %s in the guest, want PASS", name, orNone(results[name]))
		}
	}
	for name, r := range results {
		if r == "FAIL" {
			failed = true
			t.Errorf("%s failed in the guest", name)
		}
	}
	if failed {
		t.Errorf("guest: %s: %v\n%s\nstderr:\n%s", cmd, err, out.String(), errOut.String())
	} else if testing.Verbose() {
		t.Logf("guest: %s\n%s", cmd, out.String())
	}
}

func orNone(s string) string {
	if s == "" {
		return "did not run"
	}
	return strings.ToLower(s)
}

// emulated is flag+"K3SM_TEST_EMULATED_CPU=1 " when the guest runs under
// TCG: tests that judge a latency against the host's speed log it instead.
func emulated(flag string) string {
	if guest.Accel == "kvm" {
		return ""
	}
	return flag + "K3SM_TEST_EMULATED_CPU=1 "
}
