package audit

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/k3sm-dev/k3sm/internal/datadir"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"
)

func TestDefaultPolicy(t *testing.T) {
	p, err := ParsePolicy([]byte(DefaultPolicy))
	if err != nil {
		t.Fatal(err)
	}
	// Never a body: no rule logs above Metadata.
	for _, r := range p.Rules {
		if r.Level != auditv1.LevelMetadata && r.Level != auditv1.LevelNone {
			t.Errorf("rule %+v logs bodies", r)
		}
	}
	if last := p.Rules[len(p.Rules)-1]; last.Level != auditv1.LevelMetadata || len(last.Resources) != 0 || len(last.NonResourceURLs) != 0 {
		t.Errorf("the last rule must catch everything at Metadata: %+v", last)
	}
}

func TestPrepareKeepsTheOperatorsPolicy(t *testing.T) {
	l := datadir.New(t.TempDir())
	os.MkdirAll(l.ServerDir(), 0o700)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	logPath := filepath.Join(l.LogDir(), "audit.log")
	path, err := Prepare(l, logPath, log)
	if err != nil {
		t.Fatal(err)
	}
	mine := strings.Replace(DefaultPolicy, "# Everything else: Metadata too.", "# mine", 1)
	os.WriteFile(path, []byte(mine), 0o600)
	if _, err := Prepare(l, logPath, log); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != mine {
		t.Fatal("an edited policy was overwritten")
	}
	os.WriteFile(path, []byte("kind: Nope\n"), 0o600)
	if _, err := Prepare(l, logPath, log); err == nil || !strings.Contains(err.Error(), "--audit-log") {
		t.Fatalf("a broken policy: %v", err)
	}
}
