package controlplane

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestOpsFlags(t *testing.T) {
	cfg := Defaults()
	cfg.DataDir = "/d"
	cfg.Ops.AuditLog = AuditLogDefault
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if cfg.Ops.AuditLog != "/d/logs/audit.log" || cfg.Ops.SnapshotDir != "/d/server/snapshots" || cfg.Ops.SnapshotRetention != 5 {
		t.Fatalf("ops defaults %+v", cfg.Ops)
	}
	for _, tc := range []struct {
		o    Ops
		flag string
	}{
		{Ops{SnapshotSchedule: -time.Hour, SnapshotRetention: 5}, "--snapshot-schedule"},
		{Ops{SnapshotSchedule: time.Millisecond, SnapshotRetention: 5}, "--snapshot-schedule"},
		{Ops{SnapshotRetention: 0}, "--snapshot-retention"},
	} {
		c := Defaults()
		c.Ops = tc.o
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.flag) {
			t.Errorf("%+v: %v, want an error naming %s", tc.o, err, tc.flag)
		}
	}
}

// The apiserver gets the encryption and audit flags only when the ops
// addon prepared their files.
func TestAPIServerOpsArgs(t *testing.T) {
	cfg := Defaults()
	cfg.DataDir = t.TempDir()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	certs, err := EnsurePKI(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := &Plane{Cfg: &cfg, Certs: certs}
	args := func() string { return strings.Join(apiserver{p: p}.Args(), " ") }
	if a := args(); strings.Contains(a, "encryption") || strings.Contains(a, "audit") {
		t.Fatalf("ops args without ops: %s", a)
	}
	cfg.Ops.EncryptionProviderConfig = "/d/server/cred/encryption-config.yaml"
	cfg.Ops.AuditPolicyFile, cfg.Ops.AuditLog = "/d/server/audit-policy.yaml", "/d/logs/audit.log"
	got := apiserver{p: p}.Args()
	for _, want := range []string{
		"--encryption-provider-config=/d/server/cred/encryption-config.yaml", "--encryption-provider-config-automatic-reload=true",
		"--audit-policy-file=/d/server/audit-policy.yaml", "--audit-log-path=/d/logs/audit.log", "--audit-log-maxsize=100",
	} {
		if !slices.Contains(got, want) {
			t.Errorf("apiserver args miss %s: %v", want, got)
		}
	}
}
