package daemon

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/runtime/criolog"
)

// logStream collects what GetLogs sends.
type logStream struct {
	grpc.ServerStream
	ctx    context.Context
	out    bytes.Buffer
	sends  int
	onSend func()
}

func (s *logStream) Context() context.Context { return s.ctx }
func (s *logStream) Send(r *runtimev1.GetLogsResponse) error {
	s.sends++
	s.out.Write(r.GetData())
	if s.onSend != nil {
		s.onSend()
	}
	return nil
}

func heapInUse() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// writeLog writes a CRI log of n lines of width bytes at path.
func writeLog(t *testing.T, path string, n, width int) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	pad := strings.Repeat("x", width)
	for i := range n {
		fmt.Fprintf(bw, "2026-01-01T00:00:00.000000001Z stdout F %08d %s\n", i, pad)
	}
	if err := bw.Flush(); err != nil {
		t.Fatal(err)
	}
	f.Close()
}

// A log much larger than any buffer is sent in chunks as it is read: the
// live heap while sending stays far below the file's size.
func TestGetLogsStreamsLargeFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "0.log")
	const lines, width = 250_000, 100 // ~35 MB
	writeLog(t, path, lines, width)
	fi, _ := os.Stat(path)
	for _, tail := range []int64{-1, 200_000} {
		runtime.GC()
		base := heapInUse()
		var peak uint64
		st := &logStream{ctx: context.Background()}
		st.onSend = func() {
			if st.sends%128 == 0 {
				// What is live: the old GetLogs held every record.
				runtime.GC()
				peak = max(peak, heapInUse())
			}
			if st.out.Len() > 1<<20 {
				st.out.Reset() // the client consumed it
			}
		}
		files, err := criolog.OpenFiles(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := sendLogs(context.Background(), path, files, logOptions{tail: tail}, &logWriter{stream: st, limit: -1}, func() bool { return false }); err != nil {
			t.Fatal(err)
		}
		if st.sends < 100 {
			t.Fatalf("tail %d: %d sends: not streamed in chunks", tail, st.sends)
		}
		grew := int64(peak) - int64(base)
		t.Logf("tail %d: file %d MB, %d sends, live heap grew by at most %d KB", tail, fi.Size()>>20, st.sends, grew>>10)
		if grew > 4<<20 {
			t.Errorf("tail %d: live heap grew by %d MB while sending a %d MB log: the log is held in memory", tail, grew>>20, fi.Size()>>20)
		}
	}
}

// A follower reads on across rotations: every line once, in order.
func TestGetLogsFollowAcrossRotations(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "0.log")
	w, err := criolog.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w.SetRotation(2048, 1000)
	const lines = 3000
	// Some before the follow starts (read with --tail 10), the rest during it.
	for i := range 100 {
		w.WriteRecord(criolog.Stdout, false, fmt.Appendf(nil, "line %d", i))
	}
	var done atomic.Bool
	tailSent := make(chan struct{})
	go func() {
		<-tailSent // the tail was read: the rest comes during the follow
		for i := 100; i < lines; i++ {
			w.WriteRecord(criolog.Stdout, false, fmt.Appendf(nil, "line %d", i))
			if i%50 == 0 {
				time.Sleep(5 * time.Millisecond)
			}
		}
		w.Close()
		done.Store(true)
	}()
	files, err := criolog.OpenFiles(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st := &logStream{ctx: ctx}
	st.onSend = sync.OnceFunc(func() { close(tailSent) })
	err = sendLogs(ctx, path, files, logOptions{tail: 10, follow: true}, &logWriter{stream: st, limit: -1}, func() bool { return !done.Load() })
	if err != nil {
		t.Fatal(err)
	}
	if n := len(criolog.Rotated(path)); n < 20 {
		t.Fatalf("only %d rotations", n)
	}
	got := strings.Split(strings.TrimSuffix(st.out.String(), "\n"), "\n")
	if len(got) != lines-90 {
		t.Fatalf("got %d lines, want %d (first %q, last %q)", len(got), lines-90, got[0], got[len(got)-1])
	}
	for i, l := range got {
		if want := fmt.Sprintf("line %d", 90+i); l != want {
			t.Fatalf("line %d: %q, want %q", i, l, want)
		}
	}
}
