package supervisor

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/testutil/poll"
)

// chatty writes about 6 MB to stdout and stderr, then waits.
type chatty struct{}

func (chatty) Name() string { return "chatty" }
func (chatty) Command() Command {
	return Command{Path: "/bin/sh", Args: []string{"-c",
		`i=0; while [ $i -lt 3 ]; do head -c 1000000 /dev/zero | tr '\0' 'o'; echo; head -c 1000000 /dev/zero | tr '\0' 'e' >&2; echo >&2; i=$((i+1)); done; echo done; exec sleep 60`}}
}
func (chatty) Ready(context.Context) error { return nil }

// A component's log rotates at LogMaxSizeMB and keeps LogMaxBackups.
func TestComponentLogRotates(t *testing.T) {
	s := newTestSupervisor(t)
	s.LogMaxSizeMB, s.LogMaxBackups = 1, 2
	ch, err := s.Start(context.Background(), chatty{})
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Stop(2 * time.Second)
	// Every 100 ms: each try reads the whole log, up to its 1 MB.
	poll.Every(t, context.Background(), 30*time.Second, 100*time.Millisecond, "the component's output in its log", func() error {
		if b, _ := os.ReadFile(ch.LogPath()); !strings.Contains(string(b), "done") {
			return errors.New("no \"done\" yet")
		}
		return nil
	})
	// Compression of backups runs in the background. Not poll: when time
	// runs out this falls through to the checks below, which report the
	// live log's size and the backups found.
	var backups []string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		backups, _ = filepath.Glob(filepath.Join(s.LogDir, "chatty-*.log*"))
		if len(backups) == 2 && !strings.Contains(strings.Join(backups, " "), ".log ") {
			break
		}
	}
	fi, err := os.Stat(ch.LogPath())
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() > 1<<20 {
		t.Errorf("live log is %d bytes, over the 1 MB max size", fi.Size())
	}
	if len(backups) != 2 {
		t.Errorf("want 2 backups, got %v", backups)
	}
	var total int64
	ents, _ := os.ReadDir(s.LogDir)
	for _, e := range ents {
		if i, err := e.Info(); err == nil {
			total += i.Size()
		}
	}
	if total > 3<<20 {
		t.Errorf("log dir holds %d bytes for 6 MB of output with 1 MB x (1+2) kept", total)
	}
}
