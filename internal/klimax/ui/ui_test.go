package ui

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestProgressPlainLines(t *testing.T) {
	var buf bytes.Buffer
	clk := &fakeClock{t: time.Unix(0, 0)}
	p := NewProgress(&buf, false)
	p.now = clk.now
	done := p.Step("start VM")
	clk.add(2500 * time.Millisecond)
	done(nil)
	done2 := p.Step("create cluster")
	clk.add(75 * time.Second)
	done2(errors.New("kind failed\nlong detail"))
	done2(nil) // second call ignored
	want := "==> start VM\n    done start VM (2.5s)\n==> create cluster\n    FAILED create cluster (1m15s)\n"
	if buf.String() != want {
		t.Errorf("got %q\nwant %q", buf.String(), want)
	}
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

func TestProgressTTYSpinnerAndOverlap(t *testing.T) {
	var buf syncBuf
	p := NewProgress(&buf, true)
	a := p.Step("a")
	b := p.Step("b")
	time.Sleep(300 * time.Millisecond) // let the spinner draw a few frames
	a(nil)
	b(errors.New("boom"))
	out := buf.String()
	for _, want := range []string{"b (", "[+1 more]", "✓ a (", "✗ b (", "\r\033[K"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in %q", want, out)
		}
	}
	if strings.Contains(out, "boom") {
		t.Errorf("the error is the command's to print once, not the progress line's: %q", out)
	}
	if p.stop != nil {
		t.Error("spinner goroutine not stopped after the last step")
	}
}

func TestPickerModel(t *testing.T) {
	p := NewPicker("Delete which clusters?", []string{"a", "b", "c"})
	for _, k := range []Key{KeyDown, KeyToggle, KeyDown, KeyDown, KeyToggle, KeyUp, KeyUp} {
		p.Handle(k)
	}
	if got := p.Chosen(); !reflect.DeepEqual(got, []string{"a", "b"}) {
		t.Errorf("chosen %v (cursor wraps)", got)
	}
	if !strings.Contains(p.View(), "> [x] b") && p.Cursor != 2 {
		t.Errorf("view:\n%s", p.View())
	}
	p.Handle(KeyAll)
	if len(p.Chosen()) != 3 {
		t.Errorf("all: %v", p.Chosen())
	}
	p.Handle(KeyAll)
	if len(p.Chosen()) != 0 {
		t.Errorf("none: %v", p.Chosen())
	}
}

func TestRunPickerKeys(t *testing.T) {
	var out bytes.Buffer
	// down-arrow, space, 'j', 'x', enter
	got, err := RunPicker(NewPicker("pick", []string{"a", "b", "c"}), strings.NewReader("\033[B jx\r"), &out)
	if err != nil || !reflect.DeepEqual(got, []string{"b", "c"}) {
		t.Errorf("got %v %v", got, err)
	}
	if !strings.Contains(out.String(), "\033[5A\033[J") {
		t.Errorf("frames not redrawn in place: %q", out.String())
	}
	if _, err := RunPicker(NewPicker("pick", []string{"a"}), strings.NewReader(" q"), &out); !errors.Is(err, ErrCancelled) {
		t.Errorf("q: %v", err)
	}
	if _, err := RunPicker(NewPicker("pick", []string{"a"}), strings.NewReader(" "), &out); !errors.Is(err, ErrCancelled) {
		t.Errorf("EOF: %v", err)
	}
}

func TestConfirm(t *testing.T) {
	var out bytes.Buffer
	for in, want := range map[string]bool{"y\n": true, "YES\n": true, "n\n": false, "\n": false, "": false} {
		got, err := Confirm(strings.NewReader(in), &out, "Delete?")
		if err != nil || got != want {
			t.Errorf("%q: %v %v", in, got, err)
		}
	}
}
