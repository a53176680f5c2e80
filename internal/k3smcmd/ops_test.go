package k3smcmd

import (
	"strings"
	"testing"
)

func TestAuditLogPathNeedsEquals(t *testing.T) {
	root := New(nil, nil)
	root.SetArgs([]string{"server", "--data-dir", t.TempDir(), "--audit-log", "/var/log/audit.log"})
	err := root.Execute()
	if err == nil || !strings.Contains(err.Error(), "--audit-log=/var/log/audit.log") {
		t.Fatalf("want a hint to use --audit-log=PATH, got %v", err)
	}
}

func TestCertificateRotateNamesTheService(t *testing.T) {
	root := New(nil, nil)
	root.SetArgs([]string{"certificate", "rotate", "--data-dir", t.TempDir(), "--service", "bogus"})
	if err := root.Execute(); err == nil || !strings.Contains(err.Error(), "no k3sm cluster") {
		t.Fatalf("empty data dir: %v", err)
	}
}
