package supervisor

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/testutil/poll"
)

// The state file follows a child through start, readiness, a kill and
// its restart.
func TestStateFileFollowsChild(t *testing.T) {
	s := newTestSupervisor(t)
	s.StateFile = filepath.Join(t.TempDir(), "components.json")
	sock := filepath.Join(t.TempDir(), "c.sock")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ch, err := s.Start(ctx, testChild(sock))
	if err != nil {
		t.Fatal(err)
	}
	defer s.StopAll()
	if err := ch.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	wait := func(what string, ok func(ChildState) bool) ChildState {
		t.Helper()
		var c ChildState
		// Until the test's context ends, as long as it has.
		poll.Every(t, ctx, 20*time.Second, poll.Interval, "the state file to show "+what, func() error {
			st, err := ReadState(s.StateFile)
			if err != nil {
				return err
			}
			if len(st.Children) != 1 || !ok(st.Children[0]) {
				return fmt.Errorf("state %+v", st)
			}
			c = st.Children[0]
			return nil
		})
		return c
	}
	first := ch.Pid()
	c := wait("the child live", func(c ChildState) bool { return c.Live })
	if c.Name != "child" || c.Pid != first || c.Restarts != 0 || c.Started.IsZero() {
		t.Fatalf("%+v", c)
	}
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	os.Remove(sock) // a killed child leaves it; the next would fail to listen
	c = wait("the restarted child live", func(c ChildState) bool { return c.Live && c.Pid != first })
	if c.Restarts != 1 || !strings.Contains(c.LastExit, "killed") {
		t.Fatalf("after a kill: %+v", c)
	}
	if st := s.State(); st.Children[0].Pid != ch.Pid() || fmt.Sprint(st.Pid) == "0" {
		t.Fatalf("State: %+v", st)
	}
}
