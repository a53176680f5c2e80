// Package ui owns klimax's terminal interaction: progress lines with elapsed
// time for long steps (an animated spinner on a TTY, plain lines otherwise)
// and the multi-select picker used by `cluster delete` without a name.
package ui

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"golang.org/x/term"
)

// IsTerminal reports whether f is an interactive terminal.
func IsTerminal(f *os.File) bool { return f != nil && term.IsTerminal(int(f.Fd())) }

var spinFrames = []string{"⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"}

// Progress prints one line per long step with its elapsed time. Steps may
// overlap (parallel fleet creates); on a TTY the spinner shows the most
// recently started running step and how many others are running.
type Progress struct {
	w     io.Writer
	tty   bool
	now   func() time.Time
	mu    sync.Mutex
	steps []*step
	frame int
	stop  chan struct{}
}

type step struct {
	title string
	start time.Time
}

// NewProgress writes to w; tty selects the animated mode.
func NewProgress(w io.Writer, tty bool) *Progress {
	return &Progress{w: w, tty: tty, now: time.Now}
}

// Step starts a step and returns the function that ends it.
func (p *Progress) Step(title string) func(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := &step{title: title, start: p.now()}
	p.steps = append(p.steps, s)
	if !p.tty {
		fmt.Fprintf(p.w, "==> %s\n", title)
	} else {
		if p.stop == nil {
			p.stop = make(chan struct{})
			go p.spin(p.stop)
		}
		p.drawLocked()
	}
	var once sync.Once
	return func(err error) { once.Do(func() { p.end(s, err) }) }
}

func (p *Progress) end(s *step, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, x := range p.steps {
		if x == s {
			p.steps = append(p.steps[:i], p.steps[i+1:]...)
			break
		}
	}
	el := formatElapsed(p.now().Sub(s.start))
	if p.tty {
		fmt.Fprint(p.w, "\r\033[K")
	}
	// A failure's error is the command's own error, printed once at the
	// end (with every failed cluster of a fleet): not here as well.
	fmt.Fprintf(p.w, "%s %s (%s)\n", mark(p.tty, err == nil), s.title, el)
	if p.tty {
		if len(p.steps) == 0 && p.stop != nil {
			close(p.stop)
			p.stop = nil
		} else {
			p.drawLocked()
		}
	}
}

func mark(tty, ok bool) string {
	switch {
	case tty && ok:
		return "✓"
	case tty:
		return "✗"
	case ok:
		return "    done"
	default:
		return "    FAILED"
	}
}

func (p *Progress) spin(stop chan struct{}) {
	t := time.NewTicker(120 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			p.mu.Lock()
			p.frame++
			p.drawLocked()
			p.mu.Unlock()
		}
	}
}

func (p *Progress) drawLocked() {
	if len(p.steps) == 0 {
		return
	}
	s := p.steps[len(p.steps)-1]
	more := ""
	if n := len(p.steps) - 1; n > 0 {
		more = fmt.Sprintf(" [+%d more]", n)
	}
	fmt.Fprintf(p.w, "\r\033[K%s %s (%s)%s", spinFrames[p.frame%len(spinFrames)], s.title, formatElapsed(p.now().Sub(s.start)), more)
}

func formatElapsed(d time.Duration) string {
	if d < time.Minute {
		return fmt.Sprintf("%.1fs", d.Seconds())
	}
	return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
}
